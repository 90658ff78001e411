"""``kvrl-report <sweep dir> [baseline=<setting>] [holm=true]``: one table, paired comparisons and
plots from every job of a sweep.

A *job* is a directory under the sweep directory holding ``.hydra/overrides.yaml`` (Hydra writes
it for every job, whatever the launcher or sweeper) or a ``metrics.json``. Each job with a
readable ``metrics.json`` is one row: ``job`` (its path relative to the sweep directory), one
column per override key whose value differs between jobs (the swept parameters; a config group
shows the chosen option, other keys their value in the job's resolved ``config.yaml``),
``invalid`` (the job's aborted requests and policy errors, empty for a clean job), then one column
per numeric metric. Jobs without ``metrics.json`` (failed, still running) or with an unreadable
one are skipped and listed with the reason.

Replicates: the seed column is ``seed`` if swept, else ``workload.seed`` if swept. A *setting* is
one combination of the other swept parameters; its rows are its seeds. Settings are ranked by
``--rank`` (default ``goodput_tok_s``) in the metric's direction, a setting with an invalid job
always after every clean one. With ``baseline=<setting>`` (``eviction=lifo``, or
``eviction=lifo,prefix_cache=none``, or just ``lifo`` when one parameter is swept) every other
setting is compared with it per seed (the jobs of one seed serve the same requests): mean paired
difference with its 95% t-interval, % change, p-value (paired t-test; Holm-adjusted over the
settings with ``holm=true``) and a verdict (better / worse / no significant difference, in the
metric's direction; kvrl/analysis/stats.py).

Warnings (printed and at the top of ``report.md``): invalid jobs; seeds that gave identical jobs
(their intervals are not shown: there was no variation to estimate); a sweep whose settings all
gave identical metrics (the swept parameters changed nothing in this scenario).

Writes atomically into ``--out`` (default ``<sweep dir>/report``):

* ``jobs.csv``, ``jobs.md`` and ``jobs.parquet`` (with pyarrow) or else ``jobs.jsonl``: the table;
* ``summary.csv``: per setting, ``rank``, ``n`` seeds, ``invalid_jobs``, each metric's mean and 95%
  confidence half-width (Student t; empty for n = 1 or identical seeds), and with a baseline the
  paired comparison of each compared metric;
* ``report.md``: warnings, common overrides, skipped jobs, the ranked summary as ``mean ± ci``,
  the paired comparisons, the Pareto front;
* ``vs_<param>.png`` for each numeric swept parameter: the plot metrics against it, one line per
  setting of the other swept parameters (plugins), mean with a 95% CI band over seeds;
  ``bars.png`` when no swept parameter is numeric; ``pareto.png``: throughput against p99 TTFT
  per setting, the Pareto front of clean settings marked. Each figure also as a vector PDF, with
  axis labels and units from kvrl/analysis/metrics.py and a caption naming the workload and seeds.
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

from kvrl.analysis import stats
from kvrl.analysis.metrics import spec
from kvrl.analysis.stats import mean_ci  # noqa: F401  (re-exported: the interval every app reports)
from kvrl.apps import figures
from kvrl.apps.outputs import atomic_write

METRIC_ORDER = ("requests", "finished", "rejected", "aborted", "clipped", "dropped", "policy_errors",
                "output_tokens", "duration_s", "throughput_tok_s", "goodput_tok_s", "slo_attainment",
                "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "kv_utilization", "kv_occupancy",
                "preemptions", "swapped_out_blocks", "swapped_in_blocks", "recomputed_tokens",
                "prefix_hit_rate", "policy_time_s")
PLOT_METRICS = ("goodput_tok_s", "throughput_tok_s", "ttft_p99_s", "preemptions")
PARETO = ("throughput_tok_s", "ttft_p99_s")   # maximise x, minimise y
RANK_BY = "goodput_tok_s"
SEED_KEYS = ("seed", "workload.seed")
#: Wall-clock measurements: they differ between two runs of one config, so they are left out when
#: deciding whether two jobs are identical.
WALL_CLOCK = ("wall_s", "policy_time_s")
#: A job with any of these above zero is invalid: it did not serve all of its requests cleanly.
INVALID_IF = ("aborted", "policy_errors")


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
    workload: Optional[str] = None     # the workload's name in the first job's config

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


def invalid_reason(metrics: dict[str, Any]) -> str:
    """``aborted=N; policy_errors=M`` for the counts of :data:`INVALID_IF` above zero ("" if none;
    a metrics.json from before these counts existed reads as 0)."""
    return "; ".join(f"{k}={metrics.get(k) or 0:g}" for k in INVALID_IF if (metrics.get(k) or 0) > 0)


def _read_job(job: Path) -> tuple[dict, dict]:
    """``(config, metrics)`` of a job; raises ``ValueError`` naming the file that cannot be read."""
    config_file = next((p for p in (job / "config.yaml", job / ".hydra" / "config.yaml") if p.is_file()), None)
    try:
        config = (yaml.safe_load(config_file.read_text()) or {}) if config_file else {}
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"unreadable {config_file}: {type(exc).__name__}: {exc}") from None
    path = job / "metrics.json"
    try:
        metrics = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"unreadable {path}: {type(exc).__name__}: {exc}") from None
    if not isinstance(metrics, dict):
        raise ValueError(f"unreadable {path}: expected a JSON object, got {type(metrics).__name__}")
    return config, metrics


def collect(root: Path) -> Sweep:
    """Read every job under ``root``; raises ``FileNotFoundError`` if no job has readable metrics."""
    root = Path(root)
    values: list[tuple[str, dict[str, Any], dict[str, Any]]] = []
    skipped = {}
    workload = None
    for job in find_jobs(root):
        name = str(job.relative_to(root))
        if not (job / "metrics.json").is_file():
            skipped[name] = "no metrics.json"
            continue
        try:
            config, metrics = _read_job(job)
            params = dict(_override_items(job, config))
        except (ValueError, yaml.YAMLError) as exc:
            skipped[name] = str(exc)
            print(f"kvrl-report: skipping job {job}: {exc}", file=sys.stderr)
            continue
        if workload is None:
            workload = _select(config, "workload.name")
        values.append((name, params, metrics))
    if not values:
        raise FileNotFoundError(f"no job with a readable metrics.json under {root}"
                                + (f" ({len(skipped)} skipped)" if skipped else ""))
    keys = list(dict.fromkeys(k for _, params, _ in values for k in params))
    swept = [k for k in keys if len({json.dumps(p.get(k)) for _, p, _ in values}) > 1]
    common = {k: values[0][1].get(k) for k in keys if k not in swept}
    numeric = {k for _, _, m in values for k, v in m.items() if _is_number(v) or v is None}
    metrics = [k for k in METRIC_ORDER if k in numeric] + sorted(numeric - set(METRIC_ORDER))
    rows = [{"job": name, **{k: params.get(k) for k in swept}, "invalid": invalid_reason(m),
             **{k: m.get(k) for k in metrics}} for name, params, m in values]
    return Sweep(root, rows, swept, metrics, common, skipped, workload)


# ------------------------------------------------------------------------------------ statistics
def _key(row: dict, params: Sequence[str]) -> tuple:
    return tuple(json.dumps(row[p]) for p in params)


def _same_jobs(rows: Sequence[dict], metrics: Sequence[str]) -> bool:
    """Whether every row has the same value of every metric but the wall-clock ones."""
    keep = [m for m in metrics if m not in WALL_CLOCK]
    return len({json.dumps([r.get(m) for m in keep]) for r in rows}) == 1


def summarize(sweep: Sweep) -> list[dict[str, Any]]:
    """One row per setting, in discovery order: its parameters, ``n``, ``invalid_jobs``,
    ``identical_seeds`` (its n >= 2 seeds gave identical jobs: half-widths left empty) and
    ``<metric>_mean``/``<metric>_ci95``."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for row in sweep.rows:
        groups[_key(row, sweep.settings)].append(row)
    out = []
    for rows in groups.values():
        same = len(rows) > 1 and _same_jobs(rows, sweep.metrics)
        summary = {p: rows[0][p] for p in sweep.settings} | {
            "n": len(rows), "invalid_jobs": sum(1 for r in rows if r["invalid"]), "identical_seeds": same}
        for metric in sweep.metrics:
            mean, ci = mean_ci([r[metric] for r in rows if _is_number(r[metric])])
            summary[f"{metric}_mean"], summary[f"{metric}_ci95"] = mean, (math.nan if same else ci)
        out.append(summary)
    return out


