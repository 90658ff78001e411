"""Leaderboards of ``kvrl-eval``: each policy's metrics over seeds as mean and 95% confidence
interval (Student t, kvrl/analysis/stats.py), plus the paired goodput comparison with reference
policies (per seed, the same requests): mean difference with its interval, % change and a verdict
(better / worse / no significant difference at 95%). Written as CSV and Markdown (every column),
a compact text table for the terminal (fits 120 columns; the files have the rest), and the two
plots (goodput bars with CIs; watermark and KV usage over time), each also as a vector PDF.

One row per distinct policy: :func:`dedupe_policies` merges a policy that repeats another's plugin
config (the val-picked constant equal to a baseline) into one row labelled with both roles. A run
with aborted requests or policy errors is *invalid*: its policy's row says how many, a warning is
printed with the table, and such rows rank after every clean one.
"""
from __future__ import annotations

import csv
import dataclasses
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from kvrl import plugins
from kvrl.analysis.metrics import spec
from kvrl.analysis.stats import Comparison, mean_ci, paired_compare
from kvrl.apps import figures
from kvrl.apps.outputs import atomic_write

METRICS = ("goodput_tok_s", "throughput_tok_s", "slo_attainment", "ttft_p99_s", "tpot_p99_s", "preemptions",
           "recomputed_tokens")
RANK_BY = "goodput_tok_s"
INVALID_IF = ("aborted", "policy_errors")
TERMINAL_WIDTH = 120


def _canonical(plugin: Mapping[str, Any], role: Optional[str]) -> Any:
    """A plugin config with every parameter spelt out (its ``Params`` defaults filled in), so that
    ``{name: cost_aware}`` and ``{name: cost_aware, victim: lifo}`` compare equal; the config as
    given without a ``role`` or for a name the registry cannot build."""
    if role is None:
        return plugin
    spec = dict(plugin)
    name = spec.pop("name", None)
    try:
        params = plugins.make_params(role, name, **spec)
    except (KeyError, ValueError, TypeError):
        return plugin
    return name, dataclasses.asdict(params) if dataclasses.is_dataclass(params) else spec


def dedupe_policies(policies: Sequence[Any], role: Optional[str] = None) -> list[Any]:
    """``policies`` (objects with ``label``, ``kind``, ``plugin``; dataclasses) with each one whose
    plugin config equals an earlier one's merged into the earlier: it keeps the earlier's place
    and plugin, takes the later's kind when that is ``val-best`` and gets the later's ``[...]`` tag
    appended to its label (``fixed(fraction=0.01) [val-best]``). With ``role`` (the plugin kind),
    configs are compared with their parameters' defaults filled in (a val-tuned heuristic whose
    pick is its defaults is its default row)."""
    out: list[Any] = []
    keys: list[Any] = []                       # _canonical of each entry of out
    for policy in policies:
        key = _canonical(policy.plugin, role)
        same = next((i for i, k in enumerate(keys) if k == key), None)
        if same is None:
            out.append(policy)
            keys.append(key)
            continue
        tag = re.search(r"\[[^\]]*\]$", policy.label)
        first = out[same]
        out[same] = dataclasses.replace(first, label=f"{first.label} {tag.group(0)}" if tag else first.label,
                                        kind=policy.kind if policy.kind == "val-best" else first.kind)
    return out


@dataclass
class Row:
    """One policy's line: label, kind (heuristic | val-best | agent), runs, ``invalid`` (runs with
    aborted requests or policy errors), per metric ``(mean, CI half-width)``, per reference policy
    the paired goodput difference ``(mean, CI half-width)`` over the seeds both ran, and the full
    :class:`~kvrl.analysis.stats.Comparison` (% change, p-value, verdict) in ``comparisons``."""

    policy: str
    kind: str
    runs: int
    stats: dict[str, tuple[float, float]] = field(default_factory=dict)
    deltas: dict[str, tuple[float, float]] = field(default_factory=dict)
    comparisons: dict[str, Comparison] = field(default_factory=dict)
    invalid: int = 0


def _invalid(run: Mapping[str, Any]) -> bool:
    return any((run.get(k) or 0) > 0 for k in INVALID_IF)


def build_rows(results: Sequence[Mapping[str, Any]], references: Sequence[str] = ()) -> list[Row]:
    """Rows from per-run results (keys ``policy``, ``kind``, ``seed`` and the metrics), clean rows
    first, each part by best mean goodput, with paired goodput comparisons to each policy of
    ``references`` (repeats ignored)."""
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for r in results:
        groups.setdefault(r["policy"], []).append(r)
    by_seed = {p: {r["seed"]: r.get(RANK_BY) for r in runs} for p, runs in groups.items()}
    rows = []
    for policy, runs in groups.items():
        row = Row(policy, runs[0]["kind"], len(runs), {m: mean_ci([r.get(m) for r in runs]) for m in METRICS},
                  invalid=sum(1 for r in runs if _invalid(r)))
        for ref in dict.fromkeys(references):
            if ref in by_seed:
                c = paired_compare(by_seed[policy], by_seed[ref], RANK_BY)
                row.deltas[ref] = (c.delta, c.delta_ci)
                row.comparisons[ref] = c
        rows.append(row)
    return sorted(rows, key=lambda row: (row.invalid > 0, -np.nan_to_num(row.stats[RANK_BY][0], nan=-np.inf)))


