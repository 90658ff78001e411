"""Benchmark (and GPU-check) the fused decoder-layer kernels of kvrl on one CUDA device.

Usage: ``python benchmarks/bench_fused.py [--tokens 256] [--out FILE] [--check-only]``

Shape: one Qwen3-0.6B decoder layer (hidden 1024, 16 query / 8 kv heads, head_dim 128,
intermediate 3072, eps 1e-6), bf16, ``--tokens`` rows (a decode batch of that size).

1. Agreement of each fused kernel with its torch reference (the unfused ops the model used to run)
   on the GPU, bf16 and fp32, NaN-poisoned outputs: the residual stream and the norm-free rotary
   must be bitwise equal; the rest within a few output ulps (``max_ulp``: error / (eps * |ref|),
   for q/k relative to the head's largest |ref|, since a rotated value is a sum of two products
   that may cancel).
2. Time of the non-attention elementwise ops of one layer, fused vs unfused: each op alone, all of
   them in sequence, and the layer without attention (GEMMs + elementwise; the attention output is
   replaced by q). Timed the way a decode step runs: ``CALLS`` calls captured in one CUDA graph,
   replayed, median per call (``graph us``); ``eager us`` is ``triton.testing.do_bench`` (median,
   L2 flushed, launch overhead included).

``--check-only`` skips the timing; with ``--device cpu`` and ``TRITON_INTERPRET=1
KVRL_FORCE_TRITON=1`` it smoke-tests part 1 on a CPU (fp32 only: the interpreter rounds bf16 wrongly).
A Markdown table is printed last (and written to ``--out`` when given).
"""
from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass

import torch

import kvrl.kernels as K
from kvrl.kernels.reference import qk_norm_rotary_ref, rms_norm_ref, silu_and_mul_ref

HIDDEN, NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, INTER, EPS = 1024, 16, 8, 128, 3072, 1e-6
CALLS = 20  # calls per captured graph


@dataclass
class Row:
    name: str
    config: str
    graph_us: float | None = None
    eager_us: float | None = None
    speedup: float | None = None
    max_ulp: float | None = None
    mismatch: float | None = None
    ok: bool | None = None


# --------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------


class Layer:
    """Random activations and weights of one Qwen3-0.6B-shaped layer, ``tokens`` rows."""

    def __init__(self, tokens: int, dtype: torch.dtype, device: torch.device, seed: int = 0):
        g = torch.Generator(device="cpu").manual_seed(seed)

        def rnd(*shape, scale=1.0, mean=0.0):
            return (mean + scale * torch.randn(*shape, generator=g)).to(device=device, dtype=dtype)

        q_size, kv_size = NUM_HEADS * HEAD_DIM, NUM_KV_HEADS * HEAD_DIM
        self.q_size, self.kv_size = q_size, kv_size
        self.x = rnd(tokens, HIDDEN, scale=0.5)  # output of the previous sublayer
        self.residual = rnd(tokens, HIDDEN, scale=2.0)
        self.w_in, self.w_post = rnd(HIDDEN, scale=0.2, mean=1.0), rnd(HIDDEN, scale=0.2, mean=1.0)
        self.qw, self.kw = rnd(HEAD_DIM, scale=0.2, mean=1.0), rnd(HEAD_DIM, scale=0.2, mean=1.0)
        self.qkv = rnd(tokens, q_size + 2 * kv_size, scale=2.0)
        self.gate_up = rnd(tokens, 2 * INTER, scale=2.0)
        positions = torch.randint(0, 4096, (tokens,), generator=g)
        inv_freq = 1.0 / (1e6 ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.int64).float() / HEAD_DIM))
        freqs = positions[:, None].float() * inv_freq
        angles = torch.cat((freqs, freqs), -1)[:, None, :].to(device)
        self.cos, self.sin = angles.cos().to(dtype), angles.sin().to(dtype)
        # GEMM weights for the layer-without-attention timing (nn.Linear layout [out, in]).
        self.w_qkv = rnd(q_size + 2 * kv_size, HIDDEN, scale=HIDDEN**-0.5)
        self.w_o = rnd(HIDDEN, q_size, scale=q_size**-0.5)
        self.w_gu = rnd(2 * INTER, HIDDEN, scale=HIDDEN**-0.5)
        self.w_down = rnd(HIDDEN, INTER, scale=INTER**-0.5)

    def qk(self, qkv=None):
        qkv = self.qkv if qkv is None else qkv
        t = qkv.shape[0]
        q = qkv[:, : self.q_size].view(t, NUM_HEADS, HEAD_DIM)
        k = qkv[:, self.q_size : self.q_size + self.kv_size].view(t, NUM_KV_HEADS, HEAD_DIM)
        return q, k