def rank(summary: Sequence[dict], metric: str) -> list[int]:
    """Indices of ``summary`` best first by ``metric``'s mean in its direction (higher is better when
    it has none); settings with an invalid job after every clean one, NaN means last in each part."""
    sign = -1.0 if spec(metric).direction == "lower" else 1.0

    def order(i: int) -> tuple:
        mean = summary[i].get(f"{metric}_mean", math.nan)
        return (summary[i]["invalid_jobs"] > 0, math.isnan(mean), -sign * mean if not math.isnan(mean) else 0.0)
    return sorted(range(len(summary)), key=order)


def warnings_of(sweep: Sweep, summary: Sequence[dict]) -> list[str]:
    """What a reader must know before trusting the tables (see the module docs)."""
    out = []
    bad = [r for r in sweep.rows if r["invalid"]]
    if bad:
        out.append(f"{len(bad)} of {len(sweep.rows)} jobs are invalid (aborted requests or policy errors; "
                   "their settings are ranked after every clean one): "
                   + ", ".join(f"{r['job']} ({r['invalid']})" for r in bad[:8]) + (" ..." if len(bad) > 8 else ""))
    same = [s for s in summary if s["identical_seeds"]]
    if same and sweep.seed:
        names = ", ".join(_label(s, sweep.settings) for s in same[:6]) + (" ..." if len(same) > 6 else "")
        out.append(f"the seeds over `{sweep.seed}` gave identical jobs in {len(same)} of {len(summary)} settings "
                   f"({names}): they are not replicates, so no interval is shown (does `{sweep.seed}` change "
                   "this run? in a sim run it must reach the workload's random draws)")
    if len(summary) > 1:
        keep = [m for m in sweep.metrics if m not in WALL_CLOCK]
        if len({json.dumps([s[f"{m}_mean"] for m in keep]) for s in summary}) == 1:
            out.append(f"all {len(summary)} settings gave identical metrics: the swept parameters "
                       f"({', '.join(sweep.settings)}) changed nothing in this scenario (is there memory pressure?)")
    return out


