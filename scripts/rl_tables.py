"""Markdown tables for docs/rl.md from committed RL result files (generated blocks, kind ``cheap``).

    python scripts/rl_tables.py leaderboard docs/results/rl_sim_rcpi/pool512_leaderboard.csv
    python scripts/rl_tables.py headroom docs/results/headroom/headroom.jsonl

``leaderboard``: a kvrl-eval ``leaderboard.csv`` (the command that made it heads the
``leaderboard.md`` beside it) as one row per policy: goodput mean ± 95% CI over seeds and, for each
reference the leaderboard compares with (vLLM's fixed 0.01, the val-best constant, the hindsight-best
constant), the paired % change and verdict. ``headroom``: the JSON lines of
scripts/rl_rollout_oracle.py as one row per scenario: the best constant (by mean goodput over the
seeds), the planner, and the planner's paired gain over that constant (kvrl.analysis.stats).
"""
from __future__ import annotations

import argparse
import csv
import json
from collections import defaultdict

VERDICTS = {"no significant difference": "n.s.", "better": "better", "worse": "worse"}


def _num(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def leaderboard(path: str) -> str:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    refs = [k[: -len("_pct_change")] for k in rows[0] if k.startswith("vs ") and k.endswith("_pct_change")]
    head = ["#", "policy", "kind", "goodput tok/s"] + [f"Δ {r}" for r in refs]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [row["rank"], row["policy"], row["kind"],
                 f"{_num(float(row['goodput_tok_s_mean']))} ± {_num(float(row['goodput_tok_s_ci95']))}"]
        for ref in refs:
            verdict = row[f"{ref}_verdict"]
            cells.append("reference" if not verdict else
                         f"{float(row[f'{ref}_pct_change']):+.1f}% {VERDICTS.get(verdict, verdict)}")
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def headroom(path: str) -> str:
    from kvrl.analysis.stats import paired_compare

    by_scenario: dict[str, list[dict]] = defaultdict(list)
    with open(path) as f:
        for line in f:
            job = json.loads(line)
            by_scenario[job["scenario"]].append(job)
    out = ["| scenario | seeds | best constant (mean goodput tok/s) | planner | planner − best constant, paired | p |",
           "|---|---:|---|---:|---:|---:|"]
    for name, jobs in by_scenario.items():
        constants = jobs[0]["constants"].keys()
        means = {c: sum(j["constants"][c] for j in jobs) / len(jobs) for c in constants}
        best = max(means, key=means.get)
        planner = {j["seed"]: j["oracle"]["goodput"] for j in jobs}
        cmp = paired_compare(planner, {j["seed"]: j["constants"][best] for j in jobs}, "goodput_tok_s")
        out.append(f"| {name} | {len(jobs)} | {best} ({_num(means[best])}) | {_num(sum(planner.values()) / len(planner))} "
                   f"| {cmp.pct_change:+.1f}% | {cmp.p_value:.2g} |")
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("table", choices=("leaderboard", "headroom"))
    p.add_argument("path")
    a = p.parse_args()
    print(leaderboard(a.path) if a.table == "leaderboard" else headroom(a.path))


if __name__ == "__main__":
    main()
