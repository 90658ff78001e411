"""Tests for the fused decoder-layer ops of :mod:`kvrl.kernels`: ``rms_norm`` (+ residual),
``qk_norm_rotary`` and ``silu_and_mul``.

1. In process: each torch reference against the unfused composition the model used before
   fusion (written out here), bitwise, in float32 and bfloat16; against float64 math with a
   tolerance; and the restructured decoder (residual add fused into the next norm) against the
   unfused ``x + attn(norm(x))``, ``x + mlp(norm(x))`` recurrence, bitwise in bfloat16.
2. The Triton kernels against the references under the Triton CPU interpreter, in one subprocess
   (``python tests/test_fused_kernels.py --triton-checks`` with ``TRITON_INTERPRET=1
   KVRL_FORCE_TRITON=1``; see tests/test_kernels.py), with torch's deterministic mode on so every
   ``torch.empty`` output starts NaN-poisoned. float32 and float16 are checked; the interpreter
   rounds bfloat16 wrongly (even a plain add), so bfloat16 is covered by
   ``benchmarks/bench_fused.py`` on a GPU.
"""
from __future__ import annotations

import json
import os
import sys

import pytest
import torch
import torch.nn.functional as F

import kvrl.kernels as K
from kvrl.kernels.reference import apply_rotary_ref, qk_norm_rotary_ref, rms_norm_ref, silu_and_mul_ref

EPS = 1e-6


# --------------------------------------------------------------------------------------------
# Unfused compositions (the model's code before fusion) and inputs
# --------------------------------------------------------------------------------------------