def warnings(rows: Sequence[Row]) -> list[str]:
    """One line per policy with invalid runs."""
    return [f"{row.policy}: {row.invalid} of {row.runs} runs aborted requests or had policy errors "
            "(invalid: ranked after every clean policy)" for row in rows if row.invalid]


def _refs(rows: Sequence[Row]) -> list[str]:
    return list(rows[0].deltas) if rows else []


def _columns(rows: Sequence[Row]) -> list[str]:
    return list(METRICS) + [f"Δ{RANK_BY} vs {ref}" for ref in _refs(rows)]


def _fmt(value: float) -> str:
    if not math.isfinite(value):
        return "-"
    return f"{value:.4g}" if abs(value) < 1e4 else f"{value:.0f}"


def _cell(stat: tuple[float, float]) -> str:
    mean, half = stat
    return _fmt(mean) if not math.isfinite(half) else f"{_fmt(mean)} ± {_fmt(half)}"


def _pct(c: Comparison) -> str:
    return f"{c.pct_change:+.1f}%" if math.isfinite(c.pct_change) else "-"


def _p(c: Comparison) -> str:
    return f"{c.p_value:.2g}" if math.isfinite(c.p_value) else "-"


def write_csv(rows: Sequence[Row], path: os.PathLike) -> None:
    """``rank, policy, kind, runs, invalid_runs, <column>_mean, <column>_ci95`` per row (metrics,
    then deltas), then per reference ``pct_change``, ``p`` and ``verdict``."""
    refs = _refs(rows)

    def write(f):
        w = csv.writer(f)
        w.writerow(["rank", "policy", "kind", "runs", "invalid_runs"]
                   + [f"{c}_{s}" for c in _columns(rows) for s in ("mean", "ci95")]
                   + [f"vs {ref}_{s}" for ref in refs for s in ("pct_change", "p", "verdict")])
        for i, row in enumerate(rows, 1):
            values = [v for m in METRICS for v in row.stats[m]] + [v for d in row.deltas.values() for v in d]
            verdicts = [v for ref in refs for c in [row.comparisons[ref]] for v in (c.pct_change, c.p_value, c.verdict)]
            w.writerow([i, row.policy, row.kind, row.runs, row.invalid] + values + verdicts)
    atomic_write(path, write)


def markdown(rows: Sequence[Row], title: str, notes: Sequence[str] = ()) -> str:
    """The leaderboard as a Markdown section: every metric as mean ± 95% CI half-width, then per
    reference policy the paired goodput difference, its % change, p-value and verdict."""
    notes = [*notes, *(f"**Warning:** {w}" for w in warnings(rows))]
    lines = [f"## {title}", "", *[f"{n}  " for n in notes], ""] if notes else [f"## {title}", ""]
    refs = _refs(rows)
    columns = [*METRICS, *(c for ref in refs for c in (f"Δ{RANK_BY} vs {ref}", "%", "p", "verdict"))]
    lines.append("| # | policy | kind | runs | invalid runs | " + " | ".join(columns) + " |")
    lines.append("|---|---|---|---|---|" + "---|" * len(columns))
    for i, row in enumerate(rows, 1):
        cells = [_cell(row.stats[m]) for m in METRICS]
        for ref in refs:
            c = row.comparisons[ref]
            same = row.policy == ref
            cells += ["(reference)" if same else _cell((c.delta, c.delta_ci)), "" if same else _pct(c),
                      "" if same else _p(c), "" if same else c.verdict]
        lines.append(f"| {i} | {row.policy} | {row.kind} | {row.runs} | {row.invalid or ''} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def text_table(rows: Sequence[Row], title: str, files: Sequence[os.PathLike] = (),
               width: int = TERMINAL_WIDTH) -> str:
    """The leaderboard for a terminal of ``width`` columns: rank, policy (wrapped, never cut),
    goodput and p99 TTFT (mean ± CI), per reference the paired % change and verdict, invalid runs;
    then warnings and ``files`` (the full tables), one whole path per line (never wrapped)."""
    from rich import box
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    refs = _refs(rows)
    table = Table(title=Text(title), box=box.MINIMAL, pad_edge=False, title_justify="left")
    table.add_column("#", justify="right")
    table.add_column("policy", overflow="fold", ratio=3)
    table.add_column("goodput_tok_s", justify="right", no_wrap=True)
    table.add_column("p99 TTFT s", justify="right", no_wrap=True)
    for i, ref in enumerate(refs):
        table.add_column(f"vs [{i + 1}] (paired)", justify="right", overflow="fold", ratio=1)
    if any(row.invalid for row in rows):
        table.add_column("invalid", justify="right")
    for i, row in enumerate(rows, 1):
        cells = [str(i), Text(row.policy), _cell(row.stats[RANK_BY]), _cell(row.stats["ttft_p99_s"])]
        for ref in refs:
            c = row.comparisons[ref]
            cells.append("reference" if row.policy == ref else f"{_pct(c)} {_short(c.verdict)}")
        if any(r.invalid for r in rows):
            cells.append(f"{row.invalid}/{row.runs}" if row.invalid else "")
        table.add_row(*cells)
    console = Console(width=width, record=True, force_terminal=False)
    with console.capture() as cap:
        console.print(table)
    lines = [line.rstrip() for line in cap.get().rstrip("\n").splitlines()]
    lines += [f"[{i + 1}] {ref}" for i, ref in enumerate(refs)]
    lines += [f"warning: {w}" for w in warnings(rows)]
    if files:
        lines.append("full tables and plots:")
        lines += [f"  {Path(p)}" for p in files]
    return "\n".join(lines) + "\n"


