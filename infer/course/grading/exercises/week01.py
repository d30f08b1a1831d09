"""Lab 01 code checks: the naive loop, TTFT/TPOT from timestamps, arithmetic intensity.

The naive-loop check looks at how the tokens were made, not only at the tokens: `transformers`'
own generate() (or any cached loop) gives the same tokens, so the check counts the tokens each
forward pass sees (the whole sequence so far, every step), and asks for one timestamp per token,
each read when its token is ready: after the forward pass that computes it returned, before the
next one began (`ForwardTimes`), so one reading repeated, a reading taken before the forward, or
stamps spread evenly after the loop all fail. On a CUDA GPU it also asks that each timestamp
waits for its token: it keeps the device busy a little longer after every forward pass
(`SlowDevice`), so a loop that reads the clock without synchronizing reads it visibly before the
device is done. On a CPU there is nothing to wait for, so nothing about synchronizing can be
checked there, and nothing is claimed. The check runs on a model it loads itself.

At grading the library code that computes the answers (HIDDEN_AT_GRADING) is not in the student's
kernel; the helpers the lab hands out (GIVEN) are."""

import contextlib
import time

import torch

from infer import hf
from infer.course.grading.checks import Case, Verdict, case_rngs, close_to, grade_function, own_model, same_tokens
from infer.experiments.prefill_decode import token_gaps_ms, ttft_and_tpot_ms
from infer.generate import cached_greedy_generate, naive_greedy_generate
from infer.metrics import calculate_metrics, request_latencies_ms
from infer.prompts import random_prompt_ids
from infer.roofline import matmul_arithmetic_intensity
from infer.timing import synchronize

NAIVE_QID, TTFT_QID, INTENSITY_QID = "01.lab.naive_loop", "01.lab.ttft_tpot", "01.lab.intensity"
NAIVE_NEW_TOKENS = 12
SLOW_DEVICE_MS = 50.0  # extra device time after every forward pass while the timestamps are checked (CUDA)

# What the lab's kernel lacks at grading (see kernel_library): the library code that computes the answers.
HIDDEN_AT_GRADING = (
    hf.greedy_generate,
    naive_greedy_generate,
    cached_greedy_generate,
    ttft_and_tpot_ms,
    token_gaps_ms,
    request_latencies_ms,
    calculate_metrics,
    matmul_arithmetic_intensity,
)
# What the lab hands out on purpose, and allows.
GIVEN = {NAIVE_QID: (hf.forward, synchronize)}


class ForwardLengths:
    """Inside `with ForwardLengths(model) as seen:`, `seen.lengths` lists the sequence length of
    every forward pass of `model` (a transformers causal LM), in order."""

    def __init__(self, model):
        self.model, self.lengths = model, []

    def _record(self, module, args, kwargs):
        ids = args[0] if args else kwargs.get("input_ids")
        if ids is not None:
            self.lengths.append(int(ids.shape[-1]))

    def __enter__(self):
        self.handle = self.model.register_forward_pre_hook(self._record, with_kwargs=True)
        return self

    def __exit__(self, *exc):
        self.handle.remove()
        return False


class ForwardTimes:
    """Inside `with ForwardTimes(model) as times:`, `times.starts` and `times.ends` hold the
    time.perf_counter() reading at the start and at the end of every forward pass of `model`."""

    def __init__(self, model):
        self.model, self.starts, self.ends = model, [], []

    def __enter__(self):
        self.handles = [
            self.model.register_forward_pre_hook(lambda *args: self.starts.append(time.perf_counter())),
            self.model.register_forward_hook(lambda *args: self.ends.append(time.perf_counter())),
        ]
        return self

    def __exit__(self, *exc):
        for handle in self.handles:
            handle.remove()
        return False


