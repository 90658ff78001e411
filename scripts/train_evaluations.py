"""The validation record of kvrl-train runs, and the val and test splits they were validated on.

    python scripts/train_evaluations.py TASK=RUN_DIR ... --out FILE

Per run (a kvrl-train run directory of task ``TASK``): its ``evaluations.npz`` (every evaluation's timesteps and
the return of each of its episodes, in the order they were served: with ``train.val_loads=training`` one per
training load, in turn from where the previous evaluation stopped), its best validation return and training wall
time (``summary.json``); per task: the scenario's val and test splits as the environments build them (requests,
first and last arrival in seconds from the split's start). One JSON object to ``--out`` (docs/rl.md, "Validation at
the training loads"). CPU, seconds.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from kvrl.envs.config import load_task
from kvrl.workloads import build_workload


def splits(task: str) -> dict:
    """The task's val and test splits at its own rate: requests and the span of their arrivals (s)."""
    _, cfg = load_task(task, [])
    out = {}
    for split in ("val", "test"):
        requests = build_workload({**cfg.run["workload"], "split": split}, vocab_size=1 << 17, max_model_len=1 << 16)
        arrivals = [r.arrival_s for r in requests]
        out[split] = {"requests": len(requests), "first_s": round(min(arrivals), 3), "last_s": round(max(arrivals), 3)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", metavar="TASK=RUN_DIR")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    runs, tasks = {}, {}
    for spec in args.runs:
        task, run = spec.split("=", 1)
        with np.load(Path(run) / "evaluations.npz") as ev:
            timesteps, results = ev["timesteps"].tolist(), ev["results"].round(4).tolist()
        summary = json.loads((Path(run) / "summary.json").read_text())
        runs[Path(run).name] = {"task": task, "timesteps": timesteps, "results": results,
                                "best_val_reward": summary["best_val_reward"], "wall_s": round(summary["wall_s"], 1)}
        if task not in tasks:
            tasks[task] = splits(task)
    args.out.write_text(json.dumps({"runs": runs, "splits": tasks}, indent=1) + "\n")


if __name__ == "__main__":
    main()
