"""The oracle: greedy output of the live engine equals Hugging Face transformers token for token,
on random-weight tiny checkpoints of every family, also under preemption (swap and recompute),
prefix-cache hits and copy-on-write forks (n > 1)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
import transformers

from kvrl import plugins
from kvrl.engine.config import EngineConfig
from kvrl.engine.engine import Engine
from kvrl.engine.request import Request
from kvrl.executors.live import LiveExecutor
from kvrl.model import load_model, make_random_checkpoint

FAMILIES = ["llama", "qwen2", "qwen3", "mistral"]


@pytest.fixture(scope="module", params=FAMILIES)
def checkpoint(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    make_random_checkpoint(path, family=request.param, preset="tiny", seed=1)
    return path


def hf_greedy(path, prompts, max_new_tokens):
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    outs = []
    for p in prompts:
        ids = torch.tensor([list(p)])
        with torch.no_grad():
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=max_new_tokens, pad_token_id=0)
        outs.append(gen[0, len(p):].tolist())
    return outs


def live_engine(path, num_blocks=256, block_size=4, num_cpu_blocks=256, eviction="lifo", mode="recompute",
                prefix_cache="hash_lru", watermark=0.0, budget=64, piecewise_sizes=(), step_graph_max_tokens=0):
    model, config = load_model(path, dtype=torch.float32, device="cpu")
    ex = LiveExecutor(model, config, torch.device("cpu"), torch.float32, piecewise=bool(piecewise_sizes),
                      piecewise_sizes=piecewise_sizes or (1,), step_graphs=bool(step_graph_max_tokens),
                      step_graph_max_tokens=step_graph_max_tokens or 2048)
    cfg = EngineConfig(num_blocks=num_blocks, block_size=block_size, num_cpu_blocks=num_cpu_blocks,
                       max_num_batched_tokens=budget, max_model_len=512)
    return Engine(cfg, ex, plugins.create("scheduler", "fcfs"), plugins.create("watermark", "fixed", fraction=watermark),
                  plugins.create("eviction", eviction, mode=mode), plugins.create("prefix_cache", prefix_cache))


def prompts_of(lengths, seed=0, vocab=512):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, n, dtype=np.int32) for n in lengths]


def run_live(engine, prompts, output_len, n=1):
    reqs = [Request(f"r{i}", 0.0, p, output_len, n=n) for i, p in enumerate(prompts)]
    summary = engine.run(reqs)
    assert summary["finished"] == len(reqs), summary
    return [engine.outputs(r.request_id) for r in reqs], summary


def test_batched_prompts_of_different_lengths_match_transformers(checkpoint):
    prompts = prompts_of([5, 17, 33, 8, 50])
    expected = hf_greedy(checkpoint, prompts, 12)
    outs, _ = run_live(live_engine(checkpoint, budget=40), prompts, 12)   # budget 40: chunked prefill
    assert [o[0] for o in outs] == expected


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_preemption_keeps_greedy_output_exact(checkpoint, mode):
    prompts = prompts_of([9, 14, 21, 6, 11, 17], seed=3)
    expected = hf_greedy(checkpoint, prompts, 24)
    engine = live_engine(checkpoint, num_blocks=30, block_size=4, mode=mode, prefix_cache="none")
    outs, summary = run_live(engine, prompts, 24)
    assert summary["preemptions"] > 0
    assert summary["swapped_out_blocks" if mode == "swap" else "recomputed_tokens"] > 0
    assert [o[0] for o in outs] == expected


def test_prefix_cache_hits_keep_greedy_output_exact(checkpoint):
    rng = np.random.default_rng(5)
    system = rng.integers(0, 512, 24, dtype=np.int32)
    prompts = [np.concatenate([system, rng.integers(0, 512, k, dtype=np.int32)]) for k in (3, 7, 1, 12)]
    expected = hf_greedy(checkpoint, prompts, 10)
    engine = live_engine(checkpoint, block_size=4)
    reqs = [Request(f"p{i}", 0.01 * i, p, 10) for i, p in enumerate(prompts)]
    summary = engine.run(reqs)
    assert summary["prefix_hit_rate"] > 0.5
    assert [engine.outputs(r.request_id)[0] for r in reqs] == expected


def test_piecewise_segments_match_transformers(checkpoint):
    """The piecewise-graph path (run eagerly on CPU: the same segment functions, buffers and
    padding as the captured graphs on CUDA): steps of up to 32 tokens are padded to a bucket,
    larger ones (budget 40) run the plain forward; chunked prefill, prefix hits and recompute
    preemption included."""
    rng = np.random.default_rng(11)
    system = rng.integers(0, 512, 16, dtype=np.int32)
    prompts = [np.concatenate([system, p]) for p in prompts_of([3, 19, 9, 30, 5], seed=12)]
    expected = hf_greedy(checkpoint, prompts, 16)
    engine = live_engine(checkpoint, num_blocks=24, block_size=4, budget=40, piecewise_sizes=(4, 8, 16, 32))
    reqs = [Request(f"w{i}", 0.0, p, 16) for i, p in enumerate(prompts)]
    summary = engine.run(reqs)
    assert summary["preemptions"] > 0 and summary["prefix_hit_rate"] > 0
    assert [engine.outputs(r.request_id)[0] for r in reqs] == expected
    assert len(engine.executor._piecewise._segments) >= 2   # buckets that served steps


def test_step_graphs_match_transformers(checkpoint):
    """The whole-step graph path (run eagerly on CPU: the same body, padded buffers and metadata
    as the captured graphs on CUDA): steps with prefill chunks of up to 16 tokens run it, steps of
    17-24 tokens (the budget) run piecewise; chunked prefill, prefix hits, recompute preemption and
    mixed prefill + decode steps included."""
    rng = np.random.default_rng(13)
    system = rng.integers(0, 512, 16, dtype=np.int32)
    prompts = [np.concatenate([system, p]) for p in prompts_of([3, 19, 9, 30, 5, 2], seed=14)]
    expected = hf_greedy(checkpoint, prompts, 16)
    engine = live_engine(checkpoint, num_blocks=24, block_size=4, budget=24, piecewise_sizes=(4, 8, 16, 32),
                         step_graph_max_tokens=16)
    served = []
    run = engine.executor._step_graphs.run
    engine.executor._step_graphs.run = lambda size, order, n_pre: served.append((n_pre, len(order) - n_pre)) or run(size, order, n_pre)
    reqs = [Request(f"g{i}", 0.0, p, 16) for i, p in enumerate(prompts)]   # at once: the steps do not depend on the wall clock
    summary = engine.run(reqs)
    assert summary["preemptions"] > 0 and summary["prefix_hit_rate"] > 0
    assert [engine.outputs(r.request_id)[0] for r in reqs] == expected
    assert any(p and d for p, d in served), served          # mixed prefill + decode steps ran whole-step
    assert len(engine.executor._piecewise._segments) >= 1   # and larger steps piecewise


def test_split_step_graphs_match_transformers(checkpoint):
    """Mixed steps whose decodes want key splits run on the split whole-step graphs (here past a
    ``split_context`` lowered to 256 tokens, so that a tiny model's contexts cross it), and the greedy
    output stays transformers' (the graphs' body run eagerly on CPU, with their split metadata)."""
    prompts = prompts_of([300, 290, 20, 12, 310, 8, 40], seed=21)
    expected = hf_greedy(checkpoint, prompts, 12)
    engine = live_engine(checkpoint, num_blocks=320, block_size=4, budget=64, piecewise_sizes=(16, 32, 64),
                         step_graph_max_tokens=64)
    graphs = engine.executor._step_graphs
    graphs.rule = dataclasses.replace(graphs.rule, split_context=256)
    served = []
    run = graphs.run
    graphs.run = lambda key, order, n_pre: served.append(key) or run(key, order, n_pre)
    reqs = [Request(f"s{i}", 0.0, p, 12) for i, p in enumerate(prompts)]
    summary = engine.run(reqs)
    assert summary["finished"] == len(reqs)
    assert [engine.outputs(r.request_id)[0] for r in reqs] == expected
    assert any(key.split for key in served) and any(not key.split for key in served), served
    assert graphs.split_steps == sum(key.split for key in served)


def test_copy_on_write_forks_keep_greedy_output_exact(checkpoint):
    prompts = prompts_of([10, 7], seed=7)      # partial last blocks: forks write into a shared block
    expected = hf_greedy(checkpoint, prompts, 9)
    outs, _ = run_live(live_engine(checkpoint, block_size=4), prompts, 9, n=3)
    for got, want in zip(outs, expected):
        assert got == [want] * 3


def test_swap_out_then_in_restores_identical_kv(checkpoint):
    engine = live_engine(checkpoint, block_size=4)
    engine.submit(Request("s", 0.0, prompts_of([13])[0], 20))
    for _ in range(3):
        engine.step()
    seq = engine.running[0]
    ex = engine.executor
    before = torch.stack([ex.kv[:, :, b] for b in seq.block_table]).clone()
    from kvrl.engine.batch import ScheduledBatch
    from kvrl.plugins.base import PreemptionMode
    assert engine.preempt(seq.seq_id, "swap") is PreemptionMode.SWAP   # the swap-out runs at once
    ex.kv.normal_()                               # clobber the GPU pool
    back = ScheduledBatch(swap_in=engine.allocator.swap_in(seq))
    ex.execute(back)
    after = torch.stack([ex.kv[:, :, b] for b in seq.block_table])
    used = seq.num_computed
    flat_before = before.permute(1, 2, 0, 3, 4, 5).reshape(*before.shape[1:3], -1, *before.shape[4:])[:, :, :used]
    flat_after = after.permute(1, 2, 0, 3, 4, 5).reshape(*after.shape[1:3], -1, *after.shape[4:])[:, :, :used]
    assert torch.equal(flat_before, flat_after)


@pytest.mark.parametrize("padded", [0, 32])
def test_step_inputs_are_16_byte_aligned(checkpoint, padded):
    """Every attention input the eager / piecewise path uploads starts 16-byte aligned whatever the
    counts of prefills, decodes and block-table width (Triton specialises kernels on pointer
    alignment: an unaligned view compiled new variants in the middle of GPU runs, 0.2-0.7 s each)."""
    from kvrl.profiling.batches import BatchFactory

    model, config = load_model(checkpoint, dtype=torch.float32, device="cpu")
    ex = LiveExecutor(model, config, torch.device("cpu"), torch.float32, piecewise=bool(padded),
                      piecewise_sizes=(32,))
    ex.allocate_kv(64, 0, 4)
    factory = BatchFactory(64, 4, config.vocab_size, 60)
    for pre, dec in (([(3, 0)], [5, 9, 2]), ([(5, 4), (2, 0), (1, 7)], [13]), ([(7, 0)], [])):
        batch = factory.batch(decode_lens=dec, prefills=pre)
        order = [s for s in batch.seqs if not s.is_decode] + [s for s in batch.seqs if s.is_decode]
        ids, pos, meta, rows = ex._prepare(order, len(pre), padded)
        tensors = [meta.slot_mapping, meta.prefill_cu_seqlens_q, meta.prefill_context_lens,
                   meta.prefill_block_tables, meta.decode_context_lens, meta.decode_block_tables, rows]
        assert all(t.storage_offset() * t.element_size() % 16 == 0 for t in tensors), \
            [t.storage_offset() * t.element_size() for t in tensors]
        assert rows.numel() == len(batch.seqs)


def test_step_graph_buffers_are_16_byte_aligned(checkpoint):
    """The whole-step graphs' attention inputs start 16-byte aligned, for every table width."""
    from kvrl.executors.step_graph import StepGraphs, StepKey

    model, config = load_model(checkpoint, dtype=torch.float32, device="cpu")
    for width, prefills, decodes in ((5, 3, 7), (16, 16, 512), (2561, 5, 9)):
        g = StepGraphs(model, [], 4, width, sizes=(16, 512, 1024), max_prefills=prefills, max_decodes=decodes,
                       capture=False)
        for key in (StepKey(1024, False), StepKey(512, True)):
            meta = g._meta(key)
            tensors = [meta.prefill_cu_seqlens_q, meta.prefill_context_lens, meta.prefill_block_tables,
                       meta.decode_context_lens, meta.decode_block_tables, meta.decode_row0, g._rows,
                       *(meta.decode_partials or ())]
            assert all(t.storage_offset() * t.element_size() % 16 == 0 for t in tensors), (width, prefills, decodes)


