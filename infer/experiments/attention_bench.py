"""Time and peak memory of attention implementations over sequence lengths, without crashing.

- Time: `infer.timing.benchmark` (warm-up, device sync, median and p10/p90 of repeats).
- Peak memory, measured two ways, and labelled so:
  on CUDA, `torch.cuda.max_memory_allocated` after `reset_peak_memory_stats` (everything the
  caching allocator handed out during one call, minus what was live before);
  on CPU there is no such counter, so `TensorBytes` watches every PyTorch operator and tracks the
  bytes of the tensors created inside the call that are still alive: the peak of that is what the
  implementation materializes. A fused kernel's private scratch buffers are invisible to it.
- Out of memory: on CUDA a `torch.cuda.OutOfMemoryError` is caught and recorded; on CPU an
  implementation that materializes [N, N] matrices is refused *before* it runs when its predicted
  bytes exceed a budget (swapping would freeze the machine long before Python saw an error).
  Either way the sweep records an "oom" point and goes on.
- Any other error of one implementation (a kernel out of shared memory, a package that fails at
  its first call) is recorded as a "failed" point with the error's first line; the others go on.
- Time guard: an implementation whose next length would take longer than `max_call_s` per call
  (predicted from its last point, times growing as N^2) is skipped from there on, and says so."""

from dataclasses import dataclass, field

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from infer.attention import AttentionImpl, random_qkv
from infer.attention_io import score_matrix_bytes
from infer.availability import error_line
from infer.plotting import plot_medians
from infer.profiles import Profile
from infer.timing import Timing, benchmark, cpu_threads


@dataclass(frozen=True)
class SweepConfig:
    seq_lens: tuple[int, ...]
    batch: int
    heads: int
    head_dim: int
    dtype: torch.dtype
    device: str
    causal: bool = True
    warmup: int = 1
    repeats: int = 3
    cpu_budget_bytes: int = 512 * 2**20  # refuse an N x N implementation above this on CPU
    max_call_s: float = 3.0
    cpu_threads: int | None = None  # torch CPU threads during the sweep (None: unchanged)


def sweep_config(profile: Profile) -> SweepConfig:
    """The sweep of a profile: small on CPU (seconds), up to 64k tokens on a GPU."""
    if profile.name == "gpu-check":  # make gpu-check's 10 minutes: the gpu sweep's kernels, three lengths
        return SweepConfig(
            seq_lens=(1024, 4096, 16384),
            batch=1,
            heads=16,
            head_dim=128,
            dtype=torch.bfloat16,
            device="cuda",
            warmup=1,
            repeats=3,
            max_call_s=1.0,
        )
    if profile.device == "cuda":
        return SweepConfig(
            seq_lens=(1024, 2048, 4096, 8192, 16384, 32768, 65536),
            batch=1,
            heads=16,
            head_dim=128,
            dtype=torch.bfloat16,
            device="cuda",
            warmup=2,
            repeats=5,
            max_call_s=5.0,
        )
    if profile.name == "gpu-dryrun":  # the gpu sweep's dtype and head size at CPU lengths: checks paths, not speed
        return SweepConfig(
            seq_lens=(128, 256, 512),
            batch=1,
            heads=2,
            head_dim=128,
            dtype=torch.bfloat16,
            device="cpu",
            warmup=1,
            repeats=1,
            max_call_s=2.0,
            cpu_threads=1,
        )
    # One thread: on a shared 2-core machine, multi-threaded small ops spend most of their time
    # waiting for each other, which swamps the differences being measured.
    return SweepConfig(
        seq_lens=(512, 1024, 2048, 4096, 8192),
        batch=1,
        heads=1,
        head_dim=64,
        dtype=torch.float32,
        device="cpu",
        warmup=1,
        repeats=3,
        max_call_s=2.0,
        cpu_threads=1,
    )


class TensorBytes(TorchDispatchMode):
    """Inside `with TensorBytes() as t:`, t.peak is the most bytes of tensors created in the block
    that were alive at once (storages counted once, however many views share them)."""

    def __init__(self):
        super().__init__()
        self.live: dict[int, tuple[StorageWeakRef, int]] = {}
        self.now = self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for key, (ref, size) in list(self.live.items()):  # drop storages freed since the last op
            if ref.expired():
                del self.live[key]
                self.now -= size
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                storage = leaf.untyped_storage()
                if storage.nbytes() and storage.data_ptr() not in self.live:
                    self.live[storage.data_ptr()] = (StorageWeakRef(storage), storage.nbytes())
                    self.now += storage.nbytes()
        self.peak = max(self.peak, self.now)
        return out


