"""The oracle: greedy output of the live engine equals Hugging Face transformers token for token,
on random-weight tiny checkpoints of every family, also under preemption (swap and recompute),
prefix-cache hits and copy-on-write forks (n > 1)."""
from __future__ import annotations

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
                prefix_cache="hash_lru", watermark=0.0, budget=64, piecewise_sizes=()):
    model, config = load_model(path, dtype=torch.float32, device="cpu")
    ex = LiveExecutor(model, config, torch.device("cpu"), torch.float32, piecewise=bool(piecewise_sizes),
                      piecewise_sizes=piecewise_sizes or (1,))
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
        ids, pos, meta, order, rows = ex._prepare(batch, padded)
        tensors = [meta.slot_mapping, meta.prefill_cu_seqlens_q, meta.prefill_context_lens,
                   meta.prefill_block_tables, meta.decode_context_lens, meta.decode_block_tables, rows]
        assert all(t.storage_offset() * t.element_size() % 16 == 0 for t in tensors), \
            [t.storage_offset() * t.element_size() for t in tensors]
        assert len(order) == len(batch.seqs) and rows.numel() == len(batch.seqs)
