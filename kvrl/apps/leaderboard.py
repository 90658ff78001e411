"""Leaderboards of ``kvrl-eval``: each policy's metrics over seeds as mean and 95% confidence
interval (Student t), plus the paired goodput difference to reference policies (per seed, the
same requests), written as CSV, Markdown and a text table, and the two plots (goodput bars with
CIs; watermark and KV usage over time)."""
from __future__ import annotations

import csv
import math
import os
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from kvrl.analysis.stats import mean_ci
from kvrl.apps.outputs import atomic_write

METRICS = ("goodput_tok_s", "throughput_tok_s", "slo_attainment", "ttft_p99_s", "tpot_p99_s", "preemptions",
           "recomputed_tokens")
RANK_BY = "goodput_tok_s"


@dataclass
class Row:
    """One policy's line: label, kind (heuristic | val-best | agent), runs, per metric ``(mean,
    CI half-width)``, and per reference policy the paired goodput difference ``(mean, CI
    half-width)`` over the seeds both ran."""

    policy: str
    kind: str
    runs: int
    stats: dict[str, tuple[float, float]] = field(default_factory=dict)
    deltas: dict[str, tuple[float, float]] = field(default_factory=dict)

    def interval(self, metric: str = RANK_BY) -> tuple[float, float]:
        mean, half = self.stats[metric]
        return mean - half, mean + half


def build_rows(results: Sequence[Mapping[str, Any]], references: Sequence[str] = ()) -> list[Row]:
    """Rows from per-run results (keys ``policy``, ``kind``, ``seed`` and the metrics), best
    goodput first, with paired goodput differences to each policy of ``references``."""
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for r in results:
        groups.setdefault(r["policy"], []).append(r)
    by_seed = {p: {r["seed"]: r[RANK_BY] for r in runs} for p, runs in groups.items()}
    rows = []
    for policy, runs in groups.items():
        row = Row(policy, runs[0]["kind"], len(runs), {m: mean_ci([r.get(m) for r in runs]) for m in METRICS})
        for ref in references:
            if ref in by_seed:
                mine, theirs = by_seed[policy], by_seed[ref]
                row.deltas[ref] = mean_ci([mine[s] - theirs[s] for s in mine if s in theirs])
        rows.append(row)
    return sorted(rows, key=lambda row: -row.stats[RANK_BY][0])


def _columns(rows: Sequence[Row]) -> list[str]:
    refs = list(rows[0].deltas) if rows else []
    return list(METRICS) + [f"Δ{RANK_BY} vs {ref}" for ref in refs]


def _cells(row: Row) -> list[str]:
    return [_cell(row.stats[m]) for m in METRICS] + [_cell(d) for d in row.deltas.values()]


def _fmt(value: float) -> str:
    if not math.isfinite(value):
        return "-"
    return f"{value:.4g}" if abs(value) < 1e4 else f"{value:.0f}"


def _cell(stat: tuple[float, float]) -> str:
    mean, half = stat
    return _fmt(mean) if not math.isfinite(half) else f"{_fmt(mean)} ± {_fmt(half)}"


def write_csv(rows: Sequence[Row], path: os.PathLike) -> None:
    """``rank, policy, kind, runs, <column>_mean, <column>_ci95`` per row (metrics, then deltas)."""
    def write(f):
        w = csv.writer(f)
        w.writerow(["rank", "policy", "kind", "runs"] + [f"{c}_{s}" for c in _columns(rows) for s in ("mean", "ci95")])
        for i, row in enumerate(rows, 1):
            values = [v for m in METRICS for v in row.stats[m]] + [v for d in row.deltas.values() for v in d]
            w.writerow([i, row.policy, row.kind, row.runs] + values)
    atomic_write(path, write)


def markdown(rows: Sequence[Row], title: str, notes: Sequence[str] = ()) -> str:
    """The leaderboard as a Markdown section (mean ± 95% CI half-width)."""
    lines = [f"## {title}", "", *[f"{n}  " for n in notes], ""] if notes else [f"## {title}", ""]
    columns = _columns(rows)
    lines.append("| # | policy | kind | runs | " + " | ".join(columns) + " |")
    lines.append("|---|---|---|---|" + "---|" * len(columns))
    for i, row in enumerate(rows, 1):
        lines.append(f"| {i} | {row.policy} | {row.kind} | {row.runs} | " + " | ".join(_cells(row)) + " |")
    return "\n".join(lines) + "\n"


def text_table(rows: Sequence[Row], title: str) -> str:
    """The leaderboard as a rich text table."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for col in ("#", "policy", "kind", *_columns(rows)):
        table.add_column(col, justify="left" if col in ("policy", "kind") else "right")
    for i, row in enumerate(rows, 1):
        table.add_row(str(i), row.policy, row.kind, *_cells(row))
    console = Console(width=260, record=True, force_terminal=False)
    with console.capture() as cap:
        console.print(table)
    return cap.get()


def key_value_table(title: str, values: Mapping[str, Any]) -> str:
    """A two-column text table of ``values``."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    table.add_column("key")
    table.add_column("value", justify="right")
    for key, value in values.items():
        table.add_row(key, f"{value:.4g}" if isinstance(value, float) else str(value))
    console = Console(width=120, record=True, force_terminal=False)
    with console.capture() as cap:
        console.print(table)
    return cap.get()


def plot_bars(rows: Sequence[Row], path: os.PathLike, metric: str = RANK_BY) -> None:
    """Horizontal bars of ``metric`` per policy with 95% CI error bars."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [row.policy for row in rows][::-1]
    means = [row.stats[metric][0] for row in rows][::-1]
    halves = [row.stats[metric][1] if math.isfinite(row.stats[metric][1]) else 0.0 for row in rows][::-1]
    colors = [{"agent": "tab:red", "val-best": "tab:green"}.get(row.kind, "tab:blue") for row in rows][::-1]
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(rows) + 1.2))
    ax.barh(labels, means, xerr=halves, color=colors, capsize=4)
    ax.set_xlabel(f"{metric} (mean, 95% CI)")
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=110), mode="wb")
    plt.close(fig)


def plot_traces(traces: Mapping[str, Mapping[str, np.ndarray]], path: os.PathLike) -> None:
    """One panel per policy over engine time: KV occupancy (used / total blocks), the watermark
    in force (reserved / total blocks) and, on a second axis, cumulative preemptions, each held
    from one engine step to the next (idle gaps show the last busy step's value). ``traces``
    maps a policy to arrays ``time_s``, ``kv_occupancy``, ``watermark``, ``preemptions``."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not traces:
        return
    fig, axes = plt.subplots(len(traces), 1, figsize=(10, 2.4 * len(traces) + 0.6), sharex=True, squeeze=False)
    for ax, (policy, tr) in zip(axes[:, 0], traces.items()):
        ax.plot(tr["time_s"], tr["kv_occupancy"], lw=0.6, drawstyle="steps-post", label="KV occupancy")
        ax.plot(tr["time_s"], tr["watermark"], lw=1.2, drawstyle="steps-post", label="watermark (reserved / total)")
        ax.set_ylim(0, 1.05)
        ax.set_ylabel("fraction")
        ax.set_title(policy, fontsize=9)
        twin = ax.twinx()
        twin.plot(tr["time_s"], tr["preemptions"], color="tab:red", lw=0.8, drawstyle="steps-post",
                  label="preemptions (cumulative)")
        twin.set_ylabel("preemptions")
        handles = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
        ax.legend(handles=handles, loc="upper left", fontsize=7)
    axes[-1, 0].set_xlabel("engine time (s)")
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=110), mode="wb")
    plt.close(fig)
