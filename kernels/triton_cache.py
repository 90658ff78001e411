"""Triton kernels that move data inside the paged KV cache: ``store_kv`` and ``copy_blocks``.

Cache layout: ``[num_blocks, block_size, num_kv_heads, head_dim]``, contiguous, so one token
slot is ``num_kv_heads * head_dim`` consecutive elements and one block is
``block_size * num_kv_heads * head_dim`` consecutive elements. Offsets are computed in int64.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

# Elements copied per program by copy_blocks (a block is split over several programs).
_COPY_CHUNK = 2048


@triton.jit
def _store_kv_kernel(
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
    stride_kt, stride_kh, stride_kd,
    stride_vt, stride_vh, stride_vd,
    HEAD_DIM: tl.constexpr, SLOT_SIZE: tl.constexpr, BLOCK: tl.constexpr,
):
    """One program per token: copy its ``[num_kv_heads, head_dim]`` K and V rows into its slot."""
    token = tl.program_id(0)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    if slot < 0:
        return
    offs = tl.arange(0, BLOCK)
    mask = offs < SLOT_SIZE
    head = offs // HEAD_DIM
    dim = offs % HEAD_DIM
    token64 = token.to(tl.int64)
    k = tl.load(key_ptr + token64 * stride_kt + head * stride_kh + dim * stride_kd, mask=mask)
    v = tl.load(value_ptr + token64 * stride_vt + head * stride_vh + dim * stride_vd, mask=mask)
    dst = slot * SLOT_SIZE + offs
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def store_kv_triton(key, value, k_cache, v_cache, slot_mapping) -> None:
    """Triton ``store_kv``; see :func:`kvrl.kernels.store_kv` for the contract."""
    num_tokens, num_kv_heads, head_dim = key.shape
    assert k_cache.is_contiguous() and v_cache.is_contiguous(), "caches must be contiguous"
    assert k_cache.shape[2:] == (num_kv_heads, head_dim) and value.shape == key.shape
    if num_tokens == 0:
        return
    slot_size = num_kv_heads * head_dim
    _store_kv_kernel[(num_tokens,)](
        key, value, k_cache, v_cache, slot_mapping,
        *key.stride(), *value.stride(),
        HEAD_DIM=head_dim, SLOT_SIZE=slot_size, BLOCK=triton.next_power_of_2(slot_size),
    )


@triton.jit
def _copy_blocks_kernel(
    cache_ptrs, like_ptr, src_ptr, dst_ptr,
    BLOCK_NUMEL: tl.constexpr, CHUNK: tl.constexpr,
):
    """Program ``(pair, cache, chunk)`` copies ``CHUNK`` elements of block ``src[pair]`` to ``dst[pair]``.

    ``cache_ptrs`` is an int64 array of 16-byte aligned cache base addresses; ``like_ptr`` only
    supplies the element type the addresses are cast to.
    """
    pair = tl.program_id(0)
    address = tl.multiple_of(tl.load(cache_ptrs + tl.program_id(1)), 16)
    base = address.to(like_ptr.dtype)
    src = tl.load(src_ptr + pair).to(tl.int64)
    dst = tl.load(dst_ptr + pair).to(tl.int64)
    offs = tl.program_id(2) * CHUNK + tl.arange(0, CHUNK)
    mask = offs < BLOCK_NUMEL
    data = tl.load(base + src * BLOCK_NUMEL + offs, mask=mask)
    tl.store(base + dst * BLOCK_NUMEL + offs, data, mask=mask)


def copy_blocks_triton(caches, src, dst) -> None:
    """Triton ``copy_blocks``: one launch per group of caches with equal dtype and block size.

    See :func:`kvrl.kernels.copy_blocks` for the contract.
    """
    groups: dict[tuple, list[torch.Tensor]] = {}
    for cache in caches:
        assert cache.is_contiguous() and cache.data_ptr() % 16 == 0, "caches must be contiguous and 16-byte aligned"
        groups.setdefault((cache.dtype, cache[0].numel()), []).append(cache)
    src = src.to(device=caches[0].device, dtype=torch.int64)
    dst = dst.to(device=caches[0].device, dtype=torch.int64)
    for (_, block_numel), members in groups.items():
        ptrs = torch.tensor([c.data_ptr() for c in members], dtype=torch.int64, device=members[0].device)
        chunk = min(_COPY_CHUNK, triton.next_power_of_2(block_numel))
        grid = (src.numel(), len(members), triton.cdiv(block_numel, chunk))
        _copy_blocks_kernel[grid](ptrs, members[0], src, dst, BLOCK_NUMEL=block_numel, CHUNK=chunk)
