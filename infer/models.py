"""Load a model by its course name: pretrained weights when they can be had, otherwise the same
architecture with random weights built from a config that ships with the library.

Speed depends on shapes, not on weight values, so random weights keep every timing meaningful;
only the generated text turns to gibberish. Every load prints one header line saying which."""

import json
import os
import socket
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PretrainedConfig

from infer.profiles import Profile, dtype_name, pick_profile
from infer.tokenizer import byte_level_tokenizer

WEIGHTS_ENV_VAR = "INFER_WEIGHTS"  # the default of load_model(weights=...): make gpu-check sets it
HUB_HOST = "huggingface.co"
COURSE_WEIGHTS = Path(__file__).with_name("weights")  # what infer.experiments.course_weights trained
HUB_PROBE_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class ModelSpec:
    name: str
    hub_id: str | None  # None: the model exists only as a shipped config (random weights)

    def config(self) -> PretrainedConfig:
        raw = json.loads(resources.files("infer.configs").joinpath(f"{self.name}.json").read_text())
        return AutoConfig.for_model(raw.pop("model_type"), **raw)


MODEL_SPECS = {
    spec.name: spec
    for spec in (
        ModelSpec("tiny", None),
        ModelSpec("tiny-draft", None),  # week 10's draft: the tiny model with one layer
        ModelSpec("qwen2.5-0.5b", "Qwen/Qwen2.5-0.5B-Instruct"),
        ModelSpec("qwen2.5-1.5b", "Qwen/Qwen2.5-1.5B-Instruct"),
        ModelSpec("llama-3.2-1b", "meta-llama/Llama-3.2-1B-Instruct"),
        ModelSpec("qwen2-dryrun", None),  # the gpu-dryrun profile's Qwen2-shaped stand-in (see infer.profiles)
    )
}


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object
    name: str
    weights: str  # "pretrained" or "random"
    weights_note: str  # where the weights came from, or why they are random
    dtype: torch.dtype
    device: str
    profile: Profile

    @property
    def config(self) -> PretrainedConfig:
        return self.model.config

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def header(self) -> str:
        return (
            f"device: {describe_device(self.device)} | model: {self.name} ({self.num_parameters / 1e6:.1f}M params) | "
            f"weights: {self.weights} ({self.weights_note}) | dtype: {dtype_name(self.dtype)} | "
            f"profile: {self.profile.name}"
        )


def load_model(
    name: str | None = None,
    profile: Profile | None = None,
    *,
    weights: str | None = None,
    local_path: str | os.PathLike | None = None,
    seed: int = 0,
    quiet: bool = False,
) -> LoadedModel:
    """Load `name` (default: the profile's model) on the profile's device and dtype.

    weights="auto" takes pretrained weights from `local_path`, the local Hugging Face cache or the
    hub (when reachable), and falls back to random weights; "pretrained" insists on them; "random"
    never touches the network; "course" loads the weights the course trained itself on the Python
    standard library (tiny and tiny-draft only, week 10). Default: $INFER_WEIGHTS, else "auto" (so
    that a run of every notebook, such as make gpu-check, chooses its weights once, and no download
    surprises it).
    """
    profile = profile or pick_profile()
    name = name or profile.model_name
    if name not in MODEL_SPECS:
        raise ValueError(f"Unknown model {name!r}; valid names: {', '.join(MODEL_SPECS)}")
    asked_by = "asked for" if weights else f"${WEIGHTS_ENV_VAR} asks for"
    weights = weights or os.environ.get(WEIGHTS_ENV_VAR, "auto")
    if weights not in ("auto", "pretrained", "random", "course"):
        raise ValueError(f"weights must be 'auto', 'pretrained', 'random' or 'course', not {weights!r} ({asked_by} it)")
    spec = MODEL_SPECS[name]

    if weights == "course":
        source, why_not = None, ""
    elif weights == "random":
        source, why_not = None, f"{asked_by} random weights"
    else:
        source, why_not = _pretrained_source(spec, local_path)
    if source is None and weights == "pretrained":
        raise RuntimeError(f"Pretrained weights for {name!r} are not available: {why_not}")

    if weights == "course":
        state = _course_state(name, profile)  # first: a model never trained here is not built for nothing
        model, tokenizer = _random_model(spec, profile, seed)
        model.load_state_dict(state)
        loaded = dict(weights="course", weights_note=f"trained by the course, {COURSE_WEIGHTS / name}.safetensors")
    elif source is not None:
        model = AutoModelForCausalLM.from_pretrained(source, dtype=profile.dtype).to(profile.device)
        tokenizer = AutoTokenizer.from_pretrained(source)
        loaded = dict(weights="pretrained", weights_note=str(source))
    else:
        model, tokenizer = _random_model(spec, profile, seed)
        loaded = dict(weights="random", weights_note=f"seed {seed}; {why_not}; outputs are gibberish")

    result = LoadedModel(
        model=model.eval(),
        tokenizer=tokenizer,
        name=name,
        dtype=profile.dtype,
        device=profile.device,
        profile=profile,
        **loaded,
    )
    if not quiet:
        print(result.header())
    return result


