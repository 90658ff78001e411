"""Tests for :mod:`kvrl.kernels`.

1. The plain-torch references against an independent naive dense attention in float64 (K/V
   assembled token by token from the paged cache, GQA by repeating kv heads), in process.
2. The Triton kernels against the references under the Triton CPU interpreter. Because
   ``TRITON_INTERPRET`` must be set before triton is imported, one subprocess runs this file as a
   script (``python tests/test_kernels.py --triton-checks``) with ``TRITON_INTERPRET=1
   KVRL_FORCE_TRITON=1`` and prints one JSON result per case in :data:`TRITON_CASES`. It enables
   torch's deterministic mode, which fills ``torch.empty`` with NaN, so every kernel output and
   split-K partial buffer starts poisoned. bf16 is not checked here: the interpreter's ``tl.dot``
   mishandles bf16, so bf16 is covered by ``benchmarks/bench_kernels.py`` on a GPU.
"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass, field

import pytest
import torch

import kvrl.kernels as K
from kvrl.kernels.reference import (
    copy_blocks_ref,
    paged_decode_attention_ref,
    paged_prefill_attention_ref,
    store_kv_ref,
)


# --------------------------------------------------------------------------------------------
# Inputs and the naive dense attention
# --------------------------------------------------------------------------------------------


@dataclass
class Case:
    """A paged-attention problem. ``q_lens`` None means decode (one query per sequence)."""

    name: str
    num_heads: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    context_lens: list[int]
    q_lens: list[int] | None = None
    dtype: str = "float32"
    tol: float = 1e-4
    # Keyword arguments for the Triton entry point; empty means "call the public API".
    triton_kwargs: dict = field(default_factory=dict)


def make_inputs(case: Case, seed: int = 0):
    """Random cache + block tables for ``case``.

    Block tables take their blocks from a random permutation of the cache (so blocks of one
    sequence are scattered) and are padded with 0 up to a common width with 2 spare columns.
    Returns ``(q, k_cache, v_cache, block_tables, context_lens, cu_seqlens_q)``;
    ``cu_seqlens_q`` is None for decode.
    """
    g = torch.Generator().manual_seed(seed)
    dtype = getattr(torch, case.dtype)
    bs = case.block_size
    needed = [(c + bs - 1) // bs for c in case.context_lens]
    width = max(needed) + 2
    num_blocks = sum(needed) + 3
    k_cache = torch.randn(num_blocks, bs, case.num_kv_heads, case.head_dim, generator=g).to(dtype)
    v_cache = torch.randn(num_blocks, bs, case.num_kv_heads, case.head_dim, generator=g).to(dtype)
    perm = torch.randperm(num_blocks, generator=g).tolist()
    block_tables = torch.zeros(len(needed), width, dtype=torch.int32)
    for i, n in enumerate(needed):
        block_tables[i, :n] = torch.tensor(perm[:n], dtype=torch.int32)
        perm = perm[n:]
    context_lens = torch.tensor(case.context_lens, dtype=torch.int32)
    if case.q_lens is None:
        q = torch.randn(len(needed), case.num_heads, case.head_dim, generator=g).to(dtype)
        return q, k_cache, v_cache, block_tables, context_lens, None
    cu = torch.zeros(len(needed) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(case.q_lens).cumsum(0)
    q = torch.randn(int(cu[-1]), case.num_heads, case.head_dim, generator=g).to(dtype)
    return q, k_cache, v_cache, block_tables, context_lens, cu


def naive_attention(q, k_cache, v_cache, block_tables, context_lens, q_lens, scale):
    """Dense float64 causal attention, sequence by sequence; returns float64 ``q.shape``.

    Sequence ``i`` has queries ``q_lens[i]`` (its last positions) and keys ``0..context_lens[i]-1``
    assembled one token at a time from the cache.
    """
    num_heads = q.shape[1]
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    outs, row = [], 0
    for i, (ctx, q_len) in enumerate(zip(context_lens.tolist(), q_lens)):
        tokens = [(int(block_tables[i, p // block_size]), p % block_size) for p in range(ctx)]
        k = torch.stack([k_cache[b, o] for b, o in tokens]).double()
        v = torch.stack([v_cache[b, o] for b, o in tokens]).double()
        k = k.repeat_interleave(num_heads // num_kv_heads, dim=1)  # [ctx, H, D]
        v = v.repeat_interleave(num_heads // num_kv_heads, dim=1)
        qi = q[row : row + q_len].double()
        scores = torch.einsum("nhd,thd->hnt", qi, k) * scale
        q_pos = torch.arange(ctx - q_len, ctx)
        scores = scores.masked_fill(torch.arange(ctx)[None, :] > q_pos[:, None], float("-inf"))
        outs.append(torch.einsum("hnt,thd->nhd", scores.softmax(-1), v))
        row += q_len
    return torch.cat(outs)


def errors(out: torch.Tensor, ref: torch.Tensor) -> dict:
    """``rel``: ||out-ref|| / ||ref||; ``max_rel``: max |out-ref| / max |ref|; ``finite``: all finite."""
    out64, ref64 = out.double(), ref.double()
    diff = (out64 - ref64).nan_to_num(nan=float("inf"))
    return {
        "rel": float(diff.norm() / ref64.norm()),
        "max_rel": float(diff.abs().max() / ref64.abs().max()),
        "finite": bool(out.isfinite().all()),
    }


def run_attention(case: Case, fn, inputs):
    """Call a decode- or prefill-signature attention function ``fn`` on ``inputs``."""
    q, k_cache, v_cache, block_tables, context_lens, cu = inputs
    scale = case.head_dim**-0.5
    if cu is None:
        return fn(q, k_cache, v_cache, block_tables, context_lens, scale, **case.triton_kwargs)
    return fn(q, k_cache, v_cache, block_tables, cu, context_lens, scale, max(case.q_lens), **case.triton_kwargs)


# --------------------------------------------------------------------------------------------
# Triton cases (run in the interpreter subprocess)
# --------------------------------------------------------------------------------------------

_small = {"block_n": 16}
TRITON_CASES = [
    # decode
    Case("decode_mha_bs16_public_api", 4, 4, 64, 16, [1, 17, 50]),
    Case("decode_gqa4_bs8_splits3", 8, 2, 64, 8, [1, 33, 100, 7], triton_kwargs={"num_splits": 3, **_small}),
    Case("decode_gqa3_d128_bs32_splits5_empty", 6, 2, 128, 32, [65, 1, 130], triton_kwargs={"num_splits": 5, **_small}),
    Case("decode_gqa2_bs16_splits1", 4, 2, 64, 16, [16, 31, 2], triton_kwargs={"num_splits": 1, **_small}),
    Case("decode_gqa2_d48_splits2", 4, 2, 48, 16, [40, 3], triton_kwargs={"num_splits": 2, **_small}),
    Case("decode_gqa2_fp16_splits2", 4, 2, 64, 16, [90, 5], dtype="float16", tol=2e-3,
         triton_kwargs={"num_splits": 2, **_small}),
    # prefill (q_lens given)
    Case("prefill_mha_bs16_full_public_api", 4, 4, 64, 16, [1, 20, 37], q_lens=[1, 20, 37]),
    Case("prefill_gqa2_bs8_cached_prefix", 4, 2, 64, 8, [40, 70, 9], q_lens=[5, 70, 1],
         triton_kwargs={"block_m": 16, "block_n": 16}),
    Case("prefill_gqa3_d128_bs32_chunked", 6, 2, 128, 32, [100, 50, 1], q_lens=[33, 16, 1],
         triton_kwargs={"block_m": 16, "block_n": 16}),
    Case("prefill_gqa2_d48_bs16", 4, 2, 48, 16, [30, 19], q_lens=[30, 3], triton_kwargs={"block_m": 16, "block_n": 16}),
    Case("prefill_gqa2_fp16_bs16", 4, 2, 64, 16, [45, 20], q_lens=[20, 20], dtype="float16", tol=2e-3,
         triton_kwargs={"block_m": 16, "block_n": 16}),
    # key splits: short queries over long cached prefixes; rows that see no key of a split, empty splits
    Case("prefill_gqa2_bs8_splits4_cached", 4, 2, 64, 8, [150, 70, 9], q_lens=[5, 40, 1],
         triton_kwargs={"block_m": 16, "block_n": 16, "num_splits": 4}),
    Case("prefill_gqa3_d128_bs16_splits3", 6, 2, 128, 16, [200, 33], q_lens=[17, 33],
         triton_kwargs={"block_m": 16, "block_n": 16, "num_splits": 3}),
    Case("prefill_gqa2_fp16_splits2", 4, 2, 64, 16, [120, 20], q_lens=[20, 20], dtype="float16", tol=2e-3,
         triton_kwargs={"block_m": 16, "block_n": 16, "num_splits": 2}),
]
CACHE_CHECKS = ["store_kv_fp32_strided", "store_kv_fp16", "copy_blocks_multi_layer", "precompile"]


def _check_store_kv(dtype: torch.dtype) -> dict:
    """Public ``store_kv`` vs the reference on a strided K/V view, with -1 slots; exact match."""
    g = torch.Generator().manual_seed(1)
    num_tokens, kvh, d = 9, 2, 24
    qkv = torch.randn(num_tokens, 3 * kvh * d, generator=g).to(dtype)
    key = qkv[:, : kvh * d].view(num_tokens, kvh, d)
    value = qkv[:, kvh * d : 2 * kvh * d].view(num_tokens, kvh, d)
    k_cache = torch.randn(6, 8, kvh, d, generator=g).to(dtype)
    v_cache = torch.randn(6, 8, kvh, d, generator=g).to(dtype)
    slots = torch.tensor([3, -1, 47, 0, -1, 20, 21, 8, -1])
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    K.store_kv(key, value, k_cache, v_cache, slots)
    store_kv_ref(key, value, k_ref, v_ref, slots)
    return {"exact": torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)}


def _check_copy_blocks() -> dict:
    """Public ``copy_blocks`` over several layers (two dtype/shape groups) vs the reference; exact."""
    g = torch.Generator().manual_seed(2)
    caches = [torch.randn(10, 16, 2, 32, generator=g) for _ in range(4)]
    caches += [torch.randn(10, 8, 1, 24, generator=g).half() for _ in range(2)]
    refs = [c.clone() for c in caches]
    src, dst = torch.tensor([1, 2, 7]), torch.tensor([5, 9, 0])
    K.copy_blocks(caches, src, dst)
    copy_blocks_ref(refs, src, dst)
    return {"exact": all(torch.equal(c, r) for c, r in zip(caches, refs))}


def _check_precompile() -> dict:
    """``precompile_attention`` launches every decode and prefill split count x table width, and
    leaves the caches as they were."""
    from kvrl.kernels.triton_decode import SPLIT_CHOICES, TABLE_WIDTHS
    from kvrl.kernels.triton_prefill import SPLIT_CHOICES as PREFILL_SPLITS

    g = torch.Generator().manual_seed(3)
    k_cache, v_cache = torch.randn(4, 8, 2, 16, generator=g), torch.randn(4, 8, 2, 16, generator=g)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    n = K.precompile_attention(k_cache, v_cache, 4, 0.25)
    return {"exact": n == len(TABLE_WIDTHS) * (len(SPLIT_CHOICES) + len(PREFILL_SPLITS))
            and torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)}


def _step_inputs(dtype: torch.dtype, dec_lens: tuple = (1, 30, 17)):
    """A padded step for :func:`kvrl.kernels.paged_step_attention`: prefills of 5 and 12 query
    rows (contexts 9 and 12), then 3 decodes (contexts ``dec_lens``) from row 17, padded to 24 rows,
    4 prefill and 6 decode entries; and what the separate kernels give on the real rows."""
    g = torch.Generator().manual_seed(4)
    H, KVH, Dh, bs = 4, 2, 32, 8
    dec_blocks = [-(-n // bs) for n in dec_lens]
    num_blocks, W = 4 + sum(dec_blocks) + 4, max(6, *dec_blocks)
    k_cache = torch.randn(num_blocks, bs, KVH, Dh, generator=g).to(dtype)
    v_cache = torch.randn(num_blocks, bs, KVH, Dh, generator=g).to(dtype)
    perm = torch.randperm(num_blocks, generator=g).to(torch.int32)
    q = torch.randn(24, H, Dh, generator=g).to(dtype)
    pre_tab = torch.zeros(4, W, dtype=torch.int32)
    pre_tab[0, :2], pre_tab[1, :2] = perm[0:2], perm[2:4]
    dec_tab = torch.zeros(6, W, dtype=torch.int32)
    used = 4
    for i, n in enumerate(dec_blocks):
        dec_tab[i, :n] = perm[used:used + n]
        used += n
    cu = torch.tensor([0, 5, 17, 17, 17], dtype=torch.int32)
    pre_ctx = torch.tensor([9, 12, 0, 0], dtype=torch.int32)
    dec_ctx = torch.tensor([*dec_lens, 0, 0, 0], dtype=torch.int32)
    row0 = torch.tensor([17], dtype=torch.int32)
    scale = Dh ** -0.5
    ref = torch.cat([paged_prefill_attention_ref(q[:17], k_cache, v_cache, pre_tab[:2], cu[:3], pre_ctx[:2], scale, 12),
                     paged_decode_attention_ref(q[17:20], k_cache, v_cache, dec_tab[:3], dec_ctx[:3], scale)])
    args = (q, k_cache, v_cache, pre_tab, cu, pre_ctx, dec_tab, dec_ctx, row0, scale)
    return args, ref


def check_step_attention(dtype: torch.dtype, splits: int = 1) -> dict:
    """``paged_step_attention`` on a padded step against the separate kernels on the real rows;
    ``untouched``: the padding rows keep what ``out`` held. With ``splits`` > 1 the decodes split
    their keys (contexts 1, 150 and 70: one, several and all of the splits used)."""
    args, ref = _step_inputs(dtype, (1, 30, 17) if splits == 1 else (1, 150, 70))
    out = torch.full_like(args[0], 7.0)
    q = args[0]
    partials = (torch.full((6, q.shape[1], splits, q.shape[2]), float("nan")),
                torch.full((6, q.shape[1], splits), float("nan"))) if splits > 1 else None
    K.paged_step_attention(*args, out=out, decode_splits=splits, decode_partials=partials)
    return {**errors(out[:20], ref), "untouched": bool((out[20:] == 7.0).all())}


def triton_checks_main() -> None:
    """Subprocess entry point: run every Triton check, print ``{name: result}`` as JSON."""
    from kvrl.kernels.triton_decode import paged_decode_attention_triton
    from kvrl.kernels.triton_prefill import paged_prefill_attention_triton

    assert os.environ.get("TRITON_INTERPRET") == "1" and K.use_triton(torch.zeros(1))
    torch.use_deterministic_algorithms(True)  # torch.empty -> NaN: poisons kernel outputs
    results = {}
    for case in TRITON_CASES:
        inputs = make_inputs(case)
        if case.triton_kwargs:
            fn = paged_decode_attention_triton if case.q_lens is None else paged_prefill_attention_triton
        else:
            fn = K.paged_decode_attention if case.q_lens is None else K.paged_prefill_attention
        out = run_attention(case, fn, inputs)
        ref_fn = paged_decode_attention_ref if case.q_lens is None else paged_prefill_attention_ref
        ref = run_attention(Case(**{**asdict(case), "triton_kwargs": {}}), ref_fn, inputs)
        results[case.name] = {**errors(out, ref), "dtype": str(out.dtype), "shape": list(out.shape)}
    results["store_kv_fp32_strided"] = _check_store_kv(torch.float32)
    results["store_kv_fp16"] = _check_store_kv(torch.float16)
    results["copy_blocks_multi_layer"] = _check_copy_blocks()
    results["precompile"] = _check_precompile()
    results["step_attention"] = check_step_attention(torch.float32)
    results["step_attention_split"] = check_step_attention(torch.float32, splits=4)
    # The public API must really have dispatched to the Triton modules.
    results["dispatch"] = {
        "exact": all(f"kvrl.kernels.{m}" in sys.modules for m in ("triton_cache", "triton_decode", "triton_prefill"))
    }
    print(json.dumps(results))


@pytest.fixture(scope="module")
def triton_results() -> dict:
    from tests.helpers import run_triton_checks

    return run_triton_checks(__file__, timeout=900)


@pytest.mark.parametrize("case", TRITON_CASES, ids=lambda c: c.name)
def test_triton_attention_matches_reference(triton_results, case):
    r = triton_results[case.name]
    assert r["finite"], r
    assert r["rel"] < case.tol and r["max_rel"] < 10 * case.tol, r
    assert r["dtype"] == f"torch.{case.dtype}"


@pytest.mark.parametrize("name", CACHE_CHECKS + ["dispatch"])
def test_triton_cache_kernels_exact(triton_results, name):
    assert triton_results[name]["exact"]


def test_triton_step_attention_matches_separate_kernels(triton_results):
    """The captured-step attention (padded prefill entries, decodes from a row offset, decode
    entries of context 0) equals the separate kernels on the real rows, and writes no padding row."""
    r = triton_results["step_attention"]
    assert r["finite"] and r["rel"] < 1e-5 and r["untouched"], r


def test_triton_step_attention_with_decode_key_splits_matches_separate_kernels(triton_results):
    """The split graphs' attention: decodes split their keys 4 ways (a context of one tile, of
    several, of more tiles than splits), merged into the decode rows from the row offset; partials
    start as NaN, so a merge that read an unwritten split would show; padding rows stay untouched."""
    r = triton_results["step_attention_split"]
    assert r["finite"] and r["rel"] < 1e-5 and r["untouched"], r


def test_step_attention_reference_matches_separate_kernels(monkeypatch):
    monkeypatch.delenv("KVRL_FORCE_TRITON", raising=False)
    r = check_step_attention(torch.float32)
    assert r["rel"] == 0.0 and r["untouched"], r


# --------------------------------------------------------------------------------------------
# References vs naive dense attention (in process)
# --------------------------------------------------------------------------------------------

REF_CASES = [
    Case("dec_mha", 4, 4, 64, 16, [1, 17, 50, 300]),
    Case("dec_gqa2_bs8", 8, 4, 64, 8, [1, 9, 64, 129]),
    Case("dec_gqa4_bs32_d128", 8, 2, 128, 32, [33, 1, 200]),
    Case("pre_full_mha", 4, 4, 64, 16, [1, 20, 37], q_lens=[1, 20, 37]),
    Case("pre_prefix_gqa2_bs8", 4, 2, 64, 8, [40, 70, 9, 100], q_lens=[5, 70, 1, 36]),
    Case("pre_chunk_gqa3_bs32_d128", 6, 2, 128, 32, [100, 50], q_lens=[33, 16]),
    Case("pre_zero_len_seq", 4, 2, 32, 16, [10, 20], q_lens=[0, 4]),
]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("case", REF_CASES, ids=lambda c: c.name)
def test_reference_matches_naive(case, seed):
    inputs = make_inputs(case, seed)
    q, k_cache, v_cache, block_tables, context_lens, cu = inputs
    q_lens = case.q_lens or [1] * len(case.context_lens)
    fn = paged_decode_attention_ref if cu is None else paged_prefill_attention_ref
    out = run_attention(case, fn, inputs)
    expected = naive_attention(q, k_cache, v_cache, block_tables, context_lens, q_lens, case.head_dim**-0.5)
    e = errors(out, expected)
    assert out.dtype == q.dtype and out.shape == q.shape
    assert e["finite"] and e["rel"] < 1e-5 and e["max_rel"] < 1e-5, e


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_reference_low_precision(dtype):
    case = Case("lp", 8, 2, 64, 16, [70, 5], q_lens=[30, 5], dtype=str(dtype).split(".")[1])
    inputs = make_inputs(case)
    q, k_cache, v_cache, block_tables, context_lens, _ = inputs
    out = run_attention(case, paged_prefill_attention_ref, inputs)
    expected = naive_attention(q, k_cache, v_cache, block_tables, context_lens, case.q_lens, 64**-0.5)
    assert out.dtype == dtype
    assert errors(out, expected)["rel"] < 1e-2


def test_decode_equals_last_row_of_prefill():
    case = Case("p", 4, 2, 32, 8, [23, 40], q_lens=[23, 40])
    q, k_cache, v_cache, block_tables, context_lens, cu = make_inputs(case)
    prefill = paged_prefill_attention_ref(q, k_cache, v_cache, block_tables, cu, context_lens, 0.2, 40)
    last = cu[1:].long() - 1
    decode = paged_decode_attention_ref(q[last], k_cache, v_cache, block_tables, context_lens, 0.2)
    torch.testing.assert_close(decode, prefill[last], rtol=1e-5, atol=1e-6)


def test_store_kv_ref_skips_negative_slots():
    key = torch.randn(4, 2, 8)
    value = torch.randn(4, 2, 8)
    k_cache, v_cache = torch.randn(3, 4, 2, 8), torch.randn(3, 4, 2, 8)
    k_before, v_before = k_cache.clone(), v_cache.clone()
    slots = torch.tensor([5, -1, 0, 11])
    store_kv_ref(key, value, k_cache, v_cache, slots)
    written = {5: 0, 0: 2, 11: 3}
    for s in range(12):
        b, o = divmod(s, 4)
        exp_k = key[written[s]] if s in written else k_before[b, o]
        exp_v = value[written[s]] if s in written else v_before[b, o]
        assert torch.equal(k_cache[b, o], exp_k) and torch.equal(v_cache[b, o], exp_v), s


def test_copy_blocks_ref_every_layer():
    caches = [torch.randn(6, 4, 2, 8) for _ in range(5)]
    before = [c.clone() for c in caches]
    src, dst = torch.tensor([0, 3]), torch.tensor([4, 1])
    K.copy_blocks(caches, src, dst)
    for c, b in zip(caches, before):
        assert torch.equal(c[4], b[0]) and torch.equal(c[1], b[3])
        for untouched in (0, 2, 3, 5):
            assert torch.equal(c[untouched], b[untouched])


def test_gather_scatter_roundtrip():
    cache = torch.randn(8, 4, 2, 8)
    ids = torch.tensor([6, 1, 3])
    data = K.gather_blocks(cache, ids)
    assert data.shape == (3, 4, 2, 8) and torch.equal(data, cache[ids])
    other = torch.zeros_like(cache)
    K.scatter_blocks(other, ids, data)
    assert torch.equal(other[ids], cache[ids]) and other[[0, 2, 4, 5, 7]].eq(0).all()


def test_decode_split_counts_are_few_powers_of_two():
    """Every (batch, context) picks a split count among SPLIT_CHOICES, the kernel variants that
    precompile_attention builds before serving; more programs are wanted for small batches."""
    pytest.importorskip("triton")
    from kvrl.kernels.triton_decode import SPLIT_CHOICES, pick_num_splits

    picks = {pick_num_splits(b, 8, ctx, 132) for b in range(1, 513) for ctx in (1, 16, 100, 700, 2048, 40960)}
    assert picks <= set(SPLIT_CHOICES) and len(picks) > 3
    assert pick_num_splits(1, 8, 40960, 132) == max(SPLIT_CHOICES)
    assert pick_num_splits(256, 8, 4096, 132) == 1
    assert pick_num_splits(1, 8, 10, 132) == 1


def test_cpu_dispatches_to_reference(monkeypatch):
    monkeypatch.delenv("KVRL_FORCE_TRITON", raising=False)
    assert not K.use_triton(torch.zeros(1))
    monkeypatch.setenv("KVRL_FORCE_TRITON", "1")
    assert K.use_triton(torch.zeros(1))


if __name__ == "__main__" and sys.argv[1:] == ["--triton-checks"]:
    triton_checks_main()


def test_prefill_splits_only_when_few_query_tiles_meet_long_contexts():
    """Key splits for a short query over a long context (16 programs on 132 SMs), none when the
    query tiles number one per SM or the context is short; powers of two up to 16."""
    from kvrl.kernels.triton_prefill import SPLIT_CHOICES, pick_prefill_splits

    assert pick_prefill_splits(16, 16, 1, 16384, 64, 132) == 8        # 16 programs, 2,048 keys a split
    assert pick_prefill_splits(16, 128, 1, 4096, 64, 132) == 2       # 32 programs, 2,048 keys a split
    assert pick_prefill_splits(16, 64, 8, 8192, 64, 132) == 2        # 128 programs
    assert pick_prefill_splits(16, 200, 9, 8192, 64, 132) == 1       # 576 programs: no split
    assert pick_prefill_splits(16, 8192, 1, 8192, 64, 132) == 1      # 2,048 programs already
    assert pick_prefill_splits(16, 16, 1, 1000, 64, 132) == 1        # too short to split
    assert pick_prefill_splits(16, 200, 2, 2048, 64, 132) == 1       # ~1k keys a split: slower
    assert {pick_prefill_splits(h, q, s, c, 64, 132) for h in (8, 16, 32) for q in (1, 16, 300, 4096)
            for s in (1, 3, 16) for c in (16, 2048, 5000, 70000)} <= set(SPLIT_CHOICES)