def unfused_rms_norm(x, weight, eps):
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def unfused_rotary(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def unfused_silu_and_mul(gate_up):
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def rope_tables(positions, head_dim, dtype, theta=1e6):
    """cos/sin ``[T, 1, head_dim]`` built like :class:`kvrl.model.layers.RotaryEmbedding`."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    freqs = positions[:, None].float() * inv_freq
    angles = torch.cat((freqs, freqs), dim=-1)[:, None, :]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def norm_inputs(num_tokens, hidden, dtype, seed=0):
    """``(x, residual, weight)``; x and residual of different scales, weight around 1."""
    g = torch.Generator().manual_seed(seed)
    x = (3 * torch.randn(num_tokens, hidden, generator=g)).to(dtype)
    residual = torch.randn(num_tokens, hidden, generator=g).to(dtype)
    weight = (1 + 0.2 * torch.randn(hidden, generator=g)).to(dtype)
    return x, residual, weight


def qk_inputs(num_tokens, num_heads, num_kv_heads, head_dim, dtype, norm=True, seed=0):
    """``(q, k, cos, sin, q_weight, k_weight)``; q/k are strided views into one QKV projection."""
    g = torch.Generator().manual_seed(seed)
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    qkv = (2 * torch.randn(num_tokens, q_size + 2 * kv_size, generator=g)).to(dtype)
    q = qkv[:, :q_size].view(num_tokens, num_heads, head_dim)
    k = qkv[:, q_size : q_size + kv_size].view(num_tokens, num_kv_heads, head_dim)
    positions = torch.randint(0, 5000, (num_tokens,), generator=g)
    cos, sin = rope_tables(positions, head_dim, dtype)
    q_weight = k_weight = None
    if norm:
        q_weight = (1 + 0.2 * torch.randn(head_dim, generator=g)).to(dtype)
        k_weight = (1 + 0.2 * torch.randn(head_dim, generator=g)).to(dtype)
    return q, k, cos, sin, q_weight, k_weight


def silu_inputs(num_tokens, inter, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (3 * torch.randn(num_tokens, 2 * inter, generator=g)).to(dtype)


DTYPES = [torch.float32, torch.bfloat16]

# --------------------------------------------------------------------------------------------
# References vs the unfused composition (in process)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 96), (37, 1024), (5, 3, 64)], ids=str)
def test_rms_norm_ref_is_bitwise_unfused(dtype, shape):
    g = torch.Generator().manual_seed(3)
    x = (3 * torch.randn(shape, generator=g)).to(dtype)
    residual = torch.randn(shape, generator=g).to(dtype)
    weight = (1 + 0.2 * torch.randn(shape[-1], generator=g)).to(dtype)
    out = rms_norm_ref(x, weight, EPS)
    assert out.dtype == dtype and torch.equal(out, unfused_rms_norm(x, weight, EPS))
    out, h = rms_norm_ref(x, weight, EPS, residual)
    # The model used to add ``hidden + layer_out`` (residual first); IEEE addition commutes.
    assert torch.equal(h, residual + x) and h.dtype == dtype
    assert torch.equal(out, unfused_rms_norm(residual + x, weight, EPS))


def test_rms_norm_ref_mixed_dtypes_and_float64_math():
    x, _, weight = norm_inputs(9, 96, torch.bfloat16)
    out = rms_norm_ref(x, weight.float(), EPS)  # fp32 weight on bf16 activations -> fp32 out
    assert out.dtype == torch.float32 and torch.equal(out, unfused_rms_norm(x, weight.float(), EPS))
    x64 = x.double()
    expected = weight.double() * x64 / torch.sqrt(x64.pow(2).mean(-1, keepdim=True) + EPS)
    torch.testing.assert_close(out.double(), expected, rtol=1e-2, atol=1e-2)
    x32, _, w32 = norm_inputs(9, 96, torch.float32)
    x64 = x32.double()
    expected = w32.double() * x64 / torch.sqrt(x64.pow(2).mean(-1, keepdim=True) + EPS)
    torch.testing.assert_close(rms_norm_ref(x32, w32, EPS).double(), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("norm", [True, False], ids=["qk_norm", "no_norm"])
@pytest.mark.parametrize("heads", [(16, 8, 128), (4, 2, 64), (3, 1, 96)], ids=str)
def test_qk_norm_rotary_ref_is_bitwise_unfused(dtype, norm, heads):
    q, k, cos, sin, qw, kw = qk_inputs(7, *heads, dtype, norm=norm)
    q_out, k_out = qk_norm_rotary_ref(q, k, cos, sin, qw, kw, EPS)
    if norm:
        q, k = unfused_rms_norm(q, qw, EPS), unfused_rms_norm(k, kw, EPS)
    assert q_out.dtype == k_out.dtype == dtype
    assert torch.equal(q_out, unfused_rotary(q, cos, sin)) and torch.equal(k_out, unfused_rotary(k, cos, sin))


def test_rotary_ref_matches_complex_rotation_float64():
    """Rotate-half rotary is a rotation of the pairs ``(x[i], x[i + D/2])`` by the angle of column i."""
    q, k, _, _, _, _ = qk_inputs(5, 4, 2, 64, torch.float64, norm=False)
    positions = torch.arange(5) * 37
    cos, sin = rope_tables(positions, 64, torch.float64)
    out = apply_rotary_ref(q, cos, sin)
    z = torch.complex(q[..., :32], q[..., 32:]) * torch.complex(cos[..., :32], sin[..., :32])
    torch.testing.assert_close(out, torch.cat((z.real, z.imag), -1), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 96), (37, 3072), (2, 3, 64)], ids=str)
def test_silu_and_mul_ref_is_bitwise_unfused(dtype, shape):
    gate_up = torch.randn(*shape[:-1], 2 * shape[-1], generator=torch.Generator().manual_seed(5)).to(dtype)
    out = silu_and_mul_ref(gate_up)
    assert out.dtype == dtype and out.shape == shape
    assert torch.equal(out, unfused_silu_and_mul(gate_up))
    g64, u64 = gate_up.double().chunk(2, -1)
    tol = 1e-6 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.double(), g64 * torch.sigmoid(g64) * u64, rtol=tol, atol=tol)


def test_public_api_on_cpu_is_the_reference(monkeypatch):
    monkeypatch.delenv("KVRL_FORCE_TRITON", raising=False)
    x, residual, weight = norm_inputs(4, 96, torch.bfloat16)
    assert torch.equal(K.rms_norm(x, weight, EPS), rms_norm_ref(x, weight, EPS))
    out, h = K.rms_norm(x, weight, EPS, residual)
    ref_out, ref_h = rms_norm_ref(x, weight, EPS, residual)
    assert torch.equal(out, ref_out) and torch.equal(h, ref_h)
    q, k, cos, sin, qw, kw = qk_inputs(4, 4, 2, 64, torch.bfloat16)
    for a, b in zip(K.qk_norm_rotary(q, k, cos, sin, qw, kw, EPS), qk_norm_rotary_ref(q, k, cos, sin, qw, kw, EPS)):
        assert torch.equal(a, b)
    gate_up = silu_inputs(4, 48, torch.bfloat16)
    assert torch.equal(K.silu_and_mul(gate_up), silu_and_mul_ref(gate_up))


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_fused_residual_decoder_is_bitwise_unfused_bf16(family):
    """The model's forward (residual adds fused into the norms) against the unfused recurrence
    ``h = h + attn(ln1(h)); h = h + mlp(ln2(h)); norm(h)`` on the same modules, bf16, CPU."""
    from kvrl.model import AttentionMetadata, CausalLM, ModelConfig
    from kvrl.model.random_checkpoint import preset_config

    config = ModelConfig.from_dict(preset_config("tiny", family=family, num_hidden_layers=3).to_dict())
    torch.manual_seed(0)
    model = CausalLM(config).to(torch.bfloat16).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.normal_(1.0, 0.3)  # ones would hide a norm-weight rounding difference
    num_tokens, block_size = 11, 4
    shape = (8, block_size, config.num_kv_heads, config.head_dim)

    def caches():
        return [(torch.zeros(shape, dtype=torch.bfloat16), torch.zeros(shape, dtype=torch.bfloat16))
                for _ in range(config.num_layers)]

    attn = AttentionMetadata(
        slot_mapping=torch.arange(num_tokens), num_prefill_tokens=num_tokens,
        prefill_cu_seqlens_q=torch.tensor([0, num_tokens], dtype=torch.int32),
        prefill_context_lens=torch.tensor([num_tokens], dtype=torch.int32),
        prefill_block_tables=torch.tensor([[0, 1, 2]], dtype=torch.int32), max_prefill_q_len=num_tokens,
        decode_context_lens=torch.zeros(0, dtype=torch.int32),
        decode_block_tables=torch.zeros(0, 1, dtype=torch.int32), block_size=block_size,
    )
    ids = torch.randint(0, config.vocab_size, (num_tokens,), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(num_tokens)
    with torch.no_grad():
        fused = model(ids, positions, caches(), attn)
        hidden = model.embed_tokens(ids)
        cos, sin = model.rotary(positions, hidden.dtype)
        for layer, kv in zip(model.layers, caches()):
            hidden = hidden + layer.self_attn(layer.input_layernorm(hidden), cos, sin, kv, attn)
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        unfused = model.norm(hidden)
    assert fused.dtype == torch.bfloat16 and torch.equal(fused, unfused)


# --------------------------------------------------------------------------------------------
# Triton kernels vs references (interpreter subprocess)
# --------------------------------------------------------------------------------------------

# name -> (kind, args); sizes cover non-power-of-2 hidden (96), head dims 64/128 (and 96: a
# padded half), non-power-of-2 head counts, T=1 and T=37, several silu column chunks.
TRITON_CASES = {
    "rms_h96_t1_fp32": ("rms", dict(num_tokens=1, hidden=96, dtype="float32")),
    "rms_h1024_t37_fp32": ("rms", dict(num_tokens=37, hidden=1024, dtype="float32")),
    "rms_h96_t37_fp16": ("rms", dict(num_tokens=37, hidden=96, dtype="float16")),
    "rms_h96_t5_fp16x_fp32w": ("rms", dict(num_tokens=5, hidden=96, dtype="float16", weight_dtype="float32")),
    "qk_h16x8_d128_t37_fp32": ("qk", dict(num_tokens=37, heads=(16, 8, 128), dtype="float32", norm=True)),
    "qk_h4x2_d64_t1_fp32": ("qk", dict(num_tokens=1, heads=(4, 2, 64), dtype="float32", norm=True)),
    "qk_h3x1_d96_t37_fp32": ("qk", dict(num_tokens=37, heads=(3, 1, 96), dtype="float32", norm=True)),
    "qk_nonorm_h6x2_d64_t37_fp32": ("qk", dict(num_tokens=37, heads=(6, 2, 64), dtype="float32", norm=False)),
    "qk_nonorm_h4x4_d128_t1_fp32": ("qk", dict(num_tokens=1, heads=(4, 4, 128), dtype="float32", norm=False)),
    "qk_h16x8_d128_t37_fp16": ("qk", dict(num_tokens=37, heads=(16, 8, 128), dtype="float16", norm=True)),
    "qk_nonorm_h4x2_d64_t37_fp16": ("qk", dict(num_tokens=37, heads=(4, 2, 64), dtype="float16", norm=False)),
    "silu_i96_t1_fp32": ("silu", dict(num_tokens=1, inter=96, dtype="float32")),
    "silu_i1500_t37_fp32": ("silu", dict(num_tokens=37, inter=1500, dtype="float32")),
    "silu_i3072_t37_fp16": ("silu", dict(num_tokens=37, inter=3072, dtype="float16")),
}


def _compare(out: torch.Tensor, ref: torch.Tensor) -> dict:
    """Errors in units of the output dtype's epsilon: ``max_ulp`` relative to each |ref| element,
    ``max_ulp_row`` relative to the largest |ref| of its last-dim row (a head, for q/k); plus the
    fraction of differing elements, exactness, finiteness and dtype/shape agreement."""
    finfo = torch.finfo(ref.dtype)
    diff = (out.double() - ref.double()).abs().nan_to_num(nan=float("inf"))
    ulp = ref.double().abs().clamp_min(finfo.tiny) * finfo.eps
    row_ulp = ref.double().abs().amax(-1, keepdim=True).clamp_min(finfo.tiny) * finfo.eps if ref.numel() else ulp
    return {
        "max_ulp": float((diff / ulp).max()) if diff.numel() else 0.0,
        "max_ulp_row": float((diff / row_ulp).max()) if diff.numel() else 0.0,
        "mismatch": float((diff > 0).double().mean()) if diff.numel() else 0.0,
        "exact": bool(torch.equal(out, ref)),
        "finite": bool(out.isfinite().all()),
        "same_meta": out.dtype == ref.dtype and out.shape == ref.shape,
    }


def _run_case(kind: str, args: dict) -> dict:
    dtype = getattr(torch, args["dtype"])
    if kind == "rms":
        x, residual, weight = norm_inputs(args["num_tokens"], args["hidden"], dtype)
        weight = weight.to(getattr(torch, args.get("weight_dtype", args["dtype"])))
        x_before, r_before = x.clone(), residual.clone()
        plain = _compare(K.rms_norm(x, weight, EPS), rms_norm_ref(x, weight, EPS))
        out, h = K.rms_norm(x, weight, EPS, residual)
        ref_out, ref_h = rms_norm_ref(x, weight, EPS, residual)
        fused = _compare(out, ref_out)
        return {
            "plain": plain, "fused": fused, "residual": _compare(h, ref_h),
            "inputs_untouched": torch.equal(x, x_before) and torch.equal(residual, r_before),
        }
    if kind == "qk":
        q, k, cos, sin, qw, kw = qk_inputs(args["num_tokens"], *args["heads"], dtype, norm=args["norm"])
        q_out, k_out = K.qk_norm_rotary(q, k, cos, sin, qw, kw, EPS)
        q_ref, k_ref = qk_norm_rotary_ref(q, k, cos, sin, qw, kw, EPS)
        return {"q": _compare(q_out, q_ref), "k": _compare(k_out, k_ref)}
    gate_up = silu_inputs(args["num_tokens"], args["inter"], dtype)
    return {"out": _compare(K.silu_and_mul(gate_up), silu_and_mul_ref(gate_up))}


def triton_checks_main() -> None:
    """Subprocess entry point: run every Triton case, print ``{name: result}`` as JSON."""
    assert os.environ.get("TRITON_INTERPRET") == "1" and K.use_triton(torch.zeros(1))
    torch.use_deterministic_algorithms(True)  # torch.empty -> NaN: poisons kernel outputs
    results = {name: _run_case(kind, args) for name, (kind, args) in TRITON_CASES.items()}
    # Empty batches launch nothing and return empty outputs of the right shape.
    e = torch.zeros(0, 96)
    q0, k0 = K.qk_norm_rotary(torch.zeros(0, 2, 64), torch.zeros(0, 1, 64), torch.zeros(0, 1, 64),
                              torch.zeros(0, 1, 64), None, None, EPS)
    results["empty"] = {"ok": K.rms_norm(e, torch.ones(96), EPS).shape == (0, 96)
                        and K.rms_norm(e, torch.ones(96), EPS, e)[1].shape == (0, 96)
                        and q0.shape == (0, 2, 64) and k0.shape == (0, 1, 64)
                        and K.silu_and_mul(torch.zeros(0, 8)).shape == (0, 4)}
    results["dispatch"] = {"ok": "kvrl.kernels.triton_fused" in sys.modules}
    print(json.dumps(results))


@pytest.fixture(scope="module")
def triton_results() -> dict:
    from tests.helpers import run_triton_checks

    return run_triton_checks(__file__, timeout=600)


def _assert_close(r: dict, max_ulp: float, key: str = "max_ulp") -> None:
    assert r["finite"] and r["same_meta"], r
    assert r[key] <= max_ulp, r


@pytest.mark.parametrize("name", [n for n, (kind, _) in TRITON_CASES.items() if kind == "rms"])
def test_triton_rms_norm(triton_results, name):
    r = triton_results[name]
    # Only the sum-of-squares order (and rsqrt) differ from torch: a few ulps at most.
    _assert_close(r["plain"], 4)
    _assert_close(r["fused"], 4)
    assert r["residual"]["exact"], r  # x + residual is a single rounding either way
    assert r["inputs_untouched"]


@pytest.mark.parametrize("name", [n for n, (kind, _) in TRITON_CASES.items() if kind == "qk"])
def test_triton_qk_norm_rotary(triton_results, name):
    r = triton_results[name]
    norm = TRITON_CASES[name][1]["norm"]
    for part in ("q", "k"):
        if norm:
            # A rotated output is a sum of two products that may cancel, so an ulp of difference
            # in the normed input is measured against the head's largest output.
            _assert_close(r[part], 4, key="max_ulp_row")
            assert r[part]["mismatch"] < 0.5, r
        else:
            # No reduction: same roundings in the same order as torch, so bitwise equal.
            assert r[part]["exact"] and r[part]["same_meta"], r


@pytest.mark.parametrize("name", [n for n, (kind, _) in TRITON_CASES.items() if kind == "silu"])
def test_triton_silu_and_mul(triton_results, name):
    # exp differs from torch's by an ulp at most; fp16 output rounding may then flip one ulp.
    _assert_close(triton_results[name]["out"], 4)


@pytest.mark.parametrize("name", ["empty", "dispatch"])
def test_triton_misc(triton_results, name):
    assert triton_results[name]["ok"]


if __name__ == "__main__" and sys.argv[1:] == ["--triton-checks"]:
    triton_checks_main()
