"""Mixed steps that a long decode context sends off the whole-step CUDA graph: how many, and how far the
profile prices them from live, per pair of recorded fidelity runs (CPU, seconds).

The live executor runs a step with prefill chunks as one whole-step graph unless the eager path would split
the keys of its attention over a context longer than ``split_context`` (kvrl.executors.step_graph); then it
runs piecewise, whose small steps are bound by kernel launches. A small prefill beside decodes of which one
reads more than ``split_context`` tokens is such a step. No term of the step model says which path a step
takes, and the profile grid holds few such steps (a handful of its random points). From each recorded step's
features (``replay.csv``: the longest decode context, the decode count, the prefill tokens and longest prefill
context) this applies the executor's own rule with its defaults (2,048-token buckets, 16 prefills, 512
decodes, a 4,096-token ``split_context``, the kernels' split pickers on an H200's 132 SMs; a step with several
prefill chunks is judged as if they were one, the largest query a replay does not keep) and prices the steps
by a profile, and by the same profile with one constant floor under such steps (``max(price, floor)``), the
floor fitted (relative least squares) on the profile's own grid samples of this kind: what a path term
fitted from today's grid would do.

    python scripts/fidelity_step_path.py RUN_DIR [RUN_DIR ...] --profile PROFILE.json [--out FILE] [--model qwen3-0.6b]
    python scripts/fidelity_step_path.py --table FILE

``RUN_DIR``: a kvrl-fidelity share directory with ``runs/<workload>/<policy>/replay.csv`` (a committed run's
``replay.tar.xz`` unpacked). One JSON line per pair to ``--out``.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

#: the live executor's whole-step graph limits (kvrl.executors.step_graph.StepGraphs defaults; live
#: ``step_graph_max_tokens``) and the H200's SM count the split pickers are given there
MAX_TOKENS, MAX_PREFILLS, MAX_DECODES, SPLIT_CONTEXT, SMS = 2048, 16, 512, 4096, 132


def long_decode_piecewise(f: dict, heads: int, kv_heads: int) -> bool:
    """Whether a mixed step of features ``f`` would fit a whole-step graph but for a decode context that
    the eager path splits (see the module doc)."""
    from kvrl.kernels.triton_decode import pick_num_splits
    from kvrl.kernels.triton_prefill import pick_prefill_splits

    n_pre, n_dec = f["n_pre"], f["n_dec"]
    if not (n_pre and n_dec) or n_pre > MAX_PREFILLS or n_dec > MAX_DECODES or f["pre_tok"] + n_dec > MAX_TOKENS:
        return False
    if f["pre_max_ctx"] > SPLIT_CONTEXT and pick_prefill_splits(heads, f["pre_tok"], n_pre, f["pre_max_ctx"], 64, SMS) > 1:
        return False         # sent off by its prefill, not by a decode
    return f["dec_max"] > SPLIT_CONTEXT and pick_num_splits(n_dec, kv_heads, f["dec_max"], SMS) > 1


def grid_floor(samples: list[dict], model, heads: int, kv_heads: int) -> tuple[float, int]:
    """The constant floor (seconds, before the engine-context factor) that best prices the profile's grid
    samples of this kind as ``max(grid price, floor)`` on relative error, and how many samples there are."""
    import numpy as np

    from kvrl.executors.profile import StepModel

    grid = StepModel.from_dict({**model.to_dict(), "engine_factor": None})
    pts = [s for s in samples if not (s.get("graph") or s.get("holdout") or s.get("diagnostic"))
           and long_decode_piecewise(s, heads, kv_heads)]
    if not pts:
        return 0.0, 0
    pred, t = np.asarray([grid.predict_features(s, False) for s in pts]), np.asarray([s["t"] for s in pts])
    floors = np.unique(t)
    err = [float(np.sum((np.maximum(pred, f) / t - 1) ** 2)) for f in floors]
    return float(floors[int(np.argmin(err))]), len(pts)


def pairs(run: Path, model, heads: int, kv_heads: int, floor: float) -> list[dict]:
    """Per pair of ``run``: its live seconds, and those steps' count, live and priced execute seconds
    (without and with ``floor``)."""
    from kvrl.fidelity.replay import read_replay_csv

    out, k = [], model.engine_factor["eager"]
    for csv in sorted(run.glob("runs/*/*/replay.csv")):
        steps = read_replay_csv(csv)
        hit = [s for s in steps if s["kind"] == "mixed" and long_decode_piecewise(s, heads, kv_heads)]
        prices = [model.forward_s(*model.forward_args(s)[:10], cuda_graphs=True) for s in hit]
        out.append({"run": run.parent.name if run.name.startswith("pressure") else run.name,
                    "pair": f"{csv.parent.parent.name}/{csv.parent.name}", "live_s": sum(s["live_s"] for s in steps),
                    "steps": len(hit), "steps_live_s": sum(s["live_execute_s"] for s in hit),
                    "steps_priced_s": k * sum(prices), "steps_floored_s": k * sum(max(p, floor) for p in prices),
                    "floor_s": floor})
    return out


def table(path: Path) -> str:
    """A Markdown table of an ``--out`` file: the pairs with such steps."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    floor = rows[0]["floor_s"] * 1e3 if rows else 0.0
    lines = ["| run | pair | such steps | their live s | priced s | live / priced | unpriced, % of the pair's live time | "
             f"live / priced with the grid's floor ({floor:.1f} ms) | unpriced with it, % |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if r["steps"]:
            gap, gap_floor = r["steps_live_s"] - r["steps_priced_s"], r["steps_live_s"] - r["steps_floored_s"]
            lines.append(f"| {r['run']} | {r['pair']} | {r['steps']} | {r['steps_live_s']:.3f} | {r['steps_priced_s']:.3f} | "
                         f"{r['steps_live_s'] / r['steps_priced_s']:.2f} | {100 * gap / r['live_s']:+.1f} | "
                         f"{r['steps_live_s'] / r['steps_floored_s']:.2f} | {100 * gap_floor / r['live_s']:+.1f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="*", type=Path)
    ap.add_argument("--profile", default=None)
    ap.add_argument("--model", default="qwen3-0.6b")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--table", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.table:
        print(table(args.table))
        return 0
    if not (args.runs and args.profile):
        ap.error("give run directories and --profile (or --table FILE)")
    from kvrl.executors.hardware import MODEL_SHAPES
    from kvrl.executors.profile import StepProfile

    shape = MODEL_SHAPES[args.model]
    profile = StepProfile.load(args.profile)
    floor, n = grid_floor(profile.samples, profile.model, shape.num_heads, shape.num_kv_heads)
    print(f"the grid's floor: {floor * 1e3:.2f} ms from {n} samples", file=sys.stderr)
    rows = [r for run in args.runs for r in pairs(run, profile.model, shape.num_heads, shape.num_kv_heads, floor)]
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if args.out:
        args.out.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
