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
from pathlib import Path
from typing import Any, Optional, Sequence

from kvrl.analysis import stats
from kvrl.analysis.metrics import spec
from kvrl.analysis.stats import mean_ci  # noqa: F401  (re-exported: the interval every app reports)
from kvrl.analysis.sweeps import (PARETO, PLOT_METRICS, RANK_BY, Sweep, collect, compare, fmt, markdown_table,
                                  parse_setting, pareto_front, rank, setting_label, summarize, warnings_of)
from kvrl.apps.outputs import atomic_write
from kvrl.apps.report_figures import caption_of, plot_bars, plot_pareto, plot_vs_param


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
    mean, ci = fmt(row[f"{metric}_mean"]), fmt(row[f"{metric}_ci95"])
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
        parts.append("Common overrides: " + " ".join(f"`{k}={fmt(v)}`" for k, v in sweep.common.items()) + "\n")
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
               f"Δ {rank_by}": f"{fmt(c.delta)} ± {fmt(c.delta_ci) or '–'}",
               "% change": f"{c.pct_change:+.1f}%" if math.isfinite(c.pct_change) else "",
               p_name: f"{c.p_adjusted:.2g}" if math.isfinite(c.p_adjusted) else "", "verdict": c.verdict,
               "invalid": "yes" if summary[i]["invalid_jobs"] else ""}
        row.update({m: comparisons[m][i].text() for m in others})
        rows.append(row)
    columns = [*sweep.settings, "pairs", f"Δ {rank_by}", "% change", p_name, "verdict", "invalid", *others]
    return (f"## Paired differences vs {setting_label(summary[base], sweep.settings)} (per seed)\n\n"
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
