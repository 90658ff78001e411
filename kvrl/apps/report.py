"""``kvrl-report <sweep dir>``: one table and plots from every job of a sweep.

A *job* is a directory under the sweep directory holding ``.hydra/overrides.yaml`` (Hydra writes
it for every job, whatever the launcher or sweeper) or a ``metrics.json``. Each job with a
``metrics.json`` is one row: ``job`` (its path relative to the sweep directory), one column per
override key whose value differs between jobs (the swept parameters; a config group shows the
chosen option, other keys their value in the job's resolved ``config.yaml``), then one column per
numeric metric. Jobs without ``metrics.json`` (failed, still running) are skipped and listed.

Replicates: the seed column is ``seed`` if swept, else ``workload.seed`` if swept. A *setting* is
one combination of the other swept parameters; its rows are its seeds.

Writes into ``--out`` (default ``<sweep dir>/report``):

* ``jobs.csv``, ``jobs.md`` and ``jobs.parquet`` (with pyarrow) or else ``jobs.jsonl``: the table;
* ``summary.csv``: per setting, the number of seeds ``n`` and each metric's mean and 95%
  confidence half-width (Student t; empty for n = 1);
* ``report.md``: common overrides, skipped jobs, the summary as ``mean ± ci`` and the Pareto front;
* ``vs_<param>.png`` for each numeric swept parameter: the plot metrics against it, one line per
  setting of the other swept parameters (plugins), mean with a 95% CI band over seeds;
* ``bars.png`` when no swept parameter is numeric (e.g. plugin against plugin): the plot metrics
  per setting, 95% CI error bars;
* ``pareto.png``: throughput against p99 TTFT per setting, the Pareto front (higher throughput,
  lower TTFT) marked.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

import yaml

METRIC_ORDER = ("requests", "finished", "output_tokens", "duration_s", "throughput_tok_s", "goodput_tok_s",
                "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "kv_utilization", "kv_occupancy",
                "preemptions", "swapped_out_blocks", "swapped_in_blocks", "recomputed_tokens",
                "prefix_hit_rate")
PLOT_METRICS = ("goodput_tok_s", "throughput_tok_s", "ttft_p99_s", "preemptions")
PARETO = ("throughput_tok_s", "ttft_p99_s")   # maximise x, minimise y
SEED_KEYS = ("seed", "workload.seed")
# Student t quantile 0.975 for 1..30 degrees of freedom; above 30 a Cornish-Fisher expansion.
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
        2.045, 2.042)


# ------------------------------------------------------------------------------------- collect
@dataclass
class Sweep:
    """The collected sweep: rows (one per job with metrics), their columns, and what was left out."""

    root: Path
    rows: list[dict[str, Any]]
    params: list[str]                  # swept parameter columns, in override order
    metrics: list[str]                 # metric columns
    common: dict[str, Any]             # overrides equal in every job
    skipped: dict[str, str] = field(default_factory=dict)   # job -> reason

    @property
    def seed(self) -> Optional[str]:
        return next((k for k in SEED_KEYS if k in self.params), None)

    @property
    def settings(self) -> list[str]:
        """The swept parameters other than the seed."""
        return [p for p in self.params if p != self.seed]

    def numeric(self, param: str) -> bool:
        return all(_is_number(r[param]) for r in self.rows)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _natural(path: Path) -> tuple:
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in path.parts)


def find_jobs(root: Path) -> list[Path]:
    """Job directories under ``root`` (see the module docs), in natural order (2 before 10)."""
    found = {p.parent.parent for p in root.rglob(".hydra/overrides.yaml")}
    found |= {p.parent for p in root.rglob("metrics.json")}
    return sorted(found, key=lambda p: _natural(p.relative_to(root)))


def _select(config: dict, key: str) -> Any:
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _override_items(job: Path, config: dict) -> list[tuple[str, Any]]:
    """``(key, value)`` per task override of ``job``: the chosen option of a config group, the
    resolved number of a numeric key, else the override's text."""
    path = job / ".hydra" / "overrides.yaml"
    items = []
    for line in (yaml.safe_load(path.read_text()) or []) if path.is_file() else []:
        key, _, raw = line.partition("=")
        key = key.lstrip("+~")
        value = _select(config, key)
        if isinstance(value, dict):
            value = str(value.get("name", raw))
        elif not _is_number(value):
            parsed = yaml.safe_load(raw) if raw else None
            value = parsed if _is_number(parsed) else raw
        items.append((key, value))
    return items