def test_step_graphs_split_long_decode_contexts_and_leave_long_prefill_contexts_to_piecewise(checkpoint):
    """One key split leaves most SMs idle where a few items attend to a long context. Decodes that
    want splits run on a split graph (up to its tokens and decodes), a short prefill query over a
    long context runs piecewise; short contexts, and long ones with enough items to fill the GPU,
    run on the plain whole-step graph."""
    from kvrl.executors.step_graph import StepGraphs, StepKey
    from kvrl.profiling.batches import BatchFactory

    model, config = load_model(checkpoint, dtype=torch.float32, device="cpu")
    g = StepGraphs(model, [], 16, 1024, sizes=(16, 64, 128, 2048), max_decodes=2048, split_max_tokens=128,
                   split_decodes=8, capture=False)
    factory = BatchFactory(4096, 16, config.vocab_size, 9000)

    def bucket(graphs=g, **spec):
        batch = factory.batch(**spec)
        order = [s for s in batch.seqs if not s.is_decode] + [s for s in batch.seqs if s.is_decode]
        return graphs.bucket(order, sum(not s.is_decode for s in batch.seqs))

    assert g.split_sizes == (16, 64, 128) and g.decode_splits == 8
    assert bucket(decode_lens=[1024] * 32, prefills=[(64, 0)]) == StepKey(128, False)
    assert bucket(decode_lens=[8192] * 4, prefills=[(64, 0)]) == StepKey(128, True)
    assert bucket(decode_lens=[8192] * 9, prefills=[(16, 0)]) is None       # more decodes than the split graphs hold
    assert bucket(decode_lens=[8192] * 4, prefills=[(256, 0)]) is None      # more tokens than the split graphs hold
    assert bucket(prefills=[(64, 4096)]) is None
    assert bucket(prefills=[(64, 1024)]) == StepKey(64, False)
    filling = -(-8 * 132 // config.num_kv_heads)                            # decodes x kv heads fill the GPU
    assert bucket(decode_lens=[8192] * filling, prefills=[(16, 0)]) == StepKey(2048, False)
    assert bucket(prefills=[(8, 0)] * 17) is None                          # more prefill items than captured
    off = StepGraphs(model, [], 16, 1024, sizes=(16, 64, 128), decode_splits=1, capture=False)
    assert off.split_sizes == () and bucket(off, decode_lens=[8192] * 4, prefills=[(64, 0)]) is None
    # below split_context: a split graph where few decodes read long contexts (at least 512 keys, 32 per decode)
    assert bucket(decode_lens=[512] * 4, prefills=[(64, 0)]) == StepKey(128, True)
    assert bucket(decode_lens=[511] * 4, prefills=[(64, 0)]) == StepKey(128, False)
    assert bucket(decode_lens=[100, 600], prefills=[(16, 0)]) == StepKey(64, True)     # the longest decode counts
    assert bucket(decode_lens=[511] * 8 + [512], prefills=[(16, 0)]) == StepKey(64, False)   # 9 decodes > split_decodes
    wide = StepGraphs(model, [], 16, 1024, sizes=(16, 64, 128, 2048), max_decodes=2048, capture=False)
    assert bucket(wide, decode_lens=[2047] * 64, prefills=[(64, 0)]) == StepKey(128, False)   # 32 keys per decode
    assert bucket(wide, decode_lens=[2048] * 64, prefills=[(64, 0)]) == StepKey(128, True)
    assert bucket(wide, decode_lens=[2048] * 64, prefills=[(512, 0)]) == StepKey(2048, False)  # > split_max_tokens
    only_eager = StepGraphs(model, [], 16, 1024, sizes=(16, 64, 128), split_where_pays=False, capture=False)
    assert bucket(only_eager, decode_lens=[1024] * 4, prefills=[(64, 0)]) == StepKey(128, False)   # session 38's rule
    assert bucket(only_eager, decode_lens=[8192] * 4, prefills=[(64, 0)]) == StepKey(128, True)