def grade_naive_loop(naive_greedy_generate, model=None, prompts: int = 5) -> Verdict:
    """Tokens equal to transformers' greedy generate(); every step runs the whole sequence so far;
    a `timestamps` list gets one perf_counter() time per new token, read when it is ready. `model`
    (default: the check's own) is for the course's tests."""
    model = hf.float32_copy(
        model if model is not None else own_model()
    )  # in bf16, generate() and a naive loop round differently
    device = next(model.parameters()).device
    cases = []
    for rng in case_rngs(NAIVE_QID):
        for _ in range(prompts):
            length = rng.randint(3, 40)
            prompt = random_prompt_ids(model.config, length, seed=rng.randrange(2**31)).to(device)
            cases.append(Case(f"a {length}-token prompt", (model, prompt, NAIVE_NEW_TOKENS)))
    verdict = grade_function(
        NAIVE_QID,
        naive_greedy_generate,
        hf.greedy_generate,
        cases,
        same_tokens,
        "",
    )
    if not verdict.ok:
        return verdict
    return (
        _recompute_verdict(naive_greedy_generate, cases[0])
        or _timestamps_verdict(naive_greedy_generate, cases[0])
        or Verdict(
            NAIVE_QID,
            True,
            f"token-identical to transformers' generate() on {prompts} random prompts "
            f"({NAIVE_NEW_TOKENS} new tokens each, float32), the whole sequence at every "
            f"step, one timestamp per token, read as it is ready",
        )
    )


def _recompute_verdict(fn, case: Case) -> Verdict | None:
    model, prompt, new_tokens = case.args
    with ForwardLengths(model) as seen:
        fn(model, prompt, new_tokens)
    wanted = [prompt.shape[1] + step for step in range(new_tokens)]
    if seen.lengths == wanted:
        return None
    if len(seen.lengths) != new_tokens:
        return Verdict(
            NAIVE_QID,
            False,
            f"on {case.description}, your loop ran {len(seen.lengths)} forward passes for "
            f"{new_tokens} new tokens: the naive loop runs one per new token",
        )
    step = next(i for i, (got, want) in enumerate(zip(seen.lengths, wanted)) if got != want)
    return Verdict(
        NAIVE_QID,
        False,
        f"on {case.description}, step {step} fed the model {seen.lengths[step]} tokens, "
        f"not the {wanted[step]} of the whole sequence so far: the naive loop recomputes "
        f"everything at every step (no KV cache, no model.generate())",
    )


class SlowDevice:
    """Inside `with SlowDevice(model):`, every forward pass of `model` leaves the CUDA device busy
    for SLOW_DEVICE_MS more (a kernel that only waits): a loop that reads the clock without
    synchronizing reads it that long before its token exists."""

    def __init__(self, model):
        self.model = model

    def _keep_busy(self, module, args, output):
        torch.cuda._sleep(self.cycles)

    def __enter__(self):
        self.cycles = _sleep_cycles(SLOW_DEVICE_MS)
        self.handle = self.model.register_forward_hook(self._keep_busy)
        return self

    def __exit__(self, *exc):
        self.handle.remove()
        return False


def _sleep_cycles(ms: float) -> int:
    """The GPU clock cycles that torch.cuda._sleep needs to wait `ms`, measured (clock rates differ);
    0 if the wait cannot be measured, and then nothing is slowed and nothing is claimed."""
    probe_cycles = 10_000_000
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(probe_cycles)
    end.record()
    end.synchronize()
    probe_ms = start.elapsed_time(end)
    return int(probe_cycles * ms / probe_ms) if probe_ms > 0 else 0


def _timestamps_verdict(fn, case: Case) -> Verdict | None:
    model, prompt, new_tokens = case.args
    on_cuda = prompt.device.type == "cuda"
    stamps = []
    before = time.perf_counter()
    with SlowDevice(model) if on_cuda else contextlib.nullcontext(), ForwardTimes(model) as forwards:
        try:
            fn(model, prompt, new_tokens, timestamps=stamps)
        except TypeError as exc:
            return Verdict(
                NAIVE_QID,
                False,
                f"calling it with timestamps=[] raised TypeError ({exc}): keep the `timestamps=None` parameter",
            )
        after = time.perf_counter()
        synchronize(prompt.device)
        device_done = time.perf_counter()
    if not stamps:
        return Verdict(
            NAIVE_QID,
            False,
            "given a `timestamps` list, your loop recorded no time: append "
            "time.perf_counter() each time a new token is ready",
        )
    if len(stamps) != new_tokens:
        return Verdict(
            NAIVE_QID,
            False,
            f"given a `timestamps` list, your loop recorded {len(stamps)} times for "
            f"{new_tokens} new tokens: one per token, when it is ready",
        )
    if not all(isinstance(t, float) and before <= t <= after for t in stamps):
        return Verdict(
            NAIVE_QID,
            False,
            "the recorded timestamps are not time.perf_counter() readings taken during the call, "
            "one as each token becomes ready",
        )
    return _stamp_order_verdict(stamps, forwards) or _device_verdict(on_cuda, device_done, stamps)


