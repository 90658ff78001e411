"""Does a decode step's time depend on more than the profile's features (decode count, KV tokens
read, longest context)? Times CUDA-graph decode batches on the live executor, back to back as
``kvrl-profile`` times its grid, for three things the fitted model cannot see:

* the KV pool's size (``kvrl-profile`` allocates most of the GPU, kvrl-fidelity's pressure
  workloads 1,024-4,096 blocks);
* how the contexts of one batch are spread (all equal, the profile's ``ragged`` spread, or drawn
  lognormal with CV 1 as the fidelity workloads' outputs are);
* the order of the blocks in the block tables (consecutive, or a random permutation of the pool).

Every batch is also priced by a profile (default: the shipped one of this device and shape); the
table gives measured / priced per row and the median ratio per variant.

    python benchmarks/decode_shape_probe.py [--model qwen3-0.6b] [--pools 1024,4096,0] [--profile auto]
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np


def lengths(kind: str, batch: int, ctx: int, rng: np.random.Generator, max_len: int) -> list[int]:
    """Context lengths of ``batch`` decodes with mean about ``ctx``: ``equal``, ``ragged`` (the
    profile's even spread over [ctx/8, 2 ctx]) or ``lognormal`` (CV 1, clipped to [16, max_len])."""
    from kvrl.profiling.batches import ragged

    if kind == "equal":
        return [ctx] * batch
    if kind == "ragged":
        return ragged(batch, ctx)
    sigma = np.sqrt(np.log(2.0))                     # CV 1
    mu = np.log(ctx) - sigma ** 2 / 2
    return [int(v) for v in np.clip(rng.lognormal(mu, sigma, batch), 16, max_len - 1)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen3-0.6b")
    ap.add_argument("--pools", default="1024,4096,0", help="KV pool sizes in blocks; 0 = what kvrl-profile takes")
    ap.add_argument("--batches", default="4,16,32,64,128")
    ap.add_argument("--ctx", default="512,1024,2048")
    ap.add_argument("--profile", default="auto")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--out", default="")
    args = ap.parse_args()

    from kvrl.executors.profile import batch_features
    from kvrl.profiling.timing import time_batch
    from probe_common import live_probe, zeroed_pool

    ex, model, full, _ = live_probe(args.model, args.profile)
    max_len = ex.max_model_len
    rows = []
    for pool in [int(p) or full for p in args.pools.split(",")]:
        factory = zeroed_pool(ex, pool, max(int(b) for b in args.batches.split(",")))
        for b in (int(x) for x in args.batches.split(",")):
            for ctx in (int(x) for x in args.ctx.split(",")):
                for kind in ("equal", "ragged", "lognormal"):
                    for scatter in (False, True):
                        rng = np.random.default_rng(b * 7919 + ctx)
                        batch = factory.batch(decode_lens=lengths(kind, b, ctx, rng, max_len), scatter=scatter)
                        f = batch_features(batch)
                        times, _ = time_batch(ex, batch, warmup=3, reps=args.reps, budget_s=0.5)
                        t = float(np.median(times))
                        p = model.predict_features(f, True) if model is not None else float("nan")
                        rows.append(dict(pool=pool, batch=b, ctx=ctx, kind=kind, scatter=scatter, t=t, priced=p,
                                         ratio=t / p, dec_kv=f["dec_kv"], dec_max=f["dec_max"]))
        print(f"pool {pool} blocks done ({time.strftime('%T')})", flush=True)
    print("\n| pool | lengths | blocks | rows | median measured / priced | p10-p90 |")
    print("|---:|---|---|---:|---:|---|")
    for pool in sorted({r["pool"] for r in rows}):
        for kind in ("equal", "ragged", "lognormal"):
            for scatter in (False, True):
                r = np.asarray([x["ratio"] for x in rows if x["pool"] == pool and x["kind"] == kind
                                and x["scatter"] == scatter])
                print(f"| {pool} | {kind} | {'scattered' if scatter else 'consecutive'} | {len(r)} | "
                      f"{np.median(r):.3f} | {np.quantile(r, 0.1):.3f}-{np.quantile(r, 0.9):.3f} |")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(rows, fh)


if __name__ == "__main__":
    main()
