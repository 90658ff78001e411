"""Prefill attention with key splits vs without, on the GPU: time and agreement.

Short queries over long cached prefixes leave most SMs idle when each (head, query tile) walks its
whole context in one program; `pick_prefill_splits` then splits the keys. For each shape this
times one layer's prefill attention with `num_splits=1` and with the automatic choice (CUDA
events, median of 20) and reports the largest absolute difference of their outputs.

    python benchmarks/prefill_splits.py [--out prefill_splits.md]
"""
from __future__ import annotations

import argparse

import numpy as np
import torch

from kvrl.kernels.triton_common import num_sms
from kvrl.kernels.triton_prefill import paged_prefill_attention_triton, pick_prefill_splits

SHAPES = [  # (query tokens per sequence, cached tokens, sequences)
    (16, 1024, 1), (16, 16384, 1), (128, 4096, 1), (512, 16384, 1), (256, 1024, 4), (200, 2048, 2),
    (2048, 0, 1), (64, 8192, 8), (128, 2048, 1), (32, 8192, 4), (16, 4096, 16),
]


def run(dtype: torch.dtype, heads: int = 16, kv_heads: int = 8, dim: int = 128, block: int = 16) -> list[str]:
    dev = torch.device("cuda")
    rows = []
    for q_len, cached, seqs in SHAPES:
        ctx = q_len + cached
        nb = -(-ctx // block)
        k_cache = torch.randn(nb * seqs + 1, block, kv_heads, dim, device=dev, dtype=dtype)
        v_cache = torch.randn_like(k_cache)
        tables = torch.arange(nb * seqs, device=dev, dtype=torch.int32).view(seqs, nb)
        q = torch.randn(q_len * seqs, heads, dim, device=dev, dtype=dtype)
        cu = torch.arange(0, (seqs + 1) * q_len, q_len, device=dev, dtype=torch.int32)
        lens = torch.full((seqs,), ctx, device=dev, dtype=torch.int32)
        block_m = 32 if dtype == torch.float32 else 64
        auto = pick_prefill_splits(heads, q_len, seqs, nb * block, block_m, num_sms(dev))
        outs, times = {}, {}
        for splits in sorted({1, auto}):
            fn = lambda: paged_prefill_attention_triton(q, k_cache, v_cache, tables, cu, lens, dim ** -0.5, q_len,
                                                        num_splits=splits)
            outs[splits] = fn()
            ts = []
            for _ in range(20):
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                fn()
                e1.record()
                torch.cuda.synchronize()
                ts.append(e0.elapsed_time(e1) * 1e3)
            times[splits] = float(np.median(ts))
        diff = float((outs[auto].float() - outs[1].float()).abs().max())
        rows.append(f"| {str(dtype).replace('torch.', '')} | {q_len} x {seqs} over {cached} | {auto} | "
                    f"{times[1]:.1f} | {times[auto]:.1f} | {times[1] / times[auto]:.2f}x | {diff:.2e} |")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="prefill_splits.md")
    args = ap.parse_args()
    lines = [f"# Prefill attention key splits on {torch.cuda.get_device_name()} (one layer, 16 heads / 8 kv heads x 128)",
             "", f"torch {torch.__version__}", "",
             "| dtype | queries x seqs over cached | splits (auto) | 1 split us | auto us | speed-up | max abs diff |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for dtype in (torch.bfloat16, torch.float32):
        lines += run(dtype)
    text = "\n".join(lines)
    print(text)
    with open(args.out, "w") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()
