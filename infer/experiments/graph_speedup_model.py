"""What CUDA graphs and paged kernels should buy on a GPU: a model, SIMULATED until a GPU measures
it (week 09's GPU section; `make gpu-check` measures it: infer.experiments.decode_fast_paths).

An eager decode step is launched by the host one operator at a time and run by the device; the
two overlap, so the step takes the longer of the two:
- the host: the step's operators x what one costs the host (dispatch, then a kernel launch);
- the device: the step's bytes at the GPU's bandwidth, or its FLOPs at its peak, whichever is
  longer (infer.roofline), plus a small gap between one kernel and the next.
Replayed from a CUDA graph, the host makes one call and the device runs the recorded kernels back
to back: the step takes the device's time plus the replay call.

And the attention path changes the device's bytes. The gather path copies every sequence's
blocks into one tensor (the keys and values read, then written), then attends over the copy (read
again): three passes over the KV. A paged kernel (flash-attn's, the course's Triton one) reads
them where they lie: one pass.

The model's numbers are its assumptions, each named in ASSUMPTIONS with where it comes from.
"""

from dataclasses import dataclass

from matplotlib.ticker import ScalarFormatter

from infer.experiments.chunked_prefill_run import GPU_ROOFLINE
from infer.experiments.step_roofline import decode_step_cost
from infer.roofline import ForwardCost

KV_PASSES = {"gather": 3, "paged": 1}  # reads and writes of each cached key and value per step
REPLAY_US = 20.0  # one graph replay and the step's input copy, per step
DEVICE_GAP_US = 1.5  # between two kernels on the device, eager or replayed
ASSUMPTIONS = {
    "roofline": f"{GPU_ROOFLINE['device']}: {GPU_ROOFLINE['peak_flops'] / 1e12:.0f} TFLOP/s bf16 dense, "
    f"{GPU_ROOFLINE['bandwidth'] / 1e12:.2f} TB/s",
    "host_us_per_operator": "what an operator costs this machine's host, measured by week 09's profile (the GPU "
    "host's CPU and its launch cost will differ)",
    "device_gap_us": f"{DEVICE_GAP_US} us between kernels on the device (an assumption: a few hundred kernels of a "
    "step each start and drain)",
    "replay_us": f"{REPLAY_US:.0f} us per replay for the call and the step's one input copy (an assumption)",
}


@dataclass(frozen=True)
class PredictedStep:
    batch: int
    attention: str  # "gather" or "paged"
    host_ms: float  # launching the step's operators one by one
    device_ms: float  # the device's work: the roofline floor, and the gaps between kernels
    eager_ms: float
    graph_ms: float
    floor_ms: float  # the roofline floor alone, paged (the least any engine could take)

    @property
    def graph_speedup(self) -> float:
        return self.eager_ms / self.graph_ms

    @property
    def graph_roofline_share(self) -> float:
        return self.floor_ms / self.graph_ms


def device_floor_ms(cost: ForwardCost, kv_passes: int) -> float:
    """The roofline floor of a step whose KV crosses memory `kv_passes` times."""
    step_bytes = cost.bytes + (kv_passes - 1) * cost.kv_bytes
    return 1e3 * max(cost.flops / GPU_ROOFLINE["peak_flops"], step_bytes / GPU_ROOFLINE["bandwidth"])


def predict(
    config, bytes_per_element: int, batch: int, context: int, operators: int, host_us_per_operator: float, attention
) -> PredictedStep:
    """One decode step of `batch` sequences of `context` cached tokens that dispatches `operators`
    operators, eager and replayed, with the `attention` path ("gather" or "paged")."""
    cost = decode_step_cost(config, batch, context, bytes_per_element)
    device_ms = device_floor_ms(cost, KV_PASSES[attention]) + operators * DEVICE_GAP_US / 1e3
    host_ms = operators * host_us_per_operator / 1e3
    return PredictedStep(
        batch,
        attention,
        host_ms,
        device_ms,
        eager_ms=max(host_ms, device_ms),
        graph_ms=device_ms + REPLAY_US / 1e3,
        floor_ms=device_floor_ms(cost, KV_PASSES["paged"]),
    )


def operators_for(layers: int, counted: dict[int, int]) -> float:
    """A step's operators for a model of `layers` layers, from two counts {layers: operators} of the
    same architecture: a fixed part (embedding, final norm, head, sampling) and a part per layer."""
    (few, few_ops), (many, many_ops) = sorted(counted.items())
    per_layer = (many_ops - few_ops) / (many - few)
    return few_ops + per_layer * (layers - few)


def plot_predicted(ax, rows: dict[str, list[PredictedStep]]) -> None:
    """Predicted step times against the batch, one line per (model, path), eager dashed."""
    for index, (label, steps) in enumerate(rows.items()):
        color = f"C{index}"
        batches = [s.batch for s in steps]
        ax.plot(batches, [s.eager_ms for s in steps], "--", color=color, label=f"{label}, eager")
        ax.plot(batches, [s.graph_ms for s in steps], "o-", color=color, label=f"{label}, CUDA graphs")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.yaxis.set_minor_formatter(ScalarFormatter())
    ax.set_xlabel("sequences decoded per step (batch)")
    ax.set_ylabel("predicted decode step (ms)")
    ax.set_title(f"SIMULATED: a decode step on an {GPU_ROOFLINE['device']}, eager (dashed) and replayed")
    ax.legend(fontsize="small")
