"""The course library: everything the notebooks of "LLM inference, from a naive generate()
loop to chunked prefill" import. Each module is one topic; start with `profiles` and `models`."""

import os

__version__ = "0.1.0"

STRICT_DEVICES_ENV_VAR = "INFER_STRICT_DEVICES"

# A test mode, off unless asked for: the gpu-dryrun notebook runs set it so that a tensor left on
# the wrong device fails on a CPU as it would on a GPU (infer/strict_devices.py). It starts here,
# at the library's first import, before any notebook cell makes a tensor with it.
if os.environ.get(STRICT_DEVICES_ENV_VAR) == "1":
    from infer.strict_devices import enable_for_profile

    enable_for_profile()
