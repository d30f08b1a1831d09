"""The course's serving engine (weeks 05-08), one short file per job:

- sequence.py: a request's sampling parameters, state and outputs;
- scheduler.py: the waiting and running queues and the policies (static, continuous);
- kv_store.py: the KV cache slots behind the interface a paged store implements later;
- model_runner.py: one step's work as one flat forward pass, logits for sampling rows only;
- sampler.py: greedy, temperature, top-k and top-p, with per-request seeded generators;
- engine.py: the loop (schedule -> run -> update) and the public API;
- replay.py: requests arriving on a schedule, in real time, as week 03 RequestRecords;
- trace.py: the scheduler over a scripted trace without a model (steps and slots only);
- batching_study.py: week 05's experiments (static vs continuous, the concurrency sweep), sized per profile;
- bench.py: the engine against `transformers`' batchers (`python -m infer.experiments.engine_bench`).
"""

from infer.engine.engine import Engine, StepRecord
from infer.engine.sequence import CompletionResult, RequestOutput, SamplingParams

__all__ = ["Engine", "SamplingParams", "RequestOutput", "CompletionResult", "StepRecord"]
