"""infer.experiments.sequential_baseline: the streamer's timestamps, the one-at-a-time server's queue,
the grid runner."""

import re
import time

import pytest
import torch

from infer import hf
from infer.experiments.sequential_baseline import (
    BaselineSizes,
    TokenTimestamps,
    drop_unsupported_percentiles,
    format_runs_table,
    generate_with_timestamps,
    plot_request_timeline,
    prompts_per_cell,
    run_baseline_grid,
    run_sequential_server,
    sample_counts,
    steady_state,
    supported_percentiles,
)
from infer.metrics import calculate_metrics, request_latencies_ms
from infer.profiles import BenchmarkGrid
from infer.prompts import random_prompt_ids
from infer.records import RequestRecord


class FakeModel:
    """Streams `output_len` tokens through generate()'s streamer protocol, `step_s` apart; raises on
    prompt `fail_on`."""

    def __init__(self, step_s=0.002, fail_on=None):
        self.step_s, self.fail_on, self.served = step_s, fail_on, []

    def parameters(self):
        return iter([torch.zeros(1)])

    def generate(self, prompt_ids, attention_mask, generation_config, streamer):
        self.served.append(int(prompt_ids[0, 0]))
        if self.fail_on is not None and int(prompt_ids[0, 0]) == self.fail_on:
            raise RuntimeError("out of memory (pretend)")
        streamer.put(prompt_ids.cpu())  # transformers hands over the prompt first
        new = []
        for k in range(generation_config.max_new_tokens):
            time.sleep(self.step_s)
            token = torch.tensor([k])
            streamer.put(token)
            new.append(token)
        streamer.end()
        return torch.cat([prompt_ids, torch.stack(new, dim=1)], dim=1)


def test_streamer_skips_the_prompt_and_times_each_token(tiny):
    prompt = random_prompt_ids(tiny.config, 12, seed=1)
    tokens, stamps = generate_with_timestamps(tiny.model, prompt, 6)
    assert stamps.prompt_seen and stamps.ended
    assert len(stamps.times) == 6, (
        "transformers' generate() calls put() once with the prompt, then once per new token: expected 6 "
        f"timestamps for 6 new tokens, got {len(stamps.times)}"
    )
    assert stamps.tokens == [1] * 6
    assert stamps.times == sorted(stamps.times)
    assert torch.equal(tokens, hf.greedy_generate(tiny.model, prompt, 6)), "the streamer must not change the tokens"


def test_streamer_put_protocol_directly():
    s = TokenTimestamps()
    s.put(torch.tensor([[5, 6, 7]]))
    s.put(torch.tensor([8]))
    s.put(torch.tensor([9]))
    assert len(s.times) == 2 and s.tokens == [1, 1]


def test_generate_with_timestamps_rejects_a_batch(tiny):
    with pytest.raises(ValueError, match="one request at a time"):
        generate_with_timestamps(tiny.model, random_prompt_ids(tiny.config, 4, batch=2), 2)


def _prompts(n, length=3):
    return torch.arange(n).unsqueeze(1).repeat(1, length)  # row i starts with token i: FakeModel logs the order


def test_concurrency_one_sends_after_each_finish():
    records = run_sequential_server(FakeModel(), _prompts(4), output_len=3, concurrency=1)
    for earlier, later in zip(records, records[1:]):
        assert later.send_time >= earlier.finish_time, (
            "with one request in flight, the next is sent after the last ends"
        )
    assert all(r.success and r.num_output_tokens == 3 for r in records)


def test_concurrency_queues_requests_and_ttft_includes_the_wait():
    # Steps of 20 ms and 5 tokens: a request ahead in line costs 100 ms, far above a token gap plus
    # the scheduling jitter of a loaded machine.
    model = FakeModel(step_s=0.02)
    records = run_sequential_server(model, _prompts(6), output_len=5, concurrency=3)
    assert model.served == list(range(6)), "the server takes requests first come, first served"
    assert len({r.send_time for r in records[:3]}) == 1, "the client sends `concurrency` requests at once"
    ttfts = [request_latencies_ms(r).ttft_ms for r in records[:3]]
    assert ttfts[0] < ttfts[1] < ttfts[2], "requests sent together wait in line: their TTFT grows with the queue"
    tpots = [request_latencies_ms(r).tpot_ms for r in records]
    assert max(tpots) < min(ttfts[1:]), "queueing delays the first token, not the tokens after it"
    # Requests 4-6 are sent when 1-3 finish, so each waits for the two ahead of it.
    assert records[3].send_time == pytest.approx(records[0].finish_time, abs=5e-3)


