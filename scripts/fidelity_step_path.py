"""Mixed steps that a long decode context sends off the whole-step CUDA graph: how many, and how far the
profile prices them from live, per pair of recorded fidelity runs (CPU, seconds).

Until session 38 the live executor ran a step with prefill chunks as one whole-step graph unless the eager
path would split the keys of its attention over a context longer than ``split_context``
(kvrl.executors.step_graph); then it ran piecewise, whose small steps are bound by kernel launches (since
then, steps whose decodes want the splits run on split whole-step graphs; the runs read here predate them). A small prefill beside decodes of which one
reads more than ``split_context`` tokens is such a step. No term of the step model says which path a step
takes, and the profile grid holds few such steps (a handful of its random points). From each recorded step's
features (``replay.csv``: the longest decode context, the decode count, the prefill tokens and longest prefill
context) this asks the executor's own rule (``StepRule`` with the live executor's defaults as they were then) about
the step (a step with several prefill chunks is judged by its largest query where the replay kept it, since
session 39, else as if they were one), and prices the steps
by a profile, and by the same profile with one constant floor under such steps (``max(price, floor)``), the
floor fitted (relative least squares) on the profile's own grid samples of this kind: what a path term
fitted from today's grid would do.

    python scripts/fidelity_step_path.py RUN_DIR [RUN_DIR ...] --profile PROFILE.json [--out FILE] [--model qwen3-0.6b]
        [--split-graphs]
    python scripts/fidelity_step_path.py --table FILE

``RUN_DIR``: a kvrl-fidelity share directory with ``runs/<workload>/<policy>/replay.csv`` (a committed run's
``replay.tar.xz`` unpacked). One JSON line per pair to ``--out``.
"""
from __future__ import annotations

import argparse
import functools
import inspect
import json
import sys
from pathlib import Path

@functools.lru_cache(maxsize=None)
def _rule(heads: int, kv_heads: int, split_graphs: bool = False):
    """The :class:`~kvrl.executors.step_rule.StepRule` of a live executor with its defaults (token buckets up to
    ``step_graph_max_tokens``, the prefill and decode limits, ``split_context``) as the runs read here had it:
    split graphs only where the eager path splits (session 38; ``split_where_pays`` off), and without
    ``split_graphs`` none at all (``split_decodes`` 0: the runs of sessions 37 and before predate them, so their
    steps whose decodes wanted key splits ran piecewise)."""
    from kvrl.executors.live import LiveExecutor
    from kvrl.executors.piecewise import TOKEN_SIZES
    from kvrl.executors.step_graph import StepGraphs
    from kvrl.executors.step_rule import StepRule

    graph_args = inspect.signature(StepGraphs.__init__).parameters
    default = lambda name: graph_args[name].default
    max_tokens = inspect.signature(LiveExecutor.__init__).parameters["step_graph_max_tokens"].default
    sizes = tuple(s for s in sorted(TOKEN_SIZES) if s <= max_tokens)
    max_decodes = min(default("max_decodes"), sizes[-1])
    return StepRule(sizes, default("max_prefills"), max_decodes, heads, kv_heads, default("split_context"),
                    tuple(s for s in sizes if s <= default("split_max_tokens")) if split_graphs else (),
                    min(default("split_decodes"), max_decodes) if split_graphs else 0, default("decode_splits"),
                    split_where_pays=False)


def _step_key(f: dict, dec_max: int, heads: int, kv_heads: int, split_graphs: bool = False):
    """The graph (:class:`~kvrl.executors.step_rule.StepKey`) the executor would run a step of features ``f``
    (its longest decode context ``dec_max``) on, or None (piecewise); its longest prefill chunk as the replay
    recorded it (since session 39), else taken as all of the prefill tokens."""
    from kvrl.executors.profile.features import pre_max_q_of

    return _rule(heads, kv_heads, split_graphs).key(f["pre_tok"] + f["n_dec"], f["n_pre"], pre_max_q_of(f),
                                                    f["pre_max_ctx"], f["n_dec"], dec_max)


def _whole_step(f: dict, dec_max: int, heads: int, kv_heads: int) -> bool:
    """Whether the executor before split graphs would run a step of features ``f`` as a whole-step graph."""
    return _step_key(f, dec_max, heads, kv_heads) is not None


def on_split_graph(f: dict, heads: int, kv_heads: int) -> bool:
    """Whether today's executor runs a step of features ``f`` on a split whole-step graph."""
    key = _step_key(f, f["dec_max"], heads, kv_heads, split_graphs=True)
    return key is not None and key.split


