"""Where the course's own folders are: the repository, and the venv that holds vLLM.

vLLM pins an older `transformers` than the course needs, so `make vllm` installs it into a venv
of its own beside the course's `.venv`; the course runs its interpreter as a separate process."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
VLLM_VENV = REPO_ROOT / ".venv-vllm"
