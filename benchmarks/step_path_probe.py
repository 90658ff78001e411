"""What a small mixed step costs when a long decode context sends it off the whole-step CUDA graph.

The live executor runs a step with prefill chunks as one whole-step graph unless the eager path would split
the keys of a context longer than 4,096 tokens; then the step runs piecewise (kvrl.executors.step_graph).
This times mixed batches back to back, as ``kvrl-profile`` times its grid: a prefill chunk of ``--prefill``
tokens beside ``--decodes`` decodes, one of which reads ``--long`` tokens and the rest 1,024, on both sides of
that threshold. Each row records the path (``scripts/fidelity_step_path.py``'s rule on the step's features,
and the executor's own choice where it has whole-step graphs, as a check of that rule) and the price of a
profile (default: the shipped one of this device and shape).

    python benchmarks/step_path_probe.py [--model qwen3-0.6b] [--out probe.json]
    python benchmarks/step_path_probe.py --table probe.json      # CPU: the rows as a Markdown table
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))


def table(path: Path) -> str:
    """A committed run's rows: time, path and price, by long context, decodes and prefill."""
    d = json.loads(path.read_text())
    lines = [f"{d['model']}, priced by {d['profile']}", "",
             "| prefill tokens | decodes | longest decode context | path | measured ms | priced ms | measured / priced |",
             "|---:|---:|---:|---|---:|---:|---:|"]
    for r in d["rows"]:
        lines.append(f"| {r['prefill']} | {r['decodes']} | {r['long']} | {'piecewise' if r['piecewise'] else 'whole-step'} | "
                     f"{r['t'] * 1e3:.2f} | {r['priced'] * 1e3:.2f} | {r['t'] / r['priced']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen3-0.6b")
    ap.add_argument("--prefill", default="64,256")
    ap.add_argument("--decodes", default="4,16,32,64")
    ap.add_argument("--long", default="3584,4608,6144,8192")
    ap.add_argument("--profile", default="auto")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--out", default="")
    ap.add_argument("--table", type=Path, default=None, help="print a committed run's rows (CPU) and stop")
    args = ap.parse_args()
    if args.table:
        print(table(args.table))
        return

    import numpy as np

    from fidelity_step_path import long_decode_piecewise
    from kvrl.executors.profile import batch_features
    from kvrl.profiling.batches import BatchFactory
    from kvrl.profiling.timing import time_batch, warm_graphs
    from probe_common import BLOCK_SIZE as block_size, live_probe

    ex, model, pool, cost_source = live_probe(args.model, args.profile)
    shape = ex.cost_model.model
    ex.allocate_kv(pool, 64, block_size)
    ex.kv.zero_()
    factory = BatchFactory(pool, block_size, ex.vocab_size, ex.max_model_len, seed=0)
    warm_graphs(ex, factory, max(int(x) for x in args.decodes.split(",")))
    rows = []
    for q in (int(x) for x in args.prefill.split(",")):
        for b in (int(x) for x in args.decodes.split(",")):
            for long in (int(x) for x in args.long.split(",")):
                batch = factory.batch(decode_lens=[long] + [1024] * (b - 1), prefills=[(q, 0)])
                f = batch_features(batch)
                times, _ = time_batch(ex, batch, warmup=3, reps=args.reps, budget_s=0.5)
                t = float(np.median(times))
                priced = model.predict_features(f, True) if model is not None else float("nan")
                pw = long_decode_piecewise(f, shape.num_heads, shape.num_kv_heads)
                graphs = getattr(ex, "_step_graphs", None)     # the executor's own choice, to check the rule
                took = None if graphs is None else graphs.bucket(batch.seqs, 1) is None
                rows.append(dict(prefill=q, decodes=b, long=long, piecewise=pw, executor_piecewise=took, t=t,
                                 priced=priced))
                print(f"q={q:4d} b={b:3d} long={long:5d} {'piecewise ' if pw else 'whole-step'} {t * 1e3:7.3f} ms "
                      f"priced {priced * 1e3:7.3f} ms", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"model": args.model, "profile": cost_source, "pool_blocks": pool, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
