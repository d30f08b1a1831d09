"""`python -m infer.serve` (`make serve`): the course engine behind its OpenAI-compatible API, in
the foreground, on 127.0.0.1, with this machine's profile and model."""

import argparse

import uvicorn

from infer.engine.attention_backends import DECODE_ATTENTION
from infer.models import load_model
from infer.profiles import pick_profile
from infer.serve.app import build_app
from infer.serve.server import LOOPBACK, EngineSettings, build_served


def main(argv: list[str] | None = None) -> None:
    defaults = EngineSettings()
    parser = argparse.ArgumentParser(prog="python -m infer.serve", description=__doc__)
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--profile", default=None, help="cpu or gpu (default: picked from the hardware)")
    parser.add_argument("--model", default=None, help="a model of infer.models (default: the profile's)")
    parser.add_argument("--weights", default="auto", choices=("auto", "pretrained", "random"))
    parser.add_argument("--policy", default=defaults.policy)
    parser.add_argument("--max-num-seqs", type=int, default=defaults.max_num_seqs)
    parser.add_argument("--max-num-batched-tokens", type=int, default=defaults.max_num_batched_tokens)
    parser.add_argument("--max-model-len", type=int, default=defaults.max_model_len)
    parser.add_argument("--kv-store", default=defaults.kv_store, choices=("slots", "paged"))
    parser.add_argument("--num-kv-blocks", type=int, default=defaults.num_kv_blocks)
    parser.add_argument("--block-size", type=int, default=defaults.block_size)
    parser.add_argument("--enable-prefix-caching", action="store_true")
    parser.add_argument(
        "--engine-in-process", action="store_true", help="run the engine in a thread of the server's process"
    )
    parser.add_argument("--engine-threads", type=int, default=None, help="torch threads of the engine core")
    parser.add_argument(
        "--decode-attention",
        default=defaults.decode_attention,
        choices=DECODE_ATTENTION,
        help="the attention kernels (default: the fastest this machine has)",
    )
    parser.add_argument("--cuda-graphs", action="store_true", help="replay decode steps from CUDA graphs (a GPU)")
    parser.add_argument(
        "--packed-linears", action="store_true", help="linear layers on weights packed once for oneDNN (a CPU)"
    )
    args = parser.parse_args(argv)

    lm = load_model(args.model, profile=pick_profile(args.profile), weights=args.weights)
    settings = EngineSettings(
        args.policy,
        args.max_num_seqs,
        args.max_num_batched_tokens,
        args.max_model_len,
        args.kv_store,
        args.num_kv_blocks,
        args.block_size,
        args.enable_prefix_caching,
        engine_process=not args.engine_in_process,
        engine_threads=args.engine_threads,
        decode_attention=args.decode_attention,
        cuda_graphs=args.cuda_graphs,
        packed_linears=args.packed_linears,
    )
    served = build_served(lm, settings)
    if settings.engine_process:  # the line side_by_side reads from the log: where the model computes
        print(f"engine core: process {served.engine.process.pid}, {served.engine.num_threads} torch thread(s)")
    else:
        print(f"engine: {served.engine.engine.startup_line}")
    url = f"http://{LOOPBACK}:{args.port}/v1"
    print(
        f"Serving {served.model_name} ({settings.policy} policy, engine "
        f"{'in its own process' if settings.engine_process else 'in a thread'}) at {url}  (OpenAI-compatible; also "
        f"http://{LOOPBACK}:{args.port}/metrics and /health). Try:\n"
        f"  curl {url}/completions -H 'Content-Type: application/json' "
        f'-d \'{{"model": "{served.model_name}", "prompt": "Hello", "max_tokens": 8}}\'',
        flush=True,
    )
    try:
        uvicorn.run(build_app(served), host=LOOPBACK, port=args.port, log_level="warning")
    finally:
        served.engine.stop()


if __name__ == "__main__":
    main()
