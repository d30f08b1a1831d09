"""Profiles: one notebook, two scales. The hardware picks `cpu` or `gpu`; the environment
variable INFER_PROFILE overrides the choice (e.g. to try the cpu profile on a GPU box).

A third profile, `gpu-dryrun`, is never picked by the hardware: it is the gpu profile's stand-in
on a CPU. It keeps what the gpu profile's code paths depend on (bf16, a Qwen2-family model, the
seed's grid structure: two input lengths 1:4, one output length, concurrency doubling up to 32)
and cuts every size so that a 2-core CPU runs each notebook in seconds. CI executes every notebook
under it, so a gpu-profile branch that breaks is caught before a student's first GPU session.
Its timings mean nothing; every header and figure says `profile: gpu-dryrun`.

A fourth, `gpu-check`, is the gpu profile at the sizes of `make gpu-check`, the course's first run
on a GPU, which has 10 minutes for every notebook (infer/course/gpu_plan.py): the same model,
dtype, device and SLOs, with 16-token outputs, concurrency up to 8 and fewer repeats. It is never
picked by the hardware either, and its headers and results say `gpu-check`, not `gpu`."""

import os
from dataclasses import dataclass, replace

import torch

PROFILE_ENV_VAR = "INFER_PROFILE"


def dtype_name(dtype: torch.dtype) -> str:
    """ "bfloat16" for torch.bfloat16: how a dtype is written in headers, tables and results."""
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class BenchmarkGrid:
    """The fixed grid every benchmark of a profile sweeps: exact token counts, never text."""

    input_lens: tuple[int, ...]
    output_lens: tuple[int, ...]
    concurrency: tuple[int, ...]
    num_prompts: int

    def cells(self) -> list[tuple[int, int, int]]:
        """Every (input_len, output_len, concurrency) of the grid, in the order they run."""
        return [(i, o, c) for i in self.input_lens for o in self.output_lens for c in self.concurrency]


@dataclass(frozen=True)
class SLO:
    """Service-level objectives a request must meet to count towards goodput."""

    ttft_ms: float
    tpot_ms: float


@dataclass(frozen=True)
class Profile:
    name: str
    model_name: str  # a key of infer.models.MODEL_SPECS
    dtype: torch.dtype
    device: str
    grid: BenchmarkGrid
    slo: SLO
    reason: str = ""  # why this profile was chosen; filled in by pick_profile()


PROFILES = {
    "cpu": Profile(
        name="cpu",
        model_name="tiny",
        dtype=torch.float32,
        device="cpu",
        grid=BenchmarkGrid(input_lens=(32, 128, 256), output_lens=(16,), concurrency=(1, 2, 4), num_prompts=40),
        slo=SLO(ttft_ms=200.0, tpot_ms=50.0),
    ),
    "gpu": Profile(
        name="gpu",
        model_name="qwen2.5-1.5b",
        dtype=torch.bfloat16,
        device="cuda",
        # The seed's grid: 2048 input / 64 output tokens, concurrency up to 32, 200 prompts.
        grid=BenchmarkGrid(
            input_lens=(512, 2048), output_lens=(64,), concurrency=(1, 2, 4, 8, 16, 32), num_prompts=200
        ),
        slo=SLO(ttft_ms=500.0, tpot_ms=20.0),
    ),
    "gpu-check": Profile(
        name="gpu-check",
        model_name="qwen2.5-1.5b",
        dtype=torch.bfloat16,
        device="cuda",
        # The gpu grid's input lengths, with outputs, concurrency and prompts cut to fit a 10-minute check.
        grid=BenchmarkGrid(input_lens=(512, 2048), output_lens=(16,), concurrency=(1, 4, 8), num_prompts=16),
        slo=SLO(ttft_ms=500.0, tpot_ms=20.0),
    ),
    "gpu-dryrun": Profile(
        name="gpu-dryrun",
        model_name="qwen2-dryrun",  # Qwen2 (biased q/k/v, grouped-query attention, tied embeddings), 0.9M params
        dtype=torch.bfloat16,
        device="cpu",
        # The gpu grid's structure at 1/16 of its lengths, and prompts enough to fill concurrency 32 once.
        grid=BenchmarkGrid(input_lens=(32, 128), output_lens=(4,), concurrency=(1, 2, 4, 8, 16, 32), num_prompts=32),
        slo=SLO(ttft_ms=500.0, tpot_ms=20.0),  # the gpu profile's SLOs, so goodput takes the same path
    ),
}


def pick_profile(override: str | None = None) -> Profile:
    """The profile for this machine: an explicit argument, else $INFER_PROFILE, else the hardware."""
    requested = override or os.environ.get(PROFILE_ENV_VAR)
    if requested:
        if requested not in PROFILES:
            raise ValueError(
                f"Unknown profile {requested!r} (from {'the argument' if override else '$' + PROFILE_ENV_VAR}); "
                f"valid profiles: {', '.join(sorted(PROFILES))}"
            )
        if PROFILES[requested].device == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(
                f"Profile {requested!r} needs a CUDA GPU, and torch sees none "
                f"(INFER_PROFILE=gpu-dryrun runs its code paths on a CPU, at small sizes)."
            )
        return _with_reason(PROFILES[requested], f"requested by {'argument' if override else '$' + PROFILE_ENV_VAR}")
    if torch.cuda.is_available():
        return _with_reason(PROFILES["gpu"], f"CUDA device found: {torch.cuda.get_device_name(0)}")
    return _with_reason(PROFILES["cpu"], "no CUDA device found, so the small CPU model and grid")


def _with_reason(profile: Profile, reason: str) -> Profile:
    return replace(profile, reason=reason)