def parse_setting(text: str, sweep: Sweep, summary: Sequence[dict]) -> int:
    """The index in ``summary`` of the setting ``text`` names: ``key=value[,key=value...]`` (a key
    may be the swept parameter or its last dotted part) or, with one swept parameter, its value.
    Raises ``ValueError`` listing the settings when none or several match."""
    settings = sweep.settings
    if not settings:
        raise ValueError("baseline: this sweep has no swept parameter other than the seed")
    wanted: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, eq, value = part.partition("=")
        if not eq:
            if len(settings) != 1:
                raise ValueError(f"baseline={text!r}: name the parameter (key=value), one of {', '.join(settings)}")
            key, value = settings[0], part
        match = [p for p in settings if p == key or p.endswith("." + key)]
        if len(match) != 1:
            raise ValueError(f"baseline={text!r}: {key!r} is not a swept parameter ({', '.join(settings)})")
        wanted[match[0]] = value

    def equal(cell: Any, value: str) -> bool:
        if _is_number(cell):
            try:
                return math.isclose(float(value), float(cell), rel_tol=1e-9, abs_tol=1e-12)   # range() floats
            except ValueError:
                return False
        return str(cell) == value
    hits = [i for i, s in enumerate(summary) if all(equal(s[k], v) for k, v in wanted.items())]
    if len(hits) != 1:
        known = "; ".join(_label(s, settings) for s in summary)
        raise ValueError(f"baseline={text!r} matches {len(hits)} settings; the settings are: {known}")
    return hits[0]


