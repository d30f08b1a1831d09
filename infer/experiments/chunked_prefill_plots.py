"""Week 06's figures: per-request timelines (Gantt), ITL distributions, budget sweeps, and the
simulator against the engine. Each takes what infer.experiments.chunked_prefill measured (or what the
simulator produced) and draws it on the axes it is given; the caller saves with provenance."""

import matplotlib.pyplot as plt
import numpy as np

from infer.engine.step_record import StepRecord

PREFILL_COLOR, DECODE_COLOR = "tab:orange", "tab:blue"


def plot_gantt(ax: plt.Axes, steps: list[StepRecord], title: str, *, request_order: list[str] | None = None) -> None:
    """One row per request: an orange bar for every step that ran a chunk of its prompt, from the
    step's start to its end, and a blue tick where each of its tokens appeared (the end of the step
    that decoded it). A gap in the blue ticks beside an orange bar is a stall: however long the
    step that caused it, the gap shows its length."""
    t0 = steps[0].start if steps else 0.0
    order = request_order or list(dict.fromkeys(item.request_id for step in steps for item in step.items))
    row = {rid: i for i, rid in enumerate(order)}
    prefill = {rid: [] for rid in order}
    token_times, token_rows = [], []
    for step in steps:
        for item in step.items:
            if item.request_id not in row:
                continue
            if item.prefill:
                prefill[item.request_id].append((step.start - t0, step.end - step.start))
            else:
                token_times.append(step.end - t0)
                token_rows.append(row[item.request_id])
    for rid in order:
        ax.broken_barh(prefill[rid], (row[rid] - 0.4, 0.8), color=PREFILL_COLOR)
    ax.scatter(token_times, token_rows, marker="|", s=30, linewidths=1, color=DECODE_COLOR)
    ax.set_ylim(-1, len(order))
    ax.set_yticks([])
    ax.set_xlabel("time since the first step (s)")
    ax.set_ylabel(f"request ({len(order)} rows)")
    ax.set_title(title, loc="left")
    # Above the plot, beside the title: inside it, the key would hide the rows it explains.
    ax.legend(
        handles=[
            plt.Rectangle((0, 0), 1, 1, color=PREFILL_COLOR, label="prefill chunk"),
            plt.Line2D([], [], marker="|", ls="none", ms=8, color=DECODE_COLOR, label="decoded token"),
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


def _median_and_range(value) -> tuple[float, float, float]:
    """A sweep point's value: a spread over rounds (infer.experiments.rounds.spread), or one number."""
    if isinstance(value, dict):
        return value["median"], value["min"], value["max"]
    return value, value, value


def plot_budget_sweep(
    axes,
    points: list[dict],
    load_key: str,
    load_label: str,
    *,
    slo_ms: dict | None = None,
    capacity: dict[int, float] | None = None,
    stamp: str | None = None,
) -> None:
    """Four panels against the budget, one colour per load (`load_label` names it: "concurrency
    {}"): TTFT and TPOT (p50 solid, p90 dashed,
    the SLO as a red line), output throughput and goodput. Medians over rounds, bars from the
    slowest to the fastest round where there were several. The throughput-best budget of each
    load is marked with a black x, the goodput-best circled in red; a point marked overloaded (its
    load beyond the budget's capacity: a queue that only grows) is drawn hollow and never marked.

    Loads given as arrival rates (an open loop) get every budget's `capacity` (requests/s) in the
    third panel instead: below it, every budget finishes what arrives, so the throughput-best is
    the budget with the most capacity."""
    ttft_ax, tpot_ax, throughput_ax, goodput_ax = axes
    loads = list(dict.fromkeys(p[load_key] for p in points))
    colors = plt.cm.viridis(np.linspace(0, 0.85, len(loads)))

    def draw(ax, rows, key, style, color, label=None):
        values = [_median_and_range(r[key]) for r in rows]
        budgets = [r["max_num_batched_tokens"] for r in rows]
        medians = [v[0] for v in values]
        errors = [[v[0] - v[1] for v in values], [v[2] - v[0] for v in values]]
        ax.errorbar(budgets, medians, yerr=errors, fmt=style, color=color, capsize=3, label=label, mfc="none")
        steady = [(b, m) for b, m, r in zip(budgets, medians, rows) if not r.get("overloaded")]
        if steady:
            ax.plot(*zip(*steady), style[0], color=color)  # filled markers: the loads the budget keeps up with
        return budgets, medians

    for load, color in zip(loads, colors):
        rows = sorted((p for p in points if p[load_key] == load), key=lambda p: p["max_num_batched_tokens"])
        for ax, metric in ((ttft_ax, "ttft"), (tpot_ax, "tpot")):
            draw(ax, rows, f"p50_{metric}_ms", "o-", color, f"{load_label.format(load)} p50")
            draw(ax, rows, f"p90_{metric}_ms", "s--", color, f"{load_label.format(load)} p90")
        if capacity is None:
            budgets, throughput = draw(throughput_ax, rows, "output_throughput", "o-", color, load_label.format(load))
        budgets, goodput = draw(goodput_ax, rows, "request_goodput", "o-", color, load_label.format(load))
        steady = [i for i, r in enumerate(rows) if not r.get("overloaded")]
        if steady and capacity is None:  # ties go to the smaller budget, as chunked_prefill.best_budget
            fastest = max(steady, key=lambda i: (throughput[i], -budgets[i]))
            throughput_ax.plot(budgets[fastest], throughput[fastest], "x", ms=12, color="black", mew=2)
        if steady:
            best = max(steady, key=lambda i: (goodput[i], -budgets[i]))
            if goodput[best] > 0:
                goodput_ax.plot(budgets[best], goodput[best], "o", ms=14, mfc="none", mec="red", mew=2)
    if capacity is not None:
        budgets = sorted(capacity)
        throughput_ax.plot(budgets, [capacity[b] for b in budgets], "o-", color="0.3", label="all requests at once")
        fastest = max(budgets, key=lambda b: (capacity[b], -b))
        throughput_ax.plot(fastest, capacity[fastest], "x", ms=12, color="black", mew=2)
        throughput_ax.legend()
    if slo_ms:
        for ax, metric in ((ttft_ax, "ttft"), (tpot_ax, "tpot")):
            ax.axhline(slo_ms[metric], color="red", lw=1, ls=":", label=f"SLO {slo_ms[metric]:.0f} ms")
    panels = (
        (ttft_ax, "TTFT (ms)"),
        (tpot_ax, "TPOT (ms)"),
        (
            throughput_ax,
            "output throughput (tok/s); x: the best" if capacity is None else "capacity (requests/s); x: the most",
        ),
        (goodput_ax, "goodput (requests/s within SLOs); red circle: the best"),
    )
    for ax, what in panels:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("max_num_batched_tokens (token budget per step)")
        ax.set_ylabel(what)
    ttft_ax.set_yscale("log")
    tpot_ax.set_yscale("log")
    for ax in (ttft_ax, tpot_ax):
        ax.legend(ncol=2)
    goodput_ax.legend(title="hollow: overloaded" if any(p.get("overloaded") for p in points) else None)
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
    with the +-10% band. A workload measured in several rounds is drawn at their median, with a bar
    from the lowest round to the highest: how far the machine moved while the simulation did not."""
    metrics = (
        ("median_ttft_ms", "median TTFT (ms)", "o"),
        ("p90_ttft_ms", "p90 TTFT (ms)", "D"),
        ("median_tpot_ms", "median TPOT (ms)", "s"),
        ("p90_tpot_ms", "p90 TPOT (ms)", "v"),
        ("output_throughput", "output tok/s", "^"),
    )
    values = []
    for key, label, marker in metrics:
        measured = [_median_and_range(r["measured"][key]) for r in rows]
        simulated = [r["simulated"][key] for r in rows]
        x = [m[0] for m in measured]
        rounds = [[m[0] - m[1] for m in measured], [m[2] - m[0] for m in measured]]
        ax.errorbar(x, simulated, xerr=rounds, fmt=marker, label=label)
        values += [m[1] for m in measured] + [m[2] for m in measured] + simulated
    low, high = min(values) * 0.7, max(values) * 1.4
    line = np.array([low, high])
    ax.plot(line, line, color="0.3", lw=1)
    ax.fill_between(line, line * 0.9, line * 1.1, color="0.85", label="within 10%", zorder=0)  # behind the points
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(low, high)
    ax.set_ylim(low, high)
    ax.set_xlabel("measured on the engine (ms, or tok/s): median of the rounds")
    ax.set_ylabel("simulated (ms, or tok/s)")
    ax.set_title("simulator vs engine, held-out workloads")
    ax.legend()