def long_decode_piecewise(f: dict, heads: int, kv_heads: int) -> bool:
    """Whether a mixed step of features ``f`` would fit a whole-step graph but for a decode context that
    the eager path splits (see the module doc)."""
    if not (f["n_pre"] and f["n_dec"]):
        return False
    return not _whole_step(f, f["dec_max"], heads, kv_heads) and _whole_step(f, 1, heads, kv_heads)


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


def pairs(run: Path, model, heads: int, kv_heads: int, floor: float, split_graphs: bool = False) -> list[dict]:
    """Per pair of ``run``: its live seconds, and those steps' count, live and priced execute seconds
    (without and with ``floor``); with ``split_graphs`` (a run since session 38), also the count, live and
    priced seconds of those that ran on split whole-step graphs."""
    from kvrl.fidelity.replay import read_replay_csv

    out, k = [], model.engine_factor["eager"]
    for csv in sorted(run.glob("runs/*/*/replay.csv")):
        steps = read_replay_csv(csv)
        hit = [s for s in steps if s["kind"] == "mixed" and long_decode_piecewise(s, heads, kv_heads)]
        prices = [model.forward_features(s) for s in hit]
        row = {"run": run.parent.name if run.name.startswith("pressure") else run.name,
               "pair": f"{csv.parent.parent.name}/{csv.parent.name}", "live_s": sum(s["live_s"] for s in steps),
               "steps": len(hit), "steps_live_s": sum(s["live_execute_s"] for s in hit),
               "steps_priced_s": k * sum(prices), "steps_floored_s": k * sum(max(p, floor) for p in prices),
               "floor_s": floor}
        if split_graphs:
            split = [on_split_graph(s, heads, kv_heads) for s in hit]
            row.update(split_steps=sum(split), split_live_s=sum(s["live_execute_s"] for s, x in zip(hit, split) if x),
                       split_priced_s=k * sum(p for p, x in zip(prices, split) if x))
        out.append(row)
    return out


def table(path: Path) -> str:
    """A Markdown table of an ``--out`` file: the pairs with such steps."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if rows and "split_steps" in rows[0]:
        return split_table(rows)
    floor = rows[0]["floor_s"] * 1e3 if rows else 0.0
    lines = ["| run | pair | such steps | their live s | their share of the pair's live time, % | priced s | live / priced | "
             f"unpriced, % of the pair's live time | live / priced with the grid's floor ({floor:.1f} ms) | unpriced with it, % |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if r["steps"]:
            gap, gap_floor = r["steps_live_s"] - r["steps_priced_s"], r["steps_live_s"] - r["steps_floored_s"]
            lines.append(f"| {r['run']} | {r['pair']} | {r['steps']} | {r['steps_live_s']:.3f} | "
                         f"{100 * r['steps_live_s'] / r['live_s']:.1f} | {r['steps_priced_s']:.3f} | "
                         f"{r['steps_live_s'] / r['steps_priced_s']:.2f} | {100 * gap / r['live_s']:+.1f} | "
                         f"{r['steps_live_s'] / r['steps_floored_s']:.2f} | {100 * gap_floor / r['live_s']:+.1f} |")
    return "\n".join(lines)


def split_table(rows: list[dict]) -> str:
    """A run since session 38: those steps split by the graph they ran on (a split whole-step graph, or still
    piecewise), each with its live / priced seconds."""
    ratio = lambda live, priced: f"{live / priced:.2f}" if priced else "-"
    lines = ["| run | pair | such steps | their share of the pair's live time, % | live / priced | "
             "unpriced, % of the pair's live time | on split graphs | their live / priced | still piecewise | "
             "their live / priced |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if r["steps"]:
            gap = r["steps_live_s"] - r["steps_priced_s"]
            rest_live, rest_priced = r["steps_live_s"] - r["split_live_s"], r["steps_priced_s"] - r["split_priced_s"]
            lines.append(f"| {r['run']} | {r['pair']} | {r['steps']} | {100 * r['steps_live_s'] / r['live_s']:.1f} | "
                         f"{ratio(r['steps_live_s'], r['steps_priced_s'])} | "
                         f"{100 * gap / r['live_s']:+.1f} | {r['split_steps']} | {ratio(r['split_live_s'], r['split_priced_s'])} | "
                         f"{r['steps'] - r['split_steps']} | {ratio(rest_live, rest_priced)} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="*", type=Path)
    ap.add_argument("--profile", default=None)
    ap.add_argument("--model", default="qwen3-0.6b")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--table", type=Path, default=None)
    ap.add_argument("--split-graphs", action="store_true",
                    help="runs since session 38: also split those steps by the graph they ran on")
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
    rows = [r for run in args.runs
            for r in pairs(run, profile.model, shape.num_heads, shape.num_kv_heads, floor, args.split_graphs)]
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if args.out:
        args.out.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
