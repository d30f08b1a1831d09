"""Week 06's figures: per-request timelines (Gantt), ITL distributions, budget sweeps, and the
simulator against the engine. Each takes what infer.experiments.chunked_prefill measured (or what the
simulator produced) and draws it on the axes it is given; the caller saves with provenance."""

import matplotlib.pyplot as plt
import numpy as np

from infer.engine.step_record import StepRecord

PREFILL_COLOR, DECODE_COLOR = "tab:orange", "tab:blue"


def plot_gantt(ax: plt.Axes, steps: list[StepRecord], title: str, *, request_order: list[str] | None = None) -> None:
    """One row per request: an orange bar for every step that ran a chunk of its prompt, a blue
    tick for every step that decoded one of its tokens. A long orange bar with the blue rows
    stopped beside it is a stall."""
    t0 = steps[0].start if steps else 0.0
    order = request_order or list(dict.fromkeys(item.request_id for step in steps for item in step.items))
    row = {rid: i for i, rid in enumerate(order)}
    prefill, decode = {rid: [] for rid in order}, {rid: [] for rid in order}
    for step in steps:
        for item in step.items:
            if item.request_id in row:
                (prefill if item.prefill else decode)[item.request_id].append((step.start - t0, step.end - step.start))
    for rid in order:
        ax.broken_barh(prefill[rid], (row[rid] - 0.4, 0.8), color=PREFILL_COLOR)
        ax.broken_barh(decode[rid], (row[rid] - 0.25, 0.5), color=DECODE_COLOR)
    ax.set_ylim(-1, len(order))
    ax.set_yticks([])
    ax.set_xlabel("time since the first step (s)")
    ax.set_ylabel(f"request ({len(order)} rows)")
    ax.set_title(title, loc="left")
    # Above the plot, beside the title: inside it, the key would hide the rows it explains.
    ax.legend(
        handles=[
            plt.Rectangle((0, 0), 1, 1, color=PREFILL_COLOR, label="prefill chunk"),
            plt.Rectangle((0, 0), 1, 1, color=DECODE_COLOR, label="decode token"),
        ],
        loc="lower right",
        bbox_to_anchor=(1, 1),
        ncol=2,
        frameon=False,
    )


def plot_itl_distribution(ax: plt.Axes, itls_ms: dict[str, list[float]]) -> None:
    """The share of inter-token latencies above each value (log scale), one line per policy."""
    for label, values in itls_ms.items():
        values = np.sort(np.asarray(values))
        survival = 1 - np.arange(len(values)) / len(values)
        p99 = np.percentile(values, 99)
        ax.step(values, survival, where="post", label=f"{label} (p99 {p99:.0f} ms)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.axhline(0.01, color="0.6", lw=0.8, ls="--")
    ax.text(ax.get_xlim()[0], 0.011, " 1% (p99)", color="0.4")
    ax.set_xlabel("inter-token latency (ms)")
    ax.set_ylabel("share of ITLs above")
    ax.set_title("ITL distribution")
    ax.legend()


def plot_budget_sweep(axes, records: list[dict], load_key: str, load_label: str, *, stamp: str | None = None) -> None:
    """Three panels: TTFT p50/p99, TPOT p50/p99 and goodput vs budget, one colour per load; the
    goodput-best budget of each load is circled, the throughput-best marked with an x."""
    ttft_ax, tpot_ax, goodput_ax = axes
    loads = sorted({r[load_key] for r in records})
    colors = plt.cm.viridis(np.linspace(0, 0.85, len(loads)))
    for load, color in zip(loads, colors):
        rows = sorted((r for r in records if r[load_key] == load), key=lambda r: r["max_num_batched_tokens"])
        budgets = [r["max_num_batched_tokens"] for r in rows]
        for ax, metric in ((ttft_ax, "ttft"), (tpot_ax, "tpot")):
            ax.plot(
                budgets, [r[f"p50_{metric}_ms"] for r in rows], "o-", color=color, label=f"{load_label} {load:g} p50"
            )
            ax.plot(
                budgets,
                [r[f"p99_{metric}_ms"] for r in rows],
                "s--",
                color=color,
                alpha=0.7,
                label=f"{load_label} {load:g} p99",
            )
        goodput = [r["request_goodput"] for r in rows]
        goodput_ax.plot(budgets, goodput, "o-", color=color, label=f"{load_label} {load:g}")
        best = int(np.argmax(goodput))
        fastest = int(np.argmax([r["output_throughput"] for r in rows]))
        if goodput[best] > 0:
            goodput_ax.plot(budgets[best], goodput[best], "o", ms=14, mfc="none", mec="red", mew=2)
        else:
            goodput_ax.text(0.5, 0.5, "no budget meets the SLOs", transform=goodput_ax.transAxes, ha="center")
        goodput_ax.plot(budgets[fastest], goodput[fastest], "x", ms=10, color="black", mew=2)
    for ax, what in ((ttft_ax, "TTFT (ms)"), (tpot_ax, "TPOT (ms)"), (goodput_ax, "goodput (requests/s within SLOs)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("max_num_batched_tokens (token budget per step)")
        ax.set_ylabel(what)
    ttft_ax.set_yscale("log")
    tpot_ax.set_yscale("log")
    ttft_ax.legend(ncol=2)
    goodput_ax.legend(title="red circle: goodput-best\nblack x: throughput-best")
    if stamp:
        for ax in axes:
            ax.text(
                0.5,
                0.5,
                stamp,
                transform=ax.transAxes,
                ha="center",
                va="center",
                fontsize=22,
                color="red",
                alpha=0.18,
                rotation=25,
            )


def plot_simulated_vs_measured(ax: plt.Axes, rows: list[dict]) -> None:
    """Simulated against measured for each held-out workload and metric, on log axes around y = x,
    with the +-10% band."""
    metrics = (
        ("median_ttft_ms", "median TTFT (ms)", "o"),
        ("median_tpot_ms", "median TPOT (ms)", "s"),
        ("output_throughput", "output tok/s", "^"),
    )
    values = []
    for key, label, marker in metrics:
        measured = [r["measured"][key] for r in rows]
        simulated = [r["simulated"][key] for r in rows]
        ax.scatter(measured, simulated, marker=marker, label=label)
        values += measured + simulated
    low, high = min(values) * 0.7, max(values) * 1.4
    line = np.array([low, high])
    ax.plot(line, line, color="0.3", lw=1)
    ax.fill_between(line, line * 0.9, line * 1.1, color="0.85", label="within 10%", zorder=0)  # behind the points
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(low, high)
    ax.set_ylim(low, high)
    ax.set_xlabel("measured on the engine (ms, or tok/s)")
    ax.set_ylabel("simulated (ms, or tok/s)")
    ax.set_title("simulator vs engine, held-out workloads")
    ax.legend()
