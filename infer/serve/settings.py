"""The engine behind a server: its limits (vLLM's flags of the same names), where it runs, and
how it is built from a model."""

from dataclasses import dataclass

from infer.cpu_linear import pack_linears
from infer.engine import Engine
from infer.engine.speculation import SpeculativeConfig


@dataclass(frozen=True)
class EngineSettings:
    policy: str = "chunked"  # as vLLM V1: running requests in arrival order, then new prompts chunked into the rest
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 2048
    max_model_len: int = 2048
    kv_store: str = "slots"  # or "paged" (week 08), with the three settings below
    num_kv_blocks: int | None = None  # None: as much memory as the slots would take
    block_size: int = 16
    enable_prefix_caching: bool = False
    speculative: SpeculativeConfig | None = None  # speculative decoding (week 10), vLLM's --speculative-config
    # As vLLM V1: the engine core in a process of its own, so the HTTP front end never holds the
    # engine's interpreter. False: the engine in a thread of the server's process (week 07 compares).
    engine_process: bool = True
    engine_threads: int | None = None  # torch threads of the engine core process; None: this process's, less one
    decode_attention: str = "auto"  # the attention kernels (infer.engine.attention_backends)
    # decode steps replayed from CUDA graphs (infer.engine.cuda_graphs; a CUDA device). Off until a
    # GPU has measured it: make gpu-check's fast-path phase compares the two
    cuda_graphs: bool = False
    # linear layers on weights packed once for oneDNN (infer.cpu_linear; float32 on a CPU): paid on
    # Qwen2.5-0.5B's shapes, not on the tiny model's (results/09_packed_linear_cpu.json)
    packed_linears: bool = False


def make_engine(model, settings: EngineSettings) -> Engine:
    """The engine `settings` describe, on `model` (whose linear layers are packed first, in this
    process, if the settings ask: a packed weight cannot cross to another process)."""
    if settings.packed_linears:
        pack_linears(model)
    return Engine(
        model,
        policy=settings.policy,
        max_num_seqs=settings.max_num_seqs,
        max_num_batched_tokens=settings.max_num_batched_tokens,
        max_model_len=settings.max_model_len,
        kv_store=settings.kv_store,
        num_kv_blocks=settings.num_kv_blocks,
        block_size=settings.block_size,
        enable_prefix_caching=settings.enable_prefix_caching,
        speculative=settings.speculative,
        decode_attention=settings.decode_attention,
        cuda_graphs=settings.cuda_graphs,
        on_step_error="fail_requests",  # one request's failure must not stop the server
    )
