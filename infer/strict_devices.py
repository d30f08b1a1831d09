"""Strict devices: a test mode that fails where the course would put a tensor on the wrong device.

On a GPU, a prompt left on the CPU stops the first forward pass ("Expected all tensors to be on
the same device"). On `gpu-dryrun`, the gpu profile's CPU stand-in, every tensor lives on the CPU,
so the same bug passes unseen. With INFER_STRICT_DEVICES=1 in the environment (the gpu-dryrun
notebook runs set it for every kernel), importing `infer` switches on `StrictDevices`, a
TorchFunctionMode that sees every torch call of the main thread and enforces three rules, with the
profile's device standing for the accelerator even when it is the CPU:

1. A factory (torch.zeros, arange, tensor, randn, ...) called from the course's own code (infer/
   and notebook cells; torch, transformers and other libraries are left alone) says where its
   tensor goes: `device=`, or a `with torch.device(...)` block. Without one the tensor lands on
   the default device, the CPU, whatever the profile.
2. A seeded draw on the host (a course factory given a CPU `generator=`, as random_prompt_ids and
   the labs' checks draw their inputs) stays a host tensor until `.to(device)` moves it; one that
   meets the model's weights (an nn.Parameter on the accelerator) in an op fails, as it would on a
   GPU. This rule is what makes the mode mean something on a CPU, where rule 3 cannot fire.
3. No op mixes tensors of two devices, except where torch itself allows it (CPU scalars, index
   tensors, copies).

Not covered: code in other threads (the server's engine when it runs in a thread; its engine-core
process imports this library, so the mode starts there too), and host tensors made some other way
than a seeded draw (those are caught on a real GPU only)."""

import linecache
import sys
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

from infer.paths import REPO_ROOT
from infer.profiles import pick_profile

FACTORIES = frozenset(
    {
        torch.tensor,
        torch.as_tensor,
        torch.zeros,
        torch.ones,
        torch.empty,
        torch.full,
        torch.arange,
        torch.linspace,
        torch.logspace,
        torch.eye,
        torch.randn,
        torch.rand,
        torch.randint,
        torch.randperm,
        torch.empty_strided,
    }
)
# Ops that torch runs across devices itself: moves and copies, and indexing with host index tensors.
MIXING_ALLOWED = frozenset({torch.Tensor.to, torch.Tensor.copy_, torch.Tensor.__getitem__, torch.Tensor.__setitem__})
MOVES = frozenset({torch.Tensor.to, torch.Tensor.cuda})

TORCH_DIR = str(Path(torch.__file__).parent)
COURSE_DIR = str(REPO_ROOT / "infer")
HOST_MARK = "_infer_host_draw"  # set on a tensor drawn on the host, until it is moved


class StrictDeviceError(RuntimeError):
    """A tensor made without a device, or two devices in one op, in the course's code."""


def is_course_code(filename: str) -> bool:
    """The course's library (except this file) and notebook cells (ipykernel compiles each cell
    into a file under a folder named ipykernel_<pid>)."""
    if filename == __file__:
        return False
    return filename.startswith(COURSE_DIR) or "/ipykernel_" in filename or filename.startswith("<ipython-input")


