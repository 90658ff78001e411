"""Two policies of one kvrl-fidelity run compared over its workloads, live and in the sim: the paired
difference per metric (mean ± 95% CI over workloads, its share of the baseline's mean, p, verdict) beside
the sim's error on each policy's mean. For a fidelity set whose workloads are one task's seeds
(conf/fidelity_set/tenants.yaml): does the sim predict the policies' difference live?

    python scripts/fidelity_policy_pairs.py <run>/fidelity.csv --policy lpm --baseline vllm \\
        [--metrics goodput_tok_s throughput_tok_s ttft_p99_s] [--workloads tenants_s0 ...]

Prints Markdown (docs/fidelity.md, "Runs 68-69").
"""
from __future__ import annotations

import argparse
import csv
from collections import defaultdict

import numpy as np

from kvrl.analysis.stats import paired_compare


def read(rows) -> dict:
    """``{(metric, policy, side): {workload: value}}`` of a fidelity.csv's rows (dicts; side: live or sim; not
    its ``ranking`` rows)."""
    out: dict = defaultdict(dict)
    for r in rows:
        if r["policy"] == "ranking":
            continue
        for side in ("live", "sim"):
            if r[side] not in ("", "nan"):
                out[(r["metric"], r["policy"], side)][r["workload"]] = float(r[side])
    return out


def table(values: dict, policy: str, baseline: str, metrics, workloads=None) -> str:
    def pick(metric, pol, side):
        got = values.get((metric, pol, side), {})
        return {w: v for w, v in got.items() if workloads is None or w in workloads}

    lines = [f"`{policy}` against `{baseline}` (paired over workloads; 95% CI)", "",
             "| metric | workloads | live: Δ | live: % (p, verdict) | sim: Δ | sim: % (p, verdict) "
             f"| sim error, {baseline} mean | sim error, {policy} mean |",
             "|---|---:|---:|---|---:|---|---:|---:|"]
    for metric in metrics:
        cells = []
        for side in ("live", "sim"):
            c = paired_compare(pick(metric, policy, side), pick(metric, baseline, side), metric)
            cells.append((c, f"{c.delta:+.4g} ± {c.delta_ci:.3g}", f"{c.pct_change:+.1f}% (p {c.p_value:.2g}, {c.verdict})"))
        errs = []
        for pol in (baseline, policy):
            live, sim = pick(metric, pol, "live"), pick(metric, pol, "sim")
            both = [w for w in live if w in sim]
            lm, sm = np.mean([live[w] for w in both]), np.mean([sim[w] for w in both])
            errs.append(f"{100 * (sm / lm - 1):+.1f}%")
        lines.append(f"| {metric} | {cells[0][0].n} | {cells[0][1]} | {cells[0][2]} | {cells[1][1]} | {cells[1][2]} "
                     f"| {errs[0]} | {errs[1]} |")
    per = pick("throughput_tok_s", policy, "live")
    if per:
        lines += ["", "Per workload, the sim's relative error (throughput, goodput):", "",
                  f"| workload | {baseline} | {policy} |", "|---|---|---|"]
        for w in sorted(per):
            row = []
            for pol in (baseline, policy):
                e = [pick(m, pol, "sim").get(w, np.nan) / pick(m, pol, "live").get(w, np.nan) - 1
                     for m in ("throughput_tok_s", "goodput_tok_s")]
                row.append(", ".join(f"{100 * x:+.1f}%" for x in e))
            lines.append(f"| {w} | {row[0]} | {row[1]} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--policy", required=True)
    ap.add_argument("--baseline", required=True)
    ap.add_argument("--metrics", nargs="+", default=["goodput_tok_s", "throughput_tok_s", "ttft_p99_s", "tpot_p50_s"])
    ap.add_argument("--workloads", nargs="*", default=None)
    a = ap.parse_args(argv)
    with open(a.csv) as f:
        values = read(csv.DictReader(f))
    print(table(values, a.policy, a.baseline, a.metrics, set(a.workloads) if a.workloads else None))


if __name__ == "__main__":
    main()
