"""Week 05's benchmark as one figure, four panels stacked (infer.experiments.engine_bench draws it):
each system's output tokens/s per workload; each effect as a ratio with its range and target; what a
decode step costs against its batch, measured here and SIMULATED on a GPU roofline; and continuous
over static batching per workload, measured and SIMULATED, with the shares that explain it."""

import matplotlib.pyplot as plt
import numpy as np

from infer.experiments.rounds import ratio_spread, spread
from infer.plotting import COLUMN_WIDTH_IN, save_figure

COLORS = ("C0", "C1", "0.45", "0.75")  # the systems in order: the engine's two policies, then transformers'


def plot(
    runs: dict,
    summary: dict,
    why: dict,
    gpu: dict,
    meta: dict,
    *,
    systems: tuple[str, ...],
    continuous: str,
    static: str,
):
    """The benchmark's four panels, stacked (the site shows one column); figures/05_engine_bench.png.
    `systems` in the order to draw them; `continuous` and `static`: the engine's two policies."""
    fig, axes = plt.subplots(4, 1, figsize=(COLUMN_WIDTH_IN, 18))
    plot_throughput(axes[0], runs, systems)
    plot_effects(axes[1], summary)
    plot_step_cost_by_batch(axes[2], why["decode_step_ms_by_batch"], gpu)
    plot_continuous_gain(axes[3], runs, why, gpu, continuous, static)
    return save_figure(fig, "05_engine_bench", meta)


def error_bar(summary: dict) -> list[list[float]]:
    return [[summary["median"] - summary["min"]], [summary["max"] - summary["median"]]]


def plot_throughput(ax, runs: dict, systems: tuple[str, ...]) -> None:
    width, labelled = 0.8 / len(systems), set()
    for j, by_system in enumerate(runs.values()):
        for i, system in enumerate(systems):
            if system not in by_system:
                continue
            s = spread([r["output_throughput"] for r in by_system[system]])
            ax.bar(
                j + (i - (len(systems) - 1) / 2) * width,
                s["median"],
                width,
                yerr=error_bar(s),
                capsize=2,
                color=COLORS[i],
                label=None if system in labelled else system,
            )
            labelled.add(system)
    ax.set_xticks(range(len(runs)), [f"{name}\n{len(by_system)} systems" for name, by_system in runs.items()])
    ax.set_ylabel("output tokens/s (median; bars: range over rounds)")
    ax.set_title("every system, each workload in interleaved rounds")
    ax.legend()


def plot_effects(ax, summary: dict) -> None:
    keys = list(summary)
    medians = [summary[k]["median"] for k in keys]
    ax.barh(
        keys,
        medians,
        xerr=np.hstack([error_bar(summary[k]) for k in keys]),
        capsize=2,
        color=["C3" if k.startswith("engine_step") else "C0" for k in keys],
    )
    for y, key in enumerate(keys):
        ax.text(summary[key]["max"] * 1.02, y, f"{summary[key]['median']:.2f}x", va="center")
        if "target" in summary[key]:
            value = float(summary[key]["target"].split()[1])
            ax.plot([value], [y], marker="|", markersize=14, color="k")
    ax.axvline(1.0, color="0.5", linewidth=0.8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel(
        "ratio, median of the rounds (bars: their range; |: the target)\n"
        "blue: output tokens/s, higher is better; red: ms per step, lower is better"
    )
    ax.set_title("each effect apart: faster system / slower one, same requests")


def plot_step_cost_by_batch(ax, measured: dict, gpu: dict) -> None:
    batches = [int(b) for b in measured["ms"]]
    cpu = [measured["ms"][str(b)]["median"] for b in batches]
    sim = [gpu["decode_step_ms_by_batch"]["ms"][str(b)] for b in batches]
    ax.plot(
        batches,
        [c / cpu[0] for c in cpu],
        "o-",
        color="C0",
        label=f"this machine, measured ({cpu[0]:.1f} -> {cpu[-1]:.1f} ms)",
    )
    ax.plot(
        batches,
        [s / sim[0] for s in sim],
        "s--",
        color="C3",
        label=f"SIMULATED: {gpu['model']} on a GPU roofline ({sim[0]:.1f} -> {sim[-1]:.1f} ms)",
    )
    ax.set_xscale("log", base=2)
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.set_xlabel(f"decode batch (sequences of {measured['context']} tokens)")
    ax.set_ylabel("decode step time / time at batch 1")
    ax.set_ylim(bottom=0)
    ax.set_title("what an idle slot saves: a step's cost against its batch")
    ax.legend()
    ax.grid(True, alpha=0.3)


def plot_continuous_gain(ax, runs: dict, why: dict, gpu: dict, continuous: str, static: str) -> None:
    names = [name for name in runs if static in runs[name]]
    measured = [ratio_spread(runs[n][continuous], runs[n][static], "output_throughput") for n in names]
    x = np.arange(len(names))
    ax.bar(
        x - 0.2,
        [m["median"] for m in measured],
        0.4,
        yerr=np.hstack([error_bar(m) for m in measured]),
        capsize=3,
        color="C0",
        label="this machine, measured (bars: range over rounds)",
    )
    ax.bar(
        x + 0.2,
        [gpu["workloads"][n]["continuous_vs_static"] for n in names],
        0.4,
        color="C3",
        hatch="//",
        alpha=0.7,
        label=f"SIMULATED: {gpu['model']} on a GPU roofline",
    )
    ax.axhline(1.0, color="0.5", linewidth=0.8)
    labels = []
    for n in names:
        s = why["workloads"][n][continuous]
        labels.append(f"{n}\nprefill {s['prefill_share']:.0%}\ndrain {s['drain_share']:.0%}")
    ax.set_xticks(x, labels)
    ax.set_xlabel(
        "workload; the measured continuous run's time in prefill steps,\n"
        "and draining after the last request was admitted"
    )
    ax.set_ylabel("continuous / static\n(output tokens/s, in the engine)")
    ax.set_title("continuous batching's gain, measured here and SIMULATED on a GPU")
    ax.set_ylim(
        0, 1.25 * max([m["max"] for m in measured] + [gpu["workloads"][n]["continuous_vs_static"] for n in names])
    )
    ax.legend(loc="upper left")
