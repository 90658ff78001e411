"""Causal paged attention for packed query chunks (prefill, chunked prefill, prefix-cache hits).

One program per (query head, tile of ``BLOCK_M`` query rows, sequence, key split); the head is the
fastest grid axis so the heads of one kv group run side by side and share K/V through L2. Short
queries over long contexts (prefix-cache hits) would leave most SMs idle while a few programs walk
thousands of keys, so the keys of each query tile are then split over programs ("flash-decoding"
for prefill) and a second kernel merges the partial softmaxes. A program
streams K/V tiles of ``BLOCK_N`` tokens from the paged cache, from position 0 up to the causal
limit of its last row, with an online softmax in float32. Since every K/V (cached prefix, earlier
chunks and this chunk) is read from the cache, prefix hits and chunked prefill need no special
case: the queries of sequence ``i`` are simply its last ``q_len_i`` positions.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_common import (LOG2E, check_paged_inputs, dot_precision, kv_tile_offsets, num_sms, online_softmax_step,
                            powers_of_two)


# Split heuristic (num_splits=None): with fewer programs than about two per SM, a program walking a
# long context is the critical path (one 16-token query over 16k cached tokens: one program per
# head walks 256 key tiles); splitting the keys of each (head, query tile) over programs fills the
# GPU. Every split keeps at least _MIN_SPLIT_TOKENS keys, and a step whose programs already number
# one per SM is not split: on an H200 (benchmarks/prefill_splits.py, df4a263) splitting those, or
# splits of ~1k keys, cost more in partial writes and the merge than they gained (0.6-0.8x).
_PROGRAMS_PER_SM = 2
_MIN_SPLIT_TOKENS = 2048
_MAX_SPLITS = 16
#: every split count :func:`pick_prefill_splits` returns
SPLIT_CHOICES = powers_of_two(_MAX_SPLITS)


@triton.jit
def _prefill_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, cu_seqlens_ptr, context_lens_ptr, out_ptr,
    part_o_ptr, part_lse_ptr,
    qk_scale,
    stride_qt, stride_qh, stride_qd, stride_bt, stride_ot, stride_oh,
    NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    D_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Program ``(head, m_tile, seq * NUM_SPLITS + split)``: rows ``m_tile * BLOCK_M ...`` of
    sequence ``seq``'s chunk over split ``split`` of the keys they may see. With one split it writes
    the normalised output; otherwise a float32 partial output and its log2-sum-exp (``-inf`` for rows
    that see no key of the split) into ``part_o`` ``[T, num_heads, NUM_SPLITS, HEAD_DIM]`` and
    ``part_lse`` ``[T, num_heads, NUM_SPLITS]``, merged by :func:`_prefill_merge_kernel`."""
    head = tl.program_id(0)
    m_tile = tl.program_id(1)
    seq = tl.program_id(2) // NUM_SPLITS
    split = tl.program_id(2) % NUM_SPLITS

    q_start = tl.load(cu_seqlens_ptr + seq)
    q_len = tl.load(cu_seqlens_ptr + seq + 1) - q_start
    if m_tile * BLOCK_M >= q_len:
        return
    context_len = tl.load(context_lens_ptr + seq)
    kv_head = head // GROUP

    offs_m = m_tile * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D_PAD)
    m_mask = offs_m < q_len
    d_mask = offs_d < HEAD_DIM
    q_mask = m_mask[:, None] & d_mask[None, :]
    rows = (q_start + offs_m).to(tl.int64)
    q = tl.load(q_ptr + rows[:, None] * stride_qt + head * stride_qh + offs_d[None, :] * stride_qd, mask=q_mask, other=0.0)
    q_pos = context_len - q_len + offs_m  # absolute position of each query row

    # Keys 0 .. (last row's position) are visible to some row of this tile; this split's share of them.
    kv_end = tl.minimum(context_len - q_len + (m_tile + 1) * BLOCK_M, context_len)
    tiles_per_split = tl.cdiv(tl.cdiv(kv_end, BLOCK_N), NUM_SPLITS)
    start = split * tiles_per_split * BLOCK_N
    end = tl.minimum(start + tiles_per_split * BLOCK_N, kv_end)
    block_table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    m = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D_PAD], dtype=tl.float32)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs_n < end
        kv_offs = kv_tile_offsets(block_table, offs_n, n_mask, kv_head, offs_d, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE)
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(k_cache_ptr + kv_offs, mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        visible = n_mask[None, :] & (offs_n[None, :] <= q_pos[:, None])
        s = tl.where(visible, s, float("-inf"))
        v = tl.load(v_cache_ptr + kv_offs, mask=kv_mask, other=0.0)
        m, l, acc = online_softmax_step(s, v, m, l, acc, DOT_PRECISION)

    if NUM_SPLITS == 1:
        o = acc / l[:, None]
        o_ptrs = out_ptr + rows[:, None] * stride_ot + head * stride_oh + offs_d[None, :]
        tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty), mask=q_mask)
    else:
        seen = l > 0.0
        l_safe = tl.where(seen, l, 1.0)
        o = tl.where(seen[:, None], acc / l_safe[:, None], 0.0)
        lse = tl.where(seen, m + tl.log2(l_safe), float("-inf"))
        part = (rows * (NUM_KV_HEADS * GROUP) + head) * NUM_SPLITS + split
        tl.store(part_o_ptr + part[:, None] * HEAD_DIM + offs_d[None, :], o, mask=q_mask)
        tl.store(part_lse_ptr + part, lse, mask=m_mask)