def compare(sweep: Sweep, summary: Sequence[dict], baseline: int, metrics: Sequence[str],
            correct: bool = False) -> dict[str, dict[int, stats.Comparison]]:
    """Per metric, every setting but ``baseline`` (an index of ``summary``) against it, paired by
    seed (:func:`kvrl.analysis.stats.compare_to_baseline`)."""
    keys = [_key(s, sweep.settings) for s in summary]
    groups: dict[str, dict[Any, Any]] = {str(i): {} for i in range(len(summary))}
    for row in sweep.rows:
        seed = json.dumps(row[sweep.seed]) if sweep.seed else row["job"]
        groups[str(keys.index(_key(row, sweep.settings)))][seed] = row
    out = {}
    for metric in metrics:
        values = {g: {s: r.get(metric) for s, r in rows.items()} for g, rows in groups.items()}
        result = stats.compare_to_baseline(values, str(baseline), metric, correct=correct)
        out[metric] = {int(g): c for g, c in result.items()}
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
    """``rows`` as CSV, full float precision, missing values empty; written atomically."""
    def write(f):
        writer = csv.DictWriter(f, columns)
        writer.writeheader()
        writer.writerows({c: _fmt_csv(r.get(c)) for c in columns} for r in rows)
    atomic_write(path, write)


def write_columnar(stem: Path, rows: Sequence[dict]) -> Path:
    """``<stem>.parquet`` if pyarrow imports, else ``<stem>.jsonl``; returns the path written."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        path = stem.with_suffix(".jsonl")
        atomic_write(path, lambda f: f.writelines(
            json.dumps({k: None if isinstance(v, float) and math.isnan(v) else v for k, v in row.items()}) + "\n"
            for row in rows))
        return path
    path = stem.with_suffix(".parquet")
    atomic_write(path, lambda f: pq.write_table(pa.Table.from_pylist(list(rows)), f), mode="wb")
    return path


# ----------------------------------------------------------------------------------------- plots
def _label(row: dict, params: Iterable[str]) -> str:
    return ", ".join(f"{p}={_fmt(row[p])}" for p in params) or "all"


def _color(i: int) -> Any:
    return figures.pyplot().get_cmap("tab10" if i < 10 else "tab20")(i % 20)


def _legend_right(ax: Any) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0))


def _groups(summary: Sequence[dict], params: Sequence[str]) -> dict[str, list[dict]]:
    groups: dict[str, list[dict]] = defaultdict(list)
    for row in summary:
        groups[_label(row, params)].append(row)
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
    bars = list(dict.fromkeys(_fmt(r[inner]) for r in summary))
    width = 0.8 / len(bars)
    fig, axes = plt.subplots(1, len(metrics), figsize=(max(3.2, 0.25 * len(summary)) * len(metrics), 2.9),
                             squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        for j, bar in enumerate(bars):
            cells = [(x, next((r for r in rows if _fmt(r[inner]) == bar), None))
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
    markers = list(dict.fromkeys(_fmt(r[by_marker]) for r in summary)) if by_marker else [None]
    for i, (label, rows) in enumerate(_groups(summary, by_color).items() if categorical else ()):
        for j, marker in enumerate(markers):
            mine = [r for r in rows if marker is None or _fmt(r[by_marker]) == marker]
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
        ax.annotate(_label(row, settings), (row[x_key], row[y_key]), fontsize=6, xytext=(-3, 3),
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


# ---------------------------------------------------------------------------------------- report
def caption_of(sweep: Sweep, summary: Sequence[dict]) -> str:
    """The figures' caption: workload and common overrides, seeds, what the marks are."""
    seeds = sorted({r[sweep.seed] for r in sweep.rows}, key=str) if sweep.seed else []
    scenario = " ".join(f"{k}={_fmt(v)}" for k, v in sweep.common.items() if k.split(".")[0] in
                        ("workload", "engine", "backend", "model", "device", "scheduler", "watermark", "eviction",
                         "prefix_cache", "slo"))
    text = f"Workload {sweep.workload or '?'}" + (f" ({scenario})" if scenario else "") + ". "
    text += (f"Mean and 95% CI (Student t) over {len(seeds)} seeds ({sweep.seed} = "
             f"{', '.join(_fmt(s) for s in seeds)})." if seeds else "One job per setting (no seeds swept; no CI).")
    if any(s["identical_seeds"] for s in summary):
        text += " Seeds that gave identical jobs: no interval."
    return text