def collect(root: Path) -> Sweep:
    """Read every job under ``root``; raises ``FileNotFoundError`` if no job has metrics."""
    root = Path(root)
    values: list[tuple[str, dict[str, Any], dict[str, Any]]] = []
    skipped = {}
    for job in find_jobs(root):
        name = str(job.relative_to(root))
        if not (job / "metrics.json").is_file():
            skipped[name] = "no metrics.json"
            continue
        config_file = next((p for p in (job / "config.yaml", job / ".hydra" / "config.yaml") if p.is_file()), None)
        config = yaml.safe_load(config_file.read_text()) if config_file else {}
        metrics = json.loads((job / "metrics.json").read_text())
        values.append((name, dict(_override_items(job, config)), metrics))
    if not values:
        raise FileNotFoundError(f"no job with a metrics.json under {root}")
    keys = list(dict.fromkeys(k for _, params, _ in values for k in params))
    swept = [k for k in keys if len({json.dumps(p.get(k)) for _, p, _ in values}) > 1]
    common = {k: values[0][1].get(k) for k in keys if k not in swept}
    numeric = {k for _, _, m in values for k, v in m.items() if _is_number(v) or v is None}
    metrics = [k for k in METRIC_ORDER if k in numeric] + sorted(numeric - set(METRIC_ORDER))
    rows = [{"job": name, **{k: params.get(k) for k in swept}, **{k: m.get(k) for k in metrics}}
            for name, params, m in values]
    return Sweep(root, rows, swept, metrics, common, skipped)


