"""Headroom of the preemption victim choice: the eviction heuristics beside two clairvoyant
victims that know every request's true output length (``oracle_longest``: the candidate with the
most output still to generate; ``oracle_shortest``: the fewest), each in recompute and swap mode,
at the task's own watermark.

    python scripts/rl_victim_headroom.py --task classes_preemption --split val --seeds 0,1,2

Jobs are kvrl-eval's (``run_job``: the split, ``resample`` share per seed); prints one Markdown
row per policy (mean goodput tok/s over the seeds, preemptions) and, per seed, the paired
difference of the best clairvoyant victim to the best heuristic. The clairvoyant victims read the
trace's output lengths, which no server knows: they bound what a victim policy can gain here.
"""
from __future__ import annotations

import argparse
import logging

import numpy as np

from kvrl.plugins.evictions import _ByKey
from kvrl.plugins.registry import register

HEURISTICS = ("lifo", "fewest_computed", "most_blocks", "longest_remaining")
ORACLES = ("oracle_longest", "oracle_shortest")


@register("eviction", "oracle_longest")
class OracleLongest(_ByKey):
    """Clairvoyant: the candidate with the most true remaining output (ties: newest)."""

    def key(self, seq):
        return (seq.output_len - seq.num_output, seq.admit_order)


@register("eviction", "oracle_shortest")
class OracleShortest(_ByKey):
    """Clairvoyant: the candidate with the least true remaining output (ties: newest)."""

    def key(self, seq):
        return (seq.num_output - seq.output_len, seq.admit_order)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="classes_preemption")
    parser.add_argument("--split", default="val")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--resample", type=float, default=0.8)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of the task's scenario")
    args = parser.parse_args()
    logging.disable(logging.WARNING)

    from kvrl.apps.eval import Job, Policy, run_job
    from kvrl.envs.config import load_task

    _, cfg = load_task(args.task, args.overrides)
    seeds = [int(s) for s in args.seeds.split(",")]
    names = [(n, m) for n in HEURISTICS + ORACLES for m in ("recompute", "swap")]
    goodput, preempt = {}, {}
    for name, mode in names:
        plugin = {"name": name, "mode": mode}
        runs = [run_job(cfg.run, "eviction", Job(Policy(f"{name}/{mode}", "x", plugin), args.split, s), args.resample)
                for s in seeds]
        goodput[name, mode] = np.array([r["goodput_tok_s"] for r in runs])
        preempt[name, mode] = np.mean([r["preemptions"] for r in runs])
    print(f"task {args.task}, split {args.split}, seeds {seeds}, resample {args.resample}, overrides {args.overrides}\n")
    print("| victim / mode | goodput tok/s (mean) | preemptions |\n|---|---:|---:|")
    for key in names:
        print(f"| {key[0]} / {key[1]} | {goodput[key].mean():,.0f} | {preempt[key]:.0f} |")
    best_h = max((k for k in names if k[0] in HEURISTICS), key=lambda k: goodput[k].mean())
    best_o = max((k for k in names if k[0] in ORACLES), key=lambda k: goodput[k].mean())
    diff = 100 * (goodput[best_o] - goodput[best_h]) / goodput[best_h]
    print(f"\nbest clairvoyant {best_o[0]}/{best_o[1]} vs best heuristic {best_h[0]}/{best_h[1]}: "
          f"{diff.mean():+.1f}% (per seed: {', '.join(f'{d:+.1f}%' for d in diff)})")


if __name__ == "__main__":
    main()
