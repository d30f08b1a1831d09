"""Decode steps replayed from graphs (infer.engine.cuda_graphs) and the choice of attention
kernels (infer.engine.attention_backends).

On a CPU, `EagerReplay` stands in for a CUDA graph: it runs the captured step again on the same
persistent buffers. That checks everything but the recording itself: which steps replay, how a
batch is padded, that a replay reads nothing but its buffers (a buffer left stale gives other
tokens), and that padding rows write only the spare block. The CUDA tests at the end record real
graphs and run wherever a GPU is."""

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

import infer.engine.model_runner as model_runner
from infer.engine import Engine
from infer.engine.attention_backends import AttentionChoice, choose_attention
from infer.engine.cuda_graphs import DecodeGraphs, EagerReplay, batch_ladder
from infer.model import Transformer
from infer.paged_attention import gather_blocks
from tests.engine_helpers import greedy, single_request_greedy

MAX_MODEL_LEN = 64
PROMPT_LENGTHS = (5, 17, 9, 30, 3, 12, 21)
FIELDS = ("token_ids", "positions", "block_ids", "offsets", "lengths", "tables")


@pytest.fixture(scope="module")
def model(tiny):
    return Transformer.from_hf(tiny.model)


@pytest.fixture(scope="module")
def prompts(model):
    generator = torch.Generator().manual_seed(0)
    vocab = model.arch.vocab_size
    return [torch.randint(0, vocab, (n,), generator=generator).tolist() for n in PROMPT_LENGTHS]


def engine_tokens(model, prompts, max_tokens=12, **settings) -> tuple[list[list[int]], Engine]:
    engine = Engine(model, max_num_seqs=4, max_model_len=MAX_MODEL_LEN, **settings)
    results = engine.generate(prompts, greedy(max_tokens=max_tokens))
    return [r.token_ids for r in results], engine


def test_batch_ladder():
    assert batch_ladder(1) == [1]
    assert batch_ladder(6) == [1, 2, 4, 6]
    assert batch_ladder(32) == [1, 2, 4, 8, 16, 32]
    assert batch_ladder(40) == [1, 2, 4, 8, 16, 32, 40]


@pytest.mark.parametrize(
    "settings",
    [
        dict(kv_store="slots", policy="continuous"),
        dict(kv_store="slots", policy="chunked", max_num_batched_tokens=16),
        dict(kv_store="paged", policy="continuous", block_size=4),
        dict(kv_store="paged", policy="chunked", block_size=4, num_kv_blocks=24, max_num_batched_tokens=16),
    ],
    ids=["slots", "slots-chunked", "paged", "paged-preempting"],
)
def test_replayed_decodes_give_the_eager_engines_tokens(model, prompts, settings):
    eager, _ = engine_tokens(model, prompts, **settings)
    replayed, engine = engine_tokens(model, prompts, cuda_graphs=EagerReplay, **settings)
    assert engine.runner.num_replays > 0, "no decode step replayed a graph"
    assert engine.runner.num_replays < engine.runner.num_forwards, "prefill steps must run eagerly"
    assert replayed == eager, "a replayed decode step changed a token: compare DecodeGraphs._step with PagedKV.for_runs"
    assert replayed[0] == single_request_greedy(model, prompts[0], 12)


@pytest.mark.parametrize("stale", FIELDS)
def test_a_buffer_left_stale_changes_the_tokens(model, prompts, monkeypatch, stale):
    """The identity test above can fail: keep one of the step's inputs from being refilled before
    each replay, and some token changes."""
    fill = DecodeGraphs._fill

    def fill_but_one(self, work):
        old = getattr(self, stale).clone()
        fill(self, work)
        if work:  # the capture's padding fill goes through; every later one leaves `stale` as it was
            getattr(self, stale).copy_(old)

    eager, _ = engine_tokens(model, prompts, kv_store="paged", block_size=4)
    monkeypatch.setattr(DecodeGraphs, "_fill", fill_but_one)
    replayed, _ = engine_tokens(model, prompts, kv_store="paged", block_size=4, cuda_graphs=EagerReplay)
    assert replayed != eager, f"a replay that never refills {stale} gave the same tokens"


