"""Each week's measurement harness, named by what it measures. Each imports the library, the
engine and the server below it; nothing below imports from here.

- prefill_decode.py (week 01): prefill and decode timed apart, the per-token time of the naive loop;
- cache_speed.py (week 02): cached vs uncached generation, the cost of a growing cache;
- sequential_baseline.py (week 03): `transformers`' `generate()` served one request at a time over the grid;
- attention_bench.py (week 04): attention implementations swept over sequence length;
- hf_batching.py, engine_bench.py, engine_bench_plots.py, batching_study.py (week 05): batching policies and
  `transformers`' batchers;
- chunked_prefill.py, chunked_prefill_run.py, chunked_prefill_plots.py (week 06): stalls, token budgets, the simulator;
- side_by_side.py (week 07): the course server, vLLM's server and the sequential baseline, vLLM's client;
- paged_kv.py, prefix_vs_vllm.py (week 08): what a paged KV store saves, lets run and costs (and on a GPU,
  simulated); a shared system prompt served by both servers with prefix caching, vLLM's client;
- rounds.py (weeks 05 and 07): systems compared in interleaved rounds, medians and their range.
"""
