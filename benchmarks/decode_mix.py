"""Decode attention on a batch of *mixed* context lengths (as in serving), per split count.

    python benchmarks/decode_mix.py    # prints a Markdown table

Contexts are uniform in [lo, hi] (default [100, 2048], the kvrl-bench workload's range); block
tables are padded to the width the live executor's CUDA graphs use (max_model_len / block_size).
"""
from __future__ import annotations

import argparse

import torch
import triton.testing

from kvrl.kernels.triton_decode import paged_decode_attention_triton, pick_num_splits
from kvrl.kernels.triton_common import num_sms


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--lo", type=int, default=100)
    ap.add_argument("--hi", type=int, default=2048)
    ap.add_argument("--width", type=int, default=129, help="block-table width (blocks)")
    args = ap.parse_args()
    dev = torch.device("cuda")
    heads, kvh, d, bs = 16, 8, 128, 16
    rows = []
    for batch in args.batch:
        g = torch.Generator(device="cpu").manual_seed(batch)
        ctx = torch.randint(args.lo, args.hi + 1, (batch,), generator=g).to(torch.int32)
        blocks_needed = int(((ctx + bs - 1) // bs).sum())
        perm = torch.randperm(blocks_needed + 1, generator=g)[:blocks_needed] + 1
        tables = torch.zeros((batch, args.width), dtype=torch.int32)
        off = 0
        for i, c in enumerate(ctx.tolist()):
            n = (c + bs - 1) // bs
            tables[i, :n] = perm[off:off + n]
            off += n
        kc = torch.randn(blocks_needed + 1, bs, kvh, d, dtype=torch.bfloat16, device=dev)
        vc = torch.randn_like(kc)
        q = torch.randn(batch, heads, d, dtype=torch.bfloat16, device=dev)
        tables, ctx_d = tables.to(dev), ctx.to(dev)
        nbytes = int(ctx.sum()) * kvh * d * 2 * 2 + 2 * q.numel() * 2
        default = pick_num_splits(batch, kvh, args.width * bs, num_sms(dev))
        for splits in sorted({1, 2, 3, 4, 5, 8, default}):
            ms = triton.testing.do_bench(
                lambda: paged_decode_attention_triton(q, kc, vc, tables, ctx_d, d ** -0.5, splits),
                warmup=25, rep=200, return_mode="median")
            rows.append((batch, splits, "default" if splits == default else "", ms * 1e3, nbytes / ms / 1e6))
    print("| batch | splits | | time (us) | GB/s |\n|---:|---:|---|---:|---:|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]:.1f} | {r[4]:.0f} |")


if __name__ == "__main__":
    main()