def _stamp_order_verdict(stamps: list[float], forwards: ForwardTimes) -> Verdict | None:
    """Each stamp after the forward pass of its token returned, before the next one began."""
    if len(set(stamps)) == 1:
        return Verdict(
            NAIVE_QID,
            False,
            f"all {len(stamps)} timestamps are one and the same reading: read time.perf_counter() "
            "anew for each token, when that token is ready, or TTFT and TPOT time nothing",
        )
    for token, stamp in enumerate(stamps):
        if stamp < forwards.ends[token]:
            return Verdict(
                NAIVE_QID,
                False,
                f"timestamp {token} was read before the forward pass that computes token {token} "
                "had returned: read the clock once the token exists (after its forward pass and "
                "argmax), or the times do not belong to the tokens",
            )
        if token + 1 < len(forwards.starts) and stamp > forwards.starts[token + 1]:
            return Verdict(
                NAIVE_QID,
                False,
                f"timestamp {token} was read after the forward pass of token {token + 1} had "
                "begun: read the clock as each token becomes ready, inside the loop, not afterwards",
            )
    return None


def _device_verdict(on_cuda: bool, device_done: float, stamps: list[float]) -> Verdict | None:
    early_ms = (device_done - stamps[-1]) * 1e3
    if on_cuda and early_ms > SLOW_DEVICE_MS / 2:
        return Verdict(
            NAIVE_QID,
            False,
            f"the last timestamp was taken {early_ms:.0f} ms before the GPU had computed "
            f"that token: CUDA runs work after Python queues it, so synchronize the "
            f"device (infer.timing.synchronize) before time.perf_counter(), or TTFT and "
            f"TPOT time the queueing, not the tokens",
        )
    return None


def check_naive_loop(naive_greedy_generate, model=None, prompts: int = 5) -> None:
    print(grade_naive_loop(naive_greedy_generate, model, prompts).line)


def grade_ttft_tpot(student_ttft_and_tpot_ms, requests: int = 6) -> Verdict:
    qid = TTFT_QID
    cases = []
    for rng in case_rngs(qid):
        for index in range(requests):
            send = rng.uniform(0, 100)
            times = [send + rng.uniform(0.01, 2.0)]
            for _ in range(1 if index == 0 else rng.randint(1, 30)):  # the first: n = 2, the fewest the rule allows
                times.append(times[-1] + rng.uniform(0.001, 0.3))
            cases.append(Case(f"a request sent at {send:.3f} s with {len(times)} tokens", (send, times)))
    return grade_function(
        qid,
        student_ttft_and_tpot_ms,
        ttft_and_tpot_ms,
        cases,
        close_to(1e-6, unit="ms"),
        f"TTFT and TPOT match on {requests} random requests",
    )


def check_ttft_tpot(student_ttft_and_tpot_ms, requests: int = 6) -> None:
    print(grade_ttft_tpot(student_ttft_and_tpot_ms, requests).line)


def grade_intensity(student_intensity, shapes: int = 6) -> Verdict:
    qid = INTENSITY_QID
    cases = [Case("a decode-like matmul m=1, k=n=1536, bf16", (1, 1536, 1536, 2))]
    for rng in case_rngs(qid):
        for _ in range(shapes - 1):
            m, k, n, width = rng.randint(1, 4096), rng.randint(64, 8192), rng.randint(64, 8192), rng.choice([1, 2, 4])
            cases.append(Case(f"m={m}, k={k}, n={n}, {width} bytes per element", (m, k, n, width)))
    return grade_function(
        qid,
        student_intensity,
        matmul_arithmetic_intensity,
        cases,
        close_to(1e-6, unit="FLOP/byte"),
        f"arithmetic intensity matches on {shapes} matmul shapes",
    )


def check_intensity(student_intensity, shapes: int = 6) -> None:
    print(grade_intensity(student_intensity, shapes).line)
