"""What a small mixed step costs when a long decode context sends it off the plain whole-step CUDA graph.

The live executor runs a step with prefill chunks as one whole-step graph unless the eager path would split
the keys of a context longer than 4,096 tokens. Until session 38 such a step ran piecewise; now, where its
*decodes* want the splits, it runs on a whole-step graph whose decodes split their keys
(kvrl.executors.step_graph). This times mixed batches back to back, as ``kvrl-profile`` times its grid: a
prefill chunk of ``--prefill`` tokens beside ``--decodes`` decodes, one of which reads ``--long`` tokens and
the rest 1,024, on both sides of that threshold. Each row records the path (``scripts/fidelity_step_path.py``'s
rule on the step's features: the rule before split graphs; and the executor's own choice), the time on the
executor's choice and, where that is a split graph, the time of the same step piecewise (the split graphs
switched off), and the price of a profile (default: the shipped one of this device and shape).

    python benchmarks/step_path_probe.py [--model qwen3-0.6b] [--out probe.json]
    python benchmarks/step_path_probe.py --table probe.json      # CPU: the rows as a Markdown table
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))


def table(path: Path) -> str:
    """A committed run's rows: time, path and price, by long context, decodes and prefill (runs since
    session 38 also the executor's path and the same step on the other path: piecewise or a split graph, since
    session 39 also a plain whole-step graph)."""
    d = json.loads(path.read_text())
    lines = [f"{d['model']}, priced by {d['profile']}", ""]
    if "t_piecewise" not in d["rows"][0]:
        lines += ["| prefill tokens | decodes | longest decode context | path | measured ms | priced ms | measured / priced |",
                  "|---:|---:|---:|---|---:|---:|---:|"]
        for r in d["rows"]:
            lines.append(f"| {r['prefill']} | {r['decodes']} | {r['long']} | {'piecewise' if r['piecewise'] else 'whole-step'} | "
                         f"{r['t'] * 1e3:.2f} | {r['priced'] * 1e3:.2f} | {r['t'] / r['priced']:.2f} |")
        return "\n".join(lines)
    lines += ["| prefill tokens | decodes | longest decode context | executor's path | measured ms | the other path | "
              "its ms | its ms / measured | priced ms | measured / priced |", "|---:|---:|---:|---|---:|---|---:|---:|---:|---:|"]
    for r in d["rows"]:
        other = (("piecewise", r["t_piecewise"]) if r.get("t_piecewise") else ("whole-step", r["t_plain"])
                 if r.get("t_plain") else ("split graph", r.get("t_split")))
        lines.append(f"| {r['prefill']} | {r['decodes']} | {r['long']} | {r['executor_path']} | {r['t'] * 1e3:.2f} | "
                     + (f"{other[0]} | {other[1] * 1e3:.2f} | {other[1] / r['t']:.2f}" if other[1] else "- | - | -")
                     + f" | {r['priced'] * 1e3:.2f} | {r['t'] / r['priced']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen3-0.6b")
    ap.add_argument("--prefill", default="64,256")
    ap.add_argument("--decodes", default="4,16,32,64")
    ap.add_argument("--long", default="3584,4608,6144,8192")
    ap.add_argument("--others", type=int, default=1024,
                    help="context of every decode but the long one (its rows' longest decode is max(long, others))")
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
    from kvrl.profiling.timing import time_batch
    from probe_common import live_probe, zeroed_pool

    ex, model, pool, cost_source = live_probe(args.model, args.profile)
    shape = ex.cost_model.model
    factory = zeroed_pool(ex, pool, max(int(x) for x in args.decodes.split(",")))
    graphs = getattr(ex, "_step_graphs", None)
    timed = lambda batch: float(np.median(time_batch(ex, batch, warmup=3, reps=args.reps, budget_s=0.5)[0]))
    rows = []
    for q in (int(x) for x in args.prefill.split(",")):
        for b in (int(x) for x in args.decodes.split(",")):
            for long in (int(x) for x in args.long.split(",")):
                batch = factory.batch(decode_lens=[long] + [args.others] * (b - 1), prefills=[(q, 0)])
                f = batch_features(batch)
                order = [s for s in batch.seqs if not s.is_decode] + [s for s in batch.seqs if s.is_decode]
                key = graphs.bucket(order, 1) if graphs is not None else None     # the executor's own choice
                path = "piecewise" if key is None else "split graph" if key.split else "whole-step"
                t = timed(batch)
                t_piecewise = t_split = t_plain = None
                if key is not None and key.split:            # the same step with the split graphs off
                    rule, graphs.rule = graphs.rule, dataclasses.replace(graphs.rule, split_decodes=0)
                    if graphs.bucket(order, 1) is None:
                        t_piecewise = timed(batch)
                    else:                                    # split where it pays (session 39): else a plain graph
                        t_plain = timed(batch)
                    graphs.rule = rule
                elif key is not None:                        # a plain whole-step: the same on a split graph
                    rule, graphs.rule = graphs.rule, dataclasses.replace(graphs.rule, split_context=0)
                    forced = graphs.bucket(order, 1)
                    if forced is not None and forced.split:
                        t_split = timed(batch)
                    graphs.rule = rule
                priced = model.predict_features(f, True) if model is not None else float("nan")
                pw = long_decode_piecewise(f, shape.num_heads, shape.num_kv_heads)
                rows.append(dict(prefill=q, decodes=b, long=long, piecewise=pw, executor_path=path, t=t,
                                 t_piecewise=t_piecewise, t_split=t_split, t_plain=t_plain, priced=priced))
                print(f"q={q:4d} b={b:3d} long={long:5d} {path:11s} {t * 1e3:7.3f} ms"
                      + (f" (piecewise {t_piecewise * 1e3:7.3f} ms)" if t_piecewise else "")
                      + (f" (whole-step {t_plain * 1e3:7.3f} ms)" if t_plain else "")
                      + (f" (split graph {t_split * 1e3:7.3f} ms)" if t_split else "")
                      + f" priced {priced * 1e3:7.3f} ms", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"model": args.model, "profile": cost_source, "pool_blocks": pool, "other_decodes": args.others,
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
