"""The admission-order study's tables (benchmarks/rl_scheduler_study.sh and rl_scheduler_live.sh; docs/rl.md,
"The admission order: a lever the agents do not hold").

Each input is one kvrl-eval of a task under one scheduler, every run on the same test seeds (the same requests
per seed whatever the scheduler). Per policy served under every scheduler (a fixed watermark or an agent,
matched by label; kvrl-eval's ``[val-best, given]`` tag dropped), this prints its mean goodput under each
scheduler, paired per seed against the reference scheduler (the first), and the same for the best constant in
hindsight (of the fixed watermarks served on these seeds: kvrl-eval's oracle line), and the best scheduler per
test seed (a clairvoyant choice per run) against the strongest one:

    python scripts/rl_scheduler_table.py --task tenants fcfs sjf sjf_oracle lpm     # docs/results/rl_scheduler/
    python scripts/rl_scheduler_table.py fcfs=DIR/fcfs/tenants/live/results.csv lpm=...   # any results.csv files
"""
from __future__ import annotations

import argparse
import csv
from collections import defaultdict
from pathlib import Path
from typing import Iterable

from kvrl.analysis.stats import paired_compare

RESULTS = Path("docs/results/rl_scheduler")
METRIC = "goodput_tok_s"
HINDSIGHT = "best constant in hindsight"


def by_policy(rows: Iterable[dict[str, str]]) -> dict[str, dict[int, float]]:
    """policy label (``[val-best, given]`` dropped) -> seed -> goodput (tok/s), over the test rows of a kvrl-eval
    results.csv."""
    out: dict[str, dict[int, float]] = defaultdict(dict)
    for row in rows:
        if row["split"] == "test":
            out[row["policy"].replace(" [val-best, given]", "")][int(row["seed"])] = float(row[METRIC])
    return out


def read(path: str) -> dict[str, dict[int, float]]:
    """:func:`by_policy` of the results.csv at ``path``."""
    with open(path, newline="") as f:
        return by_policy(csv.DictReader(f))


def with_hindsight(runs: dict[str, dict[int, float]]) -> dict[str, dict[int, float]]:
    """``runs`` and the fixed watermark of the highest mean goodput on these seeds as :data:`HINDSIGHT`."""
    constants = [v for label, v in runs.items() if label.startswith("fixed(")]
    return {**runs, HINDSIGHT: max(constants, key=lambda v: sum(v.values()) / len(v))}


def mean(values: dict[int, float]) -> float:
    return sum(values.values()) / len(values)


def clairvoyant(by: dict[str, dict[str, dict[int, float]]]) -> tuple[dict[int, float], str]:
    """Over schedulers (``by``: name -> :func:`with_hindsight` runs): the best hindsight-best constant per seed, and
    the scheduler whose hindsight-best constant has the highest mean (the strongest)."""
    names = list(by)
    best = {seed: max(by[n][HINDSIGHT][seed] for n in names) for seed in by[names[0]][HINDSIGHT]}
    return best, max(names, key=lambda n: mean(by[n][HINDSIGHT]))


def cell(values: dict[int, float], reference: dict[int, float]) -> str:
    c = paired_compare(values, reference, METRIC)
    return f"{c.delta:+.0f} ± {c.delta_ci:.0f} tok/s ({c.pct_change:+.1f}%, p {c.p_value:.2g}, {c.verdict})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", help="read docs/results/rl_scheduler/<task>_<name>_results.csv for each name")
    p.add_argument("runs", nargs="+", help="names (with --task) or NAME=results.csv; the first is the reference")
    a = p.parse_args()
    files = {}
    for run in a.runs:
        name, _, path = run.partition("=")
        files[name] = path if path else RESULTS / f"{a.task}_{name}_results.csv"
    by = {name: with_hindsight(read(path)) for name, path in files.items()}
    names = list(by)
    ref = by[names[0]]
    policies = [label for label in ref if all(label in runs for runs in by.values())]
    seeds = sorted(ref[HINDSIGHT])
    print(f"{a.task or 'results'}: {len(seeds)} test seeds; each policy paired against itself under {names[0]}\n")
    print("| policy | " + " | ".join(f"{n} (tok/s)" for n in names) + " | "
          + " | ".join(f"{n} vs {names[0]}" for n in names[1:]) + " |")
    print("|---|" + "---:|" * len(names) + "---|" * (len(names) - 1))
    for label in sorted(policies, key=lambda x: (x == HINDSIGHT, x)):
        row = [f"{mean(by[n][label]):,.0f}" for n in names] + [cell(by[n][label], ref[label]) for n in names[1:]]
        print(f"| {label} | " + " | ".join(row) + " |")
    best, strongest = clairvoyant(by)
    print(f"\nThe best scheduler per test seed (clairvoyant), each at its hindsight-best constant: {mean(best):,.0f} tok/s; "
          f"against {strongest} (the strongest): {cell(best, by[strongest][HINDSIGHT])}")


if __name__ == "__main__":
    main()
