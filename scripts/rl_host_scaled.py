"""The sim of each live run at that run's own host speed, or at the speed of the earlier runs on its host: does the
sim track live once it knows the host's speed, and can it predict it?

Every live kvrl-eval run records ``sim_replay_error`` (the sim's price of the run's own executed steps against
their live time, ``sum(sim) / sum(live) - 1``). ``run`` re-serves each live run's policy and seed in the sim with
``backend.step_time_scale = 1 / (1 + sim_replay_error)`` (one kvrl-eval per run: the scale is the run's own) and
writes one JSON line per run. With ``--scale earlier`` the scale comes instead from the mean replay error of the runs
before it in the same file, which must then be one live process's ``results.csv`` in the order it ran (a prediction,
as kvrl-eval's ``sim_cal_<metric>`` columns; a file's first run has none and is left out). ``table`` compares with live: per results file, the median absolute per-run goodput
error of the plain sim beside the run (``sim_goodput_tok_s``) and of the host-speed sim, and per policy the live
paired difference to the reference beside the host-speed sim's, their correlation over seeds, and the mean
residual (live minus sim difference) with its 95% CI. A calibration after the fact (the scale comes from the run's
own step times), not a prediction: it says how much of the sim's live error is the host's speed.

    python scripts/rl_host_scaled.py run docs/results/rl_live_h200/pressure_mix_mooncake_s32/live_results.csv \\
        --env pressure_mooncake --extra "workload.start_s=900 workload.duration_s=180 \\
        workload.split_fractions=[0.0,0.3333333333333333,0.6666666666666667]" --out host_scaled.jsonl
    python scripts/rl_host_scaled.py table host_scaled.jsonl
    python scripts/rl_host_scaled.py targets docs/results/rl_live_h200/*_s33/calibrated.jsonl

``targets`` gives, per file (one task), the per-run errors of the sim as priced and re-served, per metric, and on how
many policies each meets issue 16's targets.
"""
from __future__ import annotations

import argparse
import csv
import json
import re
import shlex
import subprocess
import sys
import tempfile
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from rl_tables import agent_dir   # scripts/ is on sys.path when this file runs as a script

ROOT = Path(__file__).resolve().parents[1]
BASELINE = re.compile(r"([a-z_]+)(?:\((.*)\))?")


def policy_overrides(policy: str) -> list[str]:
    """kvrl-eval overrides that serve exactly ``policy`` (a watermark baseline by its label, ``name`` or
    ``name(k=v, ...)``, or a committed agent), nothing else."""
    if "agents/" in policy:
        return [f"agents=[docs/results/agents/{agent_dir(policy)}]", "baselines.watermark=[]"]
    m = BASELINE.fullmatch(policy)
    if m is None:
        raise SystemExit(f"{policy!r}: only watermark baselines (name or name(k=v, ...)) and committed agents are re-served")
    params = "".join(f", {kv.strip().replace('=', ': ', 1)}" for kv in (m.group(2) or "").split(",") if kv.strip())
    return ["agents=[]", f"baselines.watermark=[{{name: {m.group(1)}{params}}}]"]


def scales(rows: list[dict], how: str) -> list[float]:
    """Each run's ``step_time_scale`` (:func:`kvrl.fidelity.compare.speed_scale`): from its own replay error
    (``own``), or from those of the runs before it in ``rows`` (``earlier``, NaN where there is none: a process's
    first run), as kvrl-eval's ``sim_cal_`` columns."""
    from kvrl.fidelity.compare import speed_scale

    errors = [float(r["sim_replay_error"]) for r in rows]
    return [speed_scale([e] if how == "own" else errors[:i]) for i, e in enumerate(errors)]


def serve(results: str, row: dict, env: str, extra: list[str], scale: float, how: str = "own") -> dict:
    """One live run's policy and seed in the sim with ``step_time_scale`` ``scale`` (made as ``how`` says)."""
    with tempfile.TemporaryDirectory(prefix="kvrl-hs-") as tmp:
        cmd = [sys.executable, "-m", "kvrl.apps.eval", f"env={env}", *policy_overrides(row["policy"]),
               f"seeds=[{row['seed']}]", "tune=null", "oracle=false", "plots=false", "sweep=[]", *extra,
               f"backend.step_time_scale={scale!r}", "workers=1", f"hydra.run.dir={tmp}"]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if proc.returncode:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-1500:]}")
        sim = next(r for r in csv.DictReader(open(Path(tmp) / "results.csv")) if r["split"] == "test")
    out = {"results": results, "policy": row["policy"], "seed": int(row["seed"]), "scale": scale, "scale_from": how}
    for m in TARGET_METRICS:       # live, the sim beside the run as priced, and this re-served sim
        out.update({f"live_{m}": float(row[m]), f"beside_{m}": float(row[f"sim_{m}"]), f"host_{m}": float(sim[m])})
    return out


#: the metrics each re-served run records: issue 16's target metrics and goodput
TARGET_METRICS = ("throughput_tok_s", "goodput_tok_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s")