def report(root: Path, out: Optional[Path] = None, plot_metrics: Sequence[str] = PLOT_METRICS,
           baseline: Optional[str] = None, holm: bool = False, rank_by: str = RANK_BY) -> dict[str, Path]:
    """Collect the sweep under ``root`` and write the tables and plots into ``out`` (default
    ``root/report``); returns the written files by name (``jobs.csv``, ``vs_<param>.png``, ...).
    A ``baseline`` that names no single setting raises ``ValueError`` listing the settings."""
    sweep = collect(root)
    out = Path(out) if out is not None else Path(root) / "report"
    out.mkdir(parents=True, exist_ok=True)
    files: dict[str, Path] = {}
    columns = ["job", *sweep.params, "invalid", *sweep.metrics]
    write_csv(files.setdefault("jobs.csv", out / "jobs.csv"), sweep.rows, columns)
    atomic_write(files.setdefault("jobs.md", out / "jobs.md"), lambda f: f.write(markdown_table(sweep.rows, columns)))
    table = write_columnar(out / "jobs", sweep.rows)
    files[table.name] = table

    summary = summarize(sweep)
    rank_by = rank_by if rank_by in sweep.metrics else next(iter(sweep.metrics))
    for place, i in enumerate(rank(summary, rank_by), 1):
        summary[i]["rank"] = place
    plot_metrics = [m for m in plot_metrics if m in sweep.metrics]
    shown = list(dict.fromkeys([rank_by, *plot_metrics, *(m for m in PARETO if m in sweep.metrics)]))
    base = parse_setting(baseline, sweep, summary) if baseline else None
    comparisons = compare(sweep, summary, base, shown, holm) if base is not None else {}
    stat_columns = [f"{m}_{s}" for m in sweep.metrics for s in ("mean", "ci95")]
    cmp_columns = []
    for metric, result in comparisons.items():
        for i, c in result.items():
            summary[i].update({f"{metric}_delta": c.delta, f"{metric}_delta_ci95": c.delta_ci,
                               f"{metric}_pct_change": c.pct_change, f"{metric}_p": c.p_value,
                               f"{metric}_p_holm": c.p_adjusted if holm else None, f"{metric}_verdict": c.verdict})
        cmp_columns += [f"{metric}_{s}" for s in ("delta", "delta_ci95", "pct_change", "p", "p_holm", "verdict")]
    write_csv(files.setdefault("summary.csv", out / "summary.csv"), summary,
              [*sweep.settings, "rank", "n", "invalid_jobs", "identical_seeds", *stat_columns, *cmp_columns])

    caption = caption_of(sweep, summary)
    numeric = [p for p in sweep.settings if sweep.numeric(p)]
    categorical = [p for p in sweep.settings if p not in numeric]

    def add(name: str, paths: list[Path]) -> None:
        files[name] = paths[0]
        files[Path(name).with_suffix(".pdf").name] = paths[1]
    for param in numeric if plot_metrics else []:
        add(f"vs_{param}.png", plot_vs_param(summary, param, [p for p in sweep.settings if p != param],
                                             plot_metrics, out / f"vs_{param}.png", caption))
    if plot_metrics and categorical and not numeric:
        add("bars.png", plot_bars(summary, categorical, plot_metrics, out / "bars.png", caption))
    front: list[int] = []
    if all(m in sweep.metrics for m in PARETO):
        clean = [i for i, s in enumerate(summary) if not s["invalid_jobs"]]
        front = [clean[i] for i in pareto_front([(summary[i][f"{PARETO[0]}_mean"], summary[i][f"{PARETO[1]}_mean"])
                                                 for i in clean])]
        add("pareto.png", plot_pareto(summary, sweep.settings, categorical, front, out / "pareto.png", caption))
    warnings = warnings_of(sweep, summary)
    for w in warnings:
        print(f"kvrl-report: warning: {w}", file=sys.stderr)
    text = _report_md(sweep, summary, front, shown, files, warnings, rank_by, base, comparisons, holm, caption)
    atomic_write(files.setdefault("report.md", out / "report.md"), lambda f: f.write(text))
    return files


