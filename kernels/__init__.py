"""Paged KV-cache kernels (cache writes, paged decode/prefill attention, block copy and swap)
and the fused elementwise ops of a decoder layer (residual-add + RMSNorm, q/k norm + rotary,
SiLU-and-mul).

Every public function dispatches to a Triton kernel when its tensors are on CUDA, or when the
environment variable ``KVRL_FORCE_TRITON=1`` is set (used with ``TRITON_INTERPRET=1`` to run
the kernels on CPU in tests); otherwise to the plain-torch reference in
:mod:`kvrl.kernels.reference`. Triton modules are imported lazily, on first Triton dispatch.

Cache layout per layer: ``k_cache``/``v_cache`` are ``[num_blocks, block_size, num_kv_heads,
head_dim]``, contiguous; token slot ``s`` is block ``s // block_size``, offset
``s % block_size``. GQA: query head ``h`` reads kv head ``h // (num_heads // num_kv_heads)``.
Attention accumulates in float32 and returns the query dtype.
"""
from __future__ import annotations

import os

import torch

from .reference import (
    copy_blocks_ref,
    paged_decode_attention_ref,
    paged_prefill_attention_ref,
    qk_norm_rotary_ref,
    rms_norm_ref,
    silu_and_mul_ref,
    store_kv_ref,
)

__all__ = [
    "store_kv",
    "paged_decode_attention",
    "paged_prefill_attention",
    "paged_step_attention",
    "copy_blocks",
    "gather_blocks",
    "scatter_blocks",
    "rms_norm",
    "qk_norm_rotary",
    "silu_and_mul",
]


def use_triton(t: torch.Tensor) -> bool:
    """True when calls on tensor ``t`` go to the Triton kernels (CUDA, or ``KVRL_FORCE_TRITON=1``)."""
    return t.is_cuda or os.environ.get("KVRL_FORCE_TRITON") == "1"


def store_kv(key, value, k_cache, v_cache, slot_mapping) -> None:
    """Write K/V of each token into its cache slot, in place.

    Args:
        key, value: ``[num_tokens, num_kv_heads, head_dim]`` (any strides).
        k_cache, v_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``, contiguous.
        slot_mapping: int64 ``[num_tokens]``; ``-1`` means skip that token.
    """
    if use_triton(k_cache):
        from .triton_cache import store_kv_triton

        store_kv_triton(key, value, k_cache, v_cache, slot_mapping)
    else:
        store_kv_ref(key, value, k_cache, v_cache, slot_mapping)


def paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale, num_splits=None, out=None):
    """Attention of one query token per sequence over its paged KV cache (split-K on Triton).

    Args:
        q: ``[batch, num_heads, head_dim]``; query of the token at position ``context_len - 1``,
            whose K/V is already stored.
        k_cache, v_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``.
        block_tables: int32 ``[batch, max_blocks]``, padded with 0.
        context_lens: int32 ``[batch]``, each >= 1.
        scale: softmax scale.
        num_splits: context splits per (sequence, kv head) for the Triton kernel; ``None`` picks
            one from batch size, context length and SM count. Ignored by the reference.
        out: optional ``[batch, num_heads, head_dim]`` tensor (unit last-dim stride) to write into.

    Returns:
        ``[batch, num_heads, head_dim]`` in ``q.dtype`` (``out`` when given).
    """
    if use_triton(q):
        from .triton_decode import paged_decode_attention_triton

        return paged_decode_attention_triton(
            q, k_cache, v_cache, block_tables, context_lens, scale, num_splits, out=out
        )
    return _into(out, paged_decode_attention_ref(q, k_cache, v_cache, block_tables, context_lens, scale))


def _into(out, result):
    """``result``, copied into ``out`` when one is given (the reference kernels allocate)."""
    if out is None:
        return result
    out.copy_(result)
    return out


