"""Timing done right: synchronize the device, warm up, repeat, report the median and spread.

GPU work is asynchronous: without a synchronize, a timer measures only how long it took to
*queue* the kernels. On CUDA the timer uses CUDA events, which time the device itself."""

import statistics
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import torch


def synchronize(device: str | torch.device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


class Stopwatch:
    """Times one region of device work: `with Stopwatch(device) as sw: ...; sw.ms`."""

    def __init__(self, device: str | torch.device = "cpu"):
        self.on_cuda = torch.device(device).type == "cuda"
        self.device = device
        self.ms: float | None = None

    def __enter__(self):
        if self.on_cuda:
            self._start, self._end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self._start.record()
        else:
            self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if self.on_cuda:
            self._end.record()
            self._end.synchronize()
            self.ms = self._start.elapsed_time(self._end)
        else:
            self.ms = (time.perf_counter() - self._t0) * 1e3
        return False


@dataclass(frozen=True)
class Timing:
    samples_ms: tuple[float, ...]

    @property
    def median_ms(self) -> float:
        return statistics.median(self.samples_ms)

    @property
    def spread_ms(self) -> tuple[float, float]:
        """The 10th and 90th percentiles: the spread without the one-off outliers."""
        if len(self.samples_ms) < 2:
            return self.samples_ms[0], self.samples_ms[0]
        deciles = statistics.quantiles(self.samples_ms, n=10, method="inclusive")
        return deciles[0], deciles[-1]

    def __str__(self) -> str:
        low, high = self.spread_ms
        return f"{self.median_ms:.3f} ms (p10 {low:.3f}, p90 {high:.3f}, n={len(self.samples_ms)})"


def benchmark(
    fn: Callable[[], object], *, device: str | torch.device = "cpu", warmup: int = 2, repeats: int = 5
) -> Timing:
    """Run `fn` `warmup` times untimed, then `repeats` times timed, each run synchronized."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    for _ in range(warmup):
        fn()
    synchronize(device)
    samples = []
    for _ in range(repeats):
        with Stopwatch(device) as sw:
            fn()
        samples.append(sw.ms)
    return Timing(tuple(samples))


@contextmanager
def cpu_threads(count: int | None):
    """Run the body with `count` torch CPU threads (None: leave them as they are), then restore.

    On a small shared machine, a multi-threaded op whose threads wait for a busy core can take ten
    times longer than the same op on one thread: noise larger than the differences being measured."""
    before = torch.get_num_threads()
    if count is not None:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)
