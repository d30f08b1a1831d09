"""`make lab` on a remote GPU instance: no browser, a settable address and port, root allowed
when (and only when) it runs as root, and the URL with its token printed."""

import os
import re
import shutil
import socket
import subprocess
import time
import urllib.request

import pytest

from tests.notebook_files import REPO_ROOT


def _lab_command(**variables: str) -> str:
    """The shell line `make lab` runs to start JupyterLab (make -n prints it without running it)."""
    assignments = [f"{key}={value}" for key, value in variables.items()]
    printed = subprocess.run(
        ["make", "-n", "-o", ".venv/.installed", "lab", *assignments],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    joined = printed.replace("\\\n", " ")  # the recipe continues over two lines
    return next(line for line in joined.splitlines() if "jupyter lab" in line).strip()


def test_lab_listens_where_asked_and_opens_no_browser():
    command = _lab_command(LAB_IP="0.0.0.0", LAB_PORT="9123")
    assert "--no-browser" in command
    assert "--ip=0.0.0.0" in command and "--port=9123" in command


def test_allow_root_only_for_root():
    flag = subprocess.run(
        ["sh", "-c", f"echo {_lab_command().split('jupyter lab', 1)[1]}"], capture_output=True, text=True, check=True
    ).stdout
    assert ("--allow-root" in flag) == (os.geteuid() == 0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _status_within(url: str, seconds: float) -> int | None:
    """The HTTP status of `url`, retried while the server is still coming up."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return urllib.request.urlopen(url, timeout=10).status
        except OSError:
            if time.monotonic() > deadline:
                return None
            time.sleep(0.5)


@pytest.mark.skipif(
    shutil.which("jupyter-lab", path=str(REPO_ROOT / ".venv" / "bin")) is None,
    reason="JupyterLab is not installed in .venv (make lab installs it)",
)
def test_lab_starts_and_prints_a_url_with_its_token(tmp_path):
    port = _free_port()
    env = os.environ | {"JUPYTER_RUNTIME_DIR": str(tmp_path), "JUPYTER_CONFIG_DIR": str(tmp_path)}
    lab = subprocess.Popen(
        ["sh", "-c", f"exec {_lab_command(LAB_IP='127.0.0.1', LAB_PORT=str(port))}"],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        url, deadline = None, time.monotonic() + 120
        while url is None and time.monotonic() < deadline and lab.poll() is None:
            match = re.search(rf"http://127\.0\.0\.1:{port}/lab\?token=\w+", lab.stdout.readline())
            url = match.group(0) if match else None
        assert url, f"JupyterLab printed no URL with a token (exit code {lab.poll()})"
        assert _status_within(url, seconds=30) == 200, f"{url} does not answer"
    finally:
        lab.terminate()
        lab.wait(timeout=30)
