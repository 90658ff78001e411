"""Goodput of fixed watermarks (watermark task) or eviction heuristics (preemption task) on each
whole split of a task's scenario: how docs/rl.md chose the scenarios.

    python scripts/rl_scenario_table.py                       # conf/env/watermark.yaml
    python scripts/rl_scenario_table.py --task preemption
    python scripts/rl_scenario_table.py engine.num_blocks=768 slo.tpot_s=0.004   # another scenario

Each cell is one whole-split run (seed 0, no resample) in the task's scenario, through the same
``run_job`` as kvrl-eval; prints a Markdown table (goodput tok/s; the best of each row in bold)
and, below it, SLO attainment and p50 TTFT/TPOT per cell.
"""
from __future__ import annotations

import argparse
import logging
import os

FRACTIONS = (0.0, 0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5)
EVICTIONS = ("lifo", "fewest_computed", "cost_aware")


def main() -> None:
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="watermark", choices=("watermark", "preemption"))
    parser.add_argument("--splits", default="train,val,test")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of the task's scenario")
    args = parser.parse_args()
    logging.disable(logging.WARNING)

    from kvrl.apps.eval import Job, Policy, label_of, run_job
    from kvrl.envs.agent_io import ROLES
    from kvrl.envs.config import load_task

    env_id, cfg = load_task(args.task, args.overrides)
    role = ROLES[env_id]
    plugins = ([{"name": "fixed", "fraction": f} for f in FRACTIONS] if role == "watermark"
               else [{"name": n} for n in EVICTIONS])
    heads = [str(p["fraction"]) if role == "watermark" else p["name"] for p in plugins]
    run = cfg.run
    print(f"scenario: model={run['model']['name']} device={run['device']['name']} "
          f"engine.num_blocks={run['engine']['num_blocks']} workload={run['workload']['name']} "
          f"rate_scale={run['workload']['rate_scale']} slo={run['slo']} overrides={args.overrides}\n")
    print("| split | " + " | ".join(heads) + " |")
    print("|---|" + "---|" * len(heads))
    details = []
    for split in args.splits.split(","):
        results = [run_job(run, role, Job(Policy(label_of(p), "x", p), split, 0), None) for p in plugins]
        best = max(r["goodput_tok_s"] for r in results)
        cells = [f"**{r['goodput_tok_s']:.1f}**" if r["goodput_tok_s"] == best else f"{r['goodput_tok_s']:.1f}"
                 for r in results]
        print(f"| {split} | " + " | ".join(cells) + " |", flush=True)
        details.append((split, results))
    print("\nper cell: SLO attainment / p50 TTFT s / p50 TPOT ms / preemptions / engine s")
    for split, results in details:
        print(split + ": " + "; ".join(
            f"{h} {r['slo_attainment']:.2f}/{r['ttft_p50_s']:.2f}/{1000 * r['tpot_p50_s']:.1f}/{r['preemptions']}/"
            f"{r['duration_s']:.0f}" for h, r in zip(heads, results)))


if __name__ == "__main__":
    main()
