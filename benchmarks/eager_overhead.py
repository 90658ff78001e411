"""Where does an eager (non-CUDA-graph) step of the live executor spend its time?

A mixed step (a prefill chunk plus decodes) of Qwen3-0.6B took ~20 ms on an H200 whatever its
token count while a CUDA-graph decode step took ~2 ms: the eager path is bound by the host that
issues the kernels. This script measures, per batch shape: `execute` wall time, the time until
`_forward` returns on the host (kernels issued, nothing awaited) and the GPU time of its kernels
(CUDA events around the forward pass with the host far ahead), then the host cost of one call of
each kernel wrapper alone, a cProfile of eager steps and the torch profiler's per-op host time.

    python benchmarks/eager_overhead.py [--model qwen3-0.6b] [--out eager.md]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

import numpy as np
import torch
from omegaconf import OmegaConf

from kvrl.executors.live_build import build_live
from kvrl.profiling.batches import BatchFactory

SHAPES = {
    "prefill 64 + 32 decodes @1024": dict(decode_lens=[1024] * 32, prefills=[(64, 0)]),
    "prefill 1024 + 64 decodes @1024": dict(decode_lens=[1024] * 64, prefills=[(1024, 0)]),
    "prefill 512": dict(prefills=[(512, 0)]),
    "4 prefills x 256 over 1024 cached": dict(prefills=[(256, 1024)] * 4),
}


def timed(fn, reps: int) -> float:
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def shape_rows(ex, factory: BatchFactory, reps: int) -> list[str]:
    rows = ["| batch | execute ms | host issue ms | GPU ms (events) |", "|---|---:|---:|---:|"]
    for name, spec in SHAPES.items():
        batch = factory.batch(**spec)
        for _ in range(3):
            ex.execute(batch)
        t_exec = timed(lambda: ex.execute(batch), reps)
        issue, gpu = [], []
        for _ in range(reps):
            torch.cuda.synchronize()
            # park the GPU on a long kernel so the whole forward is issued before any of it runs
            torch.cuda._sleep(50_000_000)
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            t0 = time.perf_counter()
            with torch.inference_mode():
                ex._forward(batch)
            issue.append(time.perf_counter() - t0)
            e1.record()
            torch.cuda.synchronize()
            gpu.append(e0.elapsed_time(e1) / 1e3)
        rows.append(f"| {name} | {t_exec * 1e3:.2f} | {np.median(issue) * 1e3:.2f} | {np.median(gpu) * 1e3:.2f} |")
    return rows


def op_rows(ex, reps: int = 200) -> list[str]:
    """Host time of one call of each kernel wrapper (GPU kept busy so launches never wait)."""
    from kvrl import kernels

    cfg, dev, dt = ex.config, ex.device, ex.dtype
    T, H, KV, D = 96, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    x = torch.randn(T, cfg.hidden_size, device=dev, dtype=dt)
    w = torch.ones(cfg.hidden_size, device=dev, dtype=dt)
    q = torch.randn(T, H, D, device=dev, dtype=dt)
    k = torch.randn(T, KV, D, device=dev, dtype=dt)
    cos = torch.randn(T, 1, D, device=dev, dtype=dt)
    hw = torch.ones(D, device=dev, dtype=dt)
    gu = torch.randn(T, 2 * cfg.intermediate_size, device=dev, dtype=dt)
    kc, vc = ex.kv_caches[0]
    slots = torch.arange(T, device=dev, dtype=torch.int64)
    tables = torch.arange(64 * 64, device=dev, dtype=torch.int32).view(64, 64) % kc.shape[0]
    lens = torch.full((64,), 1024, device=dev, dtype=torch.int32)
    cu = torch.tensor([0, 64], device=dev, dtype=torch.int32)
    plens = torch.tensor([64], device=dev, dtype=torch.int32)
    lin = ex.model.layers[0].mlp.down_proj
    xi = torch.randn(T, cfg.intermediate_size, device=dev, dtype=dt)
    ops = {
        "rms_norm": lambda: kernels.rms_norm(x, w, 1e-6),
        "rms_norm + residual": lambda: kernels.rms_norm(x, w, 1e-6, x),
        "qk_norm_rotary": lambda: kernels.qk_norm_rotary(q, k, cos, cos, hw, hw, 1e-6),
        "store_kv": lambda: kernels.store_kv(k, k, kc, vc, slots),
        "decode attention (64 x 1024)": lambda: kernels.paged_decode_attention(q[:64], kc, vc, tables, lens, 0.1),
        "prefill attention (64 tokens)": lambda: kernels.paged_prefill_attention(q[:64], kc, vc, tables[:1], cu, plens, 0.1, 64),
        "silu_and_mul": lambda: kernels.silu_and_mul(gu),
        "torch linear (down_proj)": lambda: lin(xi),
        "torch.cat": lambda: torch.cat([q[:32], q[32:]]),
    }
    rows = ["| op | host us per call |", "|---|---:|"]
    with torch.inference_mode():
        for name, fn in ops.items():
            for _ in range(5):
                fn()
            torch.cuda.synchronize()
            torch.cuda._sleep(200_000_000)
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            rows.append(f"| {name} | {(time.perf_counter() - t0) / reps * 1e6:.1f} |")
            torch.cuda.synchronize()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen3-0.6b")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default="eager.md")
    ap.add_argument("--no-piecewise", action="store_true", help="the plain eager forward pass")
    args = ap.parse_args()
    model = OmegaConf.to_container(OmegaConf.load(f"conf/model/{args.model}.yaml"), resolve=True)
    ex = build_live(model, {"device": "cuda", "dtype": "auto", "cuda_graphs": True})
    ex.use_piecewise = not args.no_piecewise
    ex.allocate_kv(4096, 0, 16)
    factory = BatchFactory(4096, 16, ex.vocab_size, 8192)
    pw = ex._piecewise
    lines = [f"# Eager step overhead: {args.model} on {torch.cuda.get_device_name()}", "",
             f"torch {torch.__version__}; piecewise graphs: "
             + (f"{len(pw.sizes)} token sizes up to {pw.sizes[-1]}, captured in {pw.capture_s:.1f} s" if pw else "off"), ""]
    lines += shape_rows(ex, factory, args.reps) + [""]
    lines += op_rows(ex) + [""]
    batch = factory.batch(**SHAPES["prefill 64 + 32 decodes @1024"])
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(20):
        ex.execute(batch)
    prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(35)
    lines += ["## cProfile, 20 eager steps (prefill 64 + 32 decodes), by own time", "", "```", s.getvalue(), "```", ""]
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        for _ in range(10):
            ex.execute(batch)
    lines += ["## torch profiler, 10 eager steps", "", "```",
              p.key_averages().table(sort_by="self_cpu_time_total", row_limit=30), "```"]
    text = "\n".join(lines)
    print(text)
    with open(args.out, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
