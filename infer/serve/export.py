"""The course's model as a folder that any server can load: vLLM reads weights and tokenizer from
a local path, so both servers of week 07 serve the very same random weights.

The folder is what `save_pretrained` writes for the model and for the course's byte-level
tokenizer (with the plain chat template of chat.py when it has none). It is rebuilt only when
missing: the weights are a function of (model name, seed), so a folder written once stays right."""

import os
from pathlib import Path

from infer.models import LoadedModel
from infer.paths import REPO_ROOT
from infer.serve.chat import with_chat_template

EXPORT_ROOT_ENV_VAR = "INFER_EXPORT_DIR"


def export_root() -> Path:
    """$INFER_EXPORT_DIR, else _build/models in the repository (ignored by git)."""
    return Path(os.environ.get(EXPORT_ROOT_ENV_VAR) or REPO_ROOT / "_build" / "models")


def export_folder(lm: LoadedModel, seed: int = 0) -> Path:
    return export_root() / f"{lm.name}-{lm.weights}-seed{seed}"


def export_model(lm: LoadedModel, seed: int = 0) -> Path:
    """Save `lm` (model + tokenizer) for a server to load, and return the folder.

    `seed` names the folder: pass the seed the random weights were drawn with."""
    folder = export_folder(lm, seed)
    if (folder / "config.json").exists() and (folder / "tokenizer.json").exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    lm.model.save_pretrained(folder)
    with_chat_template(lm.tokenizer).save_pretrained(folder)  # vLLM then builds the same chat prompts
    return folder
