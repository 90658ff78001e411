"""A sweep's jobs as one table, its settings' statistics, ranking, paired comparisons and Pareto
front (the library under ``kvrl-report``; the definitions are in :mod:`kvrl.apps.report`'s docstring).

:func:`collect` reads every job under a sweep directory (skipping, with the reason, those without a
readable ``metrics.json``); :func:`summarize` gives each setting's mean and 95% interval over its
seeds; :func:`rank` orders settings (invalid ones last); :func:`compare` pairs settings with a
baseline per seed (:mod:`kvrl.analysis.stats`); :func:`pareto_front` marks the non-dominated ones.
"""
from __future__ import annotations

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
from kvrl.analysis.stats import mean_ci


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
        names = ", ".join(setting_label(s, sweep.settings) for s in same[:6]) + (" ..." if len(same) > 6 else "")
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
        known = "; ".join(setting_label(s, settings) for s in summary)
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


def fmt(x: Any) -> str:
    """Table text: empty for missing, floats to 4 significant digits (whole numbers from 10^4)."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return ""
    if isinstance(x, float):
        return f"{x:.0f}" if 1e4 <= abs(x) < 1e15 else f"{x:.4g}"
    return str(x)


def markdown_table(rows: Sequence[dict], columns: Sequence[str]) -> str:
    """``rows`` as a Markdown table of ``columns``, numbers formatted by :func:`fmt`."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def setting_label(row: dict, params: Iterable[str]) -> str:
    """``param=value, ...`` of a setting (``all`` when nothing is swept)."""
    return ", ".join(f"{p}={fmt(row[p])}" for p in params) or "all"