def test_a_failing_request_is_recorded_and_the_run_goes_on():
    records = run_sequential_server(FakeModel(fail_on=1), _prompts(3), output_len=2, concurrency=2)
    assert [r.success for r in records] == [True, False, True]
    assert "out of memory" in records[1].error and records[1].end_time >= records[1].send_time
    m = calculate_metrics(records)
    assert (m["completed"], m["failed"]) == (2, 1)


def test_concurrency_must_be_positive():
    with pytest.raises(ValueError, match="concurrency"):
        run_sequential_server(FakeModel(), _prompts(2), 2, concurrency=0)


def test_grid_cells_and_prompt_counts():
    grid = BenchmarkGrid(input_lens=(512, 2048), output_lens=(64,), concurrency=(1, 8, 32), num_prompts=200)
    assert grid.cells() == [(512, 64, 1), (512, 64, 8), (512, 64, 32), (2048, 64, 1), (2048, 64, 8), (2048, 64, 32)]
    sizes = BaselineSizes(min_prompts=8, rounds=2, warmup=1)
    assert [prompts_per_cell(grid, sizes, c) for c in (1, 8, 32)] == [8, 16, 64]
    small = BenchmarkGrid(input_lens=(32,), output_lens=(4,), concurrency=(4,), num_prompts=5)
    assert prompts_per_cell(small, sizes, 4) == 5, "never more prompts than the grid has"


def test_baseline_grid_on_the_tiny_model(tiny):
    grid = BenchmarkGrid(input_lens=(8,), output_lens=(3,), concurrency=(1, 2), num_prompts=3)
    runs, records = run_baseline_grid(
        tiny,
        grid,
        sizes=BaselineSizes(min_prompts=3, rounds=1, warmup=1),
        slo_ms={"ttft": 1e6, "tpot": 1e6},
        progress=False,
    )
    assert [(r["input_len"], r["output_len"], r["max_concurrency"]) for r in runs] == [(8, 3, 1), (8, 3, 2)]
    for run in runs:
        assert run["completed"] == 3 and run["failed"] == 0 and run["total_output_tokens"] == 9
        assert run["total_input_tokens"] == 24
        assert run["request_goodput"] == pytest.approx(run["request_throughput"]), "huge SLOs: every request is good"
        assert run["backend"] == "transformers-generate-sequential" and run["request_rate"] == "inf"
        assert "p50_ttft_ms" in run and "p90_ttft_ms" not in run, "3 requests support a p50 only: no tail is saved"
    assert all(len(r.chunk_times) == 3 for r in records[(8, 3, 2)])


def test_steady_state_drops_the_ramp_up_and_times_only_the_measured_work():
    records = run_sequential_server(FakeModel(step_s=0.004), _prompts(7), output_len=3, concurrency=3)
    measured, duration_s = steady_state(records, 3)
    assert measured == records[2:], "the first concurrency - 1 requests (sent together, less queueing) are left out"
    ahead = [sum(earlier.finish_time > r.send_time for earlier in records[:i]) for i, r in enumerate(records)]
    assert ahead == [0, 1, 2, 2, 2, 2, 2], f"requests still being served or queued when each was sent: {ahead}"
    assert duration_s == pytest.approx(records[-1].finish_time - records[1].finish_time), (
        "the duration starts when the server turns to the first measured request"
    )
    alone, alone_duration = steady_state(records, 1)
    assert alone == records and alone_duration == pytest.approx(records[-1].finish_time - records[0].send_time)
    with pytest.raises(ValueError, match="nothing to measure"):
        steady_state(records[:2], 3)


def test_supported_percentiles_need_two_requests_beyond_them():
    assert supported_percentiles(8, (50, 90, 95, 99)) == [50], "8 requests: a p90 or p95 would rest on one request"
    assert supported_percentiles(20, (50, 90, 95, 99)) == [50, 90]
    assert supported_percentiles(40, (50, 90, 95, 99)) == [50, 90, 95]
    assert supported_percentiles(200, (50, 90, 95, 99)) == [50, 90, 95, 99]


