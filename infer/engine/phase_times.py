"""Where an engine's steps spend their time, phase by phase, summed since the engine started (the
breakdown of week 07). Wall-clock seconds on the host: on a GPU the forward pass is only launched,
so its time shows up where the host first waits for a result, in sampling."""

import time
from contextlib import contextmanager

PHASES = ("schedule", "forward", "sample", "update")


class PhaseTimes:
    def __init__(self) -> None:
        self.seconds = dict.fromkeys(PHASES, 0.0)

    @contextmanager
    def __call__(self, phase: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            # a phase not in PHASES (propose: speculative decoding only) appears once it has run
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - start
