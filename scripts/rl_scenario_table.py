"""Goodput of fixed watermarks (watermark task), eviction heuristics (preemption task) or
(watermark, mode) constants (joint task) on each whole split of a task's scenario: how docs/rl.md
chose the scenarios.

    python scripts/rl_scenario_table.py                       # conf/env/watermark.yaml
    python scripts/rl_scenario_table.py --task preemption
    python scripts/rl_scenario_table.py --task joint --splits val,test
    python scripts/rl_scenario_table.py engine.num_blocks=768 slo.tpot_s=0.004   # another scenario

Each cell is one whole-split run (seed 0, no resample) in the task's scenario, through the same
``run_job`` as kvrl-eval; prints a Markdown table (goodput tok/s; the best of each row in bold)
and, below it, SLO attainment and p50 TTFT/TPOT per cell. The watermark task's columns are the
fixed watermarks of ``env.action.auto.sweep``, and the val row gives the suggested
``env.action.bins``: what ``kvrl-train env.action.bins=auto`` would choose (kvrl/apps/bins.py).
The joint task's columns are every (watermark of ``env.action.bins``, mode) pair (``0.01/r``: fixed
0.01 and LIFO recompute, ``/s``: swap), then the eviction heuristics at fixed 0.01 (cost_aware
picks its own mode per victim). Cells also give the prefix-cache hit rate where it is not 0.
Arguments are Hydra overrides of the task's scenario, as in kvrl-train and kvrl-eval; one that is
not a key of the config is an error.
"""
from __future__ import annotations

import argparse
import logging
import os

EVICTIONS = ("lifo", "fewest_computed", "cost_aware")


def main() -> None:
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="watermark",
                        help="a task of conf/env/ (watermark, preemption, pressure, phased, joint, tenants)")
    parser.add_argument("--splits", default="train,val,test")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of the task's scenario")
    args = parser.parse_args()
    logging.disable(logging.WARNING)

    from kvrl.apps.bins import useful_bins
    from kvrl.apps.eval import Job, Policy, label_of, run_job, sweep_plugins
    from kvrl.envs.agent_io import ROLES
    from kvrl.envs.config import describe_workload, load_task

    env_id, cfg = load_task(args.task, args.overrides)
    role = ROLES[env_id]
    if role == "watermark":
        plugins = [{"name": "fixed", "fraction": f} for f in cfg.action.auto.sweep]
        heads = [str(p["fraction"]) for p in plugins]
    elif role == "joint":
        plugins = sweep_plugins(role, cfg.action.bins)
        heads = [f"{p['watermark']['fraction']}/{p['eviction']['mode'][0]}" for p in plugins]
        plugins += [{"watermark": {"name": "fixed", "fraction": 0.01}, "eviction": {"name": n}} for n in EVICTIONS]
        heads += [f"0.01+{n}" for n in EVICTIONS]
    else:
        plugins = [{"name": n} for n in EVICTIONS]
        heads = [p["name"] for p in plugins]
    run = cfg.run
    print(f"scenario: model={run['model']['name']} device={run['device']['name']} "
          f"engine.num_blocks={run['engine']['num_blocks']} workload={describe_workload(run['workload'])} "
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
    print("\nper cell: SLO attainment / p50 TTFT s / p50 TPOT ms / preemptions / blocks swapped out / k tokens recomputed / engine s [/ prefix hit rate]")
    for split, results in details:
        print(split + ": " + "; ".join(
            f"{h} {r['slo_attainment']:.2f}/{r['ttft_p50_s']:.2f}/{1000 * r['tpot_p50_s']:.1f}/{r['preemptions']}"
            f"/{r['swapped_out_blocks']}/{r['recomputed_tokens'] / 1000:.0f}/{r['duration_s']:.0f}"
            + (f"/{r['prefix_hit_rate']:.2f}" if r["prefix_hit_rate"] else "") for h, r in zip(heads, results)))
    val = dict(details).get("val")
    if role == "watermark" and val is not None:
        sweep = useful_bins([p["fraction"] for p in plugins], [r["goodput_tok_s"] for r in val],
                            cfg.action.auto.tolerance)
        print(f"\nsuggested env.action.bins: {list(sweep.bins)} (the val row: the sweep values from the lowest to the "
              f"highest within {sweep.tolerance:.0%} of the best, {sweep.best:g}; env.action.auto.tolerance; what "
              f"kvrl-train env.action.bins=auto chooses)")
    elif role == "watermark":
        print("\nsuggested env.action.bins: add val to --splits (they come from the val row)")


if __name__ == "__main__":
    main()