def peak_bytes(fn, device: str) -> int:
    """Peak bytes allocated by one call of `fn` beyond what was allocated before (output included)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = fn()
        torch.cuda.synchronize()
        del out
        return torch.cuda.max_memory_allocated() - before
    with TensorBytes() as tracker:
        out = fn()
    del out
    return tracker.peak


def memory_method(device: str) -> str:
    if torch.device(device).type == "cuda":
        return "measured on CUDA (torch.cuda.max_memory_allocated)"
    return "measured on CPU: peak live tensor bytes at the PyTorch operator level (fused kernels' scratch not seen)"


def predicted_naive_bytes(config: SweepConfig, seq_len: int) -> int:
    """The memory of `naive_attention` as the CPU budget counts it: S in float32, P in the input dtype
    and the boolean causal mask. That overstates the naive version a little (the mask is freed
    before P is allocated: on the cpu profile, 132 MiB measured at 4096 tokens against 144 here) and
    understates SDPA's math backend, which it also stands for (194 MiB measured there)."""
    width = config.dtype.itemsize
    mask = seq_len * seq_len if config.causal else 0
    return (
        score_matrix_bytes(config.batch, config.heads, seq_len, 4)
        + score_matrix_bytes(config.batch, config.heads, seq_len, width)
        + mask
    )


@dataclass
class SweepPoint:
    name: str
    seq_len: int
    status: str  # "ok", "oom", "failed" or "skipped"
    timing: Timing | None = None
    peak_bytes: int | None = None
    note: str = ""


@dataclass
class SweepResult:
    config: SweepConfig
    points: list[SweepPoint] = field(default_factory=list)

    def point(self, name: str, seq_len: int) -> SweepPoint | None:
        return next((p for p in self.points if p.name == name and p.seq_len == seq_len), None)

    def names(self) -> list[str]:
        return list(dict.fromkeys(p.name for p in self.points))


def run_sweep(impls: dict[str, AttentionImpl], config: SweepConfig, progress: bool = True) -> SweepResult:
    """Every implementation at every length: time, peak memory, or the reason it did not run."""
    from tqdm.auto import tqdm

    result = SweepResult(config)
    last_ms: dict[str, tuple[int, float]] = {}
    jobs = [(n, name) for n in config.seq_lens for name in impls]
    with cpu_threads(config.cpu_threads):
        for seq_len, name in tqdm(jobs, desc="attention sweep", disable=not progress):
            _sweep_one(impls[name], name, seq_len, config, result, last_ms)
    return result


def _sweep_one(
    impl: AttentionImpl,
    name: str,
    seq_len: int,
    config: SweepConfig,
    result: SweepResult,
    last_ms: dict[str, tuple[int, float]],
) -> None:
    """Measure one implementation at one length, or record why it was refused or skipped."""
    refusal = _over_cpu_budget(impl, config, seq_len)
    if refusal:
        result.points.append(refusal)
        return
    if name in last_ms:
        prev_len, prev_ms = last_ms[name]
        predicted_s = prev_ms * (seq_len / prev_len) ** 2 / 1e3
        if predicted_s > config.max_call_s:
            result.points.append(
                SweepPoint(
                    name,
                    seq_len,
                    "skipped",
                    note=(
                        f"predicted {predicted_s:.0f} s per call (from {prev_len} tokens, x N^2) > "
                        f"{config.max_call_s} s limit"
                    ),
                )
            )
            return
    result.points.append(_measure(impl, config, seq_len))
    if result.points[-1].status == "ok":
        last_ms[name] = (seq_len, result.points[-1].timing.median_ms)


def _over_cpu_budget(impl: AttentionImpl, config: SweepConfig, seq_len: int) -> SweepPoint | None:
    if not impl.materializes_scores or torch.device(config.device).type == "cuda":
        return None  # on CUDA the allocator itself says when memory runs out
    needed = predicted_naive_bytes(config, seq_len)
    if needed <= config.cpu_budget_bytes:
        return None
    return SweepPoint(
        impl.name,
        seq_len,
        "oom",
        note=(f"refused: needs ~{needed / 2**20:.0f} MiB > CPU budget {config.cpu_budget_bytes / 2**20:.0f} MiB"),
    )


