"""Model selection on the validation split across training runs: serve the whole ``val`` split
(seed 0, no resample) of the task's scenario with each saved agent (checkpoints included) and
print their goodput, best first. The same ``run_job`` as kvrl-eval.

    python scripts/rl_select_checkpoint.py 'runs/train/rl2/wm-dqn-*/checkpoints/agent_*_steps.zip'
    python scripts/rl_select_checkpoint.py --task preemption 'runs/train/rl2/pre-*/checkpoints/*.zip'

A checkpoint is found with the ``agent.json`` of its run (the directory above ``checkpoints/``).
"""
from __future__ import annotations

import argparse
import glob
import logging
import os


def main() -> None:
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="watermark", choices=("watermark", "preemption"))
    parser.add_argument("--split", default="val")
    parser.add_argument("patterns", nargs="+", help="agent zips or run directories (glob patterns)")
    args = parser.parse_args()
    logging.disable(logging.WARNING)

    from kvrl.apps.eval import Job, Policy, run_job
    from kvrl.envs.agent_io import ROLES
    from kvrl.envs.config import load_task

    env_id, cfg = load_task(args.task)
    role = ROLES[env_id]
    paths = sorted({p for pattern in args.patterns for p in glob.glob(pattern)})
    if not paths:
        raise SystemExit(f"no agent matches {args.patterns}")
    scores = []
    for path in paths:
        r = run_job(cfg.run, role, Job(Policy(path, "agent", {"name": "agent", "policy_path": path}), args.split, 0),
                    None)
        scores.append((r["goodput_tok_s"], path))
        print(f"{r['goodput_tok_s']:9.1f}  {path}", flush=True)
    print(f"\nbest on {args.split}:")
    for goodput, path in sorted(scores, reverse=True)[:5]:
        print(f"{goodput:9.1f}  {path}")


if __name__ == "__main__":
    main()
