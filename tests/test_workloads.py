"""Workloads: exact token counts, and send times drawn as vLLM 0.32's `vllm bench serve` draws them."""

import math

import numpy as np
import pytest

from infer.workloads import Workload, arrival_offsets, mixed_workload


def test_send_times_follow_the_rate_and_burstiness_and_end_at_n_over_rate():
    assert arrival_offsets(5, math.inf) == [0.0] * 5
    assert arrival_offsets(4, 2.0, burstiness=math.inf) == pytest.approx([0.5, 1.0, 1.5, 2.0])
    for burstiness in (0.25, 1.0, 4.0):
        offsets = arrival_offsets(4000, 10.0, burstiness=burstiness, seed=1)
        gaps = np.diff([0.0] + offsets)
        assert offsets[-1] == pytest.approx(400.0), "vLLM rescales the schedule to end at num_requests / rate"
        assert np.all(gaps >= 0) and gaps.mean() == pytest.approx(1 / 10)
        # a gamma with shape k has coefficient of variation 1 / sqrt(k): lower burstiness, burstier
        assert gaps.std() / gaps.mean() == pytest.approx(1 / math.sqrt(burstiness), rel=0.1)


def test_a_seed_gives_one_schedule():
    assert arrival_offsets(50, 8.0, seed=3) == arrival_offsets(50, 8.0, seed=3)
    assert arrival_offsets(50, 8.0, seed=3) != arrival_offsets(50, 8.0, seed=4)
    assert arrival_offsets(3, 1.0, seed=0) == pytest.approx([1.1864, 2.9654, 3.0], abs=1e-3), (
        "the seeded schedule changed: results that quote a seed would no longer be reproducible"
    )


@pytest.mark.parametrize("bad", [{"request_rate": 0}, {"request_rate": 1.0, "burstiness": 0}, {"num_requests": 0}])
def test_bad_schedules_are_refused(bad):
    with pytest.raises(ValueError, match="must be"):
        arrival_offsets(**{"num_requests": 3, "request_rate": 1.0, "burstiness": 1.0, **bad})


def test_a_mixed_workload_has_exact_lengths_in_its_ranges():
    w = mixed_workload("m", vocab_size=100, num_requests=40, prompt_range=(5, 9), output_range=(1, 3), seed=2)
    assert all(5 <= n <= 9 for n in w.prompt_lens) and all(1 <= n <= 3 for n in w.output_lens)
    assert all(0 <= t < 100 for p in w.prompts for t in p) and w.offsets == [0.0] * 40
    assert w.max_model_len == max(p + o for p, o in zip(w.prompt_lens, w.output_lens))
    with pytest.raises(ValueError, match="one of each per request"):
        Workload("bad", [[1]], [1, 2])