class StrictDevices(TorchFunctionMode):
    """The mode itself: `with StrictDevices("cuda"): ...`, or `enable()` for a whole kernel."""

    def __init__(self, accelerator: str | torch.device, course_code=is_course_code):
        super().__init__()
        self.accelerator = torch.device(accelerator)
        self.course_code = course_code

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in FACTORIES:
            return self._factory(func, args, kwargs)
        tensors = _tensors(args, kwargs)
        if len(tensors) > 1 and func not in MIXING_ALLOWED:
            self._check_devices(func, tensors)
            self._check_host_meets_weights(func, tensors)
        result = func(*args, **kwargs)
        if any(getattr(t, HOST_MARK, False) for t in tensors):
            _set_host_mark(result, not (func in MOVES and _names_a_device(func, args, kwargs)))
        return result

    def _factory(self, func, args, kwargs):
        caller = _caller()
        from_course = self.course_code(caller.f_code.co_filename)
        copies_a_tensor = func is torch.as_tensor and args and isinstance(args[0], torch.Tensor)
        if from_course and kwargs.get("device") is None and not copies_a_tensor:
            self._no_device(func, caller)
        result = func(*args, **kwargs)
        generator = kwargs.get("generator")
        if from_course and generator is not None and generator.device.type == "cpu":
            _set_host_mark(result, True)
        return result

    def _no_device(self, func, caller) -> None:
        raise StrictDeviceError(
            f"torch.{func.__name__}() without device= at {_where(caller)}: the tensor lands on the CPU whatever the "
            f"profile's device ({self.accelerator}); pass device= (the model's, e.g. lm.device, or "
            f"device='cpu' for data meant to stay on the host)"
        )

    def _check_devices(self, func, tensors):
        devices = {t.device for t in tensors if not (t.device.type == "cpu" and t.dim() == 0)}  # CPU scalars mix
        if len(devices) > 1:
            raise StrictDeviceError(
                f"{_name(func)} mixes tensors on {', '.join(sorted(map(str, devices)))} "
                f"(called from {_where(_course_caller(self.course_code))}): move them to one "
                f"device first"
            )

    def _check_host_meets_weights(self, func, tensors):
        host = [t for t in tensors if getattr(t, HOST_MARK, False) and t.dim() > 0]
        weights = [t for t in tensors if isinstance(t, torch.nn.Parameter) and t.device == self.accelerator]
        if host and weights:
            raise StrictDeviceError(
                f"{_name(func)} feeds a tensor drawn on the host (shape {tuple(host[0].shape)}, e.g. from "
                f"random_prompt_ids) to the model's weights on the accelerator (called from "
                f"{_where(_course_caller(self.course_code))}): on a GPU this fails; move it with .to(lm.device) first"
            )


def enable(accelerator: str | torch.device) -> StrictDevices:
    """Switch the mode on for the rest of this thread (a notebook kernel's main thread)."""
    mode = StrictDevices(accelerator)
    mode.__enter__()
    return mode


def enable_for_profile() -> StrictDevices:
    """`enable()` with this machine's profile's device as the accelerator (`import infer` calls it
    when $INFER_STRICT_DEVICES is 1)."""
    return enable(pick_profile().device)


def _tensors(args, kwargs) -> list[torch.Tensor]:
    """The tensor arguments of one call, including those inside a list or tuple (torch.cat's)."""
    found = []
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found.extend(item for item in value if isinstance(item, torch.Tensor))
    return found


def _names_a_device(func, args, kwargs) -> bool:
    """Whether a .to()/.cuda() call says where to go (not only a dtype)."""
    if func is torch.Tensor.cuda or "device" in kwargs:
        return True
    return any(isinstance(a, (str, torch.device, torch.Tensor)) for a in args[1:])


def _set_host_mark(result, host: bool) -> None:
    for value in result if isinstance(result, (list, tuple)) else (result,):
        if isinstance(value, torch.Tensor):
            if host:
                setattr(value, HOST_MARK, True)
            elif getattr(value, HOST_MARK, False):
                delattr(value, HOST_MARK)


def _caller():
    """The frame that called into torch (the first one outside torch's own package)."""
    frame = sys._getframe(2)
    while frame.f_back is not None and (
        frame.f_code.co_filename.startswith(TORCH_DIR) or frame.f_code.co_filename == __file__
    ):
        frame = frame.f_back
    return frame


def _course_caller(course_code):
    """The innermost frame of the course's own code on the stack (the line to fix), else the caller."""
    frame = _caller()
    while frame is not None and not course_code(frame.f_code.co_filename):
        frame = frame.f_back
    return frame or _caller()


def _where(frame) -> str:
    """Where a frame stands, with its source line: "infer/generate.py:54 `...`", "a notebook cell, line 7 `...`"."""
    filename = frame.f_code.co_filename
    if "/ipykernel_" in filename:
        place = f"a notebook cell, line {frame.f_lineno}"
    else:
        shown = Path(filename).relative_to(REPO_ROOT) if filename.startswith(str(REPO_ROOT)) else filename
        place = f"{shown}:{frame.f_lineno}"
    source = linecache.getline(filename, frame.f_lineno).strip()
    return place + (f" `{source}`" if source else "")


def _name(func) -> str:
    return getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func))
