"""Triton kernels on a CPU: Triton's interpreter (TRITON_INTERPRET=1, read when triton is
imported) runs them with NumPy, in a fresh Python so that the variable takes effect."""

import os
import subprocess
import sys

from tests.notebook_files import REPO_ROOT


def triton_importable() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def run_in_interpreter(code: str, timeout_s: float = 300) -> None:
    """Run `code` with TRITON_INTERPRET=1 in a fresh Python; fail with its stderr if it fails."""
    run = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=os.environ | {"TRITON_INTERPRET": "1"},
    )
    assert run.returncode == 0, run.stderr[-3000:]
