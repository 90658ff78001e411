"""Does a shared KV token cost the same whatever the number of decodes that share it?

The step model prices a decode's KV tokens that sit in prefix-cache blocks (``dec_shared``) at one
price, fitted by ``kvrl-profile`` on batches whose decodes all read *one* common prefix (16 or 64
readers of every shared block). Serving shares less: 16 tenants' system prompts in a batch of 30
decodes give each shared block two or three readers. If a shared block is cheap because its later
readers find it in the GPU's L2 cache, its price depends on how many decodes read it (the *degree*):
with one reader it costs what a private token costs.

This times CUDA-graph decode batches on the live executor, back to back as ``kvrl-profile`` times its
grid: for each batch size, context and shared prefix, the private batch (no shared blocks), and the
same contexts whose first ``prefix`` tokens are shared by ``degree`` decodes each (``prefix_groups``
= batch / degree sets of blocks; degree 1: every decode has its own prefix blocks, marked shared).
Every batch is priced by a profile (default: the shipped one of this device and shape).

    python benchmarks/shared_degree_probe.py [--model qwen3-0.6b] [--out probe.json]
    python benchmarks/shared_degree_probe.py --table probe.json [--price NAME=profile.json ...]   # CPU

``--table`` prints a committed run's summary per degree: each variant's time over the private batch's, and
measured over priced by each ``--price`` profile (the batches rebuilt on the CPU, as the run built them).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from probe_common import BLOCK_SIZE


def rebuild(row: dict, pool_blocks: int, vocab_size: int):
    """The batch of one committed row, as the probe built it."""
    from kvrl.profiling.batches import BatchFactory

    b, degree = row["batch"], row["degree"]
    factory = BatchFactory(pool_blocks, BLOCK_SIZE, vocab_size, max(row["ctx"], 1) + 1, seed=0)
    return factory.batch(decode_lens=[row["ctx"]] * b, shared_prefix=row["prefix"] if degree else 0,
                         prefix_groups=b // degree if degree else 1)


def table(path: Path, prices: list[str]) -> str:
    """:func:`summary` of a committed run, priced by each ``NAME=profile.json`` of ``prices``."""
    from kvrl.executors.profile import StepProfile

    models = {name: StepProfile.load(p).model for name, p in (x.split("=", 1) for x in prices)}
    return summary(json.loads(path.read_text()), models)


def summary(d: dict, models: dict) -> str:
    """A run's summary (``d``: its JSON; see the module doc), one row per degree (0: the private batches),
    priced by each step model of ``models`` (name -> model)."""
    from kvrl.executors.hardware import MODEL_SHAPES
    from kvrl.executors.profile import batch_features

    vocab_size = d.get("vocab_size") or MODEL_SHAPES[d["model"]].vocab_size   # runs before session 38 name a shipped shape
    cells: dict = {}
    for r in d["rows"]:
        f = batch_features(rebuild(r, d["pool_blocks"], vocab_size))
        if f["dec_shared"] != r["dec_shared"]:
            raise SystemExit(f"a rebuilt batch differs from the run's ({r})")
        cells.setdefault(r["degree"], []).append(
            (r, [r["t"] / m.predict_features(f, True) for m in models.values()]))
    private = {(r["batch"], r["ctx"], r["prefix"]): r["t"] for r, _ in cells.get(0, [])}
    head = ["readers of each shared block", "batches", "measured / the private batch"]
    head += [f"measured / {name}'s price" for name in models]
    lines = ["| " + " | ".join(head) + " |", "|---|---:|" + "---:|" * (len(head) - 2)]
    for degree in sorted(cells):
        rows = cells[degree]
        own = [r["t"] / private[(r["batch"], r["ctx"], r["prefix"])] for r, _ in rows]
        ratios = [f"{np.median([x[i] for _, x in rows]):.3f}" for i in range(len(models))]
        label = "none (private)" if degree == 0 else str(degree) + (
            " (every decode of the batch)" if all(r["batch"] == degree for r, _ in rows) else "")
        lines.append("| " + " | ".join([label, str(len(rows)), f"{np.median(own):.3f}", *ratios]) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen3-0.6b")
    ap.add_argument("--batches", default="16,32,64")
    ap.add_argument("--ctx", default="1024,2048")
    ap.add_argument("--prefix", default="512,1024")
    ap.add_argument("--degrees", default="1,2,4,8,all")
    ap.add_argument("--profile", default="auto")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--out", default="")
    ap.add_argument("--table", type=Path, default=None, help="print a committed run's summary (CPU) and stop")
    ap.add_argument("--price", nargs="*", default=[], help="NAME=profile.json to price --table's batches with")
    args = ap.parse_args()
    if args.table:
        print(table(args.table, args.price))
        return

    from kvrl.executors.profile import batch_features
    from kvrl.profiling.timing import time_batch
    from probe_common import live_probe, zeroed_pool

    ex, model, pool, cost_source = live_probe(args.model, args.profile)
    batches = [int(x) for x in args.batches.split(",")]
    factory = zeroed_pool(ex, pool, max(batches))
    rows = []
    for b in batches:
        for ctx in (int(x) for x in args.ctx.split(",")):
            for prefix in (int(x) for x in args.prefix.split(",")):
                if prefix >= ctx:
                    continue
                variants = [("private", 0, 1)]
                for d in args.degrees.split(","):
                    degree = b if d == "all" else int(d)
                    if degree <= b and b % degree == 0:
                        variants.append((f"degree {degree}", prefix, b // degree))
                for name, shared, groups in variants:
                    batch = factory.batch(decode_lens=[ctx] * b, shared_prefix=shared, prefix_groups=groups)
                    f = batch_features(batch)
                    times, _ = time_batch(ex, batch, warmup=3, reps=args.reps, budget_s=0.5)
                    t = float(np.median(times))
                    p = model.predict_features(f, True) if model is not None else float("nan")
                    rows.append(dict(batch=b, ctx=ctx, prefix=prefix, variant=name, degree=b // groups if shared else 0,
                                     dec_shared=f["dec_shared"], t=t, priced=p))
                    print(f"b={b:3d} ctx={ctx:5d} prefix={prefix:5d} {name:10s} {t * 1e3:7.3f} ms  priced "
                          f"{p * 1e3:7.3f} ms  measured/priced {t / p:5.3f}", flush=True)
    data = {"model": args.model, "vocab_size": ex.vocab_size, "profile": cost_source, "pool_blocks": pool, "rows": rows}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(data, f, indent=1)
    print("\n" + summary(data, {"this run's profile": model} if model is not None else {}))


if __name__ == "__main__":
    main()