def _random_model(spec: ModelSpec, profile: Profile, seed: int):
    config = spec.config()
    torch.manual_seed(seed)
    with torch.device(profile.device):
        model = AutoModelForCausalLM.from_config(config, dtype=profile.dtype)
    tokenizer = byte_level_tokenizer(
        config.vocab_size, config.bos_token_id, config.eos_token_id, getattr(config, "pad_token_id", None)
    )
    return model, tokenizer


def _course_state(name: str, profile: Profile) -> dict:
    """The weights the course trained for `name` (infer.experiments.course_weights), in the profile's
    dtype and on its device."""
    path = COURSE_WEIGHTS / f"{name}.safetensors"
    if not path.exists():
        raise FileNotFoundError(
            f"the course has trained no weights for {name!r} ({path} is missing): "
            "python -m infer.experiments.course_weights trains them"
        )
    return {key: value.to(profile.device, profile.dtype) for key, value in load_file(path).items()}


def _pretrained_source(spec: ModelSpec, local_path) -> tuple[str | None, str]:
    """Where pretrained weights can be loaded from, or None and the reason they cannot."""
    if local_path is not None:
        if not Path(local_path, "config.json").exists():
            raise FileNotFoundError(f"{local_path} holds no config.json: not a saved model folder")
        return str(local_path), ""
    if spec.hub_id is None:
        return None, f"{spec.name!r} has no pretrained checkpoint"
    if _in_local_hub_cache(spec.hub_id):
        return spec.hub_id, ""
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        return None, "HF_HUB_OFFLINE=1 and not in the local cache"
    if not _hub_reachable():
        return None, f"{HUB_HOST} not reachable within {HUB_PROBE_TIMEOUT_S:.0f} s"
    return spec.hub_id, ""


def _in_local_hub_cache(hub_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(hub_id, "config.json"), str)


def _hub_reachable() -> bool:
    # A plain TCP connect with a short timeout: offline machines answer in seconds, not minutes.
    try:
        socket.create_connection((HUB_HOST, 443), timeout=HUB_PROBE_TIMEOUT_S).close()
        return True
    except OSError:
        return False


def describe_device(device: str, cpu_threads: int | None = None) -> str:
    """The device in a few words; on a CPU with its torch thread count, now or `cpu_threads` if given
    (a measurement that set its own, with infer.timing.cpu_threads)."""
    if device.startswith("cuda"):
        return f"cuda ({torch.cuda.get_device_name(torch.device(device))})"
    threads = torch.get_num_threads() if cpu_threads is None else cpu_threads
    return f"cpu ({threads} thread{'' if threads == 1 else 's'})"
