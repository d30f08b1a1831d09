"""The course's serving engine (weeks 05-08), one short file per job, in nano-vllm's shape:

- sequence.py: a request's sampling parameters, state and outputs;
- scheduler.py: the waiting and running queues, the policies (static, continuous, chunked), preemption;
- kv_store.py: where running sequences keep their keys and values (blocks and block tables), behind
  the interface the scheduler asks every step;
- model_runner.py: one step's work as one flat forward pass, logits for sampling rows only;
- sampler.py: greedy, temperature, top-k and top-p, with per-request seeded generators;
- speculation.py: speculative decoding (week 10): proposers (n-gram lookup, a draft model), and the
  verification of their guesses inside the step's one forward;
- engine.py: the loop (schedule -> run -> update) and the public API;
- step_record.py: what each step ran (kept with `log_steps=True`), and its shape;
- clock.py: the wall clock, or the simulator's virtual one;
- replay.py: requests arriving on a schedule, served step by step, as week 03 RequestRecords;
- step_costs.py, simulator.py: what a step costs, and the engine with a cost model in place of the model
  (`run_trace`: the same with a clock that counts steps).
"""

from infer.engine.engine import Engine
from infer.engine.sequence import CompletionResult, RequestOutput, SamplingParams
from infer.engine.speculation import SpeculativeConfig
from infer.engine.step_record import StepRecord

__all__ = ["Engine", "SamplingParams", "RequestOutput", "CompletionResult", "SpeculativeConfig", "StepRecord"]