def precompile_attention(k_cache, v_cache, num_heads: int, scale: float) -> int:
    """Compile, before serving, every variant of the Triton attention kernels that a step can
    ask for (decode and prefill split counts; block-table strides Triton specialises on), so no step stalls
    on a JIT compilation. Reads the caches, writes nothing. Returns the number of launches
    (0 when the caches are not served by Triton)."""
    if not use_triton(k_cache):
        return 0
    from .triton_decode import TABLE_WIDTHS, precompile_decode
    from .triton_prefill import SPLIT_CHOICES as PREFILL_SPLITS
    from .triton_prefill import paged_prefill_attention_triton

    launches = precompile_decode(k_cache, v_cache, num_heads, scale)
    dev = k_cache.device
    q = torch.zeros(2, num_heads, k_cache.shape[-1], dtype=k_cache.dtype, device=dev)
    cu = torch.tensor([0, 2], dtype=torch.int32, device=dev)
    lens = torch.full((1,), 2, dtype=torch.int32, device=dev)
    for width in TABLE_WIDTHS:
        tables = torch.zeros(1, width, dtype=torch.int32, device=dev)
        for splits in PREFILL_SPLITS:
            paged_prefill_attention_triton(q, k_cache, v_cache, tables, cu, lens, scale, 2, num_splits=splits)
            launches += 1
    return launches


def paged_prefill_attention(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale, max_q_len,
                            out=None):
    """Causal attention of packed query chunks over a paged KV cache.

    Args:
        q: ``[total_q_tokens, num_heads, head_dim]``, packed; ``total_q_tokens == cu_seqlens_q[-1]``.
        k_cache, v_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``; already hold the
            chunk's own K/V.
        block_tables: int32 ``[P, max_blocks]``, padded with 0.
        cu_seqlens_q: int32 ``[P + 1]``.
        context_lens: int32 ``[P]``; total KV length (cached prefix + earlier chunks + this chunk).
            The queries of sequence ``i`` are its last ``q_len_i`` positions; a query at absolute
            position ``p`` sees keys ``0 .. p``.
        scale: softmax scale.
        max_q_len: largest ``q_len_i`` (sizes the Triton grid).
        out: optional ``q``-shaped tensor (unit last-dim stride) to write into.

    Returns:
        ``[total_q_tokens, num_heads, head_dim]`` in ``q.dtype`` (``out`` when given).
    """
    args = (q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale, max_q_len)
    if use_triton(q):
        from .triton_prefill import paged_prefill_attention_triton

        return paged_prefill_attention_triton(*args, out=out)
    return _into(out, paged_prefill_attention_ref(*args))


def paged_step_attention(q, k_cache, v_cache, prefill_block_tables, cu_seqlens_q, prefill_context_lens,
                         decode_block_tables, decode_context_lens, decode_row0, scale, out, decode_splits=1,
                         decode_partials=None):
    """The attention of a whole step, launched from tensor shapes alone (a CUDA graph can capture
    it: no host sync, no allocation, grids fixed by the buffers' sizes).

    Args:
        q: ``[T, num_heads, head_dim]``: the prefill rows as ``cu_seqlens_q`` places them, then
            decode ``i`` at row ``decode_row0[0] + i``; other rows (padding) are not read.
        k_cache, v_cache: as for :func:`paged_prefill_attention`.
        prefill_block_tables: int32 ``[P, W]``; cu_seqlens_q: int32 ``[P + 1]``;
            prefill_context_lens: int32 ``[P]``. Unused prefill entries repeat the last
            ``cu_seqlens_q`` value (no query rows).
        decode_block_tables: int32 ``[D, W]``; decode_context_lens: int32 ``[D]``, 0 for unused
            entries; decode_row0: int32 ``[1]``, the first decode row.
        scale: softmax scale.
        out: ``q``-shaped output; only the rows of real prefill and decode queries are written.
        decode_splits: key splits of each decode's context (a fixed count, so the grid stays fixed);
            above 1 it needs ``decode_partials``, float32 ``(part_o [D, num_heads, decode_splits,
            head_dim], part_lse [D, num_heads, decode_splits])``.

    Returns ``out``. Same numbers as :func:`paged_prefill_attention` with one key split and
    :func:`paged_decode_attention` with ``decode_splits`` splits.
    """
    if use_triton(q):
        from .triton_decode import paged_decode_attention_rows_triton
        from .triton_prefill import paged_prefill_attention_triton

        paged_prefill_attention_triton(q, k_cache, v_cache, prefill_block_tables, cu_seqlens_q, prefill_context_lens,
                                       scale, q.shape[0], out=out, num_splits=1)
        paged_decode_attention_rows_triton(q, k_cache, v_cache, decode_block_tables, decode_context_lens, decode_row0,
                                           scale, out, num_splits=decode_splits, partials=decode_partials)
        return out
    cu = cu_seqlens_q.tolist()
    used = sum(1 for a, b in zip(cu, cu[1:]) if b > a)
    n_pre = cu[used] if used else 0
    if used:
        out[:n_pre] = paged_prefill_attention_ref(q[:n_pre], k_cache, v_cache, prefill_block_tables[:used],
                                                  cu_seqlens_q[:used + 1], prefill_context_lens[:used], scale, 0)
    n_dec = int((decode_context_lens > 0).sum())
    if n_dec:
        r0 = int(decode_row0[0])
        out[r0:r0 + n_dec] = paged_decode_attention_ref(q[r0:r0 + n_dec], k_cache, v_cache,
                                                        decode_block_tables[:n_dec], decode_context_lens[:n_dec], scale)
    return out