def _measure(impl: AttentionImpl, config: SweepConfig, seq_len: int) -> SweepPoint:
    q, k, v = random_qkv(
        config.batch, config.heads, seq_len, config.head_dim, dtype=config.dtype, device=config.device, seed=seq_len
    )
    call = lambda: impl(q, k, v, causal=config.causal)  # noqa: E731
    try:
        timing = benchmark(call, device=config.device, warmup=config.warmup, repeats=config.repeats)
        peak = peak_bytes(call, config.device)
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        return SweepPoint(impl.name, seq_len, "oom", note="torch.cuda.OutOfMemoryError")
    except Exception as exc:  # noqa: BLE001 - one implementation's failure is a result of the sweep, not its end
        return SweepPoint(impl.name, seq_len, "failed", note=error_line(exc))
    return SweepPoint(impl.name, seq_len, "ok", timing, peak)


def format_table(result: SweepResult) -> str:
    lines = [f"{'implementation':<15} {'N':>6} {'median ms':>10} {'p10-p90 ms':>17} {'peak MiB':>9}  note"]
    for p in result.points:
        if p.status == "ok":
            low, high = p.timing.spread_ms
            lines.append(
                f"{p.name:<15} {p.seq_len:>6} {p.timing.median_ms:>10.2f} {low:>8.2f}-{high:<8.2f} "
                f"{p.peak_bytes / 2**20:>9.2f}"
            )
        else:
            lines.append(f"{p.name:<15} {p.seq_len:>6} {p.status.upper():>10} {'':>17} {'':>9}  {p.note}")
    return "\n".join(lines)


def plot_sweep(ax_time, ax_memory, result: SweepResult) -> None:
    """Time (left) and peak memory (right) against N, log-log; an "OOM" marker where a run ran out
    of memory or was refused for the memory it would need.

    A refused run has no value to plot, so its marker must not look like one: the markers are
    drawn after every series, in a band added above the highest measured point, at fixed heights
    of the axes (OOM_MARKER_HEIGHTS), never at a y value of the data."""
    colors = {}
    for name in result.names():
        ok = [p for p in result.points if p.name == name and p.status == "ok"]
        lens = [p.seq_len for p in ok]
        line = plot_medians(ax_time, lens, [p.timing for p in ok], marker="o", label=name).lines[0]
        colors[name] = line.get_color()
        ax_memory.plot(lens, [p.peak_bytes / 2**20 for p in ok], marker="o", color=colors[name], label=name)
    for ax in (ax_time, ax_memory):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(result.config.seq_lens, [str(n) for n in result.config.seq_lens])
        ax.minorticks_off()
    ooms = [p for p in result.points if p.status == "oom"]
    if ooms:
        for ax in (ax_time, ax_memory):
            _draw_oom_markers(ax, ooms, colors)
    ax_time.set_xlabel("sequence length N (tokens)")
    ax_time.set_ylabel("time per call (ms), median with p10-p90")
    ax_memory.set_xlabel("sequence length N (tokens)")
    ax_memory.set_ylabel("peak memory per call (MiB)")
    ax_time.legend(fontsize=7)


OOM_MARKER_HEIGHTS = (0.93, 0.86, 0.79)  # axes fractions of the first, second, ... OOM marker at one N
OOM_BAND = 0.3  # the share of the axes' height, above the data, that holds the markers


def _draw_oom_markers(ax, ooms: list[SweepPoint], colors: dict[str, str]) -> None:
    """An "x" and "OOM: <name>" per refused run, in a band above the data (log y axis)."""
    ax.autoscale_view()
    low, high = ax.get_ylim()
    ax.set_ylim(low, high * (high / low) ** (OOM_BAND / (1 - OOM_BAND)))  # the data keep the lower 70%
    at_length: dict[int, int] = {}
    for p in ooms:
        k = at_length.get(p.seq_len, 0)
        at_length[p.seq_len] = k + 1
        height = OOM_MARKER_HEIGHTS[min(k, len(OOM_MARKER_HEIGHTS) - 1)]
        color = colors.get(p.name, "0.3")
        x_data_y_axes = ax.get_xaxis_transform()  # x in data units, y as a fraction of the axes
        ax.plot([p.seq_len], [height], marker="x", color=color, markersize=9, transform=x_data_y_axes)
        ax.annotate(
            f"OOM: {p.name}",
            (p.seq_len, height),
            xycoords=x_data_y_axes,
            textcoords="offset points",
            xytext=(-7, 0),
            ha="right",
            va="center",
            fontsize=7,
            color=color,
        )


def ratio_at(result: SweepResult, seq_len: int, slow: str, fast: str) -> tuple[float, float] | None:
    """(time ratio, memory ratio) of `slow` over `fast` at `seq_len`, or None if either did not run."""
    a, b = result.point(slow, seq_len), result.point(fast, seq_len)
    if not (a and b and a.status == b.status == "ok"):
        return None
    return a.timing.median_ms / b.timing.median_ms, a.peak_bytes / b.peak_bytes
