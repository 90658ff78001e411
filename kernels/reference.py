"""Plain-torch reference implementations of the paged KV-cache kernels.

These are the CPU path of :mod:`kvrl.kernels` and the ground truth for the Triton kernels.
They favour clarity, but are vectorised per sequence (decode: per chunk of sequences) so a CPU
model forward over tens of sequences of a few hundred tokens stays fast.

Cache layout (per layer): ``[num_blocks, block_size, num_kv_heads, head_dim]``, contiguous;
token slot ``s`` is block ``s // block_size``, offset ``s % block_size``. Attention math is
done in float32 and the result is cast back to the query dtype.
"""
from __future__ import annotations

import torch

# Decode reference: upper bound on (sequences x context tokens) gathered at once, bounding the
# float32 K/V copies to ~num_kv_heads * head_dim * 8 bytes per token (4 GiB at 8 x 128).
_DECODE_CHUNK_TOKENS = 1 << 20


def gather_tokens(cache: torch.Tensor, block_tables: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """Gather the first ``num_tokens`` token positions of each sequence out of a paged cache.

    Args:
        cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``.
        block_tables: int ``[batch, max_blocks]``; needs ``num_tokens <= max_blocks * block_size``.
        num_tokens: positions ``0 .. num_tokens - 1`` are gathered for every sequence.

    Returns:
        ``[batch, num_tokens, num_kv_heads, head_dim]`` in the cache dtype (positions past a
        sequence's real length hold whatever the padded block-table entries point at).
    """
    num_blocks, block_size, num_kv_heads, head_dim = cache.shape
    pos = torch.arange(num_tokens, device=cache.device)
    blocks = block_tables[:, pos // block_size].long()
    slots = blocks * block_size + pos % block_size
    return cache.reshape(num_blocks * block_size, num_kv_heads, head_dim)[slots]


def store_kv_ref(key, value, k_cache, v_cache, slot_mapping) -> None:
    """Write each token's K/V into its cache slot, in place.

    Args:
        key, value: ``[num_tokens, num_kv_heads, head_dim]``.
        k_cache, v_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``, contiguous.
        slot_mapping: int64 ``[num_tokens]``; slot of each token, ``-1`` = do not write.
    """
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    for src, cache in ((key, k_cache), (value, v_cache)):
        cache.view(-1, *cache.shape[2:])[slots] = src[keep].to(cache.dtype)


def paged_decode_attention_ref(q, k_cache, v_cache, block_tables, context_lens, scale) -> torch.Tensor:
    """One-query-per-sequence attention over a paged KV cache.

    Args:
        q: ``[batch, num_heads, head_dim]``; the query of the token at position ``context_len - 1``
            (its own K/V already stored).
        k_cache, v_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``.
        block_tables: int32 ``[batch, max_blocks]``, padded with 0.
        context_lens: int32 ``[batch]``, each >= 1.
        scale: softmax scale (usually ``head_dim ** -0.5``).

    Returns:
        ``[batch, num_heads, head_dim]`` in ``q.dtype``.
    """
    batch, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    out = torch.empty_like(q)
    if batch == 0:
        return out
    max_len = int(context_lens.max())
    step = max(1, _DECODE_CHUNK_TOKENS // max_len)
    for b0 in range(0, batch, step):
        rows = slice(b0, b0 + step)
        k = gather_tokens(k_cache, block_tables[rows], max_len).float()  # [b, T, kvh, D]
        v = gather_tokens(v_cache, block_tables[rows], max_len).float()
        qg = q[rows].float().view(-1, num_kv_heads, group, head_dim)
        scores = torch.einsum("bkgd,btkd->bkgt", qg, k) * scale
        pad = torch.arange(max_len, device=q.device)[None, :] >= context_lens[rows, None]
        scores.masked_fill_(pad[:, None, None, :], float("-inf"))
        v = v.masked_fill(pad[:, :, None, None], 0.0)  # slots past a context may hold garbage (even NaN)
        o = torch.einsum("bkgt,btkd->bkgd", scores.softmax(dim=-1), v)
        out[rows] = o.reshape(-1, num_heads, head_dim).to(q.dtype)
    return out


def paged_prefill_attention_ref(
    q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale, max_q_len
) -> torch.Tensor:
    """Causal attention of packed query chunks over a paged KV cache (prefix hits, chunked prefill).

    Args:
        q: ``[total_q_tokens, num_heads, head_dim]``, sequences packed back to back;
            ``total_q_tokens == cu_seqlens_q[-1]``.
        k_cache, v_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``; hold all
            ``context_lens[i]`` tokens of sequence ``i``, including this chunk's.
        block_tables: int32 ``[P, max_blocks]``, padded with 0.
        cu_seqlens_q: int32 ``[P + 1]``; query rows of sequence ``i`` are
            ``cu_seqlens_q[i] : cu_seqlens_q[i + 1]``.
        context_lens: int32 ``[P]``; total KV length of each sequence. Its queries are the last
            ``q_len`` positions, and a query at absolute position ``p`` sees keys ``0 .. p``.
        scale: softmax scale.
        max_q_len: largest ``q_len`` (unused here; part of the shared signature).

    Returns:
        ``[total_q_tokens, num_heads, head_dim]`` in ``q.dtype``.
    """
    del max_q_len
    total, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    out = torch.empty_like(q)
    cu = cu_seqlens_q.tolist()
    for i, ctx in enumerate(context_lens.tolist()):
        q_len = cu[i + 1] - cu[i]
        if q_len == 0:
            continue
        k = gather_tokens(k_cache, block_tables[i : i + 1], ctx)[0].float()  # [T, kvh, D]
        v = gather_tokens(v_cache, block_tables[i : i + 1], ctx)[0].float()
        qg = q[cu[i] : cu[i + 1]].float().view(q_len, num_kv_heads, group, head_dim)
        scores = torch.einsum("qkgd,tkd->kgqt", qg, k) * scale
        q_pos = torch.arange(ctx - q_len, ctx, device=q.device)
        future = torch.arange(ctx, device=q.device)[None, :] > q_pos[:, None]
        scores.masked_fill_(future, float("-inf"))
        o = torch.einsum("kgqt,tkd->qkgd", scores.softmax(dim=-1), v)
        out[cu[i] : cu[i + 1]] = o.reshape(q_len, num_heads, head_dim).to(q.dtype)
    return out


def copy_blocks_ref(caches, src, dst) -> None:
    """Copy block ``src[i]`` to block ``dst[i]`` in every cache tensor (copy-on-write), in place.

    Args:
        caches: list of ``[num_blocks, block_size, num_kv_heads, head_dim]`` tensors.
        src, dst: int64 ``[num_pairs]`` block ids; ``dst`` are distinct and not in ``src``.
    """
    for cache in caches:
        cache[dst] = cache[src]


# --------------------------------------------------------------------------------------------
# Fused elementwise ops of the decoder layer (the CPU path of rms_norm, qk_norm_rotary,
# silu_and_mul). Each is the plain torch composition the model used before fusion, op for op,
# so CPU numerics are bitwise unchanged.
# --------------------------------------------------------------------------------------------


def rms_norm_ref(x, weight, eps, residual=None):
    """``weight * (x32 * rsqrt(mean(x32^2) + eps)).to(x.dtype)`` over the last dim, x32 = x in fp32.

    With ``residual``: ``h = x + residual`` (in x's dtype) is normalised and ``(out, h)`` returned.
    The output dtype is ``promote(weight.dtype, x.dtype)``.
    """
    if residual is not None:
        x = x + residual
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    out = weight * x32.to(x.dtype)
    return out if residual is None else (out, x)


def apply_rotary_ref(x, cos, sin):
    """Neox (rotate-half) rotary: ``x * cos + cat(-x2, x1) * sin``; x ``[T, heads, head_dim]``,
    cos/sin ``[T, 1, head_dim]``."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def qk_norm_rotary_ref(q, k, cos, sin, q_weight, k_weight, eps):
    """Per-head RMSNorm of ``q``/``k`` (skipped when the weights are None), then rotary on both.

    Returns new ``(q, k)`` tensors.
    """
    if q_weight is not None:
        q, k = rms_norm_ref(q, q_weight, eps), rms_norm_ref(k, k_weight, eps)
    return apply_rotary_ref(q, cos, sin), apply_rotary_ref(k, cos, sin)


def silu_and_mul_ref(gate_up):
    """``silu(gate) * up`` where ``gate, up = gate_up.chunk(2, dim=-1)``, in gate_up's dtype."""
    gate, up = gate_up.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up
