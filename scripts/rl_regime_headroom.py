"""What adapting the watermark to the load regime could gain: the best constant per regime against
the best single constant over all regimes.

A regime is a task's scenario with one quantity scaled (``--axis``, by each of ``--scales``): the
arrival rate (``rate``: ``workload.rate_scale``), the KV pool (``pool``: ``engine.num_blocks``) or the
TPOT SLO (``tpot``: ``slo.tpot_s``). Every fixed watermark of ``--constants`` serves every regime (the
``--split`` split, each of ``--seeds`` with kvrl-eval's resample of 0.8, through kvrl-eval's
``run_job``). Per task it reports:

* per regime, the best constant and its goodput;
* the **mixture constant**: the one constant with the highest goodput relative to each regime's
  best, averaged over regimes (goodput averaged over seeds; what a tuned constant is when the load
  moves between these regimes);
* the **regime oracle gain**: per seed, the mean over regimes of (the regime's best constant's
  goodput / the mixture constant's) - 1, each regime's best constant picked on the mean over
  seeds; mean and 95% interval over seeds. A policy that knows the regime at every moment, and keeps it long
  enough for its constant to play out, gains at most this over the mixture constant; it needs no
  clairvoyance of single requests (docs/rl.md, "Headroom" measures that part).

    python scripts/rl_regime_headroom.py --tasks watermark,pressure,pool512,llama_pressure \\
        --axis rate --scales 0.5,0.75,1,1.5,2 --seeds 0,1,2 --workers 16 --out regimes.jsonl
    python scripts/rl_regime_headroom.py --table regimes.jsonl       # the Markdown table only
"""
from __future__ import annotations

import argparse
import json
import logging
import os
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor

import numpy as np
from scipy import stats

RESAMPLE = 0.8
#: --axis -> the (section, key) of the task's run config it scales
AXES = {"rate": ("workload", "rate_scale"), "pool": ("engine", "num_blocks"), "tpot": ("slo", "tpot_s")}


def _cell(args: tuple) -> dict:
    task, axis, scale, constant, split, seed = args
    logging.disable(logging.WARNING)
    from kvrl.apps.eval import Job, Policy, label_of, run_job
    from kvrl.envs.config import load_task

    _, cfg = load_task(task, [])
    run = cfg.run
    section, key = AXES[axis]
    value = run[section][key] * scale
    run[section][key] = int(round(value)) if key == "num_blocks" else float(value)
    plugin = {"name": "fixed", "fraction": constant}
    r = run_job(run, "watermark", Job(Policy(label_of(plugin), "x", plugin), split, seed), RESAMPLE)
    return {"task": task, "axis": axis, "scale": scale, "constant": constant, "split": split, "seed": seed,
            "goodput_tok_s": r["goodput_tok_s"], "preemptions": r["preemptions"]}


def summarise(rows: list[dict]) -> list[str]:
    """The Markdown table of the module doc, one row per task."""
    by_task: dict[str, dict] = defaultdict(lambda: defaultdict(dict))
    for r in rows:
        by_task[f'{r["task"]}, {r["axis"]}'][(r["scale"], r["seed"])][r["constant"]] = r["goodput_tok_s"]
    lines = ["| task, scaled quantity | regimes (x) | best constant per regime (goodput tok/s) | mixture constant "
             "| regime oracle gain over it, 95% CI over seeds |", "|---|---|---|---:|---:|"]
    for task, cells in by_task.items():
        scales = sorted({scale for scale, _ in cells})
        seeds = sorted({seed for _, seed in cells})
        constants = sorted(next(iter(cells.values())))
        g = np.array([[[cells[(x, s)][c] for c in constants] for x in scales] for s in seeds])  # seed, scale, constant
        mean_g = g.mean(axis=0)                               # scale, constant
        best = mean_g.argmax(axis=1)                          # each regime's best constant (mean over seeds)
        mix = int(np.argmax((mean_g / mean_g.max(axis=1, keepdims=True)).mean(axis=0)))
        picked = np.take_along_axis(g, np.broadcast_to(best[None, :, None], (len(seeds), len(scales), 1)), 2)[..., 0]
        gain = (picked / np.maximum(g[:, :, mix], 1e-9) - 1).mean(axis=1) * 100     # per seed, %
        half = stats.t.ppf(0.975, len(seeds) - 1) * gain.std(ddof=1) / np.sqrt(len(seeds)) if len(seeds) > 1 else float("nan")
        best = ", ".join(f"{x:g}x: {constants[b]:g} ({row.max():,.0f})" for x, b, row in zip(scales, best, mean_g))
        lines.append(f"| {task} | {', '.join(f'{x:g}' for x in scales)} | {best} | {constants[mix]:g} "
                     f"| {gain.mean():+.1f}% ({gain.mean() - half:+.1f} to {gain.mean() + half:+.1f}) |")
    return lines


def serve_to_jsonl(cell, cells: list, workers: int, out: str) -> list[dict]:
    """``cell`` (a picklable function of one item of ``cells``, returning a JSON-able row) over
    ``cells`` in ``workers`` processes, in order; each row is appended to the JSON-lines file ``out``
    as it comes, so a run cut short keeps what it finished. Returns the rows."""
    rows = []
    with ProcessPoolExecutor(workers) as pool, open(out, "w") as fh:
        for row in pool.map(cell, cells, chunksize=1):
            rows.append(row)
            fh.write(json.dumps(row) + "\n")
            fh.flush()
    return rows


def main() -> None:
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", default="watermark,pressure,pool512,llama_pressure")
    ap.add_argument("--axis", default="rate", help="rate | pool | tpot, or several joined by commas")
    ap.add_argument("--scales", default="0.5,0.75,1,1.5,2")
    ap.add_argument("--constants", default="0.0,0.01,0.03,0.05,0.1,0.2,0.3")
    ap.add_argument("--split", default="val")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default="regimes.jsonl")
    ap.add_argument("--table", default=None, help="only render the table of this JSONL")
    args = ap.parse_args()
    if args.table:
        print("\n".join(summarise([json.loads(line) for line in open(args.table)])))
        return
    cells = [(t, a, float(r), float(c), args.split, int(s)) for t in args.tasks.split(",") for a in args.axis.split(",")
             for r in args.scales.split(",") for c in args.constants.split(",") for s in args.seeds.split(",")]
    print("\n".join(summarise(serve_to_jsonl(_cell, cells, args.workers, args.out))))


if __name__ == "__main__":
    main()
