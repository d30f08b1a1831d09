"""infer.experiments.server_view: the server's gauges over time, preemptions drawn only when there were any."""

from infer.experiments.server_view import plot_server_view


def sample(t, running, waiting, usage, preempted):
    return t, {
        "infer:num_requests_running": running,
        "infer:num_requests_waiting": waiting,
        "infer:kv_cache_usage_perc": usage,
        "infer:num_preemptions_total": preempted,
    }


def test_preemptions_are_drawn_only_when_there_were_some():
    calm = [sample(0.0, 0, 4, 0.0, 0), sample(0.1, 4, 0, 0.5, 0), sample(0.2, 0, 0, 0.0, 0)]
    pressed = [sample(0.0, 0, 8, 0.0, 0), sample(0.1, 6, 2, 1.0, 1), sample(0.2, 5, 3, 1.0, 2)]
    calm_labels = [line.get_label() for line in plot_server_view(calm, "calm").axes[0].lines]
    pressed_labels = [line.get_label() for line in plot_server_view(pressed, "pressed").axes[0].lines]
    assert "preempted so far" not in calm_labels and "preempted so far" in pressed_labels
    kv_line = plot_server_view(pressed, "pressed").axes[1].lines[0]
    assert list(kv_line.get_ydata()) == [0.0, 100.0, 100.0], "KV usage is drawn in percent"