def test_the_runs_table_hides_percentiles_that_n_cannot_support(tiny):
    grid = BenchmarkGrid(input_lens=(8,), output_lens=(3,), concurrency=(1,), num_prompts=20)
    runs, _ = run_baseline_grid(tiny, grid, sizes=BaselineSizes(min_prompts=20, rounds=1, warmup=0), progress=False)
    data_line = format_runs_table(runs).splitlines()[1]
    assert " 20 |" in data_line, f"the table must print n beside the percentiles: {data_line}"
    assert data_line.count(" - ") + data_line.rstrip().endswith("-") == 2, (
        f"20 requests support p50 and p90, not p95: one '-' each for TTFT and TPOT, got {data_line}"
    )


def _record(prompt_len, send, ttft_ms, gaps_ms):
    times = [send + ttft_ms / 1e3]
    for gap in gaps_ms:
        times.append(times[-1] + gap / 1e3)
    return RequestRecord(prompt_len, send, chunk_times=times)


def test_saved_runs_keep_only_the_percentiles_their_samples_support():
    """Review F3: every run of results/03_baseline_cpu.json measured 40 requests, yet carried a p99
    TTFT, TPOT and E2EL, which the harness says it does not report (a p99 needs 200)."""
    records = [_record(8, 0.0, 10 + i, [4.0] * 15) for i in range(40)]  # 40 requests of 16 tokens: 600 gaps
    counts = sample_counts(records)
    assert counts == {"ttft": 40, "e2el": 40, "tpot": 40, "itl": 600}, counts
    run = drop_unsupported_percentiles(calculate_metrics(records), counts)
    for metric in ("ttft", "tpot", "e2el"):
        assert f"p95_{metric}_ms" in run, f"40 requests support a p95 {metric.upper()}: keep it"
        assert f"p99_{metric}_ms" not in run, (
            f"a p99 {metric.upper()} of 40 requests rests on less than one request beyond it: leave it out of "
            "the saved run, as the table leaves it out"
        )
        assert f"p50_{metric}_ms" in run and f"mean_{metric}_ms" in run, "p50, mean, median and std always stay"
    assert "p99_itl_ms" in run, "ITL pools 600 gaps: its p99 has 6 beyond it, keep it"
    few = drop_unsupported_percentiles(calculate_metrics(records[:1]), sample_counts(records[:1]))
    assert "p50_ttft_ms" in few and "p90_ttft_ms" not in few, "one request keeps its p50 (the median), no tail"


def test_timeline_label_computes_tpot_from_the_numbers_it_shows():
    """Review F13: the label read "TPOT = (104 - 75) / 7 = 4.0 ms", and 29 / 7 is 4.1."""
    import matplotlib.pyplot as plt

    record = _record(256, 0.0, 75.4, [4.1] * 6 + [3.7])  # TTFT 75.4 ms, E2EL 103.7 ms, 8 tokens
    fig, ax = plt.subplots()
    plot_request_timeline(ax, record)
    labels = [t.get_text() for t in ax.texts if t.get_text().startswith("TPOT")]
    plt.close(fig)
    assert labels, "the timeline must spell out how TPOT is computed"
    found = re.fullmatch(r"TPOT = \(([\d.]+) - ([\d.]+)\) / (\d+) = ([\d.]+) ms", labels[0])
    assert found, f"unexpected TPOT label {labels[0]!r}"
    e2el, ttft, steps, tpot = float(found[1]), float(found[2]), int(found[3]), float(found[4])
    assert steps == 7
    assert abs((e2el - ttft) / steps - tpot) <= 0.05 + 0.1 / steps, (
        f"{labels[0]!r}: ({e2el:g} - {ttft:g}) / {steps} = {(e2el - ttft) / steps:.2f}, not {tpot:g}: show the "
        "terms with enough decimals that a reader's arithmetic gives the TPOT shown"
    )


@pytest.mark.parametrize("name, tail", [("cpu", 95), ("gpu", 90)])
def test_each_profile_measures_enough_requests_for_its_tail_percentile(name, tail):
    from infer.experiments.sequential_baseline import BASELINE_SIZES
    from infer.profiles import PROFILES

    grid = PROFILES[name].grid
    fewest = min(prompts_per_cell(grid, BASELINE_SIZES[name], c) for c in grid.concurrency)
    assert tail in supported_percentiles(fewest, (50, 90, 95, 99)), (
        f"the {name} baseline measures only {fewest} requests in some cell: too few for a p{tail}"
    )
