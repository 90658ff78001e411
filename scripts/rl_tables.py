"""Markdown tables for docs/rl.md from committed RL result files (generated blocks, kind ``cheap``).

    python scripts/rl_tables.py leaderboard docs/results/rl_sim_rcpi/pool512_leaderboard.csv
    python scripts/rl_tables.py headroom docs/results/headroom/headroom.jsonl
    python scripts/rl_tables.py suite docs/results/rl_sim_suite/pressure_leaderboard.csv
    python scripts/rl_tables.py suite docs/results/rl_sim_suite/tenants_leaderboard.csv \
        --results docs/results/rl_sim_suite/tenants_results.csv --metrics slo_attainment,preemptions,prefix_hit_rate
    python scripts/rl_tables.py scenario docs/results/rl_scenario/pressure.txt docs/results/rl_scenario/phased.txt
    python scripts/rl_tables.py cells docs/results/rl_scenario/tenants.txt --split test \
        --fields "prefix hit rate,preemptions,SLO attainment,p50 TTFT s"
    python scripts/rl_tables.py live docs/results/rl_live_h200/pressure/{sim,live}_results.csv pressure
    python scripts/rl_tables.py live docs/results/rl_live_h200/slo_shift/{sim,live}_results.csv slo_shift --reference slo_mix
    python scripts/rl_tables.py per_seed docs/results/rl_live_h200_sim_results.csv docs/results/rl_live_h200_results.csv
    python scripts/rl_tables.py verdict pressure=docs/results/rl_sim_suite/pressure_leaderboard.csv:docs/results/rl_sim_suite/pressure_results.csv \
        pool512=docs/results/rl_sim_rcpi/pool512_leaderboard.csv
    python scripts/rl_tables.py groups pressure=docs/results/rl_sim_suite/mix/pressure_leaderboard.csv \
        --agents mixture=pressure_mix-dqn50k,single=pressure-dqn50k
    python scripts/rl_tables.py sim_error docs/results/rl_live_h200/pressure_mix_mooncake_s30/live_results.csv \
        shipped=docs/results/rl_live_h200/pressure_mix_mooncake_s30/sim_results.csv
    python scripts/rl_tables.py host_adjusted docs/results/rl_live_h200/pressure_mix_mooncake_s32/live_results.csv
    python scripts/rl_tables.py job_position docs/results/rl_live_h200/*/live_results.csv

``leaderboard``: a kvrl-eval ``leaderboard.csv`` (the command that made it heads the
``leaderboard.md`` beside it) as one row per policy: goodput mean ± 95% CI over seeds and, for each
reference the leaderboard compares with (vLLM's fixed 0.01, the val-best constant, the hindsight-best
constant), the paired % change and verdict. ``suite``: the same file with the columns the task-suite
tables of docs/rl.md show: goodput, the means of ``--metrics`` (from the leaderboard, or per policy
over the test-split rows of ``--results``, kvrl-eval's ``results.csv``, for a metric the leaderboard
lacks), and per reference the paired difference in tok/s with its 95% CI, % change, p and verdict.
``scenario``: the stdout of scripts/rl_scenario_table.py (one file per task, named after it) as one
table, a row per (task, split): goodput of each fixed watermark with the preemptions of that run in
brackets, the row's best in bold as that script marks it. ``cells``: the per-cell line of one split of
such a file as a table, a row per field of its "per cell:" legend (``--fields``, by their legend
names), a column per constant. ``live``: scripts/rl_live_compare.py's
sim-beside-live table of one scenario, its heading as a bold caption (to sit inside a section), with
the paired differences to ``--reference`` (a label or its start; default vLLM's fixed 0.01).
``per_seed``: goodput per test seed, live and in the sim, a row per live policy; a policy the sim
ran once under another label (kvrl-eval merges a given val-best constant with the same baseline)
is matched by its name without the bracketed label.
``verdict``: issue 17's question over several leaderboards, a row per ``label=leaderboard.csv[:results.csv]``:
the best agent on test (the one with the highest mean goodput, which favours the agents), the
strongest other policy on test (heuristic, val-best constant or val-tuned controller; the oracle
row excluded), the paired difference between the two (95% CI, p, verdict), the best agent against the
hindsight-best constant (the ``oracle`` row, where the leaderboard has one) and how many agents are
significantly better or worse than that strongest policy. With ``results.csv`` the comparisons are
paired over its test seeds (kvrl.analysis.stats); without it they come from the leaderboard's own
reference columns, and the strongest policy must then be one of its references (else an error).
``groups``: agents grouped by how they were trained (``--agents name=directory-prefix,...``), a row per
``label=leaderboard.csv``: per group, the range of its agents' paired % change to the val-picked constant
and to fixed 0.01, with how many are significantly better / not / worse (the leaderboard's own columns).
``host_adjusted``: live results (kvrl-eval ``results.csv`` with ``sim_replay_error``, the host's speed during
each run against the sim's cost model: negative where the live steps ran slower than priced), a row per
policy against ``--reference``: the raw paired goodput difference, the mean difference in the runs' replay
error, and the difference at equal host speed (:func:`kvrl.analysis.stats.paired_adjusted`), with the
fitted slope and R².
``beside_error``: live results files (kvrl-eval ``backend=live`` since session 32), a row per file: per metric of
:data:`BESIDE_METRICS`, the per-run error of the sim beside each live run (``sim_<metric>`` / live - 1), as priced,
calibrated on the process's earlier runs (``sim_cal_<metric>``, a prediction, where any file has it) and at the
run's own host speed (``sim_host_<metric>``, after the fact), as the median over runs with the median absolute error
and the number of runs in brackets, and the median of the runs' replay errors.
``job_position``: live results files, a row per file: how much slower the host ran for a seed's later jobs than for
its first. The order is the file's ``seed_position`` where it has one (kvrl-eval records it since session 33, when
its live jobs began to run in rotated order); else the listed order kvrl-eval used until session 32 (heuristics, then
the val-best and val-tuned policies, then the agents; a merged file's rows are put back in that order by kind). The host's speed of a
run is its replay error where recorded (``sim_replay_error``), else its sim-beside throughput over its live
throughput, minus 1 (which also carries the sim's error for that policy). Mean of (later job - first job) over every
later job of every seed with its 95% CI, and on how many the later job ran slower; a last row pools the files.
``headroom``: the JSON lines of
scripts/rl_rollout_oracle.py as one row per scenario: the best constant (by mean goodput over the
seeds), the planner, and the planner's paired gain over that constant (kvrl.analysis.stats).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
from collections import defaultdict
from pathlib import Path

import numpy as np

VERDICTS = {"no significant difference": "n.s.", "better": "better", "worse": "worse"}


def _num(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def leaderboard(path: str) -> str:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    refs = [k[: -len("_pct_change")] for k in rows[0] if k.startswith("vs ") and k.endswith("_pct_change")]
    head = ["#", "policy", "kind", "goodput tok/s"] + [f"Δ {r}" for r in refs]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [row["rank"], row["policy"], row["kind"],
                 f"{_num(float(row['goodput_tok_s_mean']))} ± {_num(float(row['goodput_tok_s_ci95']))}"]
        for ref in refs:
            verdict = row[f"{ref}_verdict"]
            is_ref = not verdict or row["policy"] == ref[len("vs "):]    # the CSV scores the reference against itself
            cells.append("reference" if is_ref else
                         f"{float(row[f'{ref}_pct_change']):+.1f}% {VERDICTS.get(verdict, verdict)}")
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def headroom(path: str) -> str:
    from kvrl.analysis.stats import paired_compare

    by_scenario: dict[str, list[dict]] = defaultdict(list)
    with open(path) as f:
        for line in f:
            job = json.loads(line)
            by_scenario[job["scenario"]].append(job)
    out = ["| scenario | seeds | best constant (mean goodput tok/s) | planner | planner − best constant, paired | p |",
           "|---|---:|---|---:|---:|---:|"]
    for name, jobs in by_scenario.items():
        constants = jobs[0]["constants"].keys()
        means = {c: sum(j["constants"][c] for j in jobs) / len(jobs) for c in constants}
        best = max(means, key=means.get)
        planner = {j["seed"]: j["oracle"]["goodput"] for j in jobs}
        cmp = paired_compare(planner, {j["seed"]: j["constants"][best] for j in jobs}, "goodput_tok_s")
        out.append(f"| {name} | {len(jobs)} | {best} ({_num(means[best])}) | {_num(sum(planner.values()) / len(planner))} "
                   f"| {cmp.pct_change:+.1f}% | {cmp.p_value:.2g} |")
    return "\n".join(out)


# columns of ``suite``: header and number format of each metric it can show
METRICS = {"slo_attainment": ("SLO att.", ".3f"), "preemptions": ("preempt.", ".1f"),
           "prefix_hit_rate": ("prefix hit rate", ".3f"), "recomputed_tokens": ("recomputed tokens", ",.0f"),
           "ttft_p50_s": ("p50 TTFT s", ".2f")}


def _read_csv(path: str) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _test_means(results: str, metric: str) -> dict[str, float]:
    """Mean of ``metric`` per policy label over the test-split rows of a kvrl-eval ``results.csv``."""
    values: dict[str, list[float]] = defaultdict(list)
    for row in _read_csv(results):
        if row["split"] == "test":
            if metric not in row:
                raise KeyError(f"{results} has no column {metric!r}")
            values[row["policy"]].append(float(row[metric]))
    return {policy: sum(v) / len(v) for policy, v in values.items()}


def _of_policy(by_label: dict, policy: str, metric: str, results: str):
    """``policy``'s entry of ``by_label`` (its mean, or its values per seed), or that of the constant a
    ``[oracle: ...]`` row names (kvrl-eval labels the oracle's test runs by the plain constant)."""
    for label in (policy, policy.split(" [")[0]):
        if label in by_label:
            return by_label[label]
    raise KeyError(f"{results} has no test-split rows of {policy!r} (metric {metric!r})")


def suite(path: str, metrics: tuple[str, ...] = ("slo_attainment", "preemptions"), results: str | None = None) -> str:
    rows = _read_csv(path)
    unknown = [m for m in metrics if m not in METRICS]
    if unknown:
        raise ValueError(f"unknown metric(s) {unknown} (known: {', '.join(METRICS)})")
    extra = {}
    for m in metrics:
        if f"{m}_mean" not in rows[0]:
            if results is None:
                raise ValueError(f"{path} has no column {m}_mean: name kvrl-eval's results.csv with --results")
            extra[m] = _test_means(results, m)
    refs = [k[: -len("_pct_change")] for k in rows[0] if k.startswith("vs ") and k.endswith("_pct_change")]
    head = ["policy", "goodput tok/s"] + [METRICS[m][0] for m in metrics] + [f"Δ {r}" for r in refs]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [row["policy"], f"{_num(float(row['goodput_tok_s_mean']))} ± {_num(float(row['goodput_tok_s_ci95']))}"]
        for m in metrics:
            value = _of_policy(extra[m], row["policy"], m, results) if m in extra else float(row[f"{m}_mean"])
            cells.append(format(value, METRICS[m][1]))
        for ref in refs:
            if row["policy"] == ref[len("vs "):]:
                cells.append("reference")
                continue
            verdict, delta = row[f"{ref}_verdict"], f"Δgoodput_tok_s {ref}"
            cells.append(f"{float(row[delta + '_mean']):+.0f} ± {float(row[delta + '_ci95']):.0f} "
                         f"({float(row[f'{ref}_pct_change']):+.1f}%, p {float(row[f'{ref}_p']):.2g}, "
                         f"{VERDICTS.get(verdict, verdict)})")
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def _scenario_file(path: str) -> tuple[list[str], dict[str, list[str]], dict[str, list[str]]]:
    """(column heads, goodput cells per split, preemptions per split) of one rl_scenario_table.py output."""
    heads, goodput, preempt, field = [], {}, {}, None
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith("| split |"):
                heads = [c.strip() for c in line.strip("|").split("|")][1:]
            elif line.startswith("| ") and heads:
                cells = [c.strip() for c in line.strip("|").split("|")]
                goodput[cells[0]] = cells[1:]
            elif line.startswith("per cell:"):
                field = [x.strip() for x in line[len("per cell:"):].split("/")].index("preemptions")
            elif field is not None and line.split(":")[0] in goodput:
                split, cells = line.split(":", 1)
                preempt[split] = [c.split()[1].split("/")[field] for c in cells.split(";")]
    if not heads or field is None or set(preempt) != set(goodput):
        raise ValueError(f"{path}: not an rl_scenario_table.py output (its table, 'per cell:' line and one "
                         f"per-cell line per split are needed)")
    return heads, goodput, preempt


def scenario(paths: list[str]) -> str:
    out, first = [], None
    for path in paths:
        heads, goodput, preempt = _scenario_file(path)
        if first is None:
            first = heads
            out += ["| task, split | " + " | ".join(heads) + " |", "|" + "---|" * (len(heads) + 1)]
        elif heads != first:
            raise ValueError(f"{path}: columns {heads} differ from {paths[0]}'s {first}")
        task = os.path.splitext(os.path.basename(path))[0]
        for split, cells in goodput.items():
            shown = []
            for cell, n in zip(cells, preempt[split]):
                bold = cell.startswith("**")
                value = f"{float(cell.strip('*')):,.1f}"
                shown.append(f"{'**' + value + '**' if bold else value} ({n})")
            out.append(f"| {task}, {split} | " + " | ".join(shown) + " |")
    return "\n".join(out)


def cells(path: str, split: str, fields: list[str]) -> str:
    """One split's per-cell fields (rl_scenario_table.py's "per cell:" legend names) as rows."""
    legend, line = None, None
    with open(path) as f:
        for text in f:
            if text.startswith("per cell:"):
                legend = [x.strip(" []\n") for x in text[len("per cell:"):].split("/")]
            elif legend and text.startswith(f"{split}: "):
                line = text[len(split) + 2:].strip()
    if legend is None or line is None:
        raise ValueError(f"{path}: no 'per cell:' legend or no line of split {split!r}")
    unknown = [x for x in fields if x not in legend]
    if unknown:
        raise ValueError(f"{path}: unknown field(s) {unknown} (the legend has {legend})")
    parsed = [cell.strip().split(" ", 1) for cell in line.split(";")]
    heads = [head for head, _ in parsed]
    values = [values.split("/") for _, values in parsed]
    out = [f"| {split} | " + " | ".join(heads) + " |", "|" + "---|" * (len(heads) + 1)]
    for field in fields:
        i = legend.index(field)
        out.append(f"| {field} | " + " | ".join(v[i] if i < len(v) else "" for v in values) + " |")
    return "\n".join(out)


def _test_rows(path: str) -> dict[str, dict[int, dict]]:
    """A kvrl-eval ``results.csv``'s test-split rows by policy and seed."""
    out: dict[str, dict[int, dict]] = defaultdict(dict)
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if row["split"] == "test":
                out[row["policy"]][int(row["seed"])] = row
    return out


def _per_seed(path: str, metric: str) -> dict[str, dict[int, float]]:
    """``metric`` of each test run of ``path`` by policy and seed."""
    return {policy: {seed: float(r[metric]) for seed, r in runs.items()} for policy, runs in _test_rows(path).items()}


def per_seed(sim: str, live_: str, metric: str = "goodput_tok_s") -> str:
    """Per test seed and mean, live and in the sim (see the module doc)."""
    live_rows, sim_rows = _per_seed(live_, metric), _per_seed(sim, metric)
    by_base = {policy.split(" [")[0]: values for policy, values in sim_rows.items()}
    seeds = sorted({seed for values in live_rows.values() for seed in values})
    cols = [f"live seed {s}" for s in seeds] + ["live mean"] + [f"sim seed {s}" for s in seeds] + ["sim mean"]
    out = ["| policy | " + " | ".join(cols) + " |", "|---|" + "---:|" * len(cols)]
    for policy, values in live_rows.items():
        simmed = sim_rows.get(policy) or by_base.get(policy.split(" [")[0])
        if simmed is None:
            raise KeyError(f"{sim}: no sim rows for {policy!r} (nor its name without the label)")
        cells = []
        for source in (values, simmed):
            cells += [f"{source[s]:.1f}" if s in source else "" for s in seeds]
            cells.append(f"{sum(source[s] for s in seeds if s in source) / sum(s in source for s in seeds):.1f}")
        out.append(f"| {policy} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def _board_delta(row: dict, reference: str, rows: list[dict]) -> tuple[float, float, float, float, str]:
    """(Δ tok/s, CI half-width, %, p, verdict) of ``row`` against ``reference`` from the
    leaderboard's own reference columns; the reference against itself is 0 with p 1."""
    if row["policy"] == reference:
        return 0.0, 0.0, 0.0, 1.0, "no significant difference"
    ref = f"vs {reference}"
    if f"{ref}_verdict" not in row:
        refs = [k[3: -len("_verdict")] for k in rows[0] if k.startswith("vs ") and k.endswith("_verdict")]
        raise KeyError(f"{reference!r} is not a reference of this leaderboard (its references: {refs}); "
                       "name its results.csv to compare with any policy")
    d = f"Δgoodput_tok_s {ref}"
    return (float(row[f"{d}_mean"]), float(row[f"{d}_ci95"]), float(row[f"{ref}_pct_change"]),
            float(row[f"{ref}_p"]), row[f"{ref}_verdict"])


def verdict(entries: list[str]) -> str:
    """Issue 17's verdict per leaderboard (see the module doc); ``entries`` are
    ``label=leaderboard.csv[:results.csv]``."""
    from kvrl.analysis.stats import paired_compare

    out = ["| task | test seeds | agents | best agent | strongest other policy | best agent − strongest, paired "
           "| best agent − hindsight-best constant | agents better / n.s. / worse than the strongest "
           "| best agent beats every other policy? |",
           "|---|---:|---:|---|---|---|---|---|---|"]
    best_verdicts, all_verdicts, beats_all = [], [], 0
    for entry in entries:
        label, _, paths = entry.partition("=")
        board_path, _, results = paths.partition(":")
        if not label or not board_path:
            raise ValueError(f"{entry!r}: give label=leaderboard.csv[:results.csv]")
        rows = _read_csv(board_path)
        agents = [r for r in rows if r["kind"] == "agent"]
        others = [r for r in rows if r["kind"] not in ("agent", "oracle")]
        oracle = next((r for r in rows if r["kind"] == "oracle"), None)
        if not agents or not others:
            raise ValueError(f"{board_path}: needs at least one agent and one other policy")
        mean = lambda r: float(r["goodput_tok_s_mean"])
        best, strongest = max(agents, key=mean), max(others, key=mean)
        if results:
            seeds = _per_seed(results, "goodput_tok_s")
            per = lambda r: _of_policy(seeds, r["policy"], "goodput_tok_s", results)

            def delta(row, ref_row):
                c = paired_compare(per(row), per(ref_row), "goodput_tok_s")
                return c.delta, c.delta_ci, c.pct_change, c.p_value, c.verdict
        else:
            delta = lambda row, ref_row: _board_delta(row, ref_row["policy"], rows)
        d = delta(best, strongest)
        cell = lambda t: f"{t[0]:+.0f} ± {t[1]:.0f} tok/s ({t[2]:+.1f}%, p {t[3]:.2g}, {VERDICTS.get(t[4], t[4])})"
        to_oracle = cell(delta(best, oracle)) if oracle else "- (no constant oracle in this leaderboard)"
        verdicts = [delta(a, strongest)[4] for a in agents]
        best_verdicts.append(d[4])
        all_verdicts += verdicts
        tally = " / ".join(map(str, _tally(verdicts)))
        every = _beats_every(best, others, delta, cell) if results else "- (needs results.csv)"
        beats_all += every == "yes"
        out.append(f"| {label} | {best['runs']} | {len(agents)} | {best['policy']} ({_num(mean(best))}) "
                   f"| {strongest['policy']} ({_num(mean(strongest))}) | {cell(d)} | {to_oracle} | {tally} | {every} |")
    best, tied, worse = _tally(best_verdicts)
    out += ["", f"{len(entries)} leaderboard{'s' if len(entries) != 1 else ''}. The best agent against the strongest "
            f"other policy: better on {best}, tied (n.s.) on {tied}, worse on {worse}. All {len(all_verdicts)} agent "
            "evaluations: {} better, {} tied, {} worse. ".format(*_tally(all_verdicts))
            + f"The best agent significantly beats every other policy (issue 17's test) on {beats_all}."]
    return "\n".join(out)


def groups(entries: list[str], agent_groups: list[str]) -> str:
    """Agents grouped by how they were trained, over several leaderboards: a row per
    ``label=leaderboard.csv``, and per group (``name=prefix``: the agents whose directory name starts
    with ``prefix``) and reference (the val-picked constant, vLLM's fixed 0.01), the range of the
    group's paired % changes to the reference and how many are significantly better / not / worse.
    On the joint task "fixed 0.01" is the first reference whose label starts with it (fixed 0.01 with
    the first baseline's preemption mode)."""
    parsed = [g.partition("=")[::2] for g in agent_groups]
    # fixed 0.01 is the val pick's row where it is that; on the joint task the first baseline, fixed 0.01 with
    # vLLM's recompute preemption, is the leaderboard's reference of that name
    refs = (("val pick", lambda r: r["kind"] == "val-best"),
            ("fixed 0.01", lambda r: r["kind"] != "oracle" and r["policy"].split(" [")[0].startswith("fixed(fraction=0.01)")
             and f"vs {r['policy']}_pct_change" in r))
    head = " | ".join(f"{name} vs {ref}" for name, _ in parsed for ref, _ in refs)
    out = [f"| leaderboard | {head} |", "|---|" + "---|" * (len(parsed) * len(refs))]
    for entry in entries:
        label, _, path = entry.partition("=")
        rows = _read_csv(path)
        # a baseline's row first (kvrl-eval keeps one row per distinct plugin: where the val pick is the
        # same plugin as a baseline, that one row is the val pick's)
        ordered = sorted(rows, key=lambda r: r["kind"] != "heuristic")
        labels = [next(r["policy"] for r in ordered if is_ref(r)) for _, is_ref in refs]
        cells = []
        for name, prefix in parsed:
            members = [r for r in rows if r["kind"] == "agent" and r["policy"].split("(agents/")[-1].startswith(prefix)]
            if not members:
                raise ValueError(f"{path}: no agent of group {name!r} (directory prefix {prefix!r})")
            for ref in labels:
                pct = [float(r[f"vs {ref}_pct_change"]) for r in members]
                tally = " / ".join(map(str, _tally([r[f"vs {ref}_verdict"] for r in members])))
                cells.append(f"{min(pct):+.1f}% to {max(pct):+.1f}% ({tally})")
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def _beats_every(best: dict, others: list[dict], delta, cell) -> str:
    """Issue 17's test for one leaderboard: does ``best`` beat every policy of ``others`` (every constant,
    heuristic and controller, the hindsight-best constant's row aside) with a paired CI that excludes zero?
    ``yes``, or ``no`` with how many it does not beat and the one it is furthest from beating (one it loses
    to significantly first, else the highest p of those)."""
    misses = [(o, delta(best, o)) for o in others]
    misses = [(o, t) for o, t in misses if t[4] != "better"]
    if not misses:
        return "yes"
    closest, t = max(misses, key=lambda m: (m[1][4] == "worse", m[1][3]))
    return f"no: {len(misses)} of {len(others)} not beaten, e.g. {closest['policy']}: {cell(t)}"


def _tally(verdicts: list[str]) -> tuple[int, int, int]:
    """How many of ``verdicts`` (kvrl.analysis.stats verdicts) are better, not significantly different, worse."""
    return tuple(verdicts.count(v) for v in ("better", "no significant difference", "worse"))


def cem(paths: list[str]) -> str:
    """Per generation of scripts/rl_cem.py runs (their cem.json): the distribution mean's fitness on
    that generation's fresh training windows (paired gain over the base, %; an unbiased estimate, as
    no candidate was selected on those windows for it) and its paired val gain (%, mean over the val
    jobs, with the per-job standard deviation); the generation each run kept is starred."""
    runs = [(Path(p).parent.name, json.loads(Path(p).read_text())) for p in paths]
    out = ["| run | generation | mean policy on fresh train windows, % | val gain, % (mean) | val gain, per-job sd |",
           "|---|---:|---:|---:|---:|"]
    for name, run in runs:
        kept = run["best"]["generation"]
        for row in run["history"]:
            g = row["generation"]
            sd = float(np.std(row["val_gain_per_seed"], ddof=1)) if len(row["val_gain_per_seed"]) > 1 else float("nan")
            star = " *" if g == kept else ""
            out.append(f"| {name} | {g}{star} | {row['train_fitness_mean_policy']:+.2f} | "
                       f"{row['val_gain_pct']:+.2f} | {sd:.2f} |")
    fresh = np.array([r["train_fitness_mean_policy"] for _, run in runs for r in run["history"] if r["generation"] > 0])
    lo, hi = _ci(fresh)
    out.append("")
    out.append(f"Mean policy on fresh training windows, every generation after the first of every run: "
               f"{fresh.mean():+.2f}% (95% CI {lo:+.2f} to {hi:+.2f}, {len(fresh)} generations).")
    return "\n".join(out)


def _ci(x: np.ndarray) -> tuple[float, float]:
    from scipy import stats

    half = float(stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x)))
    return float(x.mean()) - half, float(x.mean()) + half


