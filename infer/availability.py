"""Whether something can run here, and if not, why: the one line a skipped GPU-only path prints."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Availability:
    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


YES = Availability(True)
