"""The sim of each live run at that run's own host speed: does the sim track live once it knows the host's speed?

Every live kvrl-eval run records ``sim_replay_error`` (the sim's price of the run's own executed steps against
their live time, ``sum(sim) / sum(live) - 1``). ``run`` re-serves each live run's policy and seed in the sim with
``backend.step_time_scale = 1 / (1 + sim_replay_error)`` (one kvrl-eval per run: the scale is the run's own) and
writes one JSON line per run. ``table`` compares with live: per results file, the median absolute per-run goodput
error of the plain sim beside the run (``sim_goodput_tok_s``) and of the host-speed sim, and per policy the live
paired difference to the reference beside the host-speed sim's, their correlation over seeds, and the mean
residual (live minus sim difference) with its 95% CI. A calibration after the fact (the scale comes from the run's
own step times), not a prediction: it says how much of the sim's live error is the host's speed.

    python scripts/rl_host_scaled.py run docs/results/rl_live_h200/pressure_mix_mooncake_s32/live_results.csv \\
        --env pressure_mooncake --extra "workload.start_s=900 workload.duration_s=180 \\
        workload.split_fractions=[0.0,0.3333333333333333,0.6666666666666667]" --out host_scaled.jsonl
    python scripts/rl_host_scaled.py table host_scaled.jsonl
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
FIXED = re.compile(r"fixed\(fraction=([^)]+)\)")


def policy_overrides(policy: str) -> list[str]:
    """kvrl-eval overrides that serve exactly ``policy`` (a fixed watermark or a committed agent), nothing else."""
    m = FIXED.fullmatch(policy)
    if m:
        return ["agents=[]", f"baselines.watermark=[{{name: fixed, fraction: {m.group(1)}}}]"]
    if "agents/" in policy:
        return [f"agents=[docs/results/agents/{agent_dir(policy)}]", "baselines.watermark=[]"]
    raise SystemExit(f"{policy!r}: only fixed watermarks and committed agents are re-served")


def serve(results: str, row: dict, env: str, extra: list[str]) -> dict:
    """One live run's policy and seed in the sim at the run's host speed."""
    scale = 1.0 / (1.0 + float(row["sim_replay_error"]))
    with tempfile.TemporaryDirectory(prefix="kvrl-hs-") as tmp:
        cmd = [sys.executable, "-m", "kvrl.apps.eval", f"env={env}", *policy_overrides(row["policy"]),
               f"seeds=[{row['seed']}]", "tune=null", "oracle=false", "plots=false", "sweep=[]", *extra,
               f"backend.step_time_scale={scale!r}", "workers=1", f"hydra.run.dir={tmp}"]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if proc.returncode:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-1500:]}")
        sim = next(r for r in csv.DictReader(open(Path(tmp) / "results.csv")) if r["split"] == "test")
    return {"results": results, "policy": row["policy"], "seed": int(row["seed"]), "scale": scale,
            "live_goodput_tok_s": float(row["goodput_tok_s"]), "beside_goodput_tok_s": float(row["sim_goodput_tok_s"]),
            "host_goodput_tok_s": float(sim["goodput_tok_s"])}


def run(paths: list[str], env: str, extra: list[str], out: Path, workers: int) -> None:
    jobs = [(p, r) for p in paths for r in csv.DictReader(open(ROOT / p)) if r["split"] == "test"]
    with ThreadPoolExecutor(workers) as pool:
        lines = list(pool.map(lambda job: serve(job[0], job[1], env, extra), jobs))
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
    lines = ["| live results | runs | per-run goodput error, sim beside (median abs) | at the run's host speed | "
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
    t = sub.add_parser("table")
    t.add_argument("jsonl", type=Path)
    a = ap.parse_args()
    if a.cmd == "run":
        run(a.results, a.env, shlex.split(a.extra), a.out, a.workers)
    else:
        print(table(a.jsonl))


if __name__ == "__main__":
    main()
