"""Pieces shared by the Triton paged-attention kernels (decode and prefill).

Device helpers address a tile of ``BLOCK_N`` consecutive token positions of one sequence through
its block table (one table lookup per token, so tiles may span several cache blocks and any
``block_size`` works), and apply one online-softmax step in the log2 domain (scores are
pre-multiplied by ``scale * log2(e)``).
"""
from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

LOG2E = math.log2(math.e)

# SM count assumed when the tensors are not on CUDA (interpreter runs): an H100/H200.
_DEFAULT_NUM_SMS = 132


@triton.jit
def kv_tile_offsets(
    block_table_ptr, offs_n, n_mask, kv_head, offs_d,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
):
    """Element offsets ``[BLOCK_N, D_PAD]`` (int64) of K/V rows for token positions ``offs_n``.

    ``block_table_ptr`` points at the sequence's block-table row; positions with ``n_mask``
    false read table entry 0 (their K/V loads must be masked by the caller).
    """
    block = tl.load(block_table_ptr + offs_n // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
    slot = block * BLOCK_SIZE + offs_n % BLOCK_SIZE
    return slot[:, None] * (NUM_KV_HEADS * HEAD_DIM) + kv_head * HEAD_DIM + offs_d[None, :]


@triton.jit
def online_softmax_step(s, v, m, l, acc, DOT_PRECISION: tl.constexpr):
    """Fold a score tile into the running softmax state.

    Args:
        s: float32 ``[M, N]`` scores in log2 units, ``-inf`` where masked. A row with no finite
            score so far keeps ``m = -inf``, ``l = 0`` and ``acc = 0`` (a key split of a prefill
            may hold no key visible to some rows).
        v: ``[N, D]`` values (cache dtype). m, l: float32 ``[M]`` running max and sum.
        acc: float32 ``[M, D]`` unnormalised output.

    Returns:
        Updated ``(m, l, acc)``.
    """
    m_new = tl.maximum(m, tl.max(s, 1))
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)   # rows with nothing visible yet stay at l = 0
    alpha = tl.exp2(m - m_ref)
    p = tl.exp2(s - m_ref[:, None])
    l = l * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return m_new, l, acc


def powers_of_two(up_to: int) -> tuple[int, ...]:
    """``(1, 2, 4, ..., up_to)``: the split counts a kernel is compiled for (``up_to`` a power of two)."""
    return tuple(1 << i for i in range(up_to.bit_length()) if 1 << i <= up_to)


def dot_precision(dtype: torch.dtype) -> str:
    """``tl.dot`` input precision: exact IEEE for float32 inputs (no TF32), native otherwise."""
    return "ieee" if dtype == torch.float32 else "tf32"


@functools.lru_cache(maxsize=None)
def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of ``device``; :data:`_DEFAULT_NUM_SMS` when it is not CUDA."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return _DEFAULT_NUM_SMS


def check_paged_inputs(q, k_cache, v_cache) -> None:
    """Assert the shape/dtype contract shared by the paged attention kernels."""
    assert k_cache.is_contiguous() and v_cache.is_contiguous(), "caches must be contiguous"
    assert k_cache.shape == v_cache.shape
    assert q.dtype == k_cache.dtype == v_cache.dtype, "q and caches must share a dtype"
    assert q.shape[-1] == k_cache.shape[3], "head_dim mismatch"
    assert q.shape[-2] % k_cache.shape[2] == 0, "num_heads must be a multiple of num_kv_heads"
