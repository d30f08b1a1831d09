"""Where a serving step goes: the course server's own time counters (/metrics), read before and
after a benchmark run, turned into milliseconds per engine step (week 07).

The engine side (in its own process, or in a thread of the server's) counts the wall time of each
phase of its steps: schedule, forward, sample, update, and, when it runs in its own process, send
(pickling the step's outputs into the pipe). The API side counts its per-token work: deliver
(handing a step's outputs to the streams' queues), detokenize, and sse (building each stream's
chunk). Time spent inside a phase while another thread holds the GIL counts in that phase: the
forward pass of the same batch costs more when the front end shares the interpreter. The time
between steps is not given: the client's duration leaves out its own start and warm-up, while
the counters include the steps of its warm-up requests, so wall time per step would be wrong.
"""

import httpx

from infer.engine.phase_times import PHASES
from infer.serve.metrics import FRONTEND_PARTS, metric_samples

ENGINE_PHASES = (*PHASES, "send")  # send: the core process pickling a step's outputs into the pipe


def read_time_counters(text: str) -> dict[str, float]:
    """{"steps": n, "forward": s, "detokenize": s, ...} from a /metrics page."""
    counters: dict[str, float] = {}
    for name, labels, value in metric_samples(text):
        if name == "infer:engine_steps_total":
            counters["steps"] = value
        elif name == "infer:engine_phase_seconds_total":
            counters[labels["phase"]] = value
        elif name == "infer:frontend_seconds_total":
            counters[labels["part"]] = value
    return counters


def scrape_time_counters(url: str) -> dict[str, float]:
    return read_time_counters(httpx.get(f"{url.rstrip('/')}/metrics", timeout=30).text)


def per_step_ms(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Each part's milliseconds per engine step between two scrapes, and the step count."""
    steps = after["steps"] - before["steps"]
    if steps <= 0:
        raise ValueError("no engine step ran between the two scrapes: nothing to break down")
    parts = {
        part: 1e3 * (after.get(part, 0.0) - before.get(part, 0.0)) / steps for part in ENGINE_PHASES + FRONTEND_PARTS
    }
    return {**parts, "steps": steps}


def format_breakdown(rows: list[dict]) -> str:
    """One line per (system, concurrency): ms per engine step, engine phases then API-side parts."""
    columns = ENGINE_PHASES + FRONTEND_PARTS
    header = f"{'system':<26} {'conc':>4} {'steps':>6} | " + " ".join(f"{c:>9}" for c in columns)
    lines = [header, f"{'':<26} {'':>4} {'':>6} | ms per engine step (engine side, then API side)"]
    for row in rows:
        cells = " ".join(f"{row['breakdown'][c]:>9.2f}" for c in columns)
        lines.append(f"{row['system']:<26} {row['max_concurrency']:>4} {row['breakdown']['steps']:>6.0f} | {cells}")
    return "\n".join(lines)


def plot_breakdown(rows: list[dict], meta: dict):
    """Stacked bars: ms per engine step by part, one bar per (system, concurrency); the engine side
    on the left of each pair, the API side on the right."""
    import matplotlib.pyplot as plt

    from infer.plotting import COLUMN_WIDTH_IN, save_figure

    fig, ax = plt.subplots(figsize=(COLUMN_WIDTH_IN, 5.5))
    labels = []
    for index, row in enumerate(rows):
        for offset, parts in ((-0.2, ENGINE_PHASES), (0.2, FRONTEND_PARTS)):
            bottom = 0.0
            for part in parts:
                value = row["breakdown"][part]
                color = f"C{(ENGINE_PHASES + FRONTEND_PARTS).index(part)}"
                ax.bar(index + offset, value, 0.38, bottom=bottom, color=color, label=part if index == 0 else None)
                bottom += value
        labels.append(f"{row['system'].removeprefix('course-server')}\nc={row['max_concurrency']}".strip())
    ax.set_xticks(range(len(rows)), labels)
    ax.set_ylabel("milliseconds per engine step")
    ax.set_title("Where a serving step goes: engine side (left bar), API side (right bar)")
    ax.legend(ncol=3, fontsize="small")
    ax.grid(True, axis="y", alpha=0.3)
    return save_figure(fig, "07_serving_breakdown", meta)