def test_padding_rows_write_only_the_spare_block(model, prompts):
    engine = Engine(model, "continuous", max_num_seqs=8, max_model_len=MAX_MODEL_LEN, cuda_graphs=EagerReplay)
    spare = engine.kv_store.num_blocks
    assert engine.kv_store.cache.max_seqs == spare + 1
    engine.generate(prompts[:3], greedy(max_tokens=6))  # 3 sequences: replays of the graph for 4
    keys = engine.kv_store.cache.k[0]
    assert keys[3:spare].abs().sum() == 0, "a padding row wrote into a slot the store hands out"
    assert keys[spare].abs().sum() > 0, "the padding rows should write the spare block"


def test_which_steps_replay(model, prompts):
    engine = Engine(model, "continuous", max_num_seqs=4, max_model_len=MAX_MODEL_LEN, cuda_graphs=EagerReplay)
    graphs = engine.runner.graphs
    assert graphs.sizes == [1, 2, 4]
    engine.add_request(prompts[0], greedy(max_tokens=4))
    prefill = engine.scheduler.schedule()
    assert not graphs.runs(prefill), "a prefill step must not replay"
    engine.scheduler.update(prefill, [[1]])
    decode = engine.scheduler.schedule()
    assert graphs.runs(decode)
    guessing = replace(decode[0], num_tokens=3)
    guessing.seq.spec_token_ids = [5, 6]
    assert guessing.spec_token_ids == [5, 6]
    assert not graphs.runs([guessing]), "a step that verifies guesses must not replay"
    assert not graphs.runs([]), "an empty step has nothing to replay"


def test_cuda_graphs_need_cuda_and_say_so(model):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ValueError, match="CUDA device"):
        Engine(model, max_num_seqs=2, max_model_len=32, cuda_graphs=True)
    with pytest.raises(ValueError, match="graph class"):
        Engine(model, max_num_seqs=2, max_model_len=32, cuda_graphs="yes")


def test_the_startup_line_names_kernels_and_graphs(model):
    assert Engine(model, max_num_seqs=2, max_model_len=32).startup_line == (
        "attention: decode sdpa, prefill sdpa; no CUDA graphs (eager steps)"
    )
    line = Engine(model, max_num_seqs=2, max_model_len=32, cuda_graphs=EagerReplay).startup_line
    assert line.endswith("graphs by EagerReplay for decode steps at batch sizes 1, 2")


# ------------------------------------------------------------ the choice of kernels


def test_auto_takes_sdpa_on_a_cpu(model):
    choice = choose_attention("auto", model, 16)
    assert (choice.decode, choice.prefill, choice.decode_kernel, choice.prefill_kernel) == ("sdpa", "sdpa", None, None)


@pytest.mark.parametrize("name", ["triton", "flash-attn"])
def test_a_gpu_kernel_asked_for_on_a_cpu_says_why_not(model, name):
    with pytest.raises(ValueError, match=f"decode_attention='{name}' cannot run here: .+"):
        choose_attention(name, model, 16)


def test_unknown_kernel_names_the_valid_ones(model):
    with pytest.raises(ValueError, match="'auto', 'sdpa', 'in_place', 'triton', 'flash-attn'"):
        choose_attention("fast", model, 16)


def test_auto_on_a_gpu_passes_over_what_cannot_run(monkeypatch):
    """ "auto" on a GPU takes flash-attn, else triton, else sdpa, and says why it passed one over."""
    import infer.engine.attention_backends as backends

    gpu_model = SimpleNamespace(embed=SimpleNamespace(weight=SimpleNamespace(device=torch.device("cuda"))))
    monkeypatch.setattr(backends, "flash_attn_reason", lambda model, block_size: "not installed")
    monkeypatch.setattr(backends, "triton_reason", lambda model, block_size: None)
    monkeypatch.setattr(backends, "_kernels", lambda name, model, passed_over=(): AttentionChoice(
        name, "sdpa", passed_over=passed_over))  # fmt: skip
    choice = choose_attention("auto", gpu_model, 16)
    assert choice.line == "attention: decode triton, prefill sdpa (flash-attn: not installed)"
    monkeypatch.setattr(backends, "triton_reason", lambda model, block_size: "no triton")
    choice = choose_attention("auto", gpu_model, 16)
    assert choice.line == "attention: decode sdpa, prefill sdpa (flash-attn: not installed; triton: no triton)"


