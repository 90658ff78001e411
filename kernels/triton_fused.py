"""Triton kernels fusing the small elementwise/reduction ops of a decoder layer.

* ``rms_norm``: optional residual add, then RMSNorm; one program per row.
* ``qk_norm_rotary``: optional per-head RMSNorm of q and k (Qwen3), then neox-style rotary;
  per token one program for all its q heads and one for all its k heads.
* ``silu_and_mul``: ``silu(gate) * up``; one program per (row, column chunk).

Math is float32, but every intermediate that the torch composition rounds to a lower-precision
dtype is rounded here at the same point, so the kernels follow the rounding order of
:mod:`kvrl.kernels.reference` (only reduction order and transcendental ulps differ). Kernels are
launched with ``enable_fp_fusion=False``: torch runs each multiply and add as its own kernel, so a
contracted FMA here would round differently. No host syncs: every wrapper only allocates its
outputs and launches, so all three can be captured in a CUDA graph.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

# Columns handled by one silu_and_mul program.
_SILU_BLOCK = 1024


def _accurate_exp() -> bool:
    """Use libdevice ``expf`` (what torch's CUDA silu calls) rather than the faster ``ex2.approx``
    based ``tl.exp``, whose argument scaling costs several ulps for |x| of 10 or more. The Triton
    interpreter has no libdevice, so it runs ``tl.exp``."""
    return os.environ.get("TRITON_INTERPRET") != "1"


def _num_warps(elements: int) -> int:
    """Warps for a program that holds ``elements`` values: ~256 per warp, 1 to 16 warps."""
    return max(1, min(16, triton.next_power_of_2(elements) // 256))


def _promote(*dtypes: torch.dtype) -> torch.dtype:
    out = dtypes[0]
    for d in dtypes[1:]:
        out = torch.promote_types(out, d)
    return out


# --------------------------------------------------------------------------------------------
# RMSNorm (+ residual)
# --------------------------------------------------------------------------------------------


@triton.jit
def _rms_norm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr,
    stride_x, stride_r, stride_o, stride_ro,
    N, eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr,
):
    """One program per row: ``h = x + res`` (rounded to x's dtype, stored), ``out = w * norm(h)``."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * stride_r + offs, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(res_out_ptr + row * stride_ro + offs, x, mask=mask)
    x32 = x.to(tl.float32)
    mean_sq = tl.sum(x32 * x32, axis=0) / N
    normed = (x32 * tl.math.rsqrt(mean_sq + eps)).to(x_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_o + offs, (w * normed).to(out_ptr.dtype.element_ty), mask=mask)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a 2-D ``[rows, last_dim]`` tensor with unit stride along the last dim."""
    t2 = t.reshape(-1, t.shape[-1])
    if t2.shape[-1] > 1 and t2.stride(-1) != 1:
        t2 = t2.contiguous()
    return t2


def rms_norm_triton(x, weight, eps, residual=None):
    """Triton ``rms_norm``; see :func:`kvrl.kernels.rms_norm` for the contract."""
    n = x.shape[-1]
    assert weight.shape == (n,) and weight.is_contiguous(), "weight must be contiguous [hidden]"
    out_dtype = _promote(weight.dtype, x.dtype)
    x2 = _rows(x)
    out = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    out2 = out.view(-1, n)
    if residual is not None:
        assert residual.shape == x.shape and residual.dtype == x.dtype, "residual must match x"
        r2 = _rows(residual)
        new_res = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        nr2 = new_res.view(-1, n)
    else:
        r2 = nr2 = x2  # unused (HAS_RESIDUAL=False)
    rows = x2.shape[0]
    if rows > 0:
        block = triton.next_power_of_2(n)
        _rms_norm_kernel[(rows,)](
            x2, r2, weight, out2, nr2,
            x2.stride(0), r2.stride(0), out2.stride(0), nr2.stride(0),
            n, float(eps),
            HAS_RESIDUAL=residual is not None, BLOCK=block,
            num_warps=_num_warps(block), enable_fp_fusion=False,
        )
    return out if residual is None else (out, new_res)


# --------------------------------------------------------------------------------------------
# per-head RMSNorm + rotary
# --------------------------------------------------------------------------------------------


@triton.jit
def _norm_rotate_heads(
    x_ptr, out_ptr, w_ptr, cos_ptr, sin_ptr, token,
    stride_xt, stride_xh, stride_ot, stride_oh,
    num_heads, eps,
    HAS_NORM: tl.constexpr, NORM_IN_X_DTYPE: tl.constexpr,
    HEAD_DIM: tl.constexpr, HALF: tl.constexpr, H_PAD: tl.constexpr, HALF_PAD: tl.constexpr,
):
    """All heads of one token: optional RMSNorm over ``HEAD_DIM``, then rotate-half rotary.

    Works on the two halves ``x1 = x[:HALF]``, ``x2 = x[HALF:]`` as ``[H_PAD, HALF_PAD]`` tiles:
    ``out1 = y1 * cos1 - y2 * sin1``, ``out2 = y2 * cos2 + y1 * sin2``, each product rounded to
    the output dtype before the add, as ``x * cos + rotate_half(x) * sin`` is in torch.
    """
    offs_h = tl.arange(0, H_PAD)
    offs_d = tl.arange(0, HALF_PAD)
    d_mask = offs_d < HALF
    mask = (offs_h < num_heads)[:, None] & d_mask[None, :]
    src = x_ptr + token * stride_xt + offs_h[:, None] * stride_xh + offs_d[None, :]
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
    if HAS_NORM:
        mean_sq = (tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / HEAD_DIM
        inv = tl.math.rsqrt(mean_sq + eps)[:, None]
        x_ty = x_ptr.dtype.element_ty
        y1 = (x1 * inv).to(x_ty).to(tl.float32)
        y2 = (x2 * inv).to(x_ty).to(tl.float32)
        w1 = tl.load(w_ptr + offs_d, mask=d_mask, other=0.0).to(tl.float32)[None, :]
        w2 = tl.load(w_ptr + HALF + offs_d, mask=d_mask, other=0.0).to(tl.float32)[None, :]
        y1 = w1 * y1
        y2 = w2 * y2
        if NORM_IN_X_DTYPE:  # the norm's output dtype is x's (else float32: no rounding)
            y1 = y1.to(x_ty).to(tl.float32)
            y2 = y2.to(x_ty).to(tl.float32)
    else:
        y1 = x1
        y2 = x2
    c_src = token * HEAD_DIM + offs_d
    cos1 = tl.load(cos_ptr + c_src, mask=d_mask, other=0.0).to(tl.float32)[None, :]
    cos2 = tl.load(cos_ptr + c_src + HALF, mask=d_mask, other=0.0).to(tl.float32)[None, :]
    sin1 = tl.load(sin_ptr + c_src, mask=d_mask, other=0.0).to(tl.float32)[None, :]
    sin2 = tl.load(sin_ptr + c_src + HALF, mask=d_mask, other=0.0).to(tl.float32)[None, :]
    o_ty = out_ptr.dtype.element_ty
    out1 = (y1 * cos1).to(o_ty).to(tl.float32) - (y2 * sin1).to(o_ty).to(tl.float32)
    out2 = (y2 * cos2).to(o_ty).to(tl.float32) + (y1 * sin2).to(o_ty).to(tl.float32)
    dst = out_ptr + token * stride_ot + offs_h[:, None] * stride_oh + offs_d[None, :]
    tl.store(dst, out1.to(o_ty), mask=mask)
    tl.store(dst + HALF, out2.to(o_ty), mask=mask)


@triton.jit
def _qk_norm_rotary_kernel(
    q_ptr, k_ptr, q_out_ptr, k_out_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh,
    stride_qot, stride_qoh, stride_kot, stride_koh,
    num_q_heads, num_k_heads, eps,
    HAS_NORM: tl.constexpr, NORM_IN_X_DTYPE: tl.constexpr,
    HEAD_DIM: tl.constexpr, HALF: tl.constexpr, HALF_PAD: tl.constexpr,
    HQ_PAD: tl.constexpr, HK_PAD: tl.constexpr,
):
    """Program (token, 0) does all query heads of the token, program (token, 1) all its key heads."""
    token = tl.program_id(0).to(tl.int64)
    if tl.program_id(1) == 0:
        _norm_rotate_heads(
            q_ptr, q_out_ptr, qw_ptr, cos_ptr, sin_ptr, token,
            stride_qt, stride_qh, stride_qot, stride_qoh, num_q_heads, eps,
            HAS_NORM, NORM_IN_X_DTYPE, HEAD_DIM, HALF, HQ_PAD, HALF_PAD,
        )
    else:
        _norm_rotate_heads(
            k_ptr, k_out_ptr, kw_ptr, cos_ptr, sin_ptr, token,
            stride_kt, stride_kh, stride_kot, stride_koh, num_k_heads, eps,
            HAS_NORM, NORM_IN_X_DTYPE, HEAD_DIM, HALF, HK_PAD, HALF_PAD,
        )


def qk_norm_rotary_triton(q, k, cos, sin, q_weight, k_weight, eps):
    """Triton ``qk_norm_rotary``; see :func:`kvrl.kernels.qk_norm_rotary` for the contract."""
    num_tokens, num_q_heads, head_dim = q.shape
    num_k_heads = k.shape[1]
    assert k.shape == (num_tokens, num_k_heads, head_dim) and k.dtype == q.dtype, "q/k mismatch"
    assert head_dim % 2 == 0, "rotary needs an even head_dim"
    assert cos.shape == sin.shape and cos.shape[-1] == head_dim and cos.numel() == num_tokens * head_dim
    assert cos.dtype == sin.dtype
    if q.stride(-1) != 1:
        q = q.contiguous()
    if k.stride(-1) != 1:
        k = k.contiguous()
    cos, sin = cos.contiguous(), sin.contiguous()
    has_norm = q_weight is not None
    norm_dtype = q.dtype
    if has_norm:
        assert k_weight is not None and q_weight.shape == k_weight.shape == (head_dim,)
        assert q_weight.dtype == k_weight.dtype
        q_weight, k_weight = q_weight.contiguous(), k_weight.contiguous()
        norm_dtype = _promote(q_weight.dtype, q.dtype)
        assert norm_dtype in (q.dtype, torch.float32), f"unsupported dtype mix {q.dtype} x {q_weight.dtype}"
    else:
        q_weight = k_weight = cos  # unused
    out_dtype = _promote(norm_dtype, cos.dtype)
    q_out = torch.empty(q.shape, dtype=out_dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=out_dtype, device=k.device)
    if num_tokens == 0:
        return q_out, k_out
    half = head_dim // 2
    half_pad = triton.next_power_of_2(half)
    hq_pad, hk_pad = triton.next_power_of_2(num_q_heads), triton.next_power_of_2(num_k_heads)
    _qk_norm_rotary_kernel[(num_tokens, 2)](
        q, k, q_out, k_out, q_weight, k_weight, cos, sin,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        q_out.stride(0), q_out.stride(1), k_out.stride(0), k_out.stride(1),
        num_q_heads, num_k_heads, float(eps),
        HAS_NORM=has_norm, NORM_IN_X_DTYPE=norm_dtype == q.dtype,
        HEAD_DIM=head_dim, HALF=half, HALF_PAD=half_pad, HQ_PAD=hq_pad, HK_PAD=hk_pad,
        num_warps=_num_warps(hq_pad * half_pad), enable_fp_fusion=False,
    )
    return q_out, k_out


# --------------------------------------------------------------------------------------------
# SiLU-and-mul
# --------------------------------------------------------------------------------------------


@triton.jit
def _silu_and_mul_kernel(
    x_ptr, out_ptr, stride_x, stride_o, I,
    BLOCK: tl.constexpr, ACCURATE_EXP: tl.constexpr,
):
    """Program (row, chunk): ``out[row, c] = silu(x[row, c]) * x[row, I + c]`` for its columns."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < I
    base = x_ptr + row * stride_x
    gate = tl.load(base + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(base + I + offs, mask=mask, other=0.0).to(tl.float32)
    o_ty = out_ptr.dtype.element_ty
    if ACCURATE_EXP:
        e = libdevice.exp(-gate)
    else:
        e = tl.exp(-gate)
    # torch: x / (1 + exp(-x)) with an IEEE division.
    act = tl.math.div_rn(gate, 1.0 + e).to(o_ty).to(tl.float32)
    tl.store(out_ptr + row * stride_o + offs, (act * up).to(o_ty), mask=mask)


def silu_and_mul_triton(gate_up):
    """Triton ``silu_and_mul``; see :func:`kvrl.kernels.silu_and_mul` for the contract."""
    two_i = gate_up.shape[-1]
    assert two_i % 2 == 0, "last dim must be 2 * intermediate"
    inter = two_i // 2
    x2 = _rows(gate_up)
    out = torch.empty(*gate_up.shape[:-1], inter, dtype=gate_up.dtype, device=gate_up.device)
    out2 = out.view(-1, inter)
    rows = x2.shape[0]
    if rows > 0 and inter > 0:
        block = min(_SILU_BLOCK, triton.next_power_of_2(inter))
        _silu_and_mul_kernel[(rows, triton.cdiv(inter, block))](
            x2, out2, x2.stride(0), out2.stride(0), inter,
            BLOCK=block, ACCURATE_EXP=_accurate_exp(), num_warps=_num_warps(block), enable_fp_fusion=False,
        )
    return out
