"""Week 07: the course engine behind an OpenAI-compatible API, and one client for every server.

- protocol.py: the request fields, their checks, and the shapes of replies, chunks and errors;
- engine_client.py: what the app sees of the engine (add, abort, alive, stats), wherever it runs;
- engine_core.py: the engine core in a process of its own, over a pipe (the default, as vLLM V1);
- engine_thread.py: the engine loop in a background thread of the server's process instead;
- settings.py: the engine's limits and where it runs;
- app.py: the FastAPI endpoints (/v1/completions, /v1/chat/completions, /v1/models, /health, /metrics);
- detokenize.py, chat.py: streamed text from token ids; the chat template;
- metrics.py: the server-side view in Prometheus text, and a sampler that reads it over time;
- server.py: a running server, in a thread or in a process of its own (`python -m infer.serve`);
- client.py: `vllm bench serve`'s workload and timing, for any OpenAI-compatible server;
- export.py: the course's model as a folder vLLM can serve;
- vllm_server.py, vllm_bench.py: vLLM's server and benchmark client from `.venv-vllm`, and the commands that
  run week 03's grid against its CUDA server;
"""
