"""The server's own view of a run, over time: what `GaugeSampler` read from /metrics every few
milliseconds (requests running and waiting, the KV store in use, preemptions so far), as one
figure. Week 07 draws a slot store at work, week 08 a paged store under pressure."""

import matplotlib.pyplot as plt

from infer.plotting import COLUMN_WIDTH_IN


def plot_server_view(samples: list[tuple[float, dict[str, float]]], title: str):
    """`samples`: (seconds since start, {metric: value}) as GaugeSampler keeps them. Preemptions are
    drawn only if there were any."""
    times = [t for t, _ in samples]

    def series(name: str) -> list[float]:
        return [sample[name] for _, sample in samples]

    fig, ax = plt.subplots(figsize=(COLUMN_WIDTH_IN, 3.6))
    ax.step(times, series("infer:num_requests_running"), where="post", label="running (holding KV room)")
    ax.step(times, series("infer:num_requests_waiting"), where="post", label="waiting")
    preempted = series("infer:num_preemptions_total")
    if any(preempted):
        ax.step(times, preempted, where="post", color="C3", label="preempted so far")
    ax.set_xlabel("time since the benchmark started (s)")
    ax.set_ylabel("requests")
    kv = ax.twinx()
    kv.plot(times, [100 * u for u in series("infer:kv_cache_usage_perc")], color="C2", alpha=0.6, label="KV in use")
    kv.set_ylabel("KV store in use (%)")
    kv.set_ylim(0, 105)
    ax.legend(loc="upper right", fontsize=8)
    kv.legend(loc="center right", fontsize=8)
    ax.set_title(title)
    return fig
