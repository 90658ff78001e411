#!/usr/bin/env python
"""The tables of docs/sweeps.md's worked examples, from the committed kvrl-report summaries in
docs/figures/sweeps/<sweep>/summary.csv (written by scripts/sweeps_docs.sh), so the page and its
figures cannot disagree.

    python scripts/sweeps_table.py watermarks        # worked example 1: opt_factor, avg_block_len, fixed
    python scripts/sweeps_table.py eviction_prefix   # worked example 2
"""
from __future__ import annotations

import csv
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIGURES = ROOT / "docs" / "figures" / "sweeps"
METRICS = (("goodput_tok_s", "goodput tok/s"), ("ttft_p99_s", "p99 TTFT s"), ("preemptions", "preemptions"))
# worked example 1: (sweep, parameter column, label, values shown)
WATERMARKS = (("opt_factor", "watermark.a", "opt_factor", "a", (0, 1, 4, 8, 12)),
              ("avg_block_len", "watermark.t", "avg_block_len", "t", (1.8, 3.0, 4.2, 5.4, 6.6, 7.4)),
              ("fixed", "watermark.fraction", "fixed", "fraction", (0.0, 0.01, 0.05, 0.1, 0.2)))


def read(sweep: str) -> list[dict[str, str]]:
    path = FIGURES / sweep / "summary.csv"
    if not path.is_file():
        sys.exit(f"{path} is missing: run scripts/sweeps_docs.sh {sweep}")
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def num(text: str) -> float:
    return float(text) if text not in ("", None) else math.nan


def fmt(x: float) -> str:
    if math.isnan(x):
        return ""
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def cell(row: dict, metric: str) -> str:
    mean, ci = fmt(num(row[f"{metric}_mean"])), fmt(num(row[f"{metric}_ci95"]))
    return f"{mean} ± {ci}" if ci else mean


def verdict(row: dict, metric: str = "goodput_tok_s") -> str:
    """``+5.1% (better, p 0.003)`` against the sweep's baseline, Holm-adjusted p; "baseline" for it."""
    if not row.get(f"{metric}_verdict"):
        return "baseline"
    pct, p = num(row[f"{metric}_pct_change"]), num(row.get(f"{metric}_p_holm") or row[f"{metric}_p"])
    return f"{pct:+.1f}% ({row[f'{metric}_verdict']}, p {p:.2g})"


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows]) + "\n"


def watermarks() -> str:
    rows = []
    for sweep, column, policy, short, values in WATERMARKS:
        summary = read(sweep)
        for value in values:
            row = next((r for r in summary if math.isclose(num(r[column]), value, abs_tol=1e-9)), None)
            if row is None:
                sys.exit(f"{sweep}: no setting {column}={value} in {FIGURES / sweep / 'summary.csv'}")
            rows.append([policy, f"{short} = {value:g}", *(cell(row, m) for m, _ in METRICS), verdict(row)])
    return table(["policy", "parameter", *(label for _, label in METRICS), "goodput vs the sweep's baseline"], rows)


def eviction_prefix() -> str:
    summary = sorted(read("eviction_prefix"), key=lambda r: int(r["rank"]))
    rows = [[r["eviction"], r["prefix_cache"], *(cell(r, m) for m, _ in METRICS), verdict(r)] for r in summary]
    return table(["eviction", "prefix_cache", *(label for _, label in METRICS), "goodput vs lifo + hash_lru"], rows)


if __name__ == "__main__":
    tables = {"watermarks": watermarks, "eviction_prefix": eviction_prefix}
    if len(sys.argv) != 2 or sys.argv[1] not in tables:
        sys.exit(f"usage: {sys.argv[0]} {' | '.join(tables)}")
    print(tables[sys.argv[1]](), end="")
