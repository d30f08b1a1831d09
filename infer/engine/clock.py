"""The engine's sense of time: the wall clock when it runs a model, a virtual one when the
simulator stands in for the model (infer.engine.simulator). Both answer `now()` in seconds, and
`wait_until(t)` either sleeps until then or simply jumps there."""

import time


class WallClock:
    def now(self) -> float:
        return time.perf_counter()

    def wait_until(self, t: float) -> None:
        time.sleep(max(0.0, t - time.perf_counter()))


class VirtualClock:
    """Time that passes only when someone says so: a simulated step advances it by its cost."""

    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def wait_until(self, t: float) -> None:
        self.t = max(self.t, t)

    def advance(self, seconds: float) -> None:
        self.t += seconds
