"""The sim's metric errors against the live mean, per pair, for several runs of ``kvrl-fidelity``
over the same live runs (e.g. ``resim=`` with a profile before and after a model change), with
the pairs whose workload fitted a term marked.

    python scripts/fidelity_compare.py before=<run dir> after=<run dir> [--fit-workloads a,b] [--out <name>]

Each run directory needs ``fidelity.json``. Writes ``<out>.md`` and ``<out>.csv`` (else prints the
Markdown): per pair and metric (throughput, goodput, TTFT p50 and p99, TPOT p50) the relative error
of the sim against the mean of the live runs (the live spread in brackets), then per set (fit /
held out) the mean absolute error and how many pairs meet each target of kvrl-fidelity, and how
many meet every target at once (with the pairs that miss one); last, the policy ranking of each
workload against the live means, counted only where the policies differ live by more than the
live spread (issue 16's rule).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from fidelity_residuals import write_report   # scripts/ is on sys.path when run as a script

METRICS = (("throughput_tok_s", "throughput"), ("goodput_tok_s", "goodput"), ("ttft_p50_s", "TTFT p50"),
           ("ttft_p99_s", "TTFT p99"), ("tpot_p50_s", "TPOT p50"))


def load(run: Path) -> dict[str, dict]:
    path = run / "fidelity.json"
    if not path.exists():
        raise SystemExit(f"{run}: no fidelity.json")
    return {pair: r for pair, r in json.loads(path.read_text()).items() if r.get("live") and r.get("sim")}


def all_targets(runs: dict, names: list[str], pairs: list[str], fit_w: set[str]) -> list[str]:
    """Markdown rows: per set, how many pairs meet every target of kvrl-fidelity at once (against
    the live mean) under each run, and the pairs that miss one (with the metrics they miss)."""
    from kvrl.fidelity.compare import rel_err
    from kvrl.fidelity.report import TARGETS, live_mean_and_spread

    labels = dict(METRICS)
    lines = ["", "Every target at once; in brackets, with each bound widened to the live runs' own spread "
                 "where that is larger (a metric whose live runs differ from their mean by more than the target).",
             "", "| set | pairs | " + " | ".join(f"every target at once {n}" for n in names) + " |",
             "|---|---:|" + "---:|" * len(names)]
    misses: dict[str, list[str]] = {n: [] for n in names}
    for group in ("fit", "held out"):
        sel = [p for p in pairs if ("fit" if p.split("/")[0] in fit_w else "held out") == group]
        if not sel:
            continue
        met, met_spread = {n: 0 for n in names}, {n: 0 for n in names}
        for pair in sel:
            live = {k: live_mean_and_spread(runs[names[0]][pair], k) for k in TARGETS}
            for n in names:
                err = {k: abs(rel_err(live[k][0], runs[n][pair]["sim"].get(k, float("nan")))) for k in TARGETS}
                missed = [labels[k] for k, bound in TARGETS.items() if not err[k] < bound]
                met[n] += not missed
                met_spread[n] += all(err[k] < max(bound, live[k][1]) for k, bound in TARGETS.items())
                if missed:
                    misses[n].append(f"{pair} ({', '.join(missed)})")
        lines.append(f"| {group} | {len(sel)} | " + " | ".join(f"{met[n]} of {len(sel)} ({met_spread[n]})"
                                                              for n in names) + " |")
    lines += [""] + [f"- misses, {n}: {'; '.join(misses[n]) or 'none'}" for n in names]
    return lines


def rankings(runs: dict, names: list[str], pairs: list[str]) -> list[str]:
    """Markdown: kvrl.fidelity.report.resolved_rankings over the runs (the live side of the first run;
    each run's sim), with the resolved orders each sim reverses."""
    from kvrl.fidelity.report import resolved_rankings

    rows = resolved_rankings({p: runs[names[0]][p] for p in pairs}, {n: runs[n] for n in names})
    lines = ["", "Policy ranking against the live means: `a > b` is the better first; resolved = the live means "
                 "differ by more than the larger live spread.", "",
             "| workload | metric | live | live gap [spread] | resolved | " +
             " | ".join(f"sim {n}" for n in names) + " |", "|---|---|---|---:|---|" + "---|" * len(names)]
    for r in rows:
        cells = ["same" if r["same"][n] else "REVERSED" if r["resolved"] else "reversed (within spread)" for n in names]
        lines.append(f"| {r['workload']} | {r['metric']} | {r['first']} > {r['second']} | {r['gap']:.1%} "
                     f"[{r['spread']:.1%}] | {'yes' if r['resolved'] else 'no'} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(f"Resolved live orders: {sum(r['resolved'] for r in rows)}.")
    for n in names:
        flips = [f"{r['workload']} {r['metric']}" for r in rows if r["resolved"] and not r["same"][n]]
        lines.append(f"- sim {n} reverses {len(flips)} of them{': ' + '; '.join(flips) if flips else ''}")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="name=<run dir>, in the order of the columns")
    ap.add_argument("--fit-workloads", default="", help="workloads whose live steps fitted a term (marked 'fit')")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    from kvrl.fidelity.compare import rel_err
    from kvrl.fidelity.report import TARGETS, live_mean_and_spread

    runs = {}
    for spec in args.runs:
        name, sep, path = spec.partition("=")
        if not sep:
            raise SystemExit(f"run {spec!r}: give name=<run dir>")
        runs[name] = load(Path(path))
    names = list(runs)
    fit_w = {w for w in args.fit_workloads.split(",") if w}
    pairs = [p for p in runs[names[0]] if all(p in r for r in runs.values())]
    md = ["| workload / policy | set | metric | live mean [spread] | " + " | ".join(f"sim {n}" for n in names) + " |",
          "|---|---|---|---:|" + "---:|" * len(names)]
    rows, errs = [], {}
    for pair in pairs:
        group = "fit" if pair.split("/")[0] in fit_w else "held out"
        for key, label in METRICS:
            mean, spread = live_mean_and_spread(runs[names[0]][pair], key)
            es = [rel_err(mean, runs[n][pair]["sim"].get(key, float("nan"))) for n in names]
            md.append(f"| {pair} | {group} | {label} | {mean:.4g} [{spread:.1%}] | " +
                      " | ".join(f"{e:+.1%}" for e in es) + " |")
            rows.append({"pair": pair, "set": group, "metric": key, "live_mean": mean, "live_spread": spread,
                         **{f"err_{n}": e for n, e in zip(names, es)}})
            for n, e in zip(names, es):
                errs.setdefault((group, key, n), []).append(e)
    md += ["", "| set | metric | pairs | " + " | ".join(f"mean abs error {n}" for n in names) + " | " +
           " | ".join(f"within target {n}" for n in names) + " |", "|---|---|---:|" + "---:|" * (2 * len(names))]
    for group in ("fit", "held out"):
        for key, label in METRICS:
            if (group, key, names[0]) not in errs:
                continue
            v = {n: np.abs(np.asarray(errs[(group, key, n)])) for n in names}
            bound = TARGETS.get(key)
            within = [f"{int(np.sum(v[n] < bound))} of {len(v[n])}" if bound else "-" for n in names]
            md.append(f"| {group} | {label} | {len(v[names[0]])} | " + " | ".join(f"{np.mean(v[n]):.1%}" for n in names)
                      + " | " + " | ".join(within) + " |")
    md += all_targets(runs, names, pairs, fit_w)
    md += rankings(runs, names, pairs)
    write_report("\n".join(md) + "\n", rows, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
