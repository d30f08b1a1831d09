"""Whether something can run here, and if not, why: the one line a skipped GPU-only path prints."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Availability:
    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


YES = Availability(True)


def error_line(exc: BaseException, width: int = 150) -> str:
    """An error as one line of a reason: its type and the first line of its message."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:width]}" if lines else type(exc).__name__