@triton.jit
def _prefill_merge_kernel(
    part_o_ptr, part_lse_ptr, out_ptr, stride_ot, stride_oh,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr, S_PAD: tl.constexpr,
    D_PAD: tl.constexpr,
):
    """Program ``(row, head)``: softmax-weighted merge of the row's split partials (split 0 always
    holds key 0, which every row sees, so the weights never all vanish)."""
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    offs_s = tl.arange(0, S_PAD)
    offs_d = tl.arange(0, D_PAD)
    s_mask = offs_s < NUM_SPLITS
    d_mask = offs_d < HEAD_DIM
    part = (row * NUM_HEADS + head) * NUM_SPLITS + offs_s
    lse = tl.load(part_lse_ptr + part, mask=s_mask, other=float("-inf"))
    o = tl.load(part_o_ptr + part[:, None] * HEAD_DIM + offs_d[None, :], mask=s_mask[:, None] & d_mask[None, :], other=0.0)
    w = tl.exp2(lse - tl.max(lse, 0))
    out = tl.sum(w[:, None] * o, 0) / tl.sum(w, 0)
    tl.store(out_ptr + row * stride_ot + head * stride_oh + offs_d, out.to(out_ptr.dtype.element_ty), mask=d_mask)


def pick_prefill_splits(num_heads: int, max_q_len: int, num_seqs: int, max_context_len: int, block_m: int,
                        sms: int) -> int:
    """Key splits per (head, query tile): 1 when the programs are at least one per SM; otherwise enough
    for about ``_PROGRAMS_PER_SM`` programs per SM, each split at least ``_MIN_SPLIT_TOKENS`` keys,
    rounded down to a power of two (the variants :func:`kvrl.kernels.precompile_attention` builds).
    ``max_context_len`` bounds the context (the block-table capacity: no device sync)."""
    programs = num_heads * triton.cdiv(max(max_q_len, 1), block_m) * max(num_seqs, 1)
    if programs >= sms:
        return 1
    wanted = triton.cdiv(_PROGRAMS_PER_SM * sms, programs)
    by_length = max_context_len // _MIN_SPLIT_TOKENS
    n = max(1, min(wanted, by_length, _MAX_SPLITS))
    return 1 << (n.bit_length() - 1)


def paged_prefill_attention_triton(
    q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale, max_q_len,
    block_m=None, block_n=None, num_warps=4, num_stages=2, out=None, num_splits=None,
):
    """Triton paged prefill attention; see :func:`kvrl.kernels.paged_prefill_attention`.

    Extra knobs (tests and benchmarks): ``block_m``/``block_n`` tile sizes (default 64 for
    16-bit dtypes, 32 for float32), the ``num_warps``/``num_stages`` launch options and
    ``num_splits`` (key splits per query tile; None: :func:`pick_prefill_splits`); ``out`` an
    optional ``q``-shaped output with a unit last-dim stride.
    """
    check_paged_inputs(q, k_cache, v_cache)
    total, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    num_seqs = context_lens.shape[0]
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if total == 0 or num_seqs == 0 or max_q_len == 0:
        return out
    default_tile = 32 if q.dtype == torch.float32 else 64
    block_m = block_m or default_tile
    block_n = block_n or default_tile
    if num_splits is None:
        num_splits = pick_prefill_splits(num_heads, max_q_len, num_seqs, block_tables.shape[1] * block_size,
                                         block_m, num_sms(q.device))
    if num_splits > 1:
        part_o = torch.empty(total, num_heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(total, num_heads, num_splits, dtype=torch.float32, device=q.device)
    else:
        part_o = part_lse = out  # never touched when NUM_SPLITS == 1
    d_pad = max(16, triton.next_power_of_2(head_dim))  # tl.dot needs every dim >= 16
    grid = (num_heads, triton.cdiv(max_q_len, block_m), num_seqs * num_splits)
    _prefill_kernel[grid](
        q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, out, part_o, part_lse,
        scale * LOG2E,
        *q.stride(), block_tables.stride(0), out.stride(0), out.stride(1),
        NUM_KV_HEADS=num_kv_heads, GROUP=num_heads // num_kv_heads, HEAD_DIM=head_dim, BLOCK_SIZE=block_size,
        D_PAD=d_pad, BLOCK_M=block_m, BLOCK_N=block_n, NUM_SPLITS=num_splits,
        DOT_PRECISION=dot_precision(q.dtype),
        num_warps=num_warps, num_stages=num_stages,
    )
    if num_splits > 1:
        _prefill_merge_kernel[(total, num_heads)](
            part_o, part_lse, out, out.stride(0), out.stride(1),
            NUM_HEADS=num_heads, HEAD_DIM=head_dim, NUM_SPLITS=num_splits,
            S_PAD=max(2, triton.next_power_of_2(num_splits)), D_PAD=d_pad,
        )
    return out