def copy_blocks(caches, src, dst) -> None:
    """Copy block ``src[i]`` -> ``dst[i]`` in every cache tensor (copy-on-write), in place.

    Args:
        caches: list of ``[num_blocks, block_size, num_kv_heads, head_dim]`` tensors (all K and V
            caches of all layers).
        src, dst: int64 ``[num_pairs]`` block ids; ``dst`` distinct and disjoint from ``src``.
    """
    if not caches or src.numel() == 0:
        return
    if use_triton(caches[0]):
        from .triton_cache import copy_blocks_triton

        copy_blocks_triton(caches, src, dst)
    else:
        copy_blocks_ref(caches, src, dst)


def gather_blocks(cache, block_ids) -> torch.Tensor:
    """Return ``cache[block_ids]``: ``[n, block_size, num_kv_heads, head_dim]``, contiguous (swap-out)."""
    return cache[block_ids]


def scatter_blocks(cache, block_ids, data) -> None:
    """Write ``data`` (``[n, block_size, num_kv_heads, head_dim]``, any device) into ``cache[block_ids]`` (swap-in)."""
    cache[block_ids] = data.to(device=cache.device, dtype=cache.dtype)


def rms_norm(x, weight, eps, residual=None):
    """RMSNorm over the last dim, optionally fused with the residual add before it.

    ``out = weight * (x32 * rsqrt(mean(x32^2) + eps)).to(x.dtype)`` with ``x32 = x.float()``;
    statistics in float32, output dtype ``promote(weight.dtype, x.dtype)``.

    Args:
        x: ``[..., hidden]``.
        weight: ``[hidden]``.
        eps: epsilon added to the mean square.
        residual: optional, same shape and dtype as ``x``.

    Returns:
        ``out`` when ``residual`` is None; else ``(out, h)`` where ``h = x + residual`` (in x's
        dtype) is the normalised input, i.e. the next residual stream. Inputs are not modified.
    """
    if use_triton(x):
        from .triton_fused import rms_norm_triton

        return rms_norm_triton(x, weight, eps, residual)
    return rms_norm_ref(x, weight, eps, residual)


def qk_norm_rotary(q, k, cos, sin, q_weight, k_weight, eps):
    """Optional per-head RMSNorm of queries and keys (Qwen3 ``q_norm``/``k_norm``), then
    neox-style (rotate-half) rotary embedding of both.

    Args:
        q: ``[T, num_heads, head_dim]``; k: ``[T, num_kv_heads, head_dim]`` (any strides with a
            unit last-dim stride, e.g. views into a fused QKV projection).
        cos, sin: ``[T, 1, head_dim]`` from :class:`kvrl.model.layers.RotaryEmbedding`.
        q_weight, k_weight: ``[head_dim]`` norm weights, or both None for no norm.
        eps: norm epsilon.

    Returns:
        New contiguous ``(q, k)``; the norm rounds like :func:`rms_norm`, the rotation is
        ``x * cos + rotate_half(x) * sin`` in ``promote(norm dtype, cos.dtype)``.
    """
    if use_triton(q):
        from .triton_fused import qk_norm_rotary_triton

        return qk_norm_rotary_triton(q, k, cos, sin, q_weight, k_weight, eps)
    return qk_norm_rotary_ref(q, k, cos, sin, q_weight, k_weight, eps)


def silu_and_mul(gate_up):
    """``gate_up [..., 2 * I]`` -> ``silu(gate) * up`` ``[..., I]`` in gate_up's dtype
    (``gate, up = gate_up.chunk(2, dim=-1)``)."""
    if use_triton(gate_up):
        from .triton_fused import silu_and_mul_triton

        return silu_and_mul_triton(gate_up)
    return silu_and_mul_ref(gate_up)
