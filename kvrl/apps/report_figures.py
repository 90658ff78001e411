"""``kvrl-report``'s figures: metrics against a swept parameter, bars per setting, the Pareto plot,
and their caption (each as PNG and PDF through :mod:`kvrl.apps.figures`).
"""
from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any, Sequence

from kvrl.analysis.sweeps import PARETO, Sweep, fmt, setting_label
from kvrl.apps import figures


def _color(i: int) -> Any:
    return figures.pyplot().get_cmap("tab10" if i < 10 else "tab20")(i % 20)


def _legend_right(ax: Any) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0))


def _groups(summary: Sequence[dict], params: Sequence[str]) -> dict[str, list[dict]]:
    groups: dict[str, list[dict]] = defaultdict(list)
    for row in summary:
        groups[setting_label(row, params)].append(row)
    return groups


def _ci(row: dict, metric: str) -> float:
    ci = row[f"{metric}_ci95"]
    return 0.0 if math.isnan(ci) else ci


def plot_vs_param(summary: Sequence[dict], param: str, others: Sequence[str], metrics: Sequence[str],
                  path: Path, caption: str = "") -> list[Path]:
    """Each metric against ``param``: one line per setting of ``others``, mean ± 95% CI band
    (clipped to the metric's range)."""
    plt = figures.pyplot()
    lines = _groups(summary, others)
    fig, axes = plt.subplots(1, len(metrics), figsize=(3.2 * len(metrics), 2.7), squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        for i, (label, rows) in enumerate(lines.items()):
            rows = sorted(rows, key=lambda r: r[param])
            x, mean = [r[param] for r in rows], [r[f"{metric}_mean"] for r in rows]
            ax.plot(x, mean, marker="o", markersize=2.5, color=_color(i), label=label if others else None)
            figures.band(ax, x, mean, [_ci(r, metric) for r in rows], metric, color=_color(i), alpha=0.2,
                         linewidth=0)
        ax.set_xlabel(param)
        figures.set_metric_label(ax, metric)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    _legend_right(axes[0][-1])
    return figures.save(fig, path, caption)


def plot_bars(summary: Sequence[dict], categorical: Sequence[str], metrics: Sequence[str], path: Path,
              caption: str = "") -> list[Path]:
    """Each metric per setting of a sweep without numeric parameters: groups along x by all but
    the last categorical parameter, one bar per value of the last, 95% CI error bars (clipped to
    the metric's range)."""
    plt = figures.pyplot()
    *outer, inner = categorical
    groups = _groups(summary, outer)
    bars = list(dict.fromkeys(fmt(r[inner]) for r in summary))
    width = 0.8 / len(bars)
    fig, axes = plt.subplots(1, len(metrics), figsize=(max(3.2, 0.25 * len(summary)) * len(metrics), 2.9),
                             squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        for j, bar in enumerate(bars):
            cells = [(x, next((r for r in rows if fmt(r[inner]) == bar), None))
                     for x, rows in enumerate(groups.values())]
            cells = [(x, r) for x, r in cells if r is not None]
            means = [r[f"{metric}_mean"] for _, r in cells]
            ax.bar([x + (j - (len(bars) - 1) / 2) * width for x, _ in cells], means, width,
                   yerr=figures.error_bars(metric, means, [_ci(r, metric) for _, r in cells]), color=_color(j),
                   capsize=2, label=f"{inner}={bar}")
        ax.set_xticks(range(len(groups)), list(groups) if outer else [""], rotation=30, ha="right")
        figures.set_metric_label(ax, metric)
        ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    _legend_right(axes[0][-1])
    return figures.save(fig, path, caption)


def plot_pareto(summary: Sequence[dict], settings: Sequence[str], categorical: Sequence[str],
                front: Sequence[int], path: Path, caption: str = "") -> list[Path]:
    """Throughput against p99 TTFT per setting, the Pareto front ringed, joined and labelled. Colour:
    the categorical parameters (with two or more, the last one is the marker instead); without
    categorical parameters the colour shows the first swept (numeric) parameter."""
    plt = figures.pyplot()
    x_key, y_key = (f"{m}_mean" for m in PARETO)
    fig, ax = plt.subplots(figsize=(5.0, 3.6))
    if not categorical:
        shade = [r[settings[0]] for r in summary] if settings else None
        dots = ax.scatter([r[x_key] for r in summary], [r[y_key] for r in summary], s=18, c=shade,
                          cmap="viridis" if settings else None)
        if settings:
            fig.colorbar(dots, ax=ax, label=settings[0])
    by_color, by_marker = (categorical[:-1], categorical[-1]) if len(categorical) > 1 else (categorical, None)
    markers = list(dict.fromkeys(fmt(r[by_marker]) for r in summary)) if by_marker else [None]
    for i, (label, rows) in enumerate(_groups(summary, by_color).items() if categorical else ()):
        for j, marker in enumerate(markers):
            mine = [r for r in rows if marker is None or fmt(r[by_marker]) == marker]
            if not mine:
                continue
            name = label if marker is None else f"{label}, {by_marker}={marker}"
            ax.scatter([r[x_key] for r in mine], [r[y_key] for r in mine], s=18, color=_color(i),
                       marker="osD^v<>ph*"[j % 10], alpha=0.8, label=name)
    best = sorted((summary[i] for i in front), key=lambda r: r[x_key])
    if best:   # rings round the front's points, joined: visible (and in the legend) even for one point
        ax.plot([r[x_key] for r in best], [r[y_key] for r in best], "k--", linewidth=0.8, marker="o", markersize=9,
                markerfacecolor="none", label="Pareto front (clean settings)")
    for row in best:
        ax.annotate(setting_label(row, settings), (row[x_key], row[y_key]), fontsize=6, xytext=(-3, 3),
                    textcoords="offset points", ha="right")
    figures.set_metric_label(ax, PARETO[0], "x", ", mean over seeds")
    figures.set_metric_label(ax, PARETO[1], "y", ", mean over seeds")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    if categorical:
        _legend_right(ax)
    elif best:
        ax.legend()
    return figures.save(fig, path, caption)


def caption_of(sweep: Sweep, summary: Sequence[dict]) -> str:
    """The figures' caption: workload and common overrides, seeds, what the marks are."""
    seeds = sorted({r[sweep.seed] for r in sweep.rows}, key=str) if sweep.seed else []
    scenario = " ".join(f"{k}={fmt(v)}" for k, v in sweep.common.items() if k.split(".")[0] in
                        ("workload", "engine", "backend", "model", "device", "scheduler", "watermark", "eviction",
                         "prefix_cache", "slo"))
    text = f"Workload {sweep.workload or '?'}" + (f" ({scenario})" if scenario else "") + ". "
    text += (f"Mean and 95% CI (Student t) over {len(seeds)} seeds ({sweep.seed} = "
             f"{', '.join(fmt(s) for s in seeds)})." if seeds else "One job per setting (no seeds swept; no CI).")
    if any(s["identical_seeds"] for s in summary):
        text += " Seeds that gave identical jobs: no interval."
    return text