# --------------------------------------------------------------------------------------------
# Part 1: agreement
# --------------------------------------------------------------------------------------------


def compare(out: torch.Tensor, ref: torch.Tensor, per_row: bool = False) -> tuple[float, float, bool]:
    """(max_ulp, fraction of differing elements, exact) of ``out`` against ``ref``."""
    finfo = torch.finfo(ref.dtype)
    diff = (out.double() - ref.double()).abs().nan_to_num(nan=float("inf"))
    scale = ref.double().abs()
    if per_row:
        scale = scale.amax(-1, keepdim=True)
    ulp = float((diff / (scale.clamp_min(finfo.tiny) * finfo.eps)).max())
    assert out.dtype == ref.dtype and out.shape == ref.shape, (out.dtype, ref.dtype, out.shape, ref.shape)
    return ulp, float((diff > 0).double().mean()), bool(torch.equal(out, ref))


def check_row(name, config, out, ref, max_ulp=None, exact=False, per_row=False) -> Row:
    ulp, mismatch, is_exact = compare(out, ref, per_row)
    ok = is_exact if exact else (ulp <= max_ulp)
    return Row(name, config + (", exact" if exact else f", <= {max_ulp} ulp"), max_ulp=ulp, mismatch=mismatch, ok=ok)


def agreement(tokens: int, device: torch.device, dtypes) -> list[Row]:
    rows = []
    torch.use_deterministic_algorithms(True)  # torch.empty -> NaN: poisoned kernel outputs
    try:
        for dtype in dtypes:
            L = Layer(tokens, dtype, device, seed=1)
            cfg = f"{str(dtype).split('.')[1]}, T={tokens}"
            out = K.rms_norm(L.x, L.w_in, EPS)
            rows.append(check_row("rms_norm", cfg, out, rms_norm_ref(L.x, L.w_in, EPS), max_ulp=4))
            out, h = K.rms_norm(L.x, L.w_in, EPS, L.residual)
            ref_out, ref_h = rms_norm_ref(L.x, L.w_in, EPS, L.residual)
            rows.append(check_row("rms_norm+residual: out", cfg, out, ref_out, max_ulp=4))
            rows.append(check_row("rms_norm+residual: residual", cfg, h, ref_h, exact=True))
            q, k = L.qk()
            for norm in (True, False):
                ws = (L.qw, L.kw) if norm else (None, None)
                outs = K.qk_norm_rotary(q, k, L.cos, L.sin, *ws, EPS)
                refs = qk_norm_rotary_ref(q, k, L.cos, L.sin, *ws, EPS)
                for part, o, r in zip("qk", outs, refs):
                    name = f"qk_norm_rotary: {part}" if norm else f"rotary (no norm): {part}"
                    if norm:
                        rows.append(check_row(name, cfg + ", head-relative", o, r, max_ulp=4, per_row=True))
                    else:
                        rows.append(check_row(name, cfg, o, r, exact=True))
            rows.append(check_row("silu_and_mul", cfg, K.silu_and_mul(L.gate_up), silu_and_mul_ref(L.gate_up),
                                  max_ulp=4))
    finally:
        torch.use_deterministic_algorithms(False)
    return rows


# --------------------------------------------------------------------------------------------
# Part 2: timing
# --------------------------------------------------------------------------------------------