def _cell(row: dict, metric: str) -> str:
    mean, ci = _fmt(row[f"{metric}_mean"]), _fmt(row[f"{metric}_ci95"])
    if row["identical_seeds"]:
        return f"{mean} (identical seeds)"
    return f"{mean} ± {ci}" if ci else mean


def _report_md(sweep: Sweep, summary: list[dict], front: list[int], shown: Sequence[str], files: dict[str, Path],
               warnings: Sequence[str], rank_by: str, base: Optional[int],
               comparisons: dict[str, dict[int, stats.Comparison]], holm: bool, caption: str) -> str:
    ranked = sorted(summary, key=lambda r: r["rank"])
    parts = [f"# Sweep report: {sweep.root}\n",
             f"{len(sweep.rows)} jobs with metrics, {len(summary)} settings"
             + (f", seeds over `{sweep.seed}`" if sweep.seed else "") + f"; {len(sweep.skipped)} skipped.\n"]
    if warnings:
        parts.append("**Warnings**\n\n" + "".join(f"- {w}\n" for w in warnings))
    if sweep.common:
        parts.append("Common overrides: " + " ".join(f"`{k}={_fmt(v)}`" for k, v in sweep.common.items()) + "\n")
    if sweep.skipped:
        parts.append("Skipped jobs:\n\n" + "".join(f"- `{j}`: {why}\n" for j, why in sweep.skipped.items()))
    rows = [{"rank": r["rank"], **{p: r[p] for p in sweep.settings}, "n": r["n"],
             "invalid": f"{r['invalid_jobs']} jobs" if r["invalid_jobs"] else "",
             **{m: _cell(r, m) for m in shown}} for r in ranked]
    direction = spec(rank_by).direction or "higher"
    parts.append(f"## Mean ± 95% CI over seeds (ranked by {rank_by}, {direction} first; invalid settings last)\n\n"
                 + markdown_table(rows, ["rank", *sweep.settings, "n", "invalid", *shown]))
    if base is not None:
        parts.append(_comparison_md(sweep, summary, base, comparisons, holm, rank_by))
    if front:
        best = sorted((summary[i] for i in front), key=lambda r: -r[f"{PARETO[0]}_mean"])
        parts.append(f"## Pareto front ({PARETO[0]} up, {PARETO[1]} down; clean settings)\n\n"
                     + markdown_table(best, [*sweep.settings, *(f"{m}_mean" for m in PARETO)]))
    plots = [name for name in files if name.endswith(".png")]
    if plots:
        parts.append("## Plots\n\n" + caption + " Vector copies: the `.pdf` beside each PNG.\n\n"
                     + "".join(f"![{name}]({name})\n" for name in plots))
    return "\n".join(parts)


