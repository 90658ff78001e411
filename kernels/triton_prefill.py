"""Causal paged attention for packed query chunks (prefill, chunked prefill, prefix-cache hits).

One program per (query head, tile of ``BLOCK_M`` query rows, sequence); the head is the fastest
grid axis so the heads of one kv group run side by side and share K/V through L2. A program
streams K/V tiles of ``BLOCK_N`` tokens from the paged cache, from position 0 up to the causal
limit of its last row, with an online softmax in float32. Since every K/V (cached prefix, earlier
chunks and this chunk) is read from the cache, prefix hits and chunked prefill need no special
case: the queries of sequence ``i`` are simply its last ``q_len_i`` positions.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_common import LOG2E, check_paged_inputs, dot_precision, kv_tile_offsets, online_softmax_step


@triton.jit
def _prefill_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, cu_seqlens_ptr, context_lens_ptr, out_ptr,
    qk_scale,
    stride_qt, stride_qh, stride_qd, stride_bt, stride_ot, stride_oh,
    NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    D_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """Program ``(head, m_tile, seq)``: rows ``m_tile * BLOCK_M ...`` of sequence ``seq``'s chunk."""
    head = tl.program_id(0)
    m_tile = tl.program_id(1)
    seq = tl.program_id(2)

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

    # Keys 0 .. (last row's position) are visible to some row of this tile.
    kv_end = tl.minimum(context_len - q_len + (m_tile + 1) * BLOCK_M, context_len)
    block_table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    m = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D_PAD], dtype=tl.float32)
    for n0 in range(0, kv_end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs_n < kv_end
        kv_offs = kv_tile_offsets(block_table, offs_n, n_mask, kv_head, offs_d, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE)
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(k_cache_ptr + kv_offs, mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        visible = n_mask[None, :] & (offs_n[None, :] <= q_pos[:, None])
        s = tl.where(visible, s, float("-inf"))
        v = tl.load(v_cache_ptr + kv_offs, mask=kv_mask, other=0.0)
        m, l, acc = online_softmax_step(s, v, m, l, acc, DOT_PRECISION)

    o = acc / l[:, None]
    o_ptrs = out_ptr + rows[:, None] * stride_ot + head * stride_oh + offs_d[None, :]
    tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty), mask=q_mask)


def paged_prefill_attention_triton(
    q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale, max_q_len,
    block_m=None, block_n=None, num_warps=4, num_stages=2, out=None,
):
    """Triton paged prefill attention; see :func:`kvrl.kernels.paged_prefill_attention`.

    Extra knobs (tests and benchmarks): ``block_m``/``block_n`` tile sizes (default 64 for
    16-bit dtypes, 32 for float32) and the ``num_warps``/``num_stages`` launch options; ``out``
    an optional ``q``-shaped output with a unit last-dim stride.
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
    grid = (num_heads, triton.cdiv(max_q_len, block_m), num_seqs)
    _prefill_kernel[grid](
        q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, out,
        scale * LOG2E,
        *q.stride(), block_tables.stride(0), out.stride(0), out.stride(1),
        NUM_KV_HEADS=num_kv_heads, GROUP=num_heads // num_kv_heads, HEAD_DIM=head_dim, BLOCK_SIZE=block_size,
        D_PAD=max(16, triton.next_power_of_2(head_dim)),  # tl.dot needs every dim >= 16
        BLOCK_M=block_m, BLOCK_N=block_n,
        DOT_PRECISION=dot_precision(q.dtype),
        num_warps=num_warps, num_stages=num_stages,
    )
    return out