def varlen_reference(
    q, k_cache, v_cache, block_tables, query_starts, key_lengths, max_query, max_key, scale, key_starts
):
    """Every chunk of a step in one call, as flash_attn_varlen_func takes them: chunk i's queries
    are the last of its key_lengths[i] positions (causal, aligned to the bottom right)."""
    out = torch.empty_like(q)
    for i in range(len(key_lengths)):
        rows = slice(int(query_starts[i]), int(query_starts[i + 1]))
        n, end = rows.stop - rows.start, int(key_lengths[i])
        keys = gather_blocks(k_cache, block_tables[i : i + 1].long(), end)[0]
        values = gather_blocks(v_cache, block_tables[i : i + 1].long(), end)[0]
        group = q.shape[1] // keys.shape[0]
        keys, values = keys.repeat_interleave(group, 0), values.repeat_interleave(group, 0)
        mask = torch.ones(n, end, dtype=torch.bool).tril(diagonal=end - n)
        attended = torch.nn.functional.scaled_dot_product_attention(
            q[rows].transpose(0, 1), keys, values, attn_mask=mask, scale=scale
        )
        out[rows] = attended.transpose(0, 1)
    return out


def test_one_call_for_every_prefill_chunk_gives_the_same_tokens(model, prompts, monkeypatch):
    """The layout a varlen prefill kernel gets (infer.paged_attention.PrefillBatch), checked with a
    plain reference of that kernel, on chunks that start at 0 and later, several in one step."""
    settings = dict(kv_store="paged", block_size=4, policy="chunked", max_num_batched_tokens=24)
    eager, _ = engine_tokens(model, prompts, **settings)
    calls = []

    def counted(*args, key_starts):
        calls.append(len(args[4]) - 1)  # query_starts: one more than the chunks
        assert key_starts.tolist() == [0, *args[5].cumsum(0).tolist()]
        return varlen_reference(*args, key_starts)

    choice = AttentionChoice("sdpa", "varlen reference", prefill_kernel=counted)
    monkeypatch.setattr(model_runner, "choose_attention", lambda *args: choice)
    varlen, _ = engine_tokens(model, prompts, **settings)
    assert calls and max(calls) > 1, "no step had two prefill chunks to put in one call"
    assert varlen == eager


# ------------------------------------------------------------ on a GPU

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: CUDA graphs and GPU kernels")


@cuda
@pytest.mark.parametrize("attention", ["sdpa", "triton", "flash-attn"])
@pytest.mark.parametrize("kv_store", ["slots", "paged"])
def test_cuda_graphs_give_the_eager_engines_tokens(tiny, prompts, attention, kv_store):
    """Real graphs, in float32 so that every kernel rounds alike; each attention kernel that can run here."""
    gpu_model = Transformer.from_hf(tiny.model).to("cuda")
    block_size = 256 if attention == "flash-attn" else 16
    if attention == "flash-attn":
        gpu_model = gpu_model.to(torch.bfloat16)
    try:
        choose_attention(attention, gpu_model, block_size)
    except ValueError as error:
        pytest.skip(str(error))
    settings = dict(kv_store=kv_store, block_size=block_size, decode_attention=attention)
    eager, _ = engine_tokens(gpu_model, prompts, max_tokens=24, **settings)
    replayed, engine = engine_tokens(gpu_model, prompts, max_tokens=24, cuda_graphs=True, **settings)
    assert engine.runner.num_replays > 0
    assert replayed == eager


def test_the_fast_path_measurement_runs_and_reports(model):
    """make gpu-check's fast-path phase (infer.experiments.decode_fast_paths), here on the CPU
    stand-in: only sdpa can run, and the replayed engine must keep the eager one's tokens."""
    from infer.experiments.decode_fast_paths import measure, summary_lines

    result = measure(model, batch_sizes=(1, 2), rounds=1, graph_type=EagerReplay, bandwidth=20e9)
    assert result["kernels"] == ["sdpa"]
    assert set(result["unavailable"]) == {"triton", "flash-attn"}
    for case in result["cases"]:
        assert case["graphs_same_tokens_as_eager"] == {"sdpa": True}
        assert case["replayed_steps"]["sdpa graphs"] > 0 and case["replayed_steps"]["sdpa eager"] == 0
        assert 0 < case["hbm_roofline_share"]["sdpa graphs"] < 1
    lines = summary_lines(result)
    assert lines[0] == "fast paths: kernels sdpa"
    assert lines[-1].startswith("  batch 2: sdpa ") and "same tokens" in lines[-1]
