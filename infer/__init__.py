"""The course library: everything the notebooks of "LLM inference, from a naive generate()
loop to chunked prefill" import. Each module is one topic; start with `profiles` and `models`."""

__version__ = "0.1.0"