def live(sim: str, live_: str, name: str, reference: str = "fixed(fraction=0.01)") -> str:
    from rl_live_compare import load, render   # scripts/ is on sys.path when this file runs as a script

    heading, rest = render(load(sim), load(live_), name, reference).split("\n", 1)
    return f"**{heading.removeprefix('## ')}**\n{rest}"


def agent_dir(policy: str) -> str:
    """An agent's policy label by its directory (``agent dqn (agents/x/best_model.zip)`` -> ``x``);
    any other policy's label as it is."""
    return policy.split("agents/")[-1].split("/best_model")[0] if "agents/" in policy else policy


#: the metrics of :func:`sim_error`
SIM_ERROR_METRICS = ("throughput_tok_s", "goodput_tok_s", "ttft_p50_s", "preemptions")


def sim_error(live_path: str, sims: list[str], reference: str = "fixed(fraction=0.01)") -> str:
    """How far each sim (``label=results.csv``, kvrl-eval's sim of the live run's jobs) is from the live
    ``results.csv``: per sim, the relative error of the reference policy's mean of each of
    :data:`SIM_ERROR_METRICS` over the seeds both served, and the largest absolute goodput error of
    any policy's mean (and which). Test-split rows only."""
    live_rows = _test_rows(live_path)
    ref = next((p for p in live_rows if p == reference or p.startswith(reference)), None)
    if ref is None:
        raise SystemExit(f"{live_path}: no policy {reference!r}")
    head = [f"{reference}: {m}" for m in SIM_ERROR_METRICS] + ["largest goodput error of any policy"]
    lines = ["| sim | " + " | ".join(head) + " |", "|---|" + "---:|" * len(head)]
    for entry in sims:
        label, path = entry.split("=", 1)
        sim_rows = _test_rows(path)

        def err(policy: str, metric: str) -> float:
            seeds = sorted(set(live_rows[policy]) & set(sim_rows.get(policy, {})))
            if not seeds:
                raise SystemExit(f"{path}: no seed of {policy!r} that {live_path} also served")
            mean = lambda rows: sum(float(rows[s][metric]) for s in seeds) / len(seeds)
            return mean(sim_rows[policy]) / mean(live_rows[policy]) - 1

        worst = max(live_rows, key=lambda p: abs(err(p, "goodput_tok_s")))
        cells = [f"{err(ref, m):+.1%}" for m in SIM_ERROR_METRICS]
        cells.append(f"{err(worst, 'goodput_tok_s'):+.1%} ({agent_dir(worst)})")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def host_adjusted(path: str, reference: str = "fixed(fraction=0.01)", per_seed: bool = False) -> str:
    """The ``host_adjusted`` table (module docs) of one live ``results.csv``; with ``per_seed``, instead, each
    policy's goodput per test seed with its run's replay error in brackets."""
    from kvrl.analysis.stats import paired_adjusted, verdict as judge

    def tag(delta: float, p_value: float) -> str:
        found = judge(delta, p_value, "higher")
        return VERDICTS.get(found, found)

    rows = _test_rows(path)
    ref = next((p for p in rows if p == reference or p.startswith(reference)), None)
    if ref is None:
        raise SystemExit(f"{path}: no policy {reference!r}")
    col = lambda policy, name: {s: float(r[name]) for s, r in rows[policy].items() if r.get(name) not in (None, "")}
    if per_seed:
        seeds = sorted({s for runs in rows.values() for s in runs})
        lines = ["| policy | " + " | ".join(f"seed {s}: goodput tok/s (replay error)" for s in seeds) + " |",
                 "|---|" + "---:|" * len(seeds)]
        for policy in rows:
            g, e = col(policy, "goodput_tok_s"), col(policy, "sim_replay_error")
            lines.append(f"| {agent_dir(policy)} | " + " | ".join(
                f"{g[s]:,.0f} ({100 * e[s]:+.1f}%)" if s in g and s in e else "" for s in seeds) + " |")
        return "\n".join(lines)
    lines = [f"| policy (vs {ref}) | pairs | Δ goodput tok/s, raw | Δ replay error (host speed) | "
             "tok/s per unit replay error | R² | Δ goodput tok/s at equal host speed |",
             "|---|---:|---|---:|---:|---:|---|"]
    for policy in rows:
        if policy == ref:
            continue
        c = paired_adjusted(col(policy, "goodput_tok_s"), col(ref, "goodput_tok_s"),
                            col(policy, "sim_replay_error"), col(ref, "sim_replay_error"))
        lines.append(f"| {agent_dir(policy)} | {c.n} | {c.raw:+,.0f} ± {c.raw_ci:,.0f} (p {c.raw_p:.2g}, "
                     f"{tag(c.raw, c.raw_p)}) | {100 * c.covariate_delta:+.2f}% | {c.slope:,.0f} | {c.r2:.2f} | "
                     f"{c.adjusted:+,.0f} ± {c.adjusted_ci:,.0f} (p {c.adjusted_p:.2g}, {tag(c.adjusted, c.adjusted_p)}) |")
    return "\n".join(lines)