def graph_us(fn, calls: int = CALLS, reps: int = 30) -> float:
    """Median time per call (us) of ``fn`` replayed from a CUDA graph of ``calls`` calls."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):  # compile / autotune outside the capture
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    for _ in range(5):
        graph.replay()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / calls)
    return statistics.median(times)


def eager_us(fn) -> float:
    import triton.testing

    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1000


def timing(tokens: int, device: torch.device) -> list[Row]:
    L = Layer(tokens, torch.bfloat16, device)
    q, k = L.qk()

    def fused_elementwise():
        h, res = K.rms_norm(L.x, L.w_in, EPS, L.residual)
        qr, kr = K.qk_norm_rotary(q, k, L.cos, L.sin, L.qw, L.kw, EPS)
        h2, res2 = K.rms_norm(L.x, L.w_post, EPS, res)
        return K.silu_and_mul(L.gate_up)

    def unfused_elementwise():
        h, res = rms_norm_ref(L.x, L.w_in, EPS, L.residual)
        qr, kr = qk_norm_rotary_ref(q, k, L.cos, L.sin, L.qw, L.kw, EPS)
        h2, res2 = rms_norm_ref(L.x, L.w_post, EPS, res)
        return silu_and_mul_ref(L.gate_up)

    def layer(norm, qk_rot, act):
        def run():
            h, res = norm(L.x, L.w_in, EPS, L.residual)
            qa, ka = L.qk(h @ L.w_qkv.T)
            qa, ka = qk_rot(qa, ka, L.cos, L.sin, L.qw, L.kw, EPS)
            o = qa.reshape(tokens, -1) @ L.w_o.T  # attention output stand-in
            h, res = norm(o, L.w_post, EPS, res)
            return act(h @ L.w_gu.T) @ L.w_down.T, res
        return run

    cases = [
        ("rms_norm+residual", lambda: K.rms_norm(L.x, L.w_in, EPS, L.residual),
         lambda: rms_norm_ref(L.x, L.w_in, EPS, L.residual)),
        ("rms_norm (first layer / no residual)", lambda: K.rms_norm(L.x, L.w_in, EPS),
         lambda: rms_norm_ref(L.x, L.w_in, EPS)),
        ("qk_norm_rotary", lambda: K.qk_norm_rotary(q, k, L.cos, L.sin, L.qw, L.kw, EPS),
         lambda: qk_norm_rotary_ref(q, k, L.cos, L.sin, L.qw, L.kw, EPS)),
        ("rotary (no norm)", lambda: K.qk_norm_rotary(q, k, L.cos, L.sin, None, None, EPS),
         lambda: qk_norm_rotary_ref(q, k, L.cos, L.sin, None, None, EPS)),
        ("silu_and_mul", lambda: K.silu_and_mul(L.gate_up), lambda: silu_and_mul_ref(L.gate_up)),
        ("all elementwise ops of a layer", fused_elementwise, unfused_elementwise),
        ("layer without attention (4 GEMMs)", layer(K.rms_norm, K.qk_norm_rotary, K.silu_and_mul),
         layer(rms_norm_ref, qk_norm_rotary_ref, silu_and_mul_ref)),
    ]
    rows = []
    cfg = f"bf16, T={tokens}"
    for name, fused, unfused in cases:
        tf, tu = graph_us(fused), graph_us(unfused)
        ef, eu = eager_us(fused), eager_us(unfused)
        rows.append(Row(f"{name}: unfused", cfg, graph_us=tu, eager_us=eu))
        rows.append(Row(f"{name}: fused", cfg, graph_us=tf, eager_us=ef, speedup=tu / tf))
    # The layer outputs agree too (bf16; the GEMM inputs differ by the kernels' ulps).
    out_f, _ = cases[-1][1]()
    out_u, _ = cases[-1][2]()
    rel = float((out_f.float() - out_u.float()).norm() / out_u.float().norm())
    rows.append(Row("layer without attention: fused vs unfused output", cfg + ", rel err < 1e-2", ok=rel < 1e-2,
                    mismatch=rel))
    return rows


# --------------------------------------------------------------------------------------------


def fmt(v, spec):
    return "" if v is None else format(v, spec)


def markdown(rows: list[Row]) -> str:
    lines = [
        "| case | config | graph us | eager us | speedup (graph) | max ulp | mismatch / rel | ok |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        ok = "" if r.ok is None else ("yes" if r.ok else "**NO**")
        lines.append(f"| {r.name} | {r.config} | {fmt(r.graph_us, '.2f')} | {fmt(r.eager_us, '.2f')} | "
                     f"{fmt(r.speedup, '.2f')} | {fmt(r.max_ulp, '.2f')} | {fmt(r.mismatch, '.3g')} | {ok} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=256, help="rows (decode batch size)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--check-only", action="store_true", help="skip the timing")
    parser.add_argument("--out", help="also write the Markdown table to this file")
    args = parser.parse_args()
    device = torch.device(args.device)
    if not K.use_triton(torch.zeros(1, device=device)):
        raise SystemExit("the fused ops would run their torch references: use a CUDA device or KVRL_FORCE_TRITON=1")
    dtypes = [torch.float32] if device.type == "cpu" else [torch.bfloat16, torch.float32]
    rows = agreement(args.tokens, device, dtypes)
    for r in rows:
        print(f"check {r.name} [{r.config}]: max_ulp={r.max_ulp:.2f} mismatch={r.mismatch:.3g} ok={r.ok}", flush=True)
    if not args.check_only:
        rows += timing(args.tokens, device)
    table = markdown(rows)
    print()
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + "\n")
    if not all(r.ok for r in rows if r.ok is not None):
        raise SystemExit("some checks failed")


if __name__ == "__main__":
    main()