def _short(verdict: str) -> str:
    return {"no significant difference": "n.s."}.get(verdict, verdict)


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


def plot_bars(rows: Sequence[Row], path: os.PathLike, metric: str = RANK_BY, caption: Optional[str] = None) -> None:
    """Horizontal bars of ``metric`` per policy with 95% CI error bars clipped to the metric's range
    (PNG at ``path``, PDF beside it)."""
    plt = figures.pyplot()
    labels = [row.policy + (" (invalid)" if row.invalid else "") for row in rows][::-1]
    means = [row.stats[metric][0] for row in rows][::-1]
    halves = [row.stats[metric][1] for row in rows][::-1]
    colors = [{"agent": "tab:red", "val-best": "tab:green"}.get(row.kind, "tab:blue") for row in rows][::-1]
    fig, ax = plt.subplots(figsize=(6.5, 0.35 * len(rows) + 1.0))
    ax.barh(labels, means, xerr=figures.error_bars(metric, means, halves), color=colors, capsize=3)
    figures.set_metric_label(ax, metric, "x", ", mean and 95% CI over seeds")
    ax.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    figures.save(fig, Path(path), caption)


def _same_trace(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def plot_traces(traces: Mapping[str, Mapping[str, np.ndarray]], path: os.PathLike, caption: Optional[str] = None) -> None:
    """One panel per distinct trace over engine time: KV occupancy (used / total blocks), the
    watermark in force (reserved / total blocks) and, on a second axis, cumulative preemptions,
    each held from one engine step to the next (idle gaps show the last busy step's value).
    Policies with identical traces share one panel (its title names them all); a run without
    preemptions gets a 0-1 preemption axis marked "no preemptions" instead of an autoscaled one.
    ``traces`` maps a policy to arrays ``time_s``, ``kv_occupancy``, ``watermark``, ``preemptions``."""
    if not traces:
        return
    panels: list[tuple[list[str], Mapping[str, np.ndarray]]] = []
    for policy, tr in traces.items():
        same = next((p for p in panels if _same_trace(p[1], tr)), None)
        if same:
            same[0].append(policy)
        else:
            panels.append(([policy], tr))
    plt = figures.pyplot()
    fig, axes = plt.subplots(len(panels), 1, figsize=(7.5, 1.9 * len(panels) + 0.6), sharex=True, squeeze=False)
    for ax, (policies, tr) in zip(axes[:, 0], panels):
        ax.plot(tr["time_s"], tr["kv_occupancy"], lw=0.6, drawstyle="steps-post", label="KV occupancy")
        ax.plot(tr["time_s"], tr["watermark"], lw=1.2, drawstyle="steps-post", label="watermark (reserved / total)")
        ax.set_ylim(0, 1.05)
        ax.set_ylabel("fraction of blocks")
        ax.set_title(" = ".join(policies) + (" (identical runs)" if len(policies) > 1 else ""), fontsize=8)
        twin = ax.twinx()
        twin.plot(tr["time_s"], tr["preemptions"], color="tab:red", lw=0.8, drawstyle="steps-post",
                  label="preemptions (cumulative)")
        top = float(np.max(tr["preemptions"])) if len(tr["preemptions"]) else 0.0
        twin.set_ylim(0, max(1.0, top * 1.05))
        twin.yaxis.get_major_locator().set_params(integer=True)
        if top == 0:
            twin.text(0.99, 0.05, "no preemptions", transform=twin.transAxes, ha="right", fontsize=7, color="tab:red")
        twin.set_ylabel(spec("preemptions").axis_label)
        handles = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
        ax.legend(handles=handles, loc="upper left", fontsize=6)
    axes[-1, 0].set_xlabel("engine time (s)")
    fig.tight_layout()
    figures.save(fig, Path(path), caption)
