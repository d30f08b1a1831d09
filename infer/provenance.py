"""Where a result came from: device, model, weights, profile, date and versions, in one line.

Every figure and results file carries this line, so nobody mistakes a CPU run with random
weights for a GPU result."""

import datetime
import platform
import subprocess
from pathlib import Path

import torch
import transformers

import infer
from infer.models import LoadedModel, describe_device
from infer.profiles import Profile, dtype_name

REPO_ROOT = Path(__file__).resolve().parent.parent


def versions() -> dict[str, str]:
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "infer": infer.__version__,
    }


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() or "unknown"


def provenance(source: LoadedModel | Profile, kind: str = "measured") -> dict[str, str]:
    """The metadata of a result. `kind` is "measured", or "synthetic"/"simulated" for modelled numbers."""
    if isinstance(source, LoadedModel):
        model_fields = {"model": source.name, "weights": source.weights, "dtype": dtype_name(source.dtype),
                        "profile": source.profile.name, "device": describe_device(source.device)}
    else:
        model_fields = {"model": "-", "weights": "-", "dtype": dtype_name(source.dtype),
                        "profile": source.name, "device": describe_device(source.device)}
    return {"kind": kind, **model_fields, "date": datetime.date.today().isoformat(),
            "commit": git_commit(), **versions()}


def provenance_line(meta: dict[str, str]) -> str:
    versions_text = " ".join(f"{k} {meta[k]}" for k in ("torch", "transformers", "infer") if k in meta)
    return (f"{meta['kind'].upper()} on {meta['device']} | model {meta['model']} ({meta['weights']} weights, "
            f"{meta['dtype']}) | profile {meta['profile']} | {meta['date']} | {versions_text} | commit {meta['commit']}")
