"""infer.experiments.serving_breakdown: the server's time counters, read from /metrics text, turned
into milliseconds per engine step; the table and the figure."""

import pytest

from infer.experiments.serving_breakdown import format_breakdown, per_step_ms, plot_breakdown, read_time_counters
from infer.provenance import provenance
from infer.serve.metrics import metric_samples, read_metrics

PAGE = """# HELP infer:engine_steps_total Engine steps run (one forward pass each).
infer:engine_steps_total{model_name="tiny"} 200.0
infer:engine_phase_seconds_total{model_name="tiny",phase="schedule"} 0.2
infer:engine_phase_seconds_total{model_name="tiny",phase="forward"} 3.0
infer:engine_phase_seconds_total{model_name="tiny",phase="sample"} 0.4
infer:engine_phase_seconds_total{model_name="tiny",phase="update"} 0.2
infer:frontend_seconds_total{model_name="tiny",part="deliver"} 0.1
infer:frontend_seconds_total{model_name="tiny",part="detokenize"} 0.6
infer:frontend_seconds_total{model_name="tiny",part="sse"} 0.3
infer:frontend_seconds_created{model_name="tiny",part="sse"} 1.7e9
infer:num_requests_running{model_name="tiny"} 3.0
"""


def test_counters_are_read_by_their_phase_or_part_label():
    counters = read_time_counters(PAGE)
    assert counters["steps"] == 200 and counters["forward"] == 3.0 and counters["sse"] == 0.3
    assert "num_requests_running" not in str(counters), "only the time counters belong to the breakdown"


def test_milliseconds_per_engine_step():
    before = dict.fromkeys(read_time_counters(PAGE), 0.0)
    parts = per_step_ms(before, read_time_counters(PAGE))
    assert parts["forward"] == pytest.approx(15.0) and parts["detokenize"] == pytest.approx(3.0)
    assert parts["send"] == 0.0, "an in-process engine sends nothing: its send counter is absent"
    assert parts["steps"] == 200
    with pytest.raises(ValueError, match="no engine step"):
        per_step_ms(read_time_counters(PAGE), read_time_counters(PAGE))


def test_table_and_figure(tiny):
    parts = per_step_ms(dict.fromkeys(read_time_counters(PAGE), 0.0), read_time_counters(PAGE))
    rows = [
        {"system": "course-server", "max_concurrency": 32, "breakdown": parts},
        {"system": "course-server-in-process", "max_concurrency": 32, "breakdown": parts},
    ]
    table = format_breakdown(rows)
    assert "course-server-in-process" in table and "15.00" in table and "detokenize" in table
    path = plot_breakdown(rows, provenance(tiny))
    assert path.exists() and path.stat().st_size > 10_000


def test_prometheus_samples_keep_their_labels_and_read_metrics_sums_over_them():
    samples = metric_samples(PAGE + 'infer:quoted_total{model_name="say \\"hi\\""} 1.0\n')
    assert ("infer:engine_phase_seconds_total", {"model_name": "tiny", "phase": "sample"}, 0.4) in samples
    assert samples[-1][1] == {"model_name": 'say \\"hi\\"'}, "a quoted label value must not end the label early"
    assert read_metrics(PAGE)["infer:engine_phase_seconds_total"] == pytest.approx(0.2 + 3.0 + 0.4 + 0.2)