#: the metrics of :func:`beside_error`
BESIDE_METRICS = ("throughput_tok_s", "goodput_tok_s", "ttft_p50_s", "tpot_p50_s")


def beside_error(paths: list[str]) -> str:
    """The ``beside_error`` table (module docs). Runs whose live value of a metric is 0, or without a value of a
    sim (the calibrated sim has none for a process's first job), are left out of that cell."""
    tables = [(path, [r for r in csv.DictReader(open(path)) if r["split"] == "test" and r.get("sim_host_goodput_tok_s")])
              for path in paths]
    for path, rows in tables:
        if not rows:
            raise SystemExit(f"{path}: no test run with sim_host_ columns (kvrl-eval backend=live since session 32)")
    sims = [("as priced", "sim_")] + [("calibrated on earlier runs", "sim_cal_")] * any(
        "sim_cal_goodput_tok_s" in rows[0] for _, rows in tables) + [("at host speed", "sim_host_")]
    head = [f"{m}: {how}" for m in BESIDE_METRICS for how, _ in sims]
    lines = ["| live results | runs | median replay error | " + " | ".join(head) + " |",
             "|---|---:|---:|" + "---:|" * len(head)]
    for path, rows in tables:
        cells = []
        for m in BESIDE_METRICS:
            for _, prefix in sims:
                e = np.array([float(r[prefix + m]) / float(r[m]) - 1 for r in rows
                              if float(r[m]) > 0 and r.get(prefix + m) not in (None, "", "nan")])
                cells.append(f"{100 * np.median(e):+.1f}% ({100 * np.median(np.abs(e)):.1f}%, {e.size})" if e.size else "")
        replay = np.median([float(r["sim_replay_error"]) for r in rows])
        lines.append(f"| {Path(path).parent.name}/{Path(path).name} | {len(rows)} | {100 * replay:+.1f}% | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


#: the order kvrl-eval lists a seed's policies in (``job_order=listed``), by their kind
LISTED_KINDS = {"heuristic": 0, "val-best": 1, "val-tuned": 2, "agent": 3}


def job_position(paths: list[str]) -> str:
    """The ``job_position`` table (module docs)."""
    from kvrl.analysis.stats import mean_ci

    def slowness(r: dict) -> float:
        if r.get("sim_replay_error") not in (None, ""):
            return -float(r["sim_replay_error"])
        return float(r["sim_throughput_tok_s"]) / float(r["throughput_tok_s"]) - 1.0

    lines = ["| live results | seeds | jobs per seed | later job - first job: host slower by | later job slower |",
             "|---|---:|---:|---|---:|"]
    pooled: list[float] = []
    for path in paths:
        rows = [r for r in csv.DictReader(open(path)) if r["split"] == "test" and r.get("sim_throughput_tok_s")]
        by_seed = defaultdict(list)
        for i, r in enumerate(rows):
            recorded = r.get("seed_position") not in (None, "")
            by_seed[r["seed"]].append((int(r["seed_position"]) if recorded
                                       else LISTED_KINDS.get(r["kind"], len(LISTED_KINDS)), i, r))
        diffs = []
        for jobs in by_seed.values():
            ordered = [r for _, _, r in sorted(jobs, key=lambda t: t[:2])]
            diffs += [slowness(r) - slowness(ordered[0]) for r in ordered[1:]]
        if not diffs:
            continue
        pooled += diffs
        mean, half = mean_ci(diffs)
        per_seed = max(len(j) for j in by_seed.values())
        lines.append(f"| {Path(path).parent.name}/{Path(path).name} | {len(by_seed)} | {per_seed} | "
                     f"{100 * mean:+.2f}% ± {100 * half:.2f} | {sum(d > 0 for d in diffs)} of {len(diffs)} |")
    mean, half = mean_ci(pooled)
    lines.append(f"| all | | | {100 * mean:+.2f}% ± {100 * half:.2f} | {sum(d > 0 for d in pooled)} of {len(pooled)} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="table", required=True)
    sub.add_parser("leaderboard").add_argument("path")
    sub.add_parser("headroom").add_argument("path")
    s = sub.add_parser("suite")
    s.add_argument("path")
    s.add_argument("--metrics", default="slo_attainment,preemptions", help=f"comma-separated, of {', '.join(METRICS)}")
    s.add_argument("--results", help="kvrl-eval results.csv, for metrics the leaderboard lacks")
    sub.add_parser("scenario").add_argument("paths", nargs="+")
    ps = sub.add_parser("per_seed")
    ps.add_argument("sim")
    ps.add_argument("live")
    c = sub.add_parser("cells")
    c.add_argument("path")
    c.add_argument("--split", required=True)
    c.add_argument("--fields", required=True, help="comma-separated names of the file's 'per cell:' legend")
    sub.add_parser("verdict").add_argument("entries", nargs="+", help="label=leaderboard.csv[:results.csv]")
    sub.add_parser("cem").add_argument("paths", nargs="+", help="cem.json of scripts/rl_cem.py runs")
    g = sub.add_parser("groups")
    g.add_argument("entries", nargs="+", help="label=leaderboard.csv")
    g.add_argument("--agents", required=True, help="comma-separated name=directory-prefix groups")
    lv = sub.add_parser("live")
    for name in ("sim", "live", "scenario"):
        lv.add_argument(name)
    lv.add_argument("--reference", default="fixed(fraction=0.01)", help="label (prefix) of the paired Δ's reference")
    se = sub.add_parser("sim_error")
    se.add_argument("live")
    se.add_argument("sims", nargs="+", help="label=results.csv of the sim")
    ha = sub.add_parser("host_adjusted")
    ha.add_argument("live", help="kvrl-eval results.csv of a live run, with sim_replay_error")
    ha.add_argument("--reference", default="fixed(fraction=0.01)", help="label (prefix) of the reference policy")
    ha.add_argument("--per-seed", action="store_true", help="each policy's goodput and replay error per seed instead")
    sub.add_parser("beside_error").add_argument("paths", nargs="+", help="live results.csv files with sim_host_ columns")
    jp = sub.add_parser("job_position")
    jp.add_argument("paths", nargs="+", help="live results.csv files (kvrl-eval backend=live, merged or not)")
    a = p.parse_args()
    if a.table == "leaderboard":
        print(leaderboard(a.path))
    elif a.table == "headroom":
        print(headroom(a.path))
    elif a.table == "suite":
        print(suite(a.path, tuple(m for m in a.metrics.split(",") if m), a.results))
    elif a.table == "scenario":
        print(scenario(a.paths))
    elif a.table == "per_seed":
        print(per_seed(a.sim, a.live))
    elif a.table == "verdict":
        print(verdict(a.entries))
    elif a.table == "cem":
        print(cem(a.paths))
    elif a.table == "groups":
        print(groups(a.entries, a.agents.split(",")))
    elif a.table == "cells":
        print(cells(a.path, a.split, [f.strip() for f in a.fields.split(",")]))
    elif a.table == "sim_error":
        print(sim_error(a.live, a.sims))
    elif a.table == "beside_error":
        print(beside_error(a.paths))
    elif a.table == "job_position":
        print(job_position(a.paths))
    elif a.table == "host_adjusted":
        print(host_adjusted(a.live, a.reference, a.per_seed))
    else:
        print(live(a.sim, a.live, a.scenario, a.reference))


if __name__ == "__main__":
    main()