def targets(paths: list[Path]) -> str:
    """Per JSON-lines file of ``run`` (one task), a row: the runs, the median absolute per-run error of the sim beside
    them as priced and of the re-served sim, per metric of :data:`TARGET_METRICS`, and on how many policies each
    meets every one of issue 16's targets (``kvrl.fidelity.compare.TARGETS``: the sim's mean over a policy's runs
    against the live mean)."""
    from kvrl.fidelity.compare import within_targets

    head = [f"{m}: {side}" for m in TARGET_METRICS for side in ("as priced", "re-served")]
    lines = ["| runs of | runs | " + " | ".join(head) + " | policies meeting every target: as priced | re-served |",
             "|---|---:|" + "---:|" * (len(head) + 2)]
    for path in paths:
        runs = [json.loads(line) for line in open(path)]
        cells = []
        for m in TARGET_METRICS:
            for side in ("beside", "host"):
                e = [abs(r[f"{side}_{m}"] / r[f"live_{m}"] - 1) for r in runs if r[f"live_{m}"] > 0]
                cells.append(f"{100 * float(np.median(e)):.1f}%")
        by_policy = defaultdict(list)
        for r in runs:
            by_policy[r["policy"]].append(r)
        means = lambda rows, side: {m: float(np.mean([r[f"{side}_{m}"] for r in rows])) for m in TARGET_METRICS}
        met = {side: sum(within_targets(means(rows, "live"), means(rows, side)) for rows in by_policy.values())
               for side in ("beside", "host")}
        lines.append(f"| {Path(path).parent.name} | {len(runs)} | " + " | ".join(cells)
                     + f" | {met['beside']} of {len(by_policy)} | {met['host']} of {len(by_policy)} |")
    return "\n".join(lines)


def run(paths: list[str], env: str, extra: list[str], out: Path, workers: int, how: str = "own") -> None:
    jobs = []
    for p in paths:
        rows = [r for r in csv.DictReader(open(ROOT / p)) if r["split"] == "test"]
        jobs += [(p, r, s) for r, s in zip(rows, scales(rows, how)) if np.isfinite(s)]
    with ThreadPoolExecutor(workers) as pool:
        lines = list(pool.map(lambda job: serve(job[0], job[1], env, extra, job[2], how), jobs))
    with open(out, "w") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")
    print(f"{len(lines)} runs -> {out}")


def table(path: Path, reference: str = "fixed(fraction=0.01)") -> str:
    from kvrl.analysis.stats import mean_ci

    by_file: dict[str, list[dict]] = defaultdict(list)
    for line in open(path):
        d = json.loads(line)
        by_file[d["results"]].append(d)
    scaled = ("calibrated on earlier runs" if all(d.get("scale_from") == "earlier" for runs in by_file.values() for d in runs)
              else "at the run's host speed")
    lines = [f"| live results | runs | per-run goodput error, sim beside (median abs) | {scaled} | "
             f"policy vs {reference} | live Δ | host-speed sim Δ | corr. over seeds | live - sim Δ |",
             "|---|---:|---:|---:|---|---:|---:|---:|---|"]
    for results, runs in by_file.items():
        err = lambda key: np.median([abs(r[key] / r["live_goodput_tok_s"] - 1) for r in runs])
        head = f"| {Path(results).parent.name} | {len(runs)} | {100 * err('beside_goodput_tok_s'):.1f}% | " \
               f"{100 * err('host_goodput_tok_s'):.1f}% |"
        at = {(r["policy"], r["seed"]): r for r in runs}
        for policy in sorted({r["policy"] for r in runs} - {reference}):
            seeds = sorted(s for p, s in at if p == policy and (reference, s) in at)
            live = np.array([at[(policy, s)]["live_goodput_tok_s"] - at[(reference, s)]["live_goodput_tok_s"] for s in seeds])
            sim = np.array([at[(policy, s)]["host_goodput_tok_s"] - at[(reference, s)]["host_goodput_tok_s"] for s in seeds])
            resid, half = mean_ci(live - sim)
            lines.append(f"{head} {agent_dir(policy)} | {live.mean():+,.0f} | {sim.mean():+,.0f} | "
                         f"{np.corrcoef(live, sim)[0, 1]:.2f} | {resid:+,.0f} ± {half:,.0f} |")
            head = "| | | | |"
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("results", nargs="+", help="live kvrl-eval results.csv files (relative to the repository)")
    r.add_argument("--env", required=True, help="the task they served")
    r.add_argument("--extra", default="", help="the other kvrl-eval overrides they served with (one string)")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--workers", type=int, default=2)
    r.add_argument("--scale", choices=("own", "earlier"), default="own",
                   help="each run's own replay error, or the mean of the earlier runs' in its file (a prediction)")
    t = sub.add_parser("table")
    t.add_argument("jsonl", type=Path)
    g = sub.add_parser("targets", help="per file: per-run errors and the policies meeting issue 16's targets")
    g.add_argument("jsonl", type=Path, nargs="+", help="run's output, one file per task")
    a = ap.parse_args()
    if a.cmd == "run":
        run(a.results, a.env, shlex.split(a.extra), a.out, a.workers, a.scale)
    elif a.cmd == "targets":
        print(targets(a.jsonl))
    else:
        print(table(a.jsonl))


if __name__ == "__main__":
    main()