# ------------------------------------------------------------------------------------ statistics
def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` >= 1 degrees of freedom."""
    if df <= len(T975):
        return T975[df - 1]
    z = 1.959964
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)


def mean_ci(values: Sequence[float]) -> tuple[float, float]:
    """Mean and 95% confidence half-width of ``values`` (NaN half-width for fewer than two)."""
    n = len(values)
    if n == 0:
        return math.nan, math.nan
    mean = sum(values) / n
    if n < 2:
        return mean, math.nan
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, t975(n - 1) * sd / math.sqrt(n)


def summarize(sweep: Sweep) -> list[dict[str, Any]]:
    """One row per setting: its parameters, ``n`` and ``<metric>_mean``/``<metric>_ci95``."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for row in sweep.rows:
        groups[tuple(json.dumps(row[p]) for p in sweep.settings)].append(row)
    out = []
    for rows in groups.values():
        summary = {p: rows[0][p] for p in sweep.settings} | {"n": len(rows)}
        for metric in sweep.metrics:
            mean, ci = mean_ci([r[metric] for r in rows if _is_number(r[metric])])
            summary[f"{metric}_mean"], summary[f"{metric}_ci95"] = mean, ci
        out.append(summary)
    return out


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points not dominated when maximising x and minimising y."""
    def dominated(i: int) -> bool:
        xi, yi = points[i]
        return any(x >= xi and y <= yi and (x, y) != (xi, yi) for x, y in points)
    return [i for i, p in enumerate(points) if all(map(math.isfinite, p)) and not dominated(i)]


# --------------------------------------------------------------------------------------- writers
def _fmt(x: Any) -> str:
    """Table text: empty for missing, floats to 4 significant digits (whole numbers from 10^4)."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return ""
    if isinstance(x, float):
        return f"{x:.0f}" if 1e4 <= abs(x) < 1e15 else f"{x:.4g}"
    return str(x)


def markdown_table(rows: Sequence[dict], columns: Sequence[str]) -> str:
    """``rows`` as a Markdown table of ``columns``, numbers formatted by :func:`_fmt`."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_fmt(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def _fmt_csv(x: Any) -> Any:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else x


def write_csv(path: Path, rows: Sequence[dict], columns: Sequence[str]) -> None:
    """``rows`` as CSV, full float precision, missing values empty."""
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, columns)
        writer.writeheader()
        writer.writerows({c: _fmt_csv(r.get(c)) for c in columns} for r in rows)


def write_columnar(stem: Path, rows: Sequence[dict]) -> Path:
    """``<stem>.parquet`` if pyarrow imports, else ``<stem>.jsonl``; returns the path written."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        path = stem.with_suffix(".jsonl")
        with open(path, "w") as f:
            for row in rows:
                f.write(json.dumps({k: None if isinstance(v, float) and math.isnan(v) else v
                                    for k, v in row.items()}) + "\n")
        return path
    path = stem.with_suffix(".parquet")
    pq.write_table(pa.Table.from_pylist(list(rows)), path)
    return path


# ----------------------------------------------------------------------------------------- plots
def _label(row: dict, params: Iterable[str]) -> str:
    return ", ".join(f"{p}={_fmt(row[p])}" for p in params) or "all"


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _color(i: int) -> Any:
    return _pyplot().get_cmap("tab10" if i < 10 else "tab20")(i % 20)


def _save(fig: Any, path: Path, legend_ax: Any = None) -> None:
    """Save ``fig``; ``legend_ax``'s legend goes to the right of the figure."""
    if legend_ax is not None and legend_ax.get_legend_handles_labels()[0]:
        legend_ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.savefig(path, dpi=110, bbox_inches="tight")
    _pyplot().close(fig)


def _groups(summary: Sequence[dict], params: Sequence[str]) -> dict[str, list[dict]]:
    groups: dict[str, list[dict]] = defaultdict(list)
    for row in summary:
        groups[_label(row, params)].append(row)
    return groups


def _ci(row: dict, metric: str) -> float:
    ci = row[f"{metric}_ci95"]
    return 0.0 if math.isnan(ci) else ci


def plot_vs_param(summary: Sequence[dict], param: str, others: Sequence[str], metrics: Sequence[str],
                  path: Path) -> None:
    """Each metric against ``param``: one line per setting of ``others``, mean ± 95% CI band."""
    plt = _pyplot()
    lines = _groups(summary, others)
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.3 * len(metrics), 3.6), squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        for i, (label, rows) in enumerate(lines.items()):
            rows = sorted(rows, key=lambda r: r[param])
            x, mean = [r[param] for r in rows], [r[f"{metric}_mean"] for r in rows]
            ci = [_ci(r, metric) for r in rows]
            ax.plot(x, mean, marker="o", markersize=3, color=_color(i), label=label if others else None)
            ax.fill_between(x, [m - c for m, c in zip(mean, ci)], [m + c for m, c in zip(mean, ci)],
                            color=_color(i), alpha=0.2)
        ax.set_xlabel(param)
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
    fig.suptitle(f"mean and 95% CI over seeds vs {param}", fontsize=10)
    fig.tight_layout()
    _save(fig, path, axes[0][-1])


def plot_bars(summary: Sequence[dict], categorical: Sequence[str], metrics: Sequence[str], path: Path) -> None:
    """Each metric per setting of a sweep without numeric parameters: groups along x by all but
    the last categorical parameter, one bar per value of the last, 95% CI error bars."""
    plt = _pyplot()
    *outer, inner = categorical
    groups = _groups(summary, outer)
    bars = list(dict.fromkeys(_fmt(r[inner]) for r in summary))
    width = 0.8 / len(bars)
    fig, axes = plt.subplots(1, len(metrics), figsize=(max(4.3, 0.3 * len(summary)) * len(metrics), 3.8),
                             squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        for j, bar in enumerate(bars):
            cells = [(x, next((r for r in rows if _fmt(r[inner]) == bar), None))
                     for x, rows in enumerate(groups.values())]
            cells = [(x, r) for x, r in cells if r is not None]
            ax.bar([x + (j - (len(bars) - 1) / 2) * width for x, _ in cells], [r[f"{metric}_mean"] for _, r in cells],
                   width, yerr=[_ci(r, metric) for _, r in cells], color=_color(j), capsize=2,
                   label=f"{inner}={bar}")
        ax.set_xticks(range(len(groups)), list(groups) if outer else [""], rotation=30, ha="right", fontsize=7)
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle("mean and 95% CI over seeds", fontsize=10)
    fig.tight_layout()
    _save(fig, path, axes[0][-1])


def plot_pareto(summary: Sequence[dict], settings: Sequence[str], categorical: Sequence[str],
                front: Sequence[int], path: Path) -> None:
    """Throughput against p99 TTFT per setting, the Pareto front joined and labelled. Colour: the
    categorical parameters (with two or more, the last one is the marker instead); without
    categorical parameters the colour shows the first swept (numeric) parameter."""
    plt = _pyplot()
    x_key, y_key = (f"{m}_mean" for m in PARETO)
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    if not categorical:
        shade = [r[settings[0]] for r in summary] if settings else None
        dots = ax.scatter([r[x_key] for r in summary], [r[y_key] for r in summary], s=22, c=shade, cmap="viridis")
        if settings:
            fig.colorbar(dots, ax=ax, label=settings[0])
    by_color, by_marker = (categorical[:-1], categorical[-1]) if len(categorical) > 1 else (categorical, None)
    markers = list(dict.fromkeys(_fmt(r[by_marker]) for r in summary)) if by_marker else [None]
    for i, (label, rows) in enumerate(_groups(summary, by_color).items() if categorical else ()):
        for j, marker in enumerate(markers):
            mine = [r for r in rows if marker is None or _fmt(r[by_marker]) == marker]
            name = label if marker is None else f"{label}, {by_marker}={marker}"
            ax.scatter([r[x_key] for r in mine], [r[y_key] for r in mine], s=22, color=_color(i),
                       marker="osD^v<>ph*"[j % 10], alpha=0.8, label=name)
    best = sorted((summary[i] for i in front), key=lambda r: r[x_key])
    ax.plot([r[x_key] for r in best], [r[y_key] for r in best], "k--", linewidth=1, label="Pareto front")
    for row in best:
        ax.annotate(_label(row, settings), (row[x_key], row[y_key]), fontsize=6, xytext=(-3, 3),
                    textcoords="offset points", ha="right")
    ax.set_xlabel(f"{PARETO[0]} (mean over seeds)")
    ax.set_ylabel(f"{PARETO[1]} (mean over seeds)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    if not categorical:
        ax.legend(fontsize=7)
    _save(fig, path, ax if categorical else None)


# ---------------------------------------------------------------------------------------- report
def report(root: Path, out: Optional[Path] = None, plot_metrics: Sequence[str] = PLOT_METRICS) -> dict[str, Path]:
    """Collect the sweep under ``root`` and write the tables and plots into ``out`` (default
    ``root/report``); returns the written files by name (``jobs.csv``, ``vs_<param>.png``, ...)."""
    sweep = collect(root)
    out = Path(out) if out is not None else Path(root) / "report"
    out.mkdir(parents=True, exist_ok=True)
    files: dict[str, Path] = {}
    columns = ["job", *sweep.params, *sweep.metrics]
    write_csv(files.setdefault("jobs.csv", out / "jobs.csv"), sweep.rows, columns)
    (files.setdefault("jobs.md", out / "jobs.md")).write_text(markdown_table(sweep.rows, columns))
    table = write_columnar(out / "jobs", sweep.rows)
    files[table.name] = table

    summary = summarize(sweep)
    stats = [f"{m}_{s}" for m in sweep.metrics for s in ("mean", "ci95")]
    write_csv(files.setdefault("summary.csv", out / "summary.csv"), summary, [*sweep.settings, "n", *stats])

    plot_metrics = [m for m in plot_metrics if m in sweep.metrics]
    numeric = [p for p in sweep.settings if sweep.numeric(p)]
    categorical = [p for p in sweep.settings if p not in numeric]
    for param in numeric if plot_metrics else []:
        path = files.setdefault(f"vs_{param}.png", out / f"vs_{param}.png")
        plot_vs_param(summary, param, [p for p in sweep.settings if p != param], plot_metrics, path)
    if plot_metrics and categorical and not numeric:
        plot_bars(summary, categorical, plot_metrics, files.setdefault("bars.png", out / "bars.png"))
    front: list[int] = []
    if all(m in sweep.metrics for m in PARETO):
        front = pareto_front([(r[f"{PARETO[0]}_mean"], r[f"{PARETO[1]}_mean"]) for r in summary])
        plot_pareto(summary, sweep.settings, categorical, front, files.setdefault("pareto.png", out / "pareto.png"))
    files["report.md"] = out / "report.md"
    files["report.md"].write_text(_report_md(sweep, summary, front, plot_metrics, files))
    return files


def _report_md(sweep: Sweep, summary: list[dict], front: list[int], metrics: Sequence[str],
               files: dict[str, Path]) -> str:
    shown = [m for m in (*metrics, *(m for m in PARETO if m not in metrics)) if m in sweep.metrics]
    rows = [{**{p: r[p] for p in sweep.settings}, "n": r["n"],
             **{m: f"{_fmt(r[f'{m}_mean'])} ± {_fmt(r[f'{m}_ci95']) or '–'}" for m in shown}} for r in summary]
    parts = [f"# Sweep report: {sweep.root}\n",
             f"{len(sweep.rows)} jobs with metrics, {len(summary)} settings"
             + (f", seeds over `{sweep.seed}`" if sweep.seed else "") + f"; {len(sweep.skipped)} skipped.\n"]
    if sweep.common:
        parts.append("Common overrides: " + " ".join(f"`{k}={_fmt(v)}`" for k, v in sweep.common.items()) + "\n")
    if sweep.skipped:
        parts.append("Skipped jobs:\n\n" + "".join(f"- `{j}`: {why}\n" for j, why in sweep.skipped.items()))
    parts.append("## Mean ± 95% CI over seeds\n\n" + markdown_table(rows, [*sweep.settings, "n", *shown]))
    if front:
        best = sorted((summary[i] for i in front), key=lambda r: -r[f"{PARETO[0]}_mean"])
        parts.append(f"## Pareto front ({PARETO[0]} up, {PARETO[1]} down)\n\n"
                     + markdown_table(best, [*sweep.settings, *(f"{m}_mean" for m in PARETO)]))
    plots = [name for name in files if name.endswith(".png")]
    if plots:
        parts.append("## Plots\n\n" + "".join(f"![{name}]({name})\n" for name in plots))
    return "\n".join(parts)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="kvrl-report", description=__doc__.split("\n")[0])
    parser.add_argument("sweep_dir", type=Path, help="a multirun directory (one subdirectory per job)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: <sweep_dir>/report)")
    parser.add_argument("--metrics", default=",".join(PLOT_METRICS),
                        help="comma-separated metrics to plot against each numeric swept parameter")
    args = parser.parse_args(argv)
    try:
        files = report(args.sweep_dir, args.out, [m for m in args.metrics.split(",") if m])
    except FileNotFoundError as exc:
        print(f"kvrl-report: {exc}", file=sys.stderr)
        return 1
    sweep_md = files["report.md"].read_text().split("\n## ")[0]
    print(sweep_md.strip())
    print("wrote " + ", ".join(str(p) for p in files.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
