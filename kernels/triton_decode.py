"""Split-K ("flash-decoding") paged attention for one query token per sequence.

Kernel 1 runs one program per (sequence, kv head, split). It loads the queries of ALL query
heads that share the kv head (padded to ``G_PAD >= 16`` rows so ``tl.dot`` applies), so each
K/V byte is read once per kv group, then streams its share of the context in tiles of
``BLOCK_N`` tokens through the block table with an online softmax in float32. With one split it
writes the normalised output directly; otherwise it writes a float32 partial output and its
log2-sum-exp, and kernel 2 merges the splits of each (sequence, head).

Splits partition each sequence's tiles evenly: split ``s`` of a sequence with ``T`` tiles
covers tiles ``[s * ceil(T / S), (s + 1) * ceil(T / S))``; trailing splits may be empty
(partial ``lse = -inf``, output 0) and get zero weight in the merge.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .triton_common import (LOG2E, check_paged_inputs, dot_precision, kv_tile_offsets, num_sms, online_softmax_step,
                            powers_of_two)

# Heuristic for num_splits=None: aim for this many programs per SM, but give every split at
# least _MIN_SPLIT_TOKENS tokens of context so the merge and per-program overhead stay small.
_PROGRAMS_PER_SM = 8
_MIN_SPLIT_TOKENS = 256
_MAX_SPLITS = 64


@triton.jit
def _decode_split_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr, row0_ptr,
    out_ptr, part_o_ptr, part_lse_ptr,
    qk_scale,
    stride_qb, stride_qh, stride_qd, stride_bt, stride_ob, stride_oh,
    NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    G_PAD: tl.constexpr, D_PAD: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr,
    DOT_PRECISION: tl.constexpr, HAS_ROW0: tl.constexpr,
):
    """Program ``(seq, kv_head, split)``; see the module docstring.

    ``part_o`` is float32 ``[batch, num_heads, NUM_SPLITS, HEAD_DIM]`` and ``part_lse`` float32
    ``[batch, num_heads, NUM_SPLITS]`` (both contiguous, unused when ``NUM_SPLITS == 1``).
    ``HAS_ROW0``: sequence ``seq`` reads q row and writes out row ``row0[0] + seq`` (else ``seq``),
    and a sequence of context length 0 (padding of a captured step) is skipped.
    """
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    context_len = tl.load(context_lens_ptr + seq)
    row = seq.to(tl.int64)
    if HAS_ROW0:
        if context_len == 0:
            return
        row += tl.load(row0_ptr).to(tl.int64)
    tiles_per_split = tl.cdiv(tl.cdiv(context_len, BLOCK_N), NUM_SPLITS)
    start = split * tiles_per_split * BLOCK_N
    end = tl.minimum(start + tiles_per_split * BLOCK_N, context_len)
    if HAS_ROW0:
        if start >= end:    # a split past a short context: nothing to read or write
            return

    offs_g = tl.arange(0, G_PAD)
    offs_d = tl.arange(0, D_PAD)
    heads = kv_head * GROUP + offs_g
    g_mask = offs_g < GROUP
    d_mask = offs_d < HEAD_DIM
    q_mask = g_mask[:, None] & d_mask[None, :]
    q = tl.load(
        q_ptr + row * stride_qb + heads[:, None] * stride_qh + offs_d[None, :] * stride_qd,
        mask=q_mask, other=0.0,
    )

    block_table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    m = tl.full([G_PAD], float("-inf"), dtype=tl.float32)
    l = tl.zeros([G_PAD], dtype=tl.float32)
    acc = tl.zeros([G_PAD, D_PAD], dtype=tl.float32)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs_n < end
        kv_offs = kv_tile_offsets(block_table, offs_n, n_mask, kv_head, offs_d, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE)
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(k_cache_ptr + kv_offs, mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        s = tl.where(n_mask[None, :], s, float("-inf"))
        v = tl.load(v_cache_ptr + kv_offs, mask=kv_mask, other=0.0)
        m, l, acc = online_softmax_step(s, v, m, l, acc, DOT_PRECISION)

    if NUM_SPLITS == 1:
        o = acc / l[:, None]
        o_ptrs = out_ptr + row * stride_ob + heads[:, None] * stride_oh + offs_d[None, :]
        tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty), mask=q_mask)
    elif start < end:   # empty splits write nothing; the merge reads only the used ones
        o = acc / l[:, None]
        lse = m + tl.log2(l)
        part = (seq.to(tl.int64) * (NUM_KV_HEADS * GROUP) + heads) * NUM_SPLITS + split
        tl.store(part_o_ptr + part[:, None] * HEAD_DIM + offs_d[None, :], o, mask=q_mask)
        tl.store(part_lse_ptr + part, lse, mask=g_mask)


@triton.jit
def _decode_merge_kernel(
    part_o_ptr, part_lse_ptr, out_ptr, context_lens_ptr, row0_ptr, stride_ob, stride_oh,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr,
    S_PAD: tl.constexpr, D_PAD: tl.constexpr, BLOCK_N: tl.constexpr, HAS_ROW0: tl.constexpr,
):
    """Program ``(seq, head)``: softmax-weighted merge of the used split partials into ``out``.
    ``HAS_ROW0``: as for the split kernel (out row ``row0[0] + seq``; context length 0 skipped)."""
    seq = tl.program_id(0)
    head = tl.program_id(1)
    context_len = tl.load(context_lens_ptr + seq)
    out_row = seq.to(tl.int64)
    if HAS_ROW0:
        if context_len == 0:
            return
        out_row += tl.load(row0_ptr).to(tl.int64)
    num_tiles = tl.cdiv(context_len, BLOCK_N)
    used = tl.cdiv(num_tiles, tl.cdiv(num_tiles, NUM_SPLITS))   # splits the split kernel filled
    offs_s = tl.arange(0, S_PAD)
    offs_d = tl.arange(0, D_PAD)
    s_mask = offs_s < used
    d_mask = offs_d < HEAD_DIM
    row = (seq.to(tl.int64) * NUM_HEADS + head) * NUM_SPLITS + offs_s
    lse = tl.load(part_lse_ptr + row, mask=s_mask, other=float("-inf"))
    o = tl.load(part_o_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], mask=s_mask[:, None] & d_mask[None, :], other=0.0)
    w = tl.exp2(lse - tl.max(lse, 0))
    out = tl.sum(w[:, None] * o, 0) / tl.sum(w, 0)
    o_ptrs = out_ptr + out_row * stride_ob + head * stride_oh + offs_d
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=d_mask)


def pick_num_splits(batch: int, num_kv_heads: int, max_context_len: int, sms: int) -> int:
    """Splits per (sequence, kv head): enough programs to fill ``sms`` SMs, each split about 256
    tokens or more, rounded to the nearest power of two.

    E.g. on 132 SMs with 8 kv heads: batch 64 -> 4 splits (context >= 768), batch 256 -> 1.
    Finer splits to balance mixed context lengths measured slower on an H200
    (benchmarks/decode_mix.py: batch 256, contexts U[100, 2048]: 1 split 3.82 TB/s, 5 splits 3.67).
    Splits a shorter sequence does not fill cost one early exit. The split count is a compile-time
    constant of the kernels: powers of two keep the variants to :data:`SPLIT_CHOICES`, which
    :func:`precompile_decode` builds before serving (each new variant otherwise stalls the first
    step that needs it for a JIT compilation).
    """
    wanted = triton.cdiv(_PROGRAMS_PER_SM * sms, max(1, batch * num_kv_heads))
    by_length = triton.cdiv(max_context_len, _MIN_SPLIT_TOKENS)
    n = max(1, min(wanted, by_length, _MAX_SPLITS))
    return min(1 << round(math.log2(n)), _MAX_SPLITS)


#: block-table widths that cover Triton's integer specialisations of the table stride (1, 16k, other)
TABLE_WIDTHS = (1, 16, 17)
#: every split count :func:`pick_num_splits` returns
SPLIT_CHOICES = powers_of_two(_MAX_SPLITS)


def paged_decode_attention_triton(
    q, k_cache, v_cache, block_tables, context_lens, scale, num_splits=None,
    block_n=None, num_warps=4, num_stages=3, out=None,
):
    """Triton paged decode attention; see :func:`kvrl.kernels.paged_decode_attention`.

    Extra knobs (tests and benchmarks): ``block_n`` tokens per tile (default 64 for 16-bit
    dtypes, 32 for float32) and the ``num_warps``/``num_stages`` launch options. The split
    heuristic bounds the context by the block-table capacity, so no device sync is needed.
    ``out``: an optional ``q``-shaped output with a unit last-dim stride.
    """
    check_paged_inputs(q, k_cache, v_cache)
    batch, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    group = num_heads // num_kv_heads
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if batch == 0:
        return out
    if num_splits is None:
        capacity = block_tables.shape[1] * block_size
        num_splits = pick_num_splits(batch, num_kv_heads, capacity, num_sms(q.device))
    if block_n is None:
        block_n = 32 if q.dtype == torch.float32 else 64
    d_pad = max(16, triton.next_power_of_2(head_dim))  # tl.dot needs every dim >= 16
    if num_splits > 1:
        part_o = torch.empty(batch, num_heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(batch, num_heads, num_splits, dtype=torch.float32, device=q.device)
    else:
        part_o = part_lse = out  # never touched when NUM_SPLITS == 1
    _decode_split_kernel[(batch, num_kv_heads, num_splits)](
        q, k_cache, v_cache, block_tables, context_lens, context_lens, out, part_o, part_lse,
        scale * LOG2E,
        *q.stride(), block_tables.stride(0), out.stride(0), out.stride(1),
        NUM_KV_HEADS=num_kv_heads, GROUP=group, HEAD_DIM=head_dim, BLOCK_SIZE=block_size,
        G_PAD=max(16, triton.next_power_of_2(group)), D_PAD=d_pad, BLOCK_N=block_n,
        NUM_SPLITS=num_splits, DOT_PRECISION=dot_precision(q.dtype), HAS_ROW0=False,
        num_warps=num_warps, num_stages=num_stages,
    )
    if num_splits > 1:
        _decode_merge_kernel[(batch, num_heads)](
            part_o, part_lse, out, context_lens, context_lens, out.stride(0), out.stride(1),
            NUM_HEADS=num_heads, HEAD_DIM=head_dim, NUM_SPLITS=num_splits,
            S_PAD=triton.next_power_of_2(num_splits), D_PAD=d_pad, BLOCK_N=block_n, HAS_ROW0=False,
        )
    return out


def paged_decode_attention_rows_triton(q, k_cache, v_cache, block_tables, context_lens, row0, scale, out,
                                       num_splits=1, partials=None, block_n=None, num_warps=4, num_stages=3):
    """Decode attention whose launch depends on tensor shapes only (for captured steps): sequence
    ``i`` reads ``q`` row and writes ``out`` row ``row0[0] + i``; sequences of context length 0 are
    skipped. Grid ``(block_tables.shape[0], num_kv_heads, num_splits)``; no allocation.

    ``num_splits > 1`` splits each sequence's context as :func:`paged_decode_attention_triton`
    does (a short context fills fewer splits; the empty ones exit at once) and needs ``partials``:
    float32 ``(part_o [D, num_heads, num_splits, head_dim], part_lse [D, num_heads, num_splits])``
    with ``D >= block_tables.shape[0]``, both contiguous; the merge kernel then writes ``out``."""
    check_paged_inputs(q, k_cache, v_cache)
    _, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    group = num_heads // num_kv_heads
    batch = block_tables.shape[0]
    if block_n is None:
        block_n = 32 if q.dtype == torch.float32 else 64
    d_pad = max(16, triton.next_power_of_2(head_dim))
    if num_splits > 1:
        part_o, part_lse = partials
        if part_o.shape[0] < batch or part_o.shape[1:] != (num_heads, num_splits, head_dim) \
                or part_lse.shape[1:] != (num_heads, num_splits):
            raise ValueError(f"partials {tuple(part_o.shape)}, {tuple(part_lse.shape)} do not hold {batch} sequences "
                             f"x {num_heads} heads x {num_splits} splits of {head_dim}")
    else:
        part_o = part_lse = out     # never touched with one split
    _decode_split_kernel[(batch, num_kv_heads, num_splits)](
        q, k_cache, v_cache, block_tables, context_lens, row0, out, part_o, part_lse,
        scale * LOG2E,
        *q.stride(), block_tables.stride(0), out.stride(0), out.stride(1),
        NUM_KV_HEADS=num_kv_heads, GROUP=group, HEAD_DIM=head_dim, BLOCK_SIZE=block_size,
        G_PAD=max(16, triton.next_power_of_2(group)), D_PAD=d_pad,
        BLOCK_N=block_n, NUM_SPLITS=num_splits, DOT_PRECISION=dot_precision(q.dtype), HAS_ROW0=True,
        num_warps=num_warps, num_stages=num_stages,
    )
    if num_splits > 1:
        _decode_merge_kernel[(batch, num_heads)](
            part_o, part_lse, out, context_lens, row0, out.stride(0), out.stride(1),
            NUM_HEADS=num_heads, HEAD_DIM=head_dim, NUM_SPLITS=num_splits,
            S_PAD=triton.next_power_of_2(num_splits), D_PAD=d_pad, BLOCK_N=block_n, HAS_ROW0=True,
        )
    return out


def precompile_decode(k_cache, v_cache, num_heads: int, scale: float) -> int:
    """Compile every variant of the decode kernels that :func:`pick_num_splits` can ask for
    (each split count; block-table widths of 1, a multiple of 16 and neither, which Triton
    specialises on), by running them on one sequence of one token. Reads the caches, writes
    nothing in them. Returns the number of launches."""
    dev, dtype = k_cache.device, k_cache.dtype
    head_dim = k_cache.shape[-1]
    q = torch.zeros(1, num_heads, head_dim, dtype=dtype, device=dev)
    lens = torch.ones(1, dtype=torch.int32, device=dev)
    launches = 0
    for width in TABLE_WIDTHS:
        tables = torch.zeros(1, width, dtype=torch.int32, device=dev)
        for splits in SPLIT_CHOICES:
            paged_decode_attention_triton(q, k_cache, v_cache, tables, lens, scale, num_splits=splits)
            launches += 1
    return launches