def _comparison_md(sweep: Sweep, summary: list[dict], base: int, comparisons: dict[str, dict[int, stats.Comparison]],
                   holm: bool, rank_by: str) -> str:
    """The paired comparisons as a Markdown section: the rank metric in full, the others as % change
    and verdict."""
    main, others = comparisons[rank_by], [m for m in comparisons if m != rank_by]
    p_name = "p (Holm)" if holm else "p"
    rows = []
    for i in sorted(main, key=lambda i: summary[i]["rank"]):
        c = main[i]
        row = {**{p: summary[i][p] for p in sweep.settings}, "pairs": c.n,
               f"Δ {rank_by}": f"{_fmt(c.delta)} ± {_fmt(c.delta_ci) or '–'}",
               "% change": f"{c.pct_change:+.1f}%" if math.isfinite(c.pct_change) else "",
               p_name: f"{c.p_adjusted:.2g}" if math.isfinite(c.p_adjusted) else "", "verdict": c.verdict,
               "invalid": "yes" if summary[i]["invalid_jobs"] else ""}
        row.update({m: comparisons[m][i].text() for m in others})
        rows.append(row)
    columns = [*sweep.settings, "pairs", f"Δ {rank_by}", "% change", p_name, "verdict", "invalid", *others]
    return (f"## Paired differences vs {_label(summary[base], sweep.settings)} (per seed)\n\n"
            f"Each setting minus the baseline on the same seed (same requests): mean ± 95% CI, % of the "
            f"baseline's mean, paired t-test{' with Holm correction over the settings' if holm else ''}; "
            "verdict at 95% in the metric's direction.\n\n" + markdown_table(rows, columns))


def terminal_summary(path: Path, tables_only: bool = False) -> str:
    """The ranked summary (and comparison) sections of ``report.md`` as plain text for the terminal;
    ``tables_only``: without the title and common overrides (which name the sweep directory), for
    documentation (scripts/docs_examples.sh)."""
    text = path.read_text()
    keep = [s for s in text.split("\n## ") if s.startswith(("Mean ± 95% CI", "Paired differences"))]
    head = text.split("\n## ")[0].strip()
    if tables_only:      # sections as bold titles: the output goes inside other documents
        head = "\n\n".join(p for p in head.split("\n\n") if not p.startswith(("# Sweep report", "Common overrides")))
        return "\n\n".join([head, *("**{}**\n{}".format(*s.strip().split("\n", 1)) for s in keep)])
    return "\n\n".join([head, *("## " + s.strip() for s in keep)])


def _argv(argv: Sequence[str]) -> list[str]:
    """Hydra-style ``key=value`` arguments (baseline, holm, out, metrics, rank) as ``--key value``."""
    out = []
    for arg in argv:
        key, eq, value = arg.partition("=")
        if eq and key in ("baseline", "holm", "out", "metrics", "rank", "tables"):
            out += [f"--{key}", value]
        else:
            out.append(arg)
    return out


def _bool(text: str) -> bool:
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"holm: expected true or false, got {text!r}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="kvrl-report", description=__doc__.split("\n")[0])
    parser.add_argument("sweep_dir", type=Path, help="a multirun directory (one subdirectory per job)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: <sweep_dir>/report)")
    parser.add_argument("--metrics", default=",".join(PLOT_METRICS),
                        help="comma-separated metrics to plot against each numeric swept parameter")
    parser.add_argument("--baseline", default=None,
                        help="setting to compare every other with, per seed (e.g. eviction=lifo)")
    parser.add_argument("--holm", type=_bool, nargs="?", const=True, default=False,
                        help="Holm-correct the comparisons' p-values over the settings")
    parser.add_argument("--rank", default=RANK_BY, help="metric the settings are ranked by")
    parser.add_argument("--tables", type=_bool, nargs="?", const=True, default=False,
                        help="print only the summary and comparison tables (no paths), e.g. for docs")
    args = parser.parse_args(_argv(sys.argv[1:] if argv is None else argv))
    try:
        files = report(args.sweep_dir, args.out, [m for m in args.metrics.split(",") if m], args.baseline,
                       args.holm, args.rank)
    except (FileNotFoundError, ValueError) as exc:
        print(f"kvrl-report: {exc}", file=sys.stderr)
        return 1
    print(terminal_summary(files["report.md"], args.tables))
    if args.tables:
        return 0
    print("wrote:")
    for path in files.values():
        print(f"  {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
