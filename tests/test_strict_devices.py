"""The strict-devices mode (infer/strict_devices.py), the gpu-dryrun notebooks' stand-in for a GPU's
device checks: it must fail on each of the bugs it exists for, and let correct code through."""

import subprocess
import sys

import pytest
import torch

from infer.prompts import random_prompt_ids
from infer.strict_devices import HOST_MARK, StrictDeviceError, StrictDevices, is_course_code
from tests.notebook_files import REPO_ROOT


def strict(accelerator="cpu"):
    """The mode, with this test file counted as the course's code (as notebook cells are)."""
    return StrictDevices(accelerator, course_code=lambda filename: filename == __file__ or is_course_code(filename))


def test_a_factory_without_a_device_fails_and_says_where():
    with strict(), pytest.raises(StrictDeviceError, match=r"torch.arange\(\) without device=.*test_strict_devices.py"):
        torch.arange(8)


def test_a_factory_with_a_device_passes():
    with strict():
        assert torch.zeros(3, device="cpu").shape == (3,)
        with torch.device("cpu"):  # a device block is a device too (Transformer.from_hf builds inside one)
            torch.ones(2)
        torch.as_tensor(torch.ones(2, device="cpu"))  # no new data, no new device


def test_factories_inside_libraries_are_left_alone():
    with StrictDevices("cpu", course_code=lambda filename: False):
        torch.arange(8)


def test_a_cross_device_op_fails():
    with strict(), pytest.raises(StrictDeviceError, match="mixes tensors on cpu, meta"):
        torch.ones(2, device="cpu") + torch.ones(2, device="meta")


def test_what_torch_allows_across_devices_passes():
    with strict():
        host, other = torch.arange(4, device="cpu"), torch.zeros(4, device="meta")
        other[host]  # index tensors may live on the host
        other * torch.tensor(2.0, device="cpu")  # so may scalars


def test_a_host_prompt_fed_to_weights_on_the_accelerator_fails_on_a_cpu(tiny):
    """The lab 01/02 bug (a prompt from random_prompt_ids without .to(lm.device)), caught with no GPU."""
    with strict(), pytest.raises(StrictDeviceError, match=r"drawn on the host.*\.to\(lm.device\)"):
        prompt = random_prompt_ids(tiny.config, 5)
        tiny.model(prompt[:, 1:])  # a slice of a host draw is still on the host
    with strict():
        tiny.model(random_prompt_ids(tiny.config, 5).to(tiny.device))


def test_import_infer_switches_the_mode_on_when_asked():
    probe = (
        "import torch, infer; from torch.overrides import _get_current_function_mode_stack as stack; "
        "print([type(m).__name__ for m in stack()])"
    )
    env = {"INFER_STRICT_DEVICES": "1", "INFER_PROFILE": "gpu-dryrun", "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.stdout.strip() == "['StrictDevices']", done.stderr[-2000:]


def test_week05_baseline_hands_generate_prompts_on_the_models_device(tiny, monkeypatch):
    """Issue 22, item 9: batching_study.sequential_baseline timed host prompts (no device sync)."""
    from infer.experiments import batching_study

    handed = []

    def serve(model, prompts, output_len, concurrency):
        handed.append(getattr(prompts, HOST_MARK, False))
        raise StopIteration  # one look is enough

    monkeypatch.setattr(batching_study, "run_sequential_server", serve)
    with strict(), pytest.raises(StopIteration):
        batching_study.sequential_baseline(tiny.model, tiny.config, batching_study.STUDY_SIZES["cpu"])
    assert handed == [False], "the prompts were still host tensors: move them with .to(hf_model.device)"


def test_the_mixing_study_synchronizes_its_timings(tiny, monkeypatch):
    """Issue 22, item 9: chunked_prefill timed its steps without device=, so nothing synchronized."""
    from infer.experiments import chunked_prefill
    from infer.model import Transformer
    from infer.timing import benchmark

    devices = []

    def watched(fn, **kwargs):
        devices.append(kwargs.get("device"))
        return benchmark(fn, **kwargs)

    monkeypatch.setattr(chunked_prefill, "benchmark", watched)
    model = Transformer.from_hf(tiny.model)
    chunked_prefill.time_step_kinds(model, num_tokens=4, context=8, repeats=1)
    assert devices and all(d == model.embed.weight.device for d in devices), devices
