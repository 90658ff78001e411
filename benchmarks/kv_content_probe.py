"""Does a step's time depend on what the KV pool holds? ``kvrl-profile`` zeroes the pool before it
times its grid, so its decode batches read zeros; a serving engine's decodes read the keys and
values its prefills wrote. This times the same batches on the live executor with the pool zeroed
and filled with N(0, 1) values (:func:`kvrl.profiling.timing.fill_kv`), in alternating rounds
(zeros, random, zeros, random, ...), back to back as the profile times its grid, and prices each
batch by a profile (default: the shipped one of this device and shape).

Batches: CUDA-graph decodes of equal and lognormal lengths, mixed steps (a prefill chunk beside
decodes), a prefill over a cached prefix and a fresh prefill.

    python benchmarks/kv_content_probe.py [--model qwen3-0.6b] [--rounds 4] [--out probe.json]
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np


def batch_specs(max_len: int, scale: int = 1) -> list[tuple[str, dict]]:
    """(kind, BatchFactory.batch kwargs) of every probed batch; ``scale`` > 1 divides batch sizes
    and lengths by it (a quick run on CPU)."""
    rng = np.random.default_rng(0)
    sigma = np.sqrt(np.log(2.0))                 # lognormal lengths with CV 1, as the fidelity workloads'

    def lognormal(b: int, ctx: int) -> list[int]:
        return [int(v) for v in np.clip(rng.lognormal(np.log(ctx) - sigma ** 2 / 2, sigma, b), 16, max_len - 1)]

    b_, n_ = (lambda b: max(b // scale, 1)), (lambda n: max(n // scale, 16))
    specs = [("decode", {"decode_lens": [n_(ctx)] * b_(b)}) for b in (1, 4, 16, 64, 128, 256)
             for ctx in (512, 1024, 2048, 4096)]
    specs += [("decode_lognormal", {"decode_lens": lognormal(b_(b), n_(ctx))}) for b in (16, 64, 128) for ctx in (1024, 2048)]
    specs += [("mixed", {"decode_lens": [n_(ctx)] * b_(b), "prefills": [(n_(256), 0)]}) for b in (16, 64)
              for ctx in (1024, 2048)]
    specs += [("prefix", {"prefills": [(n_(q), n_(4096))]}) for q in (128, 512)]
    specs += [("prefill", {"prefills": [(n_(2048), 0)]})]
    return list({json.dumps(kw): (k, kw) for k, kw in specs}.values())   # scaled sizes can coincide


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen3-0.6b")
    ap.add_argument("--rounds", type=int, default=4, help="alternating fills, starting with zeros")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--profile", default="auto")
    ap.add_argument("--out", default="")
    args = ap.parse_args()

    from kvrl.executors.profile import batch_features
    from kvrl.profiling.batches import BatchFactory
    from kvrl.profiling.timing import fill_kv, time_batch, warm_graphs
    from probe_common import BLOCK_SIZE as block_size, live_probe

    ex, model, pool, _ = live_probe(args.model, args.profile)
    max_len = ex.max_model_len
    ex.allocate_kv(pool, 64, block_size)
    ex.cpu_pool.zero_()
    factory = BatchFactory(pool, block_size, ex.vocab_size, max_len, seed=0)
    specs = [(k, kw) for k, kw in batch_specs(max_len, 1 if ex.device.type == "cuda" else 16)
             if sum(-(-n // block_size) for n in kw.get("decode_lens", ())) + 1024 < pool]
    fill_kv(ex, "zeros")
    warm_graphs(ex, factory, max(len(kw.get("decode_lens", ())) for _, kw in specs))
    times: dict[str, list[list[float]]] = {"zeros": [[] for _ in specs], "random": [[] for _ in specs]}
    for r in range(args.rounds):
        fill = ("zeros", "random")[r % 2]
        fill_kv(ex, fill, seed=r)
        for i, (_, kw) in enumerate(specs):
            ts, _ = time_batch(ex, factory.batch(**kw), warmup=3, reps=args.reps, budget_s=1.0)
            times[fill][i].append(float(np.median(ts)))
        print(f"round {r + 1}/{args.rounds} ({fill}) done ({time.strftime('%T')})", flush=True)
    rows = []
    for i, (kind, kw) in enumerate(specs):
        f = batch_features(factory.batch(**kw))
        z, rnd = float(np.mean(times["zeros"][i])), float(np.mean(times["random"][i]))
        p = model.predict_features(f, kind.startswith("decode")) if model is not None else float("nan")
        rows.append(dict(kind=kind, n_dec=f["n_dec"], dec_kv=f["dec_kv"], dec_max=f["dec_max"], pre_tok=f["pre_tok"],
                         pre_ctx=f["pre_ctx"], t_zeros=z, t_random=rnd, t_zeros_rounds=times["zeros"][i],
                         t_random_rounds=times["random"][i], priced=p))
    print("\n| kind | decodes | KV tokens | prefill tokens | zeros ms | random ms | random / zeros | zeros / priced | random / priced |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['kind']} | {r['n_dec']} | {r['dec_kv'] + r['pre_ctx']} | {r['pre_tok']} | {1e3 * r['t_zeros']:.3f} | "
              f"{1e3 * r['t_random']:.3f} | {r['t_random'] / r['t_zeros']:.3f} | {r['t_zeros'] / r['priced']:.3f} | "
              f"{r['t_random'] / r['priced']:.3f} |")
    print("\n| kind | batches | median random / zeros | min | max |")
    print("|---|---:|---:|---:|---:|")
    for kind in dict.fromkeys(r["kind"] for r in rows):
        q = np.asarray([r["t_random"] / r["t_zeros"] for r in rows if r["kind"] == kind])
        print(f"| {kind} | {len(q)} | {np.median(q):.3f} | {q.min():.3f} | {q.max():.3f} |")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(rows, fh)


if __name__ == "__main__":
    main()
