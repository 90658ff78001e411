"""What a policy's runs did step by step, from kvrl-eval's ``step_traces.npz`` (``step_traces=all``): live
against the sim of the same jobs.

    python scripts/rl_step_traces.py summarise live=a.npz,b.npz sim=c.npz --num-blocks 1024 --out jobs.csv
    python scripts/rl_step_traces.py table jobs.csv

``summarise``: one CSV row per job (label, policy, seed) of each labelled set of files: steps, engine seconds,
the mean time of a decode-only step and of a step with prefill tokens (ms), the time-weighted means of queued
requests, running sequences and KV blocks in use (a fraction of ``--num-blocks``), the time-weighted mean
watermark (reserved blocks over ``--num-blocks``) and the share of engine time with it above 0.02, and the
preemptions. ``table``: per policy and label, the mean over its jobs of each column, and per label the ratio of
its mean decode and prefill step times to the first label's (which label is first: the file's first row).
"""
from __future__ import annotations

import argparse
import csv
from collections import defaultdict
from pathlib import Path

import numpy as np

from kvrl.apps.eval_files import read_step_traces
from rl_tables import agent_dir   # scripts/ is on sys.path when this file runs as a script

COLUMNS = ("steps", "engine_s", "decode_ms", "prefill_ms", "waiting", "running", "used", "watermark",
           "watermark_above_0.02", "preemptions")


def job_row(steps: dict[str, np.ndarray], num_blocks: int) -> dict[str, float]:
    """:data:`COLUMNS` of one job's steps (``read_step_traces``' columns)."""
    d = steps["duration_s"]
    decode, prefill = (steps["prefill_tokens"] == 0) & (d > 0), steps["prefill_tokens"] > 0
    dt = np.diff(np.concatenate([[0.0], steps["time_s"]]))     # engine time each step's state lasted
    mean = lambda x: float(np.average(x, weights=dt))
    watermark = steps["reserved_blocks"] / num_blocks
    return {"steps": len(d), "engine_s": float(steps["time_s"][-1]), "decode_ms": 1e3 * float(d[decode].mean()),
            "prefill_ms": 1e3 * float(d[prefill].mean()), "waiting": mean(steps["num_waiting"]),
            "running": mean(steps["num_running"]), "used": mean(steps["used_blocks"] / num_blocks),
            "watermark": mean(watermark), "watermark_above_0.02": mean(watermark > 0.02),
            "preemptions": int(steps["preemptions"][-1])}


def summarise(entries: list[str], num_blocks: int) -> list[dict]:
    rows = []
    for entry in entries:
        label, paths = entry.split("=", 1)
        for path in paths.split(","):
            for job, steps in read_step_traces(Path(path)):
                rows.append({"label": label, "policy": agent_dir(job["policy"]), "seed": job["seed"],
                             **job_row(steps, num_blocks)})
    return rows


def table(path: Path) -> str:
    rows = list(csv.DictReader(path.open()))
    labels = list(dict.fromkeys(r["label"] for r in rows))
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in rows:
        groups[r["policy"], r["label"]].append(r)
    mean = lambda rs, k: float(np.mean([float(r[k]) for r in rs]))
    fmt = {"steps": "{:.0f}", "engine_s": "{:.2f}", "decode_ms": "{:.3f}", "prefill_ms": "{:.2f}", "waiting": "{:.1f}",
           "running": "{:.1f}", "used": "{:.3f}", "watermark": "{:.4f}", "watermark_above_0.02": "{:.2f}",
           "preemptions": "{:.1f}"}
    out = ["| policy | jobs | " + " | ".join(COLUMNS) + " |", "|---|---|" + "---:|" * len(COLUMNS)]
    for policy in dict.fromkeys(r["policy"] for r in rows):
        for label in labels:
            rs = groups.get((policy, label), [])
            if rs:
                cells = [fmt[k].format(mean(rs, k)) for k in COLUMNS]
                out.append(f"| {policy} | {label} ({len(rs)}) | " + " | ".join(cells) + " |")
    base = [r for r in rows if r["label"] == labels[0]]
    ratios = []
    for label in labels[1:]:
        rs = [r for r in rows if r["label"] == label]
        ratios.append(f"{labels[0]} / {label}: decode steps x{mean(base, 'decode_ms') / mean(rs, 'decode_ms'):.3f}, "
                      f"prefill steps x{mean(base, 'prefill_ms') / mean(rs, 'prefill_ms'):.3f}")
    return "\n".join(out + ["", "Mean step time, every job of a label: " + "; ".join(ratios) + "."])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("summarise")
    s.add_argument("entries", nargs="+", help="label=step_traces.npz[,more.npz]")
    s.add_argument("--num-blocks", type=int, required=True)
    s.add_argument("--out", type=Path, required=True)
    t = sub.add_parser("table")
    t.add_argument("path", type=Path)
    a = ap.parse_args()
    if a.cmd == "table":
        print(table(a.path))
        return
    rows = summarise(a.entries, a.num_blocks)
    with a.out.open("w", newline="") as f:
        w = csv.DictWriter(f, ["label", "policy", "seed", *COLUMNS])
        w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    main()
