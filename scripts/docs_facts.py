#!/usr/bin/env python
"""Numbers quoted in the running prose of README.md and docs/, computed from committed data, so a
sentence cannot keep a number its data no longer gives.

In the Markdown a quoted number (or a short phrase of numbers) sits in an inline span naming its
fact, ``<source>.<key>``::

    TTFT p50 falls on every seed (<!-- fact: tiers.llama_ttft_p50_cpu -->55 -> 21, 38 -> 18, 1734 -> 83<!-- /fact --> ms)

A source is a function below that reads committed result files (its ``inputs``) and returns its
facts as ``{key: text}``; ``python scripts/docs_facts.py <source>`` prints them as JSON, and that
command is what scripts/docs_tables.py runs to check the spans (``check``: the CI drift test
tests/test_docs.py for ``cheap`` sources) or rewrite them (``update``: scripts/regen_docs.sh).
Sources read their files only; a source that needs a simulation run would be of kind ``sim``
(none yet: the sim results quoted in prose are committed first and read from there).

    python scripts/docs_facts.py list            # every source: kind, inputs
    python scripts/docs_facts.py tiers           # its facts, as JSON
"""
from __future__ import annotations

import argparse
import csv
import functools
import io
import json
import math
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

ROOT = Path(__file__).resolve().parent.parent
KINDS = ("cheap", "sim")


@dataclass(frozen=True)
class Source:
    """A fact source: its kind (``cheap``: reads committed files in well under a second), the
    committed files it reads (relative to the repository root) and the function computing its
    facts (``{key: text}``, the text exactly as the prose quotes it)."""

    kind: str
    inputs: tuple[str, ...]
    facts: Callable[[], dict[str, str]]


SOURCES: dict[str, Source] = {}


def source(name: str, kind: str, *inputs: str):
    """Register the decorated function as the fact source ``name``."""
    if kind not in KINDS:
        raise ValueError(f"source {name}: unknown kind {kind!r} (expected one of {', '.join(KINDS)})")

    def register(fn: Callable[[], dict[str, str]]):
        SOURCES[name] = Source(kind, inputs, fn)
        return fn
    return register


def command(name: str) -> str:
    """The shell command (from the repository root) that prints the facts of source ``name``."""
    return f"python scripts/docs_facts.py {name}"


def _sibling(name: str):
    """The script ``scripts/<name>.py`` as a module, for a source that reuses its reading of its files."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _text(path: str) -> str:
    """The committed file ``path`` (relative to the repository root): every read of a source goes
    through here, so a test can check that a source reads only its declared ``inputs``."""
    return (ROOT / path).read_text()


def _json(path: str):
    return json.loads(_text(path))


def _csv(path: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(_text(path), newline="")))


def _by_policy(path: str, metric: str, skip_kinds: Sequence[str] = ()) -> dict[str, dict[int, float]]:
    """A kvrl-eval results.csv's test-split ``metric`` by policy and seed, rows of ``skip_kinds`` left out
    (``("sweep",)``: a val-best sweep's own runs, which the leaderboard leaves out too)."""
    out: dict[str, dict[int, float]] = {}
    for row in _csv(path):
        if row["split"] == "test" and row.get("kind") not in skip_kinds:
            out.setdefault(row["policy"], {})[int(row["seed"])] = float(row[metric])
    return out


def _jsonl(path: str) -> list[dict]:
    """The JSON objects of a JSON-lines file, blank lines skipped."""
    return [json.loads(line) for line in _text(path).splitlines() if line.strip()]


def _span(values: Sequence[float], fmt: str, sep: str = "-") -> str:
    """``lo-hi`` of ``values`` in ``fmt`` (one value when they round alike; ``lo to hi`` with a
    minus sign when the range has a negative end)."""
    lo, hi = format(min(values), fmt), format(max(values), fmt)
    if lo == hi:
        return lo.replace("-", "−")
    if min(values) < 0 or fmt.startswith("+"):
        return f"{lo} to {hi}".replace("-", "−")
    return f"{lo}{sep}{hi}"


# --- docs/tiers.md and README: the CPU tier in the sim (scripts/tiers_study.py results.json) ------

TIERS = {"qwen": "docs/results/tiers/qwen3-0.6b/results.json", "llama": "docs/results/tiers/llama-3-8b/results.json"}


def _runs(path: str) -> dict[str, list[dict]]:
    """results.json's runs by variant, each list in seed order."""
    by: dict[str, list[dict]] = {}
    for run in sorted(_json(path), key=lambda r: r["seed"]):
        by.setdefault(run["variant"], []).append(run)
    return by




def _ms(seconds: float) -> str:
    """Milliseconds, one decimal below 100 ms, none above."""
    ms = seconds * 1e3
    return f"{ms:.1f}" if ms < 100 else f"{ms:.0f}"


@source("tiers", "cheap", *TIERS.values())
def tiers() -> dict[str, str]:
    out = {}
    for shape, path in TIERS.items():
        runs = _runs(path)
        seeds = [r["seed"] for r in runs["gpu"]]
        out[f"{shape}_per_seed"] = "; ".join(
            f"seed {s}: " + ", ".join(f"{v} {runs[v][i]['ttft_p50_s'] * 1e3:.1f} / {runs[v][i]['ttft_p99_s'] * 1e3:.0f} ms"
                                      for v in ("gpu", "cpu", "cost"))
            for i, s in enumerate(seeds))
        gpu, cpu = runs["gpu"], runs["cpu"]
        out[f"{shape}_working_set"] = (f"mean {gpu[0]['working_set_mean_x_pool']:.1f}x the GPU pool, "
                                       f"peak {gpu[0]['working_set_peak_x_pool']:.1f}x (seed {gpu[0]['seed']})")
        out[f"{shape}_ttft_p50_cpu"] = ", ".join(f"{_ms(g['ttft_p50_s'])} -> {_ms(c['ttft_p50_s'])}" for g, c in zip(gpu, cpu))
        out[f"{shape}_ttft_p99_drop"] = _span([100 * (1 - c["ttft_p99_s"] / g["ttft_p99_s"]) for g, c in zip(gpu, cpu)],
                                              ".0f") + "%"
        out[f"{shape}_ttft_p99_change"] = _span([100 * (c["ttft_p99_s"] / g["ttft_p99_s"] - 1) for g, c in zip(gpu, cpu)],
                                                "+.0f") + "%"
        out[f"{shape}_gpu_hit"] = _span([r["tier_gpu_hit_rate"] for r in cpu], ".2f")
        out[f"{shape}_total_hit"] = _span([r["prefix_hit_rate"] for r in cpu], ".2f")
        out[f"{shape}_cpu_hit_pct"] = _span([100 * r["tier_cpu_hit_rate"] for r in cpu], ".0f") + "%"
        out[f"{shape}_cost_equals"] = "gpu" if all(
            c["tier_loaded_blocks"] == 0 for c in runs["cost"]) else "cpu" if all(
            c["ttft_p50_s"] == p["ttft_p50_s"] for c, p in zip(runs["cost"], cpu)) else "neither"
    both_cpu = [r for p in TIERS.values() for r in _runs(p)["cpu"]]
    out["gpu_hit"] = _span([r["tier_gpu_hit_rate"] for r in both_cpu], ".2f")
    out["total_hit"] = _span([r["prefix_hit_rate"] for r in both_cpu], ".2f")
    out["cpu_hit_pct"] = _span([100 * r["tier_cpu_hit_rate"] for r in both_cpu], ".0f") + "%"
    return out


DISK = {"ld": "docs/results/tiers/llama-3-8b_disk/results.json", "qd": "docs/results/tiers/qwen3-0.6b_disk/results.json"}


@source("tiers_disk", "cheap", *DISK.values())
def tiers_disk() -> dict[str, str]:
    out = {}
    mean = lambda values: sum(values) / len(values)          # noqa: E731
    for key, path in DISK.items():
        runs = _runs(path)
        shown = [v for v in ("gpu", "cpu", "disk", "prefetch") if v in runs]
        out[f"{key}_per_seed"] = ", ".join(f"{v} " + " / ".join(_ms(r["ttft_p50_s"]) for r in runs[v]) for v in shown)
        same = next((v for v in ("cpu", "gpu") if [r["ttft_p50_s"] for r in runs["disk_cost"]] ==
                     [r["ttft_p50_s"] for r in runs[v]]), None)
        out[f"{key}_disk_cost_equals"] = f"disk_cost = {same}" if same else "disk_cost differs from gpu and cpu"
        out[f"{key}_saved"] = ("CPU tier " + " / ".join(f"{r['tier_cpu_ttft_saved_s']:+.2g}" for r in runs["cpu"]) + " s, disk tier "
                               + " / ".join(f"{r['tier_disk_ttft_saved_s']:+.1f}" for r in runs["disk"]) + " s").replace("-", "−")
        disk = runs["disk"]
        out[f"{key}_tier_hits"] = (f"GPU {mean([r['tier_gpu_hit_rate'] for r in disk]):.2f}, CPU "
                                   f"{mean([r['tier_cpu_hit_rate'] for r in disk]):.2f}, disk {mean([r['tier_disk_hit_rate'] for r in disk]):.2f}")
        out[f"{key}_total_hit"] = (f"{mean([r['prefix_hit_rate'] for r in runs['cpu']]):.2f} to "
                                   f"{mean([r['prefix_hit_rate'] for r in disk]):.2f}")
        out[f"{key}_disk_hit"] = f"{mean([r['tier_disk_hit_rate'] for r in disk]):.2f}"
        ratios = [mean([r[m] for r in disk]) / mean([r[m] for r in runs["gpu"]]) for m in ("preemptions", "recomputed_tokens")]
        out[f"{key}_disk_vs_gpu_preempt"] = _span(ratios, ".1f") + "x"
        out[f"{key}_cpu_p50_change"] = _span([100 * (c["ttft_p50_s"] / g["ttft_p50_s"] - 1)
                                              for g, c in zip(runs["gpu"], runs["cpu"])], "+.1f") + "%"
        if "prefetch" in runs:
            pre = runs["prefetch"]
            out[f"{key}_prefetched"] = _span([r["tier_prefetched_blocks"] / 1e3 for r in pre], ".0f") + "k"
            out[f"{key}_prefetch_used"] = _span([r["tier_prefetch_used_blocks"] for r in pre], "d")
    return out


# --- docs/tiers.md: swap-in prefetching (scripts/swap_prefetch_study.py outputs, committed) -------

SWAP = "docs/results/swap_prefetch"


@source("swap", "cheap", f"{SWAP}/traces.json", f"{SWAP}/predictors.json", f"{SWAP}/plugin.json")
def swap() -> dict[str, str]:
    out = {}
    traces = _json(f"{SWAP}/traces.json")
    workloads = sorted({k.rsplit("-", 1)[0] for k in traces}, key=lambda w: w != "long_outputs")
    out["swap_outs"] = " and ".join(_span([t["swap_out"] for k, t in traces.items() if k.startswith(w + "-")], "d")
                                    for w in workloads)
    out["all_back"] = "every one" if all(t["swap_in"] == t["swap_out"] for t in traces.values()) else "not every one"
    shares = {t["fifo_share"] for t in traces.values()}
    out["fifo_share"] = (f"FIFO share {shares.pop():.3f} in all {len(traces)}" if len(shares) == 1
                         else f"FIFO share {_span(list(shares), '.3f')} over the {len(traces)}")
    rows = _json(f"{SWAP}/predictors.json")
    peaks, windows, in_window, reg = [], set(), [], []
    for w in workloads:
        mine = [r for r in rows if r["workload"] == w]
        best = max(max(r["mlp_cla"], r["lstm_cla"]) for r in mine)
        peaks.append(f"{best:.2f} ({w})")
        top = [r for r in mine if max(r["mlp_cla"], r["lstm_cla"]) >= best - 0.05]
        windows.update(r["window"] for r in top)
        in_window += [r["in_window"] for r in top]
        reg += [v for r in mine for v in (r["mlp_reg"], r["lstm_reg"])]
    out["cla_peaks"] = " and ".join(peaks)
    out["cla_windows"] = _span(sorted(windows), "d")
    out["cla_in_window"] = _span(in_window, ".2f")
    out["reg_range"] = _span(reg, ".2f")
    plugin = _json(f"{SWAP}/plugin.json")
    latency = [r for r in plugin if r["metric"] != "preemptions"]
    out["plugin_latency"] = ("no TTFT, TPOT or throughput difference is significant" if
                             all(r["verdict"] == "no significant difference" for r in latency)
                             else "some latency or throughput difference is significant")
    pre = [r for r in plugin if r["metric"] == "preemptions"]
    out["plugin_preempt"] = _span([r["pct"] for r in pre], ".0f") + "%" + (
        " (significant)" if all(r["verdict"] == "worse" for r in pre) else " (not all significant)")
    return out


# --- docs/sweeps.md: the worked examples' readings (kvrl-report summaries, scripts/sweeps_docs.sh) --

SWEEPS = "docs/figures/sweeps"


def _summary(sweep: str) -> list[dict[str, str]]:
    return _csv(f"{SWEEPS}/{sweep}/summary.csv")


def _f(row: dict, key: str) -> float:
    return float(row[key]) if row.get(key) not in ("", None) else math.nan


def _pct(x: float) -> str:
    return f"{x:+.1f}%".replace("-", "−")


@source("sweeps", "cheap", *(f"{SWEEPS}/{s}/summary.csv" for s in ("opt_factor", "avg_block_len", "fixed",
                                                                      "eviction_prefix")))
def sweeps() -> dict[str, str]:
    out = {}
    fixed = {_f(r, "watermark.fraction"): r for r in _summary("fixed")}
    best = max(fixed.values(), key=lambda r: _f(r, "goodput_tok_s_mean"))
    out["fixed_best"] = f"{_f(best, 'watermark.fraction'):g}"
    out["fixed_best_vs_001"] = _pct(_f(best, "goodput_tok_s_pct_change"))
    out["fixed_best_preempt"] = (f"{_f(fixed[0.01], 'preemptions_mean'):.0f} -> "
                                 f"{_f(best, 'preemptions_mean'):.0f}")
    opt = _summary("opt_factor")
    obest = max(opt, key=lambda r: _f(r, "goodput_tok_s_mean"))
    out["opt_best_a"] = f"{_f(obest, 'watermark.a'):g}"
    out["opt_best_vs_a0"] = _pct(_f(obest, "goodput_tok_s_pct_change"))
    base_pre = next(_f(r, "preemptions_mean") for r in opt if _f(r, "watermark.a") == 0)
    out["opt_best_preempt"] = f"{base_pre:.0f} -> {_f(obest, 'preemptions_mean'):.0f}"
    rows = opt + _summary("avg_block_len") + list(fixed.values())
    compared = [r for r in rows if r.get("goodput_tok_s_verdict")]
    significant = [r for r in compared if r["goodput_tok_s_verdict"] != "no significant difference"]
    out["holm_significant"] = f"{len(significant)} of {len(compared)}"
    abl = {_f(r, "watermark.t"): r for r in _summary("avg_block_len")}
    out["abl_74_vs_fixed_001"] = _pct(100 * (_f(abl[7.4], "goodput_tok_s_mean") / _f(fixed[0.01], "goodput_tok_s_mean") - 1))
    ep = _summary("eviction_prefix")
    none = [r for r in ep if r["prefix_cache"] == "none"]
    out["ep_none_loss"] = _span([-_f(r, "goodput_tok_s_pct_change") for r in none], ".0f", "–") + "%"
    base = next(r for r in ep if not r.get("goodput_tok_s_verdict"))
    out["ep_none_ttft_p99_x"] = _span([_f(r, "ttft_p99_s_mean") / _f(base, "ttft_p99_s_mean") for r in none], ".1f", "–") + "x"
    cached = [r for r in ep if r["prefix_cache"] != "none"]
    others = [r for r in cached if r["eviction"] != "cost_aware" and r is not base]
    out["ep_cached_within"] = f"{max(abs(_f(r, 'goodput_tok_s_pct_change')) for r in others):.1f}%"
    cost = [r for r in cached if r["eviction"] == "cost_aware"]
    out["ep_cost_aware"] = _span([-_f(r, "goodput_tok_s_pct_change") for r in cost], ".1f", "–") + "%"
    p_none = [_f(r, "goodput_tok_s_p_holm") for r in none]
    out["ep_none_p_holm"] = _span(p_none, ".3f", "–")
    return out


# --- docs/rl.md: the session-4 scenario tables (rl_scenario_table.py output, committed) ----------

SCENARIO = "docs/results/rl_scenario"


def _cells(path: str) -> tuple[list[str], dict[str, dict[str, list[str]]]]:
    """An rl_scenario_table.py output's column heads and, per split, head -> the cell's fields
    (SLO attainment, p50 TTFT s, p50 TPOT ms, preemptions, engine s)."""
    text = _text(path)
    heads = re.search(r"^\| split \| (.+) \|$", text, re.M)[1].split(" | ")
    cells = {}
    for split, line in re.findall(r"^(\w+): (.+)$", text, re.M):
        if split in ("scenario", "suggested"):
            continue
        cells[split] = dict(zip(heads, (c.split(" ", 1)[1].split("/") for c in line.split("; "))))
    return heads, cells


def _goodput(path: str) -> dict[str, dict[str, float]]:
    text = _text(path)
    heads = re.search(r"^\| split \| (.+) \|$", text, re.M)[1].split(" | ")
    return {m[1]: dict(zip(heads, (float(v.strip("*")) for v in m[2].split(" | "))))
            for m in re.finditer(r"^\| (\w+) \| ([\d.*| ]+) \|$", text, re.M)}


@source("scenario", "cheap", f"{SCENARIO}/d5ff5ad/watermark.txt", f"{SCENARIO}/d5ff5ad/preemption.txt",
        f"{SCENARIO}/tenants.txt", f"{SCENARIO}/joint.txt")
def scenario() -> dict[str, str]:
    out = {}
    splits = ("train", "val", "test")
    path = f"{SCENARIO}/d5ff5ad/watermark.txt"
    _, cells = _cells(path)
    out["wm_slo_001"] = ", ".join(f"{s} {100 * float(cells[s]['0.01'][0]):.0f}%" for s in splits)
    out["wm_ttft_001"] = ", ".join(f"{float(cells[s]['0.01'][1]):.{1 if float(cells[s]['0.01'][1]) >= 1 else 2}f} s"
                                   for s in splits)
    good = _goodput(path)
    for s in splits:
        out[f"wm_{s}_best"] = max(good[s], key=good[s].get)
    test = good["test"]
    out["wm_val_pick_loss"] = f"{100 * (1 - test[out['wm_val_best']] / test[out['wm_test_best']]):.0f}%"
    pre = f"{SCENARIO}/d5ff5ad/preemption.txt"
    _, pcells = _cells(pre)
    out["pre_slo_lifo"] = ", ".join(f"{s} {100 * float(pcells[s]['lifo'][0]):.0f}%" for s in splits)
    out["pre_slo_cost"] = ", ".join(f"{100 * float(pcells[s]['cost_aware'][0]):.0f}%" for s in splits)
    out["pre_lifo_test_preempt"] = f"{float(pcells['test']['lifo'][3]):,.0f}"
    out["pre_lifo_train_preempt"] = f"{float(pcells['train']['lifo'][3]):,.0f}"
    out["pre_lifo_train_ttft"] = f"{float(pcells['train']['lifo'][1]):.0f} s"
    tenants = f"{SCENARIO}/tenants.txt"
    _, tcells = _cells(tenants)
    tgood = _goodput(tenants)
    test, val = tgood["test"], tgood["val"]
    vbest, tbest = max(val, key=val.get), max(test, key=test.get)
    out["tn_val_best"], out["tn_test_best"] = vbest, tbest
    out["tn_val_pick_loss"] = f"{100 * (1 - test[vbest] / test[tbest]):.1f}%"
    out["tn_val_pick_vs"] = f"{test[vbest]:,.0f} vs {test[tbest]:,.0f}"
    out["tn_loss_05"] = f"{100 * (test['0.5'] / test[tbest] - 1):.0f}%".replace("-", "−")
    preempting = [int(c[3]) for c in tcells["test"].values() if int(c[3]) > 0]
    out["tn_test_preempt_range"] = _span(preempting, "d", "–")
    out["tn_val_hits"] = f"{tcells['val']['0.0'][-1]} at 0 to {tcells['val']['0.2'][-1]} at 0.2"
    out["tn_val_preempt_0"] = tcells["val"]["0.0"][3]
    joint = _goodput(f"{SCENARIO}/joint.txt")
    gains = [100 * (g[f"{w}/s"] / g[f"{w}/r"] - 1) for g in joint.values() for w in ("0.0", "0.01")]
    out["jt_swap_gain"] = _span(gains, ".0f", "–") + "%"
    jtest = joint["test"]
    out["jt_test_0"] = f"{jtest['0.0/s']:,.0f} vs {jtest['0.0/r']:,.0f}"
    jbest = max(jtest, key=jtest.get)
    out["jt_loss_02"] = f"{100 * (1 - max(jtest['0.2/r'], jtest['0.2/s']) / jtest[jbest]):.0f}%"
    out["jt_fewest"] = f"{jtest['0.01+fewest_computed']:,.0f}"
    out["jt_best"] = f"({jbest.split('/')[0]}, {'swap' if jbest.endswith('/s') else 'recompute'})"
    out["jt_same_best"] = "the same" if max(joint["val"], key=joint["val"].get) == jbest else "not the same"
    pgood = _goodput(pre)
    out["pre_cost_wins"] = "every split" if all(max(pgood[s], key=pgood[s].get) == "cost_aware" for s in splits) else \
        "not every split"
    return out


# --- docs/security.md: fill-and-squeeze (kvrl-attack fill-squeeze's JSON, committed) -------------

SECURITY = "docs/results/security"


@source("security", "cheap", f"{SECURITY}/fill_squeeze.json")
def security() -> dict[str, str]:
    run = _json(f"{SECURITY}/fill_squeeze.json")
    rows = {r["defence"]: r for r in run["rows"]}
    base = rows[run["baseline"]]["no_attack"]["benign_goodput_tok_s"]
    frac = {name: r["attack"]["benign_goodput_tok_s"] / base for name, r in rows.items()}
    out = {f"fs_{name.replace('+', '_')}_fraction": f"{f:.3f}" for name, f in frac.items()}
    out["fs_baseline_goodput"] = f"{base:.0f}"
    for name in ("undefended", "recommended"):
        attack = rows[name]["attack"]
        out[f"fs_{name}_max_preempt"] = f"{attack['benign_max_preemptions']}"
        out[f"fs_{name}_ttft_p99"] = f"{attack['benign_ttft_p99_s']:.3g} s"
    served = {r["attack"]["attacker_output_tokens"] for r in rows.values()}
    finished = all(r["attack"]["attacker_finished"] == r["attack"]["attacker_requests"] for r in rows.values())
    out["fs_attacker_tokens"] = (f"{served.pop():,} attacker tokens served in each" if len(served) == 1
                                 else "attacker tokens served differ between defences")
    out["fs_attacker_finished"] = "finishes every attacker request" if finished else "does not finish every attacker request"
    out["fs_no_attack_cost"] = ("nothing with any defence: {:.0f} tok/s everywhere".format(base)
                                if all(abs(r["no_attack"]["benign_goodput_tok_s"] - base) < 0.5 for r in rows.values())
                                else "something: the defences' no-attack goodput differs")
    return out


BENIGN = {"mt": "benign_cost_multi_tenant", "r6": "benign_cost_synthetic_rate6", "r12": "benign_cost_synthetic_rate12"}


def _signed(pct: float) -> str:
    """A % change as the tables print it: one decimal, a sign, ``±0.0%`` when it rounds to zero."""
    text = f"{pct:+.1f}%"
    return "±0.0%" if text in ("+0.0%", "-0.0%") else text.replace("-", "−")


@source("benign", "cheap", *(f"{SECURITY}/{name}.json" for name in BENIGN.values()))
def benign() -> dict[str, str]:
    out = {}
    runs = {key: {r["defence"]: r for r in _json(f"{SECURITY}/{name}.json")["rows"]} for key, name in BENIGN.items()}
    for key, rows in runs.items():
        for name, r in rows.items():
            stem = f"{key}_{name.replace('+', '_')}"
            out[f"{stem}_goodput"] = _signed(100 * r["goodput_vs_baseline"])
            out[f"{stem}_slo"] = f"{r['slo_attainment']:.3f}"
            out[f"{stem}_preempt"] = f"{r['preemptions']} (max {r['max_preemptions']} per request)"
    for name in ("capped", "thrash_guard", "recommended", "all"):
        values = [100 * rows[name]["goodput_vs_baseline"] for rows in runs.values()]
        lo, hi = _signed(min(values)), _signed(max(values))
        out[f"{name.replace('+', '_')}_goodput_range"] = (lo if lo == hi else f"{lo.rstrip('%')} to {hi}").replace("±", "")
    cut = [rows["undefended"]["preemptions"] / rows["thrash_guard"]["preemptions"] for rows in runs.values()]
    out["thrash_guard_preempt_cut"] = _span(cut, ".1f", "–") + "×"
    mt = runs["mt"]
    out["mt_recommended_slo_points"] = f"{100 * (mt['recommended']['slo_attainment'] - mt['undefended']['slo_attainment']):+.1f}"
    return out


# --- docs/rl.md: the task suite's test leaderboards (kvrl-eval leaderboard.csv, committed) -------

SUITE = "docs/results/rl_sim_suite"


def _vs(row: dict, ref: str) -> tuple[float, str]:
    return float(row[f"{ref}_pct_change"]), row[f"{ref}_verdict"]


@source("suite", "cheap", f"{SUITE}/pressure_leaderboard.csv", f"{SUITE}/phased_leaderboard.csv")
def suite() -> dict[str, str]:
    out = {}
    for task in ("pressure", "phased"):
        rows = _csv(f"{SUITE}/{task}_leaderboard.csv")
        oracle = next(k[:-len("_pct_change")] for k in rows[0] if k.endswith("_pct_change") and "[oracle" in k)
        agents = [_vs(r, oracle)[0] for r in rows if r["kind"] == "agent"]
        out[f"{task}_agents_vs_oracle"] = _span([0.0 - x for x in agents], ".1f", "–") + "%"
        controllers = [r for r in rows if r["policy"].startswith(("pi", "bandit"))]
        out[f"{task}_controllers_loss"] = _span([-_vs(r, oracle)[0] for r in controllers], ".1f", "–") + "%"
        worse = [("tuned " if "[val-tuned]" in r["policy"] else "") + r["policy"].split("(")[0] for r in controllers
                 if _vs(r, oracle)[1] == "worse"]
        out[f"{task}_controllers_worse"] = ", ".join(worse) if worse else "none"
        for name in ("token_ratio", "past_future"):
            default = next(r for r in rows if r["policy"] == name)
            tuned = next(r for r in rows if r["policy"].startswith(f"{name}(") and "[val-tuned]" in r["policy"])
            out[f"{task}_{name}_default"] = f"{_vs(default, oracle)[0]:.0f}%".replace("-", "−")
            out[f"{task}_{name}_tuned"] = f"{_vs(tuned, oracle)[0]:.0f}%".replace("-", "−")
    return out


LIVE_SUITE = "docs/results/rl_live_h200/pressure"


@source("live_suite", "cheap", f"{LIVE_SUITE}/sim_leaderboard.csv", f"{LIVE_SUITE}/live_leaderboard.csv")
def live_suite() -> dict[str, str]:
    """docs/rl.md's sentence on the `pressure` task live on an H200 beside the sim (rl_live.sh's leaderboards)."""
    out, means = {}, {}
    for side in ("sim", "live"):
        rows = _csv(f"{LIVE_SUITE}/{side}_leaderboard.csv")
        ref = next(k[:-len("_pct_change")] for k in rows[0] if k.endswith("_pct_change"))
        agents = sorted((r for r in rows if r["kind"] == "agent"), key=lambda r: r["policy"])   # by training seed
        out[f"agents_{side}"] = ", ".join(f"{float(r[f'{ref}_pct_change']):.1f}%" for r in agents).replace("-", "−")
        out[f"any_significant_{side}"] = "no" if all(r[f"{ref}_verdict"] == "no significant difference" for r in rows) else "some"
        base = next(r for r in rows if not r["kind"] == "agent" and r["policy"].startswith("fixed(fraction=0.01)"))
        means[side] = float(base["goodput_tok_s_mean"])
        out[f"fixed_{side}"] = f"{means[side]:,.0f} ± {float(base['goodput_tok_s_ci95']):,.0f}"
    out["sim_optimistic"] = f"{100 * (means['sim'] / means['live'] - 1):.0f}%"
    return out


def _paired_cell(row: dict, ref: str) -> str:
    """A kvrl-eval leaderboard row's paired goodput difference to the reference policy ``ref``:
    ``+X ± Y tok/s (+P%, p Q)`` from its ``Δgoodput_tok_s vs <ref>`` and ``vs <ref>`` columns."""
    d = f"Δgoodput_tok_s vs {ref}"
    return (f"{float(row[d + '_mean']):+.0f} ± {float(row[d + '_ci95']):.0f} tok/s "
            f"({float(row[f'vs {ref}_pct_change']):+.1f}%, p {float(row[f'vs {ref}_p']):.2g})")


def _tally(verdicts: Sequence[str]) -> str:
    """How many of ``verdicts`` (kvrl.analysis.stats verdicts) are better / not significantly different /
    worse: ``"b / n / w"``."""
    return " / ".join(str(sum(v == want for v in verdicts)) for want in ("better", "no significant difference", "worse"))


def _compare_cell(c, digits: int = 0) -> str:
    """A :func:`kvrl.analysis.stats.paired_compare` result as ``+X ± Y tok/s (+P%, p Q)``."""
    return f"{c.delta:+.{digits}f} ± {c.delta_ci:.{digits}f} tok/s ({c.pct_change:+.1f}%, p {c.p_value:.2g})"


def _tuned_vs_default(results_csv: str) -> str:
    """The Optuna-tuned DQN recipe (agents named ``*dqnopt*``) against the default one (the other agents)
    in a kvrl-eval ``results.csv``: each test seed the mean goodput of a recipe's agents, paired over the
    seeds (:func:`_compare_cell`)."""
    from kvrl.analysis.stats import paired_compare

    per_seed: dict[str, dict[int, list[float]]] = {"dqnopt": {}, "dqn": {}}
    for row in _csv(results_csv):
        if row["kind"] == "agent" and row["split"] == "test":
            recipe = "dqnopt" if "dqnopt" in row["policy"] else "dqn"
            per_seed[recipe].setdefault(int(row["seed"]), []).append(float(row["goodput_tok_s"]))
    mean = lambda rec: {seed: sum(v) / len(v) for seed, v in per_seed[rec].items()}
    return _compare_cell(paired_compare(mean("dqnopt"), mean("dqn"), "goodput_tok_s"))


def _references(rows: list[dict]) -> list[str]:
    """The policies a kvrl-eval or merge_eval leaderboard compares every row against, in column order
    (its ``vs <reference>_verdict`` columns)."""
    return [k[3:-len("_verdict")] for k in rows[0] if k.startswith("vs ") and k.endswith("_verdict")]


def _pct_change_span(rows: list[dict], ref: str) -> str:
    """``lo to hi`` of the leaderboard ``rows``' goodput change against ``ref`` (``vs <ref>_pct_change``),
    one value when they are equal."""
    pct = [float(r[f"vs {ref}_pct_change"]) for r in rows]
    return " to ".join(f"{v:+.1f}%" for v in sorted({min(pct), max(pct)}))


def _sim_beside_errors(runs: list[dict], metric: str) -> list[float]:
    """Per live run of a kvrl-eval results.csv: the relative error of the sim's prediction of that run
    (its ``sim_<metric>`` column) against the live ``metric``."""
    return [float(r[f"sim_{metric}"]) / float(r[metric]) - 1 for r in runs]


SLO_SHIFT_LIVE = "docs/results/rl_live_h200/slo_shift"


@source("slo_shift_live", "cheap", f"{SLO_SHIFT_LIVE}/sim_leaderboard.csv", f"{SLO_SHIFT_LIVE}/live_leaderboard.csv",
        f"{SLO_SHIFT_LIVE}/live_results.csv")
def slo_shift_live() -> dict[str, str]:
    """docs/rl.md's bullets on `slo_shift` live on an H200 beside the sim (scripts/merge_eval.py's
    leaderboards, references the constant 0.2 and `slo_mix`; the sim's per-run errors from the
    ``sim_*`` columns the live runs record)."""
    out = {}
    for side, suffix in (("live", ""), ("sim", "_sim")):
        rows = _csv(f"{SLO_SHIFT_LIVE}/{side}_leaderboard.csv")
        const = next(r for r in _references(rows) if "fixed(fraction=0.2)" in r)
        mix = next(r for r in _references(rows) if "slo_mix" in r)
        rule = next(r for r in rows if r["policy"] == mix)
        d = f"Δgoodput_tok_s vs {const}"
        pct = float(rule[f"vs {const}_pct_change"])
        if side == "live":
            out["mix_vs_const"] = (f"{float(rule[d + '_mean']):+.1f} ± {float(rule[d + '_ci95']):.1f} tok/s "
                                   f"({pct:+.1f}%, p {float(rule[f'vs {const}_p']):.2g})")
        else:
            out["mix_vs_const_sim"] = f"{float(rule[d + '_mean']):+.1f} ± {float(rule[d + '_ci95']):.1f} tok/s ({pct:+.1f}%)"
        agents = [r for r in rows if r["kind"] == "agent"]
        out[f"agents_vs_const{suffix}"] = _pct_change_span(agents, const)
        out[f"agents_vs_mix{suffix}"] = _pct_change_span(agents, mix)
    runs = _csv(f"{SLO_SHIFT_LIVE}/live_results.csv")
    for key, metric in (("err_throughput", "throughput_tok_s"), ("err_goodput", "goodput_tok_s"), ("err_tpot", "tpot_p50_s"),
                        ("err_ttft", "ttft_p50_s"), ("err_ttft_p99", "ttft_p99_s")):
        errors = _sim_beside_errors(runs, metric)
        out[key] = f"{100 * sum(errors) / len(errors):+.1f}%"
        per_policy = {}
        for r, e in zip(runs, errors):
            per_policy.setdefault(r["policy"], []).append(e)
        means = [100 * sum(v) / len(v) for v in per_policy.values()]
        out[f"{key}_policies"] = f"{min(means):+.1f}% to {max(means):+.1f}%"
    return out



REGEN = {"cp10": "docs/results/rl_classes/classes_preemption_leaderboard.csv",
         "cp30": "docs/results/rl_classes/classes_preemption_30seeds_leaderboard.csv",
         "heldout": "docs/results/rl_classes/classes_heldout_leaderboard.csv",
         "slots4": "docs/results/rl_slots/round4_classes_preemption_leaderboard.csv",
         "slots4_heldout": "docs/results/rl_slots/round4_classes_heldout_leaderboard.csv",
         "cem": "docs/results/rl_hinted/cem_leaderboard.csv",
         "cem_heldout": "docs/results/rl_hinted/cem_heldout_leaderboard.csv",
         "pool512": "docs/results/rl_sim_rcpi/pool512_leaderboard.csv",
         "llama": "docs/results/rl_sim_rcpi/llama_pressure_leaderboard.csv"}


def _board_facts(key: str, rows: list[dict], ref: str) -> dict[str, str]:
    """One leaderboard's agents against its reference ``ref``: the span of their goodput change and how many
    are better / n.s. / worse (``<key>_agents_vs_<short>``, ``<key>_agents_tally_<short>``; ``short`` is
    ``oracle`` or ``valbest`` for those references, else the plugin's name)."""
    short = "oracle" if "[oracle" in ref else "valbest" if "[val-best" in ref else ref.split("(")[0].split(" ")[0]
    agents = [r for r in rows if r["kind"] == "agent"]
    return {f"{key}_agents_vs_{short}": _pct_change_span(agents, ref),
            f"{key}_agents_tally_{short}": _tally([r[f"vs {ref}_verdict"] for r in agents])}


@source("regenerated", "cheap", *REGEN.values())
def regenerated() -> dict[str, str]:
    """docs/rl.md's bullets on the leaderboards session 28 regenerated on the current profile
    (scripts/rerun_leaderboard.py --regenerate): per leaderboard its agents against its references,
    and the heuristics' and the strongest policy's paired differences the bullets quote."""
    out = {}
    boards = {k: _csv(v) for k, v in REGEN.items()}
    by = lambda k, prefix: next(r for r in boards[k] if r["policy"].startswith(prefix))
    for key, rows in boards.items():
        for ref in _references(rows):
            out.update(_board_facts(key, rows, ref))
    out["cp10_best_vs_lifo"] = _paired_cell(by("cp10", "most_blocks(mode=swap) [val-tuned]"), "lifo")
    cp = boards["cp30"]
    best = by("cp30", "most_blocks(mode=swap) [val-tuned]")
    out["cp30_best_vs_lifo"] = _paired_cell(best, "lifo")
    swap = [r for r in cp if "[val-tuned]" in r["policy"] and "mode=swap" in r["policy"] and r is not best]
    out["cp30_swap_vs_lifo"] = _pct_change_span(swap, "lifo")
    out["cp30_swap_names"] = ", ".join(f"`{r['policy'].split(' [')[0]}`" for r in swap)
    out["cp30_lr_choice"] = by("cp30", "longest_remaining(")["policy"].split(" [")[0]
    held = boards["heldout"]
    ref = _references(held)[0]
    out["heldout_span"] = _pct_change_span([r for r in held if r["policy"] != ref], ref)
    out["heldout_significant"] = str(sum(r[f"vs {ref}_verdict"] != "no significant difference" for r in held))
    s4 = boards["slots4"]
    out["slots4_slack_vs_best"] = _paired_cell(by("slots4", "slo_slack(mode=swap"), "most_blocks(mode=swap) [val-tuned]")
    out["slots4_slack_label"] = by("slots4", "slo_slack(mode=swap")["policy"].split(" [")[0]
    agent = next(r for r in s4 if r["kind"] == "agent")      # the nine serve every seed alike
    out["slots4_agent_vs_best"] = _paired_cell(agent, "most_blocks(mode=swap) [val-tuned]")
    out["slots4_agent_vs_lifo"] = _paired_cell(agent, "lifo")
    cem = boards["cem"]
    oracle = next(r for r in _references(cem) if "[oracle" in r)
    others = [r for r in cem if r["kind"] not in ("agent", "oracle")]
    strongest = max(others, key=lambda r: float(r["goodput_tok_s_mean"]))
    out["cem_strongest"] = strongest["policy"]
    out["cem_strongest_vs_oracle"] = _paired_cell(strongest, oracle)
    out["cem_oracle"] = oracle.split(" [")[0]
    tuned = [r for r in others if "[val-tuned]" in r["policy"] or r["kind"] == "heuristic"]
    out["cem_controllers_worse"] = ", ".join(sorted({r["policy"].split("(")[0].split(" ")[0] for r in tuned
                                                     if r[f"vs {oracle}_verdict"] == "worse"}))
    return out


#: session 29's held-out families from a public trace kept out of the repository (the Mooncake conversation trace)
MOONCAKE_BOARDS = {"pressure": "docs/results/rl_sim_suite/pressure_mooncake_leaderboard.csv",
                   "tenants": "docs/results/rl_sim_suite/tenants_mooncake_leaderboard.csv"}
#: the same tasks' held-out families from kvrl's generators, for comparison
GENERATOR_HELDOUT = {"pressure": "docs/results/rl_sim_suite/pressure_heldout_leaderboard.csv",
                     "tenants": "docs/results/rl_sim_suite/tenants_heldout_agents_leaderboard.csv"}


@source("mooncake_heldout", "cheap", *MOONCAKE_BOARDS.values(), *GENERATOR_HELDOUT.values())
def mooncake_heldout() -> dict[str, str]:
    """docs/rl.md "Held out on a public trace": per task's Mooncake leaderboard, its agents against fixed 0.01,
    the val-picked and the hindsight-best constant (:func:`_board_facts`), which constants those are, the
    best and the worst agent's paired difference to fixed 0.01, the preemptions per job of the agents worse
    than the val pick and of the two constants, and how many
    of the tuned heuristics and controllers are significantly worse than fixed 0.01; for comparison, the worst
    agent's change against the val-picked constant on the task's generator held-out family
    (``<task>_generator_worst_vs_valbest``)."""
    out = {}
    for key, path in GENERATOR_HELDOUT.items():
        rows = _csv(path)
        ref = next(r for r in _references(rows) if "[val-best" in r)
        out[f"{key}_generator_worst_vs_valbest"] = f"{min(float(r[f'vs {ref}_pct_change']) for r in rows if r['kind'] == 'agent'):+.1f}%"
    for key, path in MOONCAKE_BOARDS.items():
        rows = _csv(path)
        refs = _references(rows)
        for ref in refs:
            out.update(_board_facts(key, rows, ref))
        valbest = next(r for r in refs if "[val-best" in r)
        out[f"{key}_valbest"] = valbest.split(" [")[0]
        out[f"{key}_oracle"] = next(r for r in refs if "[oracle" in r).split(" [")[0]
        agents = sorted((r for r in rows if r["kind"] == "agent"), key=lambda r: float(r["goodput_tok_s_mean"]))
        f001 = "fixed(fraction=0.01)"
        out[f"{key}_best_agent_vs_f001"] = _paired_cell(agents[-1], f001)
        out[f"{key}_worst_agent_vs_f001"] = _paired_cell(agents[0], f001)
        out[f"{key}_worst_agent"] = agents[0]["policy"].split("(agents/")[1].split("/")[0]
        out[f"{key}_worse_agent_preemptions"] = _span([float(r["preemptions_mean"]) for r in agents
                                                       if r[f"vs {valbest}_verdict"] == "worse"], ".0f")
        out[f"{key}_constant_preemptions"] = ", ".join(
            f"{r['policy'].split(' [')[0].removeprefix('fixed(fraction=').removesuffix(')')}: {float(r['preemptions_mean']):.0f}"
            for r in rows if r["policy"] in (f001, valbest))
        others = [r for r in rows if r["kind"] not in ("agent", "oracle") and r["policy"] != f001
                  and not r["policy"].startswith("fixed(")]
        worse = [r for r in others if r[f"vs {f001}_verdict"] == "worse"]
        out[f"{key}_controllers_worse"] = f"{len(worse)} of {len(others)}"
    return out


POOL512_FRESH = "docs/results/rl_sim_rcpi/pool512_seeds10-39_results.csv"
POOL512_FRESH6 = "docs/results/rl_sim_rcpi/pool512_seeds40-69_results.csv"


def _fresh_seed_facts(path: str) -> dict[str, str]:
    """A `pool512` test run on seeds no earlier table used: each rcpi agent's paired goodput difference
    (``seed<k>_vs_<ref>``) to fixed 0.01 (``f001``), the val-best constant (``valbest``) and the val-tuned
    pi and bandit; how many agents beat each significantly (``better_<ref>``); the family's Holm-adjusted
    p of seed 1 against the val-best constant (``seed1_vs_valbest_holm``, over ``comparisons``); and the
    agents' mean difference to each reference (``mean_vs_<ref>``: the training seeds' average policy)."""
    from kvrl.analysis.stats import holm, paired_compare

    per: dict[str, dict[int, float]] = {}
    kinds: dict[str, str] = {}
    for r in _csv(path):
        if r["split"] == "test":
            per.setdefault(r["policy"], {})[int(r["seed"])] = float(r["goodput_tok_s"])
            kinds[r["policy"]] = r["kind"]
    pick = lambda test: next(p for p in per if test(p))
    refs = {"f001": "fixed(fraction=0.01)", "valbest": pick(lambda p: kinds[p] == "val-best"),
            "pi": pick(lambda p: p.startswith("pi(") and p.endswith("[val-tuned]")),
            "bandit": pick(lambda p: p.startswith("bandit(") and p.endswith("[val-tuned]"))}
    agents = sorted(p for p in per if kinds[p] == "agent")
    out = {"seeds": str(len(per[agents[0]])), "agents": str(len(agents)), "valbest": refs["valbest"].split(" [")[0]}
    p_values = {}
    for key, ref in refs.items():
        verdicts = []
        for a in agents:
            c = paired_compare(per[a], per[ref], "goodput_tok_s")
            name = f"seed{a.split('-seed')[1][0]}_vs_{key}"
            out[name] = _compare_cell(c, 1)
            p_values[name] = c.p_value
            verdicts.append(c.verdict)
        out[f"better_{key}"] = f"{sum(v == 'better' for v in verdicts)} of {len(agents)}"
        family = {s: sum(per[a][s] for a in agents) / len(agents) for s in per[ref]}
        out[f"mean_vs_{key}"] = _compare_cell(paired_compare(family, per[ref], "goodput_tok_s"), 1)
    adjusted = dict(zip(p_values, holm(list(p_values.values()))))
    out["comparisons"] = str(len(p_values))
    out["seed1_vs_valbest_holm"] = f"{adjusted['seed1_vs_valbest']:.2g}"
    return out


@source("pool512_fresh", "cheap", POOL512_FRESH)
def pool512_fresh() -> dict[str, str]:
    """docs/rl.md's confirmation of `pool512` on 30 test seeds none of its tables had used (10-39), the three
    committed rcpi agents (:func:`_fresh_seed_facts`)."""
    return _fresh_seed_facts(POOL512_FRESH)


@source("pool512_fresh6", "cheap", POOL512_FRESH6)
def pool512_fresh6() -> dict[str, str]:
    """The same on seeds 40-69 with six rcpi training seeds (three more fitted in session 28 on the same
    rollouts), for the recipe rather than one fit (:func:`_fresh_seed_facts`)."""
    return _fresh_seed_facts(POOL512_FRESH6)


RERUN = "docs/results/reproduce/rerun_s27.jsonl"
RERUN_S28 = "docs/results/reproduce/rerun_s28.jsonl"
REGEN_S28 = "docs/results/reproduce/regen_s28.jsonl"


def _rerun_facts(path: str) -> dict[str, str]:
    """scripts/rerun_leaderboard.py's lines in ``path``: how many reproduce bit for bit, differ, were
    skipped or failed, and per differing leaderboard its largest relative goodput difference (``differ_list``)."""
    runs = _jsonl(path)
    by = {v: [r for r in runs if r["verdict"] == v] for v in ("reproduces", "differs", "skipped", "failed")}
    out = {f"{v}_count": f"{len(rs)} of {len(runs)}" for v, rs in by.items()}
    name = lambda r: "`" + r["leaderboard"].removeprefix("docs/results/") + "`"
    out["reproduces_list"] = ", ".join(name(r) for r in by["reproduces"])
    out["differ_list"] = ", ".join(f"{name(r)} (up to {100 * r['max_goodput_rel_diff']:.0f}%)" for r in by["differs"])
    out["commit"] = " and ".join(dict.fromkeys(r["commit"] for r in runs))
    out["wall_min"] = f"{sum(r.get('wall_s', 0) for r in runs) / 60:.0f}"
    return out


@source("rerun", "cheap", RERUN)
def rerun() -> dict[str, str]:
    """The re-runs of the committed sim leaderboards in session 27 (:func:`_rerun_facts`)."""
    return _rerun_facts(RERUN)


@source("rerun_s28", "cheap", REGEN_S28, RERUN_S28)
def rerun_s28() -> dict[str, str]:
    """Session 28: the leaderboards regenerated on the current profile (``regen_*``: each line compares the
    new run with what was committed before) and their plain re-runs afterwards (the rest)."""
    out = _rerun_facts(RERUN_S28)
    out.update({f"regen_{k}": v for k, v in _rerun_facts(REGEN_S28).items()})
    return out


REGEN_S32 = "docs/results/reproduce/regen_fit11_s32.jsonl"
RERUN_S32 = "docs/results/reproduce/rerun_s32.jsonl"


@source("rerun_s32", "cheap", REGEN_S32, RERUN_S32)
def rerun_s32() -> dict[str, str]:
    """Session 32: the verdict table's sim leaderboards regenerated on the fit-11 profile into docs/results/fit11/
    (``regen_*``: each line compares the new run with the fit-10 one committed; ``regen_moved_span``: the range over
    leaderboards of the largest change in one run's goodput), and plain re-runs afterwards on this machine (the
    fit-11 copies as recorded, and committed fit-10 ones with ``--profile`` naming the archived fit-10 profile)."""
    out = _rerun_facts(RERUN_S32)
    out.update({f"regen_{k}": v for k, v in _rerun_facts(REGEN_S32).items()})
    moved = sorted(r["max_goodput_rel_diff"] for r in _jsonl(REGEN_S32))
    out["regen_moved_span"] = f"{100 * moved[0]:.0f}% to {100 * moved[-1]:.0f}%"
    runs = _jsonl(RERUN_S32)
    for side, pinned in (("fit11", False), ("fit10", True)):
        mine = [r for r in runs if bool(r.get("profile")) == pinned]
        out[f"{side}_reproduces"] = f"{sum(r['verdict'] == 'reproduces' for r in mine)} of {len(mine)}"
    return out


def _live_beside_sim(directory: str) -> dict[str, str]:
    """The facts of one scenario served live on an H200 beside its sim stage (``directory`` holds
    scripts/merge_eval.py's ``{live,sim}_{leaderboard,results}.csv``, reference the constant 0.01):
    the agents' paired differences live and in the sim, the significant sim differences whose sign live
    shares, and per live run the error of the sim stage (the RL tasks' profile, ``backend.profile=auto``)
    and of the sim beside the run (``profile=select``'s choice, its ``sim_*`` columns)."""
    from kvrl.analysis.stats import sign_holds

    out = {}
    for side in ("live", "sim"):
        rows = _csv(f"{directory}/{side}_leaderboard.csv")
        ref = next(r for r in _references(rows) if r == "fixed(fraction=0.01)")
        agents = [r for r in rows if r["kind"] == "agent"]
        out[f"agents_{side}"] = _pct_change_span(agents, ref)
        out[f"agents_worse_{side}"] = f"{sum(r[f'vs {ref}_verdict'] == 'worse' for r in agents)} of {len(agents)}"
        if side == "live":
            live = {r["policy"]: r for r in rows}
        else:
            d = f"Δgoodput_tok_s vs {ref}_mean"
            checks = [sign_holds(r[f"vs {ref}_verdict"], float(r[d]), float(live[r["policy"]][d])) for r in rows]
            out["same_sign"] = f"{sum(c is True for c in checks)} of {sum(c is not None for c in checks)}"
    runs = _csv(f"{directory}/live_results.csv")
    stage = {(r["policy"], r["seed"]): r for r in _csv(f"{directory}/sim_results.csv")}
    sources = {r["sim_cost_source"].split("/")[-2] for r in runs}
    out["beside_profile"] = ", ".join(sorted("the shipped default" if s == "profiles" else f"`{s}/`" for s in sources))
    for key, metric in (("throughput", "throughput_tok_s"), ("goodput", "goodput_tok_s"), ("tpot", "tpot_p50_s"),
                        ("ttft", "ttft_p50_s")):
        beside = _sim_beside_errors(runs, metric)
        staged = [float(stage[(r["policy"], r["seed"])][metric]) / float(r[metric]) - 1 for r in runs]
        out[f"err_{key}_beside"] = f"{100 * sum(beside) / len(beside):+.1f}%"
        out[f"err_{key}_stage"] = f"{100 * sum(staged) / len(staged):+.1f}%"
    met, policies = _targets_met(runs)
    out["beside_targets_met"] = f"{met} of {policies}"
    return out


def _targets_met(runs: list[dict], sim: str = "sim_{}", live: str = "{}") -> tuple[int, int]:
    """Per policy of ``runs`` (rows of a live results.csv, or the JSON lines of scripts/rl_host_scaled.py): does the
    sim's mean over its runs meet every one of issue 16's targets against the live mean
    (:func:`kvrl.fidelity.compare.within_targets`)? ``sim`` and ``live`` name each metric's column (``sim_{}``: the
    sim beside as priced, ``sim_host_{}`` at each run's host speed). (policies meeting all, policies)."""
    from kvrl.fidelity.compare import TARGETS, within_targets

    by: dict[str, list[dict]] = {}
    for r in runs:
        by.setdefault(r["policy"], []).append(r)
    mean = lambda rows, col: sum(float(r[col]) for r in rows) / len(rows)
    met = sum(within_targets({m: mean(rows, live.format(m)) for m in TARGETS}, {m: mean(rows, sim.format(m)) for m in TARGETS})
              for rows in by.values())
    return met, len(by)


def _live_sources(directory: str) -> tuple[str, ...]:
    """The four merged files :func:`_live_beside_sim` reads from ``directory``."""
    return tuple(f"{directory}/{side}_{kind}.csv" for side in ("sim", "live") for kind in ("leaderboard", "results"))


TENANTS_LIVE = "docs/results/rl_live_h200/tenants"
PRESSURE_LIVE = "docs/results/rl_live_h200/pressure_s28"
PHASED_LIVE = "docs/results/rl_live_h200/phased_s28"


@source("tenants_live", "cheap", *_live_sources(TENANTS_LIVE))
def tenants_live() -> dict[str, str]:
    """docs/rl.md's bullets on `tenants` (task (c)) live on an H200 beside the sim (session 27)."""
    return _live_beside_sim(TENANTS_LIVE)


@source("pressure_live", "cheap", *_live_sources(PRESSURE_LIVE))
def pressure_live() -> dict[str, str]:
    """docs/rl.md's bullets on `pressure` live on an H200 on the current profile (session 28)."""
    return _live_beside_sim(PRESSURE_LIVE)


@source("phased_live", "cheap", *_live_sources(PHASED_LIVE))
def phased_live() -> dict[str, str]:
    """docs/rl.md's bullets on `phased` live on an H200 on the current profile (session 28)."""
    return _live_beside_sim(PHASED_LIVE)


def _live_rotated(directory: str) -> dict[str, str]:
    """The facts of one scenario served live with its jobs in rotated order (session 33): those of
    :func:`_live_beside_sim`, the agents' paired differences to fixed 0.01 at equal host speed (each run's
    ``sim_replay_error`` as the covariate, :func:`kvrl.analysis.stats.paired_adjusted`: the span in tok/s and how
    many are significantly worse / better), the median absolute per-run goodput error of the sim beside the
    runs as priced and at each run's own host speed (``sim_host_goodput_tok_s``), how many policies the sim beside
    meets issue 16's targets for at host speed, and the agents against the other policy with the best live mean
    (``rival``): their paired % span and how many are significantly worse, raw and at equal host speed."""
    from kvrl.analysis.stats import paired_adjusted, paired_compare

    out = _live_beside_sim(directory)
    runs = _csv(f"{directory}/live_results.csv")
    col = lambda policy, name: {r["seed"]: float(r[name]) for r in runs if r["policy"] == policy}
    ref = "fixed(fraction=0.01)"
    agents = sorted({r["policy"] for r in runs if r["kind"] == "agent"})
    adjusted = [paired_adjusted(col(a, "goodput_tok_s"), col(ref, "goodput_tok_s"), col(a, "sim_replay_error"),
                                col(ref, "sim_replay_error")) for a in agents]
    out["agents_adjusted"] = f"{min(c.adjusted for c in adjusted):+,.0f} to {max(c.adjusted for c in adjusted):+,.0f} tok/s"
    for tag, sign in (("worse", -1), ("better", 1)):
        n = sum(c.adjusted_p < 0.05 and sign * c.adjusted > 0 for c in adjusted)
        out[f"agents_adjusted_{tag}"] = f"{n} of {len(adjusted)}"
    for key, prefix in (("priced", "sim_"), ("host", "sim_host_")):
        errors = sorted(abs(float(r[prefix + "goodput_tok_s"]) / float(r["goodput_tok_s"]) - 1) for r in runs)
        out[f"goodput_err_{key}"] = f"{100 * statistics.median(errors):.1f}%"
    met, policies = _targets_met(runs, "sim_host_{}")
    out["host_targets_met"] = f"{met} of {policies}"
    # against the other policy with the best live mean (the agents' strongest rival live), raw and at equal host speed
    others = {r["policy"] for r in runs if r["kind"] != "agent"}
    live_mean = lambda policy: statistics.mean(col(policy, "goodput_tok_s").values())
    rival = max(others, key=live_mean)
    out["rival"] = f"`{rival}`"
    raw = [paired_compare(col(a, "goodput_tok_s"), col(rival, "goodput_tok_s"), "goodput_tok_s") for a in agents]
    out["agents_vs_rival"] = f"{min(c.pct_change for c in raw):+.1f}% to {max(c.pct_change for c in raw):+.1f}%"
    out["agents_worse_rival"] = f"{sum(c.verdict == 'worse' for c in raw)} of {len(raw)}"
    adjusted = [paired_adjusted(col(a, "goodput_tok_s"), col(rival, "goodput_tok_s"), col(a, "sim_replay_error"),
                                col(rival, "sim_replay_error")) for a in agents]
    out["agents_worse_rival_adjusted"] = f"{sum(c.adjusted_p < 0.05 and c.adjusted < 0 for c in adjusted)} of {len(adjusted)}"
    return out


# docs/rl.md's bullets on `tenants`, `phased` and `pressure` live again with the job order rotated (session 33):
# the sources tenants_live_s33, phased_live_s33 and pressure_live_s33
for _task in ("tenants", "phased", "pressure"):
    _directory = f"docs/results/rl_live_h200/{_task}_s33"
    source(f"{_task}_live_s33", "cheap", *_live_sources(_directory))(functools.partial(_live_rotated, _directory))


CALIBRATED_S33 = {t: f"docs/results/rl_live_h200/{t}_s33/calibrated.jsonl" for t in ("tenants", "phased", "pressure")}


@source("calibrated_s33", "cheap", *CALIBRATED_S33.values())
def calibrated_s33() -> dict[str, str]:
    """The session-33 live runs served again in the sim at the host speed of the earlier runs of their process
    (``scripts/rl_host_scaled.py run --scale earlier``): per task the median absolute per-run throughput and goodput
    error as priced and so calibrated, and the policies whose mean meets every issue-16 target either way; ``all_*``
    pools the tasks."""
    out, pooled = {}, {"runs": 0, "met_priced": 0, "met_cal": 0, "policies": 0}
    for task, path in CALIBRATED_S33.items():
        runs = _jsonl(path)
        for side, name in (("beside", "priced"), ("host", "cal")):
            for metric, key in (("throughput_tok_s", "throughput"), ("goodput_tok_s", "goodput")):
                e = [abs(r[f"{side}_{metric}"] / r[f"live_{metric}"] - 1) for r in runs if r[f"live_{metric}"] > 0]
                out[f"{task}_{key}_{name}"] = f"{100 * statistics.median(e):.1f}%"
            met, policies = _targets_met(runs, side + "_{}", "live_{}")
            out[f"{task}_met_{name}"] = f"{met} of {policies}"
            pooled[f"met_{name}"] += met
        pooled["runs"] += len(runs)
        pooled["policies"] += policies
    out["all_runs"] = str(pooled["runs"])
    for name in ("priced", "cal"):
        out[f"all_met_{name}"] = f"{pooled[f'met_{name}']} of {pooled['policies']}"
    return out


#: fidelity_calibrated.py's sims (keys of its JSON lines) and the short names the fact keys give them
CALIBRATED_SIMS = {"as priced": "priced", "calibrated": "cal", "own speed": "own"}


def _calibrated_totals(rows: list[dict], keys: dict[str, str], suffix: str = "") -> dict[str, str]:
    """Each shape's totals of ``scripts/fidelity_calibrated.py``'s JSON lines ``rows``, per sim and count (``keys``:
    its JSON key -> the fact's short name): ``<qwen|llama>_<short>_<sim><suffix>`` = ``"k of n"``."""
    out = {}
    for row in rows:
        if "total" in row:
            shape = "qwen" if row["total"].startswith("qwen") else "llama"
            for name, sim in CALIBRATED_SIMS.items():
                for key, short in keys.items():
                    out[f"{shape}_{short}_{sim}{suffix}"] = row[name][key]
    return out


CALIBRATED_S34 = {"offline": "docs/results/fidelity_same_host/calibrated_s34.jsonl",
                  "live": "docs/results/fidelity_same_host/calibrated_live_s34.jsonl"}


@source("calibrated_s34", "cheap", *CALIBRATED_S34.values())
def calibrated_s34() -> dict[str, str]:
    """The fidelity set's sim as priced, calibrated on earlier pairs and at each pair's own host speed
    (``scripts/fidelity_calibrated.py``): offline on the committed single-H200 runs and as recorded live in
    session 34, per shape's totals: ``<set>_<qwen|llama>_<every|throughput|ttft_p50>_<priced|cal|own>``, e.g.
    ``offline_llama_every_cal`` = ``"32 of 50"``; the spans over the runs' shares of the replay error's standard
    deviation and of the two policies' median difference (``<set>_<shape>_replay_sd``, ``_policy_diff``, points),
    and of the decode steps' share of the live time (``<set>_decode_share``)."""
    keys = {"every_target": "every", "throughput_within": "throughput", "ttft_p50_within": "ttft_p50"}
    out = {}
    for tag, path in CALIBRATED_S34.items():
        rows = _jsonl(path)
        for shape in ("qwen", "llama"):
            runs = [r for r in rows if r.get("shape", "").startswith(shape)]
            for key in ("replay_sd", "policy_diff"):
                out[f"{tag}_{shape}_{key}"] = _span([100 * v for r in runs for v in r[key]], ".1f")
        out[f"{tag}_decode_share"] = _span([100 * r["decode_share"] for r in rows if "run" in r], ".0f") + "%"
        out.update({f"{tag}_{k}": v for k, v in _calibrated_totals(rows, keys).items()})
    return out


ENSEMBLE_S35 = {"offline_det": "docs/results/fidelity_same_host/calibrated_s34.jsonl",
                "offline_ens": "docs/results/fidelity_same_host/ensemble_s35.jsonl",
                "live_det": "docs/results/fidelity_same_host/ensemble_live_det_s35.jsonl",
                "live_ens": "docs/results/fidelity_same_host/ensemble_live_s35.jsonl",
                "live54_det": "docs/results/fidelity_same_host/calibrated_live_s34.jsonl",
                "live54_ens": "docs/results/fidelity_same_host/ensemble_live54_s35.jsonl"}
#: the profiles session 35's ensemble ran on (the defaults then: fit 11, archived since session 39)
ENSEMBLE_PROFILES = {"qwen": "kvrl/executors/profiles/archive/h200_qwen3-0.6b_bfloat16_step_graphs_fit11.json",
                     "llama": "kvrl/executors/profiles/archive/h200_llama-3-8b_bfloat16_step_graphs_fit11.json",
                     "qwen_x4": "kvrl/executors/profiles/h200x4/h200_qwen3-0.6b_bfloat16_step_graphs.json",
                     "llama_x4": "kvrl/executors/profiles/h200x4/h200_llama-3-8b_bfloat16_step_graphs.json"}
ENSEMBLE_RUNS = ("docs/results/fidelity_same_host/run58_qwen_ensemble/pressure_0/fidelity.json",
                 "docs/results/fidelity_same_host/run59_llama_ensemble/pressure_0/fidelity.json",
                 "docs/results/fidelity_same_host/run60_llama_blind_ensemble/pressure_0/fidelity.json",
                 "docs/results/fidelity_same_host/run60_llama_blind_ensemble/pressure_1/fidelity.json")


@source("ensemble_s35", "cheap", *ENSEMBLE_S35.values(), *ENSEMBLE_RUNS, *ENSEMBLE_PROFILES.values())
def ensemble_s35() -> dict[str, str]:
    """The sim as an ensemble (kvrl-fidelity ``sim_ensemble``; ``scripts/fidelity_calibrated.py``): each shape's totals
    deterministic and as an ensemble, offline on the committed single-H200 runs, on the live runs 58-60 and on
    session 34's live runs 54-57 re-simulated
    (``<offline|live|live54>_<qwen|llama>_<every|throughput>_<priced|cal|own>_<det|ens>``, ``"k of n"``); over runs 58-60's
    pairs, how many have a sim ensemble whose throughput spans more than 3% of its mean (max - min;
    ``wide_<shape>``, ``"k of n"``), how many of those are sjf_swap's (``wide_sjf``), and run 60's
    ``blind_phased/sjf_swap``: its live runs' and its 16 jittered sims' throughput (``phased_live``, ``phased_sims``,
    tok/s spans) and its deterministic sim (``phased_det``); run 60's ``blind_parallel/sjf_swap``: the throughput
    range (max - min over the mean) of its 16 jittered sims and of its live runs (``parallel_sims_range``,
    ``parallel_live_range``); the profiles' measured step-time scatter
    (``StepProfile.step_noise``: ``noise_<qwen|llama>[_x4]``, the shipped and the ``h200x4/`` H200 step-graph ones)."""
    from kvrl.executors.profile.registry import StepProfile

    out = {}
    for tag, path in ENSEMBLE_S35.items():
        where, kind = tag.split("_")
        totals = _calibrated_totals(_jsonl(path), {"every_target": "every", "throughput_within": "throughput"}, f"_{kind}")
        out.update({f"{where}_{k}": v for k, v in totals.items()})
    wide, total, sjf = {"qwen": 0, "llama": 0}, {"qwen": 0, "llama": 0}, 0
    for path in ENSEMBLE_RUNS:
        shape = "qwen" if "qwen" in path else "llama"
        for pair, r in _json(path).items():
            if "sim_runs" not in r:
                continue
            t = [x["throughput_tok_s"] for x in r["sim_runs"]]
            total[shape] += 1
            if (max(t) - min(t)) / (sum(t) / len(t)) > 0.03:
                wide[shape] += 1
                sjf += pair.endswith("/sjf_swap")
    for shape in total:
        out[f"wide_{shape}"] = f"{wide[shape]} of {total[shape]}"
    out["wide_sjf"] = f"{sjf} of {sum(wide.values())}"
    r = _json(ENSEMBLE_RUNS[3])["blind_phased/sjf_swap"]
    out["phased_live"] = _span([x["throughput_tok_s"] for x in [r["live"], *r["live_repeats"]]], ",.0f")
    out["phased_sims"] = _span([x["throughput_tok_s"] for x in r["sim_runs"]], ",.0f")
    out["phased_det"] = format(r["sim_deterministic"]["throughput_tok_s"], ",.0f")
    rel_range = lambda runs: 100 * (max(x["throughput_tok_s"] for x in runs) - min(x["throughput_tok_s"] for x in runs)) \
        / (sum(x["throughput_tok_s"] for x in runs) / len(runs))
    r = _json(ENSEMBLE_RUNS[2])["blind_parallel/sjf_swap"]
    out["parallel_sims_range"] = format(rel_range(r["sim_runs"]), ".0f") + "%"
    out["parallel_live_range"] = format(rel_range([r["live"], *r["live_repeats"]]), ".1f") + "%"
    for key, path in ENSEMBLE_PROFILES.items():
        out[f"noise_{key}"] = format(StepProfile.from_dict(_json(path), path).step_noise, ".3f")
    return out


VAL_LOADS_S34 = "docs/results/rl_val_loads_s34/evaluations.json"


@source("val_loads_s34", "cheap", VAL_LOADS_S34)
def val_loads_s34() -> dict[str, str]:
    """kvrl-train's validation at the training loads (``scripts/train_evaluations.py``): per task the span of the
    val returns over every run, evaluation and load (``<task>_returns``), how many runs' evaluations all gave the
    same returns (``<task>_same_every_eval``: the same multiset of returns, each evaluation starting at another
    load), and the val and test splits' requests and arrival spans (``<task>_<split>_requests``, ``_span_s``)."""
    data = _json(VAL_LOADS_S34)
    out = {}
    for task, split in data["splits"].items():
        runs = [r for r in data["runs"].values() if r["task"] == task]
        out[f"{task}_returns"] = _span([v for r in runs for row in r["results"] for v in row], ".1f")
        same = sum(all(sorted(row) == sorted(r["results"][0]) for row in r["results"]) for r in runs)
        out[f"{task}_same_every_eval"] = f"{same} of {len(runs)}"
        for name, stats in split.items():
            out[f"{task}_{name}_requests"] = str(stats["requests"])
            out[f"{task}_{name}_span_s"] = f"{stats['last_s'] - stats['first_s']:.1f}"
    return out


SLO_SHIFT_CEMRULE = "docs/results/rl_live_h200/slo_shift_cemrule"


@source("slo_shift_cemrule_live", "cheap", f"{SLO_SHIFT_CEMRULE}/sim_leaderboard.csv",
        f"{SLO_SHIFT_CEMRULE}/live_leaderboard.csv", f"{SLO_SHIFT_CEMRULE}/live_results.csv")
def slo_shift_cemrule_live() -> dict[str, str]:
    """docs/rl.md's bullets on the rule-started `slo_shift` agents live on an H200 beside the sim
    (scripts/merge_eval.py's leaderboards, reference `slo_mix`; the sim's per-run errors from the
    ``sim_*`` columns of the live runs)."""
    out = {}
    for side in ("live", "sim"):
        rows = _csv(f"{SLO_SHIFT_CEMRULE}/{side}_leaderboard.csv")
        mix = next(r for r in _references(rows) if "slo_mix" in r)
        d = f"Δgoodput_tok_s vs {mix}"
        agents = sorted((r for r in rows if r["kind"] == "agent"), key=lambda r: r["policy"])   # by training seed
        out[f"agents_vs_mix_{side}"] = "; ".join(
            f"{float(r[d + '_mean']):+.1f} ± {float(r[d + '_ci95']):.1f} (p {float(r[f'vs {mix}_p']):.2g})" for r in agents)
        out[f"significant_{side}"] = str(sum(r[f"vs {mix}_verdict"] != "no significant difference" for r in agents))
        out[f"seeds_{side}"] = "/".join(r["runs"] for r in agents)
    runs = _csv(f"{SLO_SHIFT_CEMRULE}/live_results.csv")
    for key, metric in (("err_throughput", "throughput_tok_s"), ("err_goodput", "goodput_tok_s"),
                        ("err_tpot", "tpot_p50_s"), ("err_ttft", "ttft_p50_s")):
        errors = _sim_beside_errors(runs, metric)
        out[key] = f"{100 * sum(errors) / len(errors):+.1f}%"
    return out


#: the same 21 sim jobs re-priced with a profile of a four-GPU host (docs/fidelity.md, runs 37 and 38)
CEMRULE_PROFILES = {"shipped": f"{SLO_SHIFT_CEMRULE}/sim_results.csv",
                    "run37": f"{SLO_SHIFT_CEMRULE}/sim_profile_run37/results.csv",
                    "run38": f"{SLO_SHIFT_CEMRULE}/sim_profile_run38/results.csv"}


@source("slo_shift_cemrule_profiles", "cheap", f"{SLO_SHIFT_CEMRULE}/live_results.csv", *CEMRULE_PROFILES.values())
def slo_shift_cemrule_profiles() -> dict[str, str]:
    """The rule-started agents' live check priced by each sim profile: ``<profile>_mix_err``, the sim's
    mean goodput of ``slo_mix`` over the live seeds against the live mean; ``<profile>_agents``, each agent's
    paired difference to ``slo_mix`` in that sim over all its seeds (by training seed); ``<profile>_significant``, how many of
    them a paired t-test finds significant (p < 0.05)."""
    from scipy import stats

    live = _by_policy(f"{SLO_SHIFT_CEMRULE}/live_results.csv", "goodput_tok_s")
    mix = next(p for p in live if p.startswith("slo_mix"))
    out = {}
    for prof, path in CEMRULE_PROFILES.items():
        sim = _by_policy(path, "goodput_tok_s")
        seeds = sorted(set(live[mix]) & set(sim[mix]))
        sim_mean = sum(sim[mix][s] for s in seeds) / len(seeds)
        live_mean = sum(live[mix][s] for s in seeds) / len(seeds)
        out[f"{prof}_mix_err"] = f"{100 * (sim_mean / live_mean - 1):+.1f}%"
        agents = sorted(p for p in sim if p.startswith("agent"))
        out[f"{prof}_agents"] = "; ".join(_paired(sim[a], sim[mix], 1) for a in agents)
        out[f"{prof}_significant"] = str(sum(
            stats.ttest_rel([sim[a][s] for s in sorted(sim[a])], [sim[mix][s] for s in sorted(sim[a])]).pvalue < 0.05
            for a in agents))
    return out


#: env=slo_shift's committed leaderboard (the shipped profile) and the same evaluation priced by run 38's
#: four-GPU-host profile (KVRL_PROFILE_PATH)
SLO_SHIFT_BOARDS = {"shipped": "docs/results/rl_slo_shift/leaderboard.csv",
                    "run38": "docs/results/rl_slo_shift/profile_run38/leaderboard.csv"}


@source("slo_shift_profiles", "cheap", *SLO_SHIFT_BOARDS.values())
def slo_shift_profiles() -> dict[str, str]:
    """Per profile (``<profile>_<fact>``): the val-tuned ``slo_mix`` (``mix``) and the hindsight-best constant
    (``oracle``); the rule against that constant (``mix_vs_oracle``); the best agent against the rule
    (``best_vs_mix``); how many agents are better / not significantly different / worse than the rule."""
    out = {}
    for prof, path in SLO_SHIFT_BOARDS.items():
        rows = _csv(path)
        refs = _references(rows)
        mix = next(r for r in refs if r.startswith("slo_mix") and "[val-tuned]" in r)
        oracle = next(r for r in refs if "[oracle" in r)
        rule = next(r for r in rows if r["policy"] == mix)
        agents = [r for r in rows if r["kind"] == "agent"]
        best = max(agents, key=lambda r: float(r["goodput_tok_s_mean"]))
        out[f"{prof}_mix"] = mix.removesuffix(" [val-tuned]")
        out[f"{prof}_oracle"] = oracle.split(" [")[0]
        out[f"{prof}_mix_vs_oracle"] = f"{float(rule[f'vs {oracle}_pct_change']):+.1f}%"
        out[f"{prof}_best_vs_mix"] = _paired_cell(best, mix)
        out[f"{prof}_agents_vs_mix"] = _tally([r[f"vs {mix}_verdict"] for r in agents])
    return out


SLO_SHIFT_OPTUNA = "docs/results/rl_slo_shift/optuna"


@source("slo_shift_optuna", "cheap", f"{SLO_SHIFT_OPTUNA}/trials.csv", f"{SLO_SHIFT_OPTUNA}/leaderboard.csv",
        f"{SLO_SHIFT_OPTUNA}/results.csv")
def slo_shift_optuna() -> dict[str, str]:
    """Session 23's Optuna study of DQN on ``env=slo_shift`` and its evaluation (docs/rl.md, "Tuning DQN with
    Optuna"): the study's trials (``trials``, ``best_value``, ``distinct``: distinct values among them,
    ``constant_value``: the most frequent value and how often); per agent of the tuned
    (``dqnopt``) and the default recipe (``dqn``), the paired difference to the rule (``<agent>_vs_mix``);
    how many of each recipe's agents are better / not significantly different / worse than the rule
    (``<recipe>_vs_mix``); and the tuned recipe's agents against the default's, each seed the mean of a
    recipe's three agents, paired over the test seeds (``tuned_vs_default``)."""
    from collections import Counter

    trials = [r for r in _csv(f"{SLO_SHIFT_OPTUNA}/trials.csv") if r["state"] == "COMPLETE"]
    values = Counter(r["value"] for r in trials)
    common, times = values.most_common(1)[0]
    out = {"trials": str(len(trials)), "best_value": trials[0]["value"], "distinct": str(len(values)),
           "constant_value": f"{common} ({times} of {len(trials)} trials)"}
    rows = _csv(f"{SLO_SHIFT_OPTUNA}/leaderboard.csv")
    mix = next(r["policy"] for r in rows if r["policy"].startswith("slo_mix"))
    agents = [r for r in rows if r["kind"] == "agent"]
    recipe = lambda r: "dqnopt" if "dqnopt" in r["policy"] else "dqn"
    for r in agents:
        name = re.search(r"slo_shift-(dqn\w*-seed\d)", r["policy"]).group(1)
        out[f"{name}_vs_mix"] = _paired_cell(r, mix)
    for rec in ("dqnopt", "dqn"):
        out[f"{rec}_vs_mix"] = _tally([r[f"vs {mix}_verdict"] for r in agents if recipe(r) == rec])
    out["tuned_vs_default"] = _tuned_vs_default(f"{SLO_SHIFT_OPTUNA}/results.csv")
    return out


PRESSURE_OPTUNA = "docs/results/rl_sim_suite/optuna"


@source("pressure_optuna", "cheap", f"{PRESSURE_OPTUNA}/pressure_trials.csv",
        f"{PRESSURE_OPTUNA}/pressure_leaderboard.csv", f"{PRESSURE_OPTUNA}/pressure_results.csv")
def pressure_optuna() -> dict[str, str]:
    """Session 24's Optuna study of DQN on ``env=pressure`` and its evaluation (docs/rl.md, "Tuning DQN with
    Optuna on pressure"): the study (``trials``, ``distinct`` values, ``spread``: best over worst value);
    per tuned agent, the constant whose test runs it equals on every seed (``<agent>_copies``, "none" if
    no constant's); the tuned agents against the val-best constant (``dqnopt_vs_valbest``, better / n.s. /
    worse) and against the strongest other policy (``dqnopt_vs_best``); and the tuned recipe against the
    default, each seed the mean of a recipe's three agents (``tuned_vs_default``)."""
    trials = [r for r in _csv(f"{PRESSURE_OPTUNA}/pressure_trials.csv") if r["state"] == "COMPLETE"]
    values = [float(r["value"]) for r in trials]
    out = {"trials": str(len(trials)), "distinct": str(len(set(values))),
           "spread": f"{100 * (max(values) / min(values) - 1):.1f}%"}
    rows = _csv(f"{PRESSURE_OPTUNA}/pressure_leaderboard.csv")
    valbest = next(r["policy"] for r in rows if r["kind"] == "val-best")
    others = [r for r in rows if r["kind"] not in ("agent", "oracle")]
    best = max(others, key=lambda r: float(r["goodput_tok_s_mean"]))["policy"]
    out["best_other"] = best
    tuned = [r for r in rows if r["kind"] == "agent" and "dqnopt" in r["policy"]]
    out["dqnopt_vs_valbest"] = _tally([r[f"vs {valbest}_verdict"] for r in tuned])
    out["dqnopt_vs_best"] = _tally([r[f"vs {best}_verdict"] for r in tuned])
    by_policy = _by_policy(f"{PRESSURE_OPTUNA}/pressure_results.csv", "goodput_tok_s")
    constants = {p: v for p, v in by_policy.items() if p.startswith("fixed(") and "[" not in p}
    for r in tuned:
        name = re.search(r"pressure-(dqnopt-seed\d)", r["policy"]).group(1)
        same = [p for p, v in constants.items() if v == by_policy[r["policy"]]]
        out[f"{name}_copies"] = same[0] if same else "none"
    out["tuned_vs_default"] = _tuned_vs_default(f"{PRESSURE_OPTUNA}/pressure_results.csv")
    return out


RULE_HEADROOM = "docs/results/headroom"


def _planner_jobs(name: str) -> dict[int, dict]:
    """A scripts/rl_rule_headroom.py ``--out`` file of :data:`RULE_HEADROOM`: its jobs by seed."""
    return {r["seed"]: r for r in _jsonl(f"{RULE_HEADROOM}/{name}")}


def _planner_vs_base(jobs: dict[int, dict]) -> tuple[str, str]:
    """The planner against its base (the rule or constant it plans over) over :func:`_planner_jobs`' seeds:
    the paired goodput difference as a cell, and ``k of n`` seeds where the planner is below the base."""
    from kvrl.analysis.stats import paired_compare

    c = paired_compare({s: r["planner_goodput"] for s, r in jobs.items()},
                       {s: r["rule_goodput"] for s, r in jobs.items()}, "goodput_tok_s")
    below = sum(r["planner_goodput"] < r["rule_goodput"] for r in jobs.values())
    return _compare_cell(c, 1), f"{below} of {len(jobs)}"


def _planner_vs_planner(a: dict[int, dict], b: dict[int, dict]) -> str:
    """Planner ``a``'s goodput against planner ``b``'s (two :func:`_planner_jobs`), paired over their
    common seeds, as a cell."""
    from kvrl.analysis.stats import paired_compare

    seeds = sorted(set(a) & set(b))
    return _compare_cell(paired_compare({s: a[s]["planner_goodput"] for s in seeds},
                                        {s: b[s]["planner_goodput"] for s in seeds}, "goodput_tok_s"), 1)


def _planner_facts(files: dict[str, str], against: str) -> dict[str, str]:
    """:func:`_planner_vs_base` of each named planner file of :data:`RULE_HEADROOM`, as the facts
    ``<name>_vs_<against>`` and ``<name>_below``."""
    out = {}
    for name, f in files.items():
        out[f"{name}_vs_{against}"], out[f"{name}_below"] = _planner_vs_base(_planner_jobs(f))
    return out


@source("rule_forecast", "cheap", f"{RULE_HEADROOM}/rule_headroom_slo_shift.jsonl",
        f"{RULE_HEADROOM}/rule_forecast5_slo_shift.jsonl", f"{RULE_HEADROOM}/rule_forecast40_slo_shift.jsonl")
def rule_forecast() -> dict[str, str]:
    """The rollout planner over ``slo_mix`` on slo_shift's live-check jobs, clairvoyant (session 20), on a
    5 s persistence forecast of arrivals (session 24; scripts/rl_rule_headroom.py ``--forecast 5``) and on
    a 40 s one, the traffic's period (session 25, ``--forecast 40``): per planner the paired difference to the
    rule over the seeds (``<planner>_vs_rule``), the seeds where it loses to the rule (``<planner>_below``),
    and each forecast planner against the clairvoyant one (``<planner>_vs_clairvoyant``)."""
    runs = {"clairvoyant": _planner_jobs("rule_headroom_slo_shift.jsonl"),
            "forecast": _planner_jobs("rule_forecast5_slo_shift.jsonl"),
            "forecast40": _planner_jobs("rule_forecast40_slo_shift.jsonl")}
    out = {}
    for name, rows in runs.items():
        out[f"{name}_vs_rule"], out[f"{name}_below"] = _planner_vs_base(rows)
    for name in ("forecast", "forecast40"):
        out[f"{name}_vs_clairvoyant"] = _planner_vs_planner(runs[name], runs["clairvoyant"])
    return out


PRESSURE_HEADROOM = {"clairvoyant": "rule_headroom_pressure_fc0.jsonl", "forecast1": "rule_headroom_pressure_fc1.jsonl",
                     "forecast2": "rule_headroom_pressure_fc2.jsonl",
                     "tenants_clairvoyant": "rule_headroom_tenants_fc0.jsonl",
                     "tenants_forecast1": "rule_headroom_tenants_fc1.jsonl"}
TENANTS_CONSTANTS = f"{RULE_HEADROOM}/tenants_constants_test.jsonl"


@source("pressure_headroom", "cheap", *(f"{RULE_HEADROOM}/{f}" for f in PRESSURE_HEADROOM.values()), TENANTS_CONSTANTS)
def pressure_headroom() -> dict[str, str]:
    """The rollout planner over the best constant in hindsight (session 25; scripts/rl_rule_headroom.py
    ``--rule fixed:fraction=0.01``) on the test jobs of ``env=pressure`` (keys without prefix) and
    ``env=tenants`` (``tenants_``), clairvoyant and on 1 s (and on pressure 2 s) persistence forecasts of
    arrivals: per planner the paired difference to the constant over the seeds (``<planner>_vs_best``) and
    the seeds where it loses (``<planner>_below``); tenants' constants on the same jobs (``--sweep``):
    ``tenants_best`` and ``tenants_constants`` (mean goodput per constant)."""
    consts = _jsonl(TENANTS_CONSTANTS)
    out = {"tenants_best": f"{max(consts, key=lambda r: r['goodput_mean'])['constant']:g}",
           "tenants_constants": ", ".join(f"{r['constant']:g}: {r['goodput_mean']:,.0f}" for r in consts)}
    return {**out, **_planner_facts(PRESSURE_HEADROOM, "best")}


THROTTLE_HEADROOM = {"clairvoyant": "rule_headroom_throttle_fc0.jsonl", "forecast": "rule_headroom_throttle_fc5.jsonl",
                     "blind": "rule_headroom_throttle_fc0_blind.jsonl",
                     "forecast_blind": "rule_headroom_throttle_fc5_blind.jsonl",
                     "forecast_hints05": "rule_headroom_throttle_fc5_hints0.5.jsonl",
                     "forecast_hints10": "rule_headroom_throttle_fc5_hints1.0.jsonl",
                     "blind_k8": "rule_headroom_throttle_fc0_blind_k8.jsonl",
                     "blind_k16": "rule_headroom_throttle_fc0_blind_k16.jsonl",
                     "forecast_blind_k8": "rule_headroom_throttle_fc5_blind_k8.jsonl",
                     "forecast_blind_k16": "rule_headroom_throttle_fc5_blind_k16.jsonl",
                     "horizon": "rule_headroom_throttle_fc5_h20.jsonl",
                     "horizon_blind": "rule_headroom_throttle_fc5_blind_h20.jsonl",
                     "horizon_blind_k8": "rule_headroom_throttle_fc5_blind_k8_h20.jsonl",
                     "horizon_poisson_k8": "rule_headroom_throttle_fc5_poisson_k8_h20.jsonl",
                     "horizon_poisson_k8_fresh": "rule_headroom_throttle_fc5_poisson_k8_h20_seeds20-27.jsonl",
                     "horizon_poisson_k8_fresh28": "rule_headroom_throttle_fc5_poisson_k8_h20_seeds28-43.jsonl",
                     "heldout_horizon_poisson_k8": "rule_headroom_throttle_heldout_fc5_poisson_k8_h20.jsonl"}


@source("throttle_headroom", "cheap", *(f"{RULE_HEADROOM}/{f}" for f in THROTTLE_HEADROOM.values()),
        "docs/results/rl_throttle/planner_rcpi_heldout_results.csv")
def throttle_headroom() -> dict[str, str]:
    """The rollout planner over the val-tuned ``token_ratio`` on ``env=throttle``'s 20 test jobs (session 42;
    scripts/rl_rule_headroom.py): clairvoyant, on a 5 s persistence forecast of arrivals (``forecast``),
    with the copies' output lengths guessed from finished requests (``blind``: ``--blind``), both, and on the
    forecast with the requests' length hints of log-error sigma 0.5 or 1.0 (``--hints``); session 43's blind
    planners ranking the candidates over 8 or 16 guessed futures (``_k8``, ``_k16``: ``--samples``), and the
    forecast run 20 s ahead past the job's end (``horizon``: ``--horizon 20``; ``horizon_poisson``: each guessed
    future drawing Poisson arrivals at the recent rate, ``--poisson``; ``_fresh``: on fresh test seeds 20-27;
    session 44: ``_fresh28`` on seeds 28-43, ``_fresh_all`` both fresh sets, ``_every`` those and seeds 0-19, and
    ``heldout_horizon_poisson_k8`` on ``env=throttle_heldout``'s test jobs 0-9, also against fixed 0.0, the best
    constant there, from kvrl-eval's rows for the same jobs: ``heldout_horizon_poisson_k8_vs_fixed0``): per planner the paired
    difference to the rule (``<planner>_vs_rule``) and the seeds where it loses (``<planner>_below``); and
    the 8-draw planner forecasting past the end against the one whose forecast stops there
    (``horizon_blind_k8_vs_forecast_blind_k8``, paired), and the Poisson forecast against the replayed one
    (``horizon_poisson_k8_vs_horizon_blind_k8``); for the 16-draw forecast planner and the 8-draw ones that
    forecast past the end (replayed or Poisson), the share of decisions
    among each job's last four (``<planner>_end_release``) and among the others (``<planner>_mid_release``)
    that hold 0.01 or less: how often the planner lets the queue in."""
    from kvrl.analysis.stats import paired_compare

    out = _planner_facts(THROTTLE_HEADROOM, "rule")
    for a, b in (("horizon_blind_k8", "forecast_blind_k8"), ("horizon_poisson_k8", "horizon_blind_k8")):
        out[f"{a}_vs_{b}"] = _planner_vs_planner(_planner_jobs(THROTTLE_HEADROOM[a]), _planner_jobs(THROTTLE_HEADROOM[b]))
    fresh = {**_planner_jobs(THROTTLE_HEADROOM["horizon_poisson_k8_fresh"]),
             **_planner_jobs(THROTTLE_HEADROOM["horizon_poisson_k8_fresh28"])}
    out["horizon_poisson_k8_fresh_all_vs_rule"], out["horizon_poisson_k8_fresh_all_below"] = _planner_vs_base(fresh)
    held = _planner_jobs(THROTTLE_HEADROOM["heldout_horizon_poisson_k8"])
    fixed0 = _by_policy("docs/results/rl_throttle/planner_rcpi_heldout_results.csv", "goodput_tok_s")[
        "fixed(fraction=0.0) [val-best]"]
    out["heldout_horizon_poisson_k8_vs_fixed0"] = _compare_cell(paired_compare(
        {s: r["planner_goodput"] for s, r in held.items()}, {s: fixed0[s] for s in held}, "goodput_tok_s"), 1)
    every = {**fresh, **_planner_jobs(THROTTLE_HEADROOM["horizon_poisson_k8"])}
    out["horizon_poisson_k8_every_vs_rule"], out["horizon_poisson_k8_every_below"] = _planner_vs_base(every)
    for name in ("forecast_blind_k16", "horizon_blind_k8", "horizon_poisson_k8"):
        last, rest = [], []
        for job in _planner_jobs(THROTTLE_HEADROOM[name]).values():
            n = len(job["chosen"])
            for i, held in enumerate(job["chosen"]):
                (last if i >= n - 4 else rest).append(held is not None and held <= 0.01)
        out[f"{name}_end_release"] = f"{sum(last) / len(last):.0%}"
        out[f"{name}_mid_release"] = f"{sum(rest) / len(rest):.0%}"
    return out


FIT13_HEADROOM = {"pressure_clairvoyant": "fit13/rule_headroom_pressure_fc0.jsonl",
                  "pressure_forecast1": "fit13/rule_headroom_pressure_fc1.jsonl",
                  "pressure_forecast1_blind": "fit13/rule_headroom_pressure_fc1_blind.jsonl",
                  "pressure_forecast1_blind_k16": "fit13/rule_headroom_pressure_fc1_blind_k16.jsonl",
                  "pressure_forecast1_poisson_k8": "fit13/rule_headroom_pressure_fc1_poisson_k8_h5.jsonl",
                  "tenants_clairvoyant": "fit13/rule_headroom_tenants_fc0.jsonl",
                  "tenants_forecast1": "fit13/rule_headroom_tenants_fc1.jsonl"}


@source("fit13_headroom", "cheap", *(f"{RULE_HEADROOM}/{f}" for f in FIT13_HEADROOM.values()))
def fit13_headroom() -> dict[str, str]:
    """Session 25's planners over the best constant re-run on the fit-13 profile (session 42), over fixed 0.0,
    the hindsight-best constant of ``pressure`` and ``tenants`` there: clairvoyant, on a 1 s persistence
    forecast, and (pressure) on that forecast with lengths guessed from finished requests (``--blind``; session
    43: ``_k16``, ranking the candidates over 16 guessed futures; session 44: ``_poisson_k8``, 8 guessed futures
    drawing Poisson arrivals at the recent rate for 5 s ahead, past the job's end); per
    planner the paired difference to the constant (``<planner>_vs_best``) and the seeds below it (``<planner>_below``)."""
    return _planner_facts(FIT13_HEADROOM, "best")


PLANNER_RCPI = "docs/results/rl_throttle/planner_rcpi_results.csv"
PLANNER_RCPI_HELDOUT = "docs/results/rl_throttle/planner_rcpi_heldout_results.csv"
PLANNER_RCPI_CROSSVAL = "docs/results/rcpi_planner/crossval.json"
PLANNER_RCPI_LOADS = {14: "docs/results/rl_throttle/planner_rcpi_rate14_results.csv",
                      28: "docs/results/rl_throttle/planner_rcpi_rate28_results.csv"}
PLANNER_RULES = ("token_ratio(clip_max_new_tokens=4096, min_ratio=0.05) [val-tuned]",   # the full leaderboard's
                 "token_ratio(clip_max_new_tokens=4096, min_ratio=0.05)")               # the held-out one's


def _agent_key(label: str) -> str:
    """A fact key for an agent's kvrl-eval label: ``seed<k>`` from its directory's ``-seed<k>`` suffix."""
    return "seed" + label.split("-seed")[1][0]


@source("planner_rcpi", "cheap", PLANNER_RCPI, PLANNER_RCPI_HELDOUT, PLANNER_RCPI_CROSSVAL, *PLANNER_RCPI_LOADS.values())
def planner_rcpi() -> dict[str, str]:
    """Session 44's agents distilled from the guessed-future planner (``env=throttle_planner``, scripts/rl_rcpi.py
    ``collect --guess_samples 2`` then ``fit``, training seeds 0-2): per agent ``seed<k>`` its paired goodput
    difference to the val-tuned ``token_ratio(4096, 0.05)`` (the rule the planner plans over) on test seeds 0-19
    (``_vs_rule_s0``, the seeds looked at before), 20-59 (``_vs_rule_fresh``, never looked at before the run) and
    all 60 (``_vs_rule``), and to the strongest other policy on all 60 (``_vs_best``, naming it in ``best``); on
    ``throttle_planner_heldout`` against the rule (``_heldout_vs_rule``) and the best constant there
    (``_heldout_vs_best``, fixed 0.0); the crossval's held-out realised gain per decision (``crossval_gain``,
    % of the base's goodput, ± 95% CI over the collection files), the best guessed action's (``crossval_oracle``)
    and the decisions collected (``crossval_decisions``); and on the test split at rate scales 14 and 28 (the test
    load is 20; seeds 0-19) each agent against the rule (``<agent>_rate<scale>_vs_rule``)."""
    from kvrl.analysis.stats import paired_compare

    test, held = _by_policy(PLANNER_RCPI, "goodput_tok_s"), _by_policy(PLANNER_RCPI_HELDOUT, "goodput_tok_s")
    rule, held_rule = (next(p for p in PLANNER_RULES if p in runs) for runs in (test, held))
    agents = {p: _agent_key(p) for p in sorted(test) if p.startswith("agent")}   # label -> key
    others = {p: g for p, g in test.items() if not p.startswith("agent") and "[oracle" not in p}
    best = max(others, key=lambda p: sum(others[p].values()) / len(others[p]))
    out = {"best": best}
    for agent, key in agents.items():
        mine = test[agent]
        for suffix, seeds in (("_s0", range(20)), ("_fresh", range(20, 60)), ("", range(60))):
            c = paired_compare({s: mine[s] for s in seeds}, {s: test[rule][s] for s in seeds}, "goodput_tok_s")
            out[f"{key}_vs_rule{suffix}"] = _compare_cell(c, 1)
        out[f"{key}_vs_best"] = _compare_cell(paired_compare(mine, test[best], "goodput_tok_s"), 1)
        out[f"{key}_heldout_vs_rule"] = _compare_cell(paired_compare(held[agent], held[held_rule], "goodput_tok_s"), 1)
        out[f"{key}_heldout_vs_best"] = _compare_cell(paired_compare(held[agent], held["fixed(fraction=0.0) [val-best]"],
                                                                     "goodput_tok_s"), 1)
    for scale, path in PLANNER_RCPI_LOADS.items():
        runs = _by_policy(path, "goodput_tok_s")
        for agent, key in agents.items():
            out[f"{key}_rate{scale}_vs_rule"] = _compare_cell(
                paired_compare(runs[agent], runs[PLANNER_RULES[1]], "goodput_tok_s"), 1)
    cv = json.loads(_text(PLANNER_RCPI_CROSSVAL))
    gain, half = cv["realised_gain_pct_margin_0.0"]
    out.update(crossval_gain=f"{gain:+.2f} ± {half:.2f}%", crossval_oracle=f"{cv['clairvoyant_gain_pct']:.2f}%",
               crossval_decisions=str(cv["decisions"]))
    return out


PLANNER_RCPI2 = "docs/results/rl_throttle/planner_rcpi2_results.csv"
PLANNER_RCPI2_CROSSVAL = "docs/results/rcpi_planner2/crossval.json"


@source("planner_rcpi2", "cheap", PLANNER_RCPI2, PLANNER_RCPI2_CROSSVAL, PLANNER_RCPI)
def planner_rcpi2() -> dict[str, str]:
    """Session 45's second expert-iteration round on ``throttle_planner``: data collected with session 44's
    seed-0 agent as the base (``collect --base <agent dir>``), fitted at margin 0 with training seeds 0-2. The
    crossval's held-out realised gain per decision over that base (``crossval_gain``), the best guessed action's
    (``crossval_oracle``), the decisions (``crossval_decisions``); per round-2 agent ``seed<k>`` its paired goodput
    difference over test seeds 0-59 to its base (``<key>_vs_base``) and to ``token_ratio(4096, 0.05)``
    (``<key>_vs_rule``); and whether the base's, the rule's and fixed 0.01's rows equal session 44's run
    (``rerun_identical``: yes/no)."""
    from kvrl.analysis.stats import paired_compare

    runs, before = _by_policy(PLANNER_RCPI2, "goodput_tok_s"), _by_policy(PLANNER_RCPI, "goodput_tok_s")
    base = next(p for p in runs if "throttle_planner-rcpi-seed0" in p)
    rule = next(p for p in runs if p.startswith("token_ratio("))
    out = {}
    for label in sorted(runs):
        if "throttle_planner-rcpi2-seed" in label:
            key = _agent_key(label)
            out[f"{key}_vs_base"] = _compare_cell(paired_compare(runs[label], runs[base], "goodput_tok_s"), 1)
            out[f"{key}_vs_rule"] = _compare_cell(paired_compare(runs[label], runs[rule], "goodput_tok_s"), 1)
    shared = (base, "fixed(fraction=0.01)")
    same = all(runs[p] == before[p] for p in shared) and runs[rule] == before[PLANNER_RULES[0]]
    cv = json.loads(_text(PLANNER_RCPI2_CROSSVAL))
    gain, half = cv["realised_gain_pct_margin_0.0"]
    out.update(crossval_gain=f"{gain:+.3f} ± {half:.3f}%", crossval_oracle=f"{cv['clairvoyant_gain_pct']:.2f}%",
               crossval_decisions=str(cv["decisions"]), rerun_identical="yes" if same else "no")
    return out


PLANNER_MIX = {"test": "docs/results/rl_throttle/planner_mix_results.csv",
               "heldout": "docs/results/rl_throttle/planner_mix_heldout_results.csv",
               "conv": "docs/results/rl_throttle/planner_mix_conv_results.csv"}
PLANNER_MIX_CROSSVAL = {"mix": "docs/results/rcpi_planner_mix/crossval.json",
                        "real": "docs/results/rcpi_planner_mix_real/crossval.json",
                        "end": "docs/results/rcpi_planner_mix_end/crossval.json",
                        "start": "docs/results/rcpi_planner_mix_start/crossval.json",
                        "startonly": "docs/results/rcpi_planner_mix_start/crossval_start_only.json"}
PLANNER_MIX_ROUNDS = {"mix": "throttle_planner_mix-rcpi-seed", "end": "throttle_planner_mix-end-seed",
                      "start": "throttle_planner_mix-start-seed", "old": "throttle_planner-rcpi-seed"}


def _rounds_vs_rule_and_best(results: dict[str, str], rounds: dict[str, str], spans: dict[str, Sequence[str]],
                             also_vs: Optional[dict[str, str]] = None) -> dict[str, str]:
    """Per family (``results``: family -> kvrl-eval results.csv) and agent (``rounds``: round name -> the stem of
    its agents' directories, seed appended): its paired goodput difference to ``token_ratio(4096, 0.05)``
    (``<family>_<round>_seed<k>_vs_rule``), to the best other non-agent policy on the same seeds, the
    hindsight-best constant aside (``_vs_best``, named in ``<family>_best``), and to each policy of ``also_vs``
    (key suffix -> the label it starts with: ``_vs_<suffix>``); and per family and span (``spans``: key -> its
    rounds) the range of those rounds' agents' ``_vs_best`` (``<family>_<span key>_vs_best``, %)."""
    from kvrl.analysis.stats import paired_compare

    out, span_pcts = {}, {}
    for family, path in results.items():
        runs = _by_policy(path, "goodput_tok_s", skip_kinds=("sweep",))
        rule = next(p for p in PLANNER_RULES if p in runs)
        others = {p: g for p, g in runs.items() if not p.startswith("agent") and "[oracle" not in p}
        best = max(others, key=lambda p: sum(others[p].values()) / len(others[p]))
        out[f"{family}_best"] = best
        extra = {suffix: next(p for p in runs if p.startswith(prefix)) for suffix, prefix in (also_vs or {}).items()}
        for label in sorted(runs):
            for name, stem in rounds.items():
                if stem in label:
                    key = f"{family}_{name}_{_agent_key(label)}"
                    out[f"{key}_vs_rule"] = _compare_cell(paired_compare(runs[label], runs[rule], "goodput_tok_s"), 1)
                    vs_best = paired_compare(runs[label], runs[best], "goodput_tok_s")
                    out[f"{key}_vs_best"] = _compare_cell(vs_best, 1)
                    for suffix, other in extra.items():
                        out[f"{key}_vs_{suffix}"] = _compare_cell(paired_compare(runs[label], runs[other], "goodput_tok_s"), 1)
                    for span, members in spans.items():
                        if name in members:
                            span_pcts.setdefault((family, span), []).append(vs_best.pct_change)
    for (family, span), pcts in span_pcts.items():
        out[f"{family}_{span}_vs_best"] = _span(pcts, "+.1f") + "%"
    return out


@source("planner_mix", "cheap", *PLANNER_MIX.values(), *PLANNER_MIX_CROSSVAL.values())
def planner_mix() -> dict[str, str]:
    """Session 49's agents trained on ``throttle_planner_mix`` (docs/rl.md, "Trained where throttling does not
    pay"), per round (``mix``: the planner's guessed scores, 1 s held; ``end``: each action held to the window's
    end on the real future; ``start``: ``mix``'s data, more of it, and the episodes' first 4 s on the real
    future) and the session-44 agent they started from (``old``), each ``<round>_seed<k>``: its paired goodput
    difference to ``token_ratio(4096, 0.05)`` (``_vs_rule``) and to the best other non-agent policy (``_vs_best``,
    named in ``<family>_best``) on ``throttle_planner``'s test split (family ``test``, 60 seeds), on
    ``throttle_planner_heldout`` (``heldout``) and on ``throttle_planner_heldout_conv`` (``conv``), keys
    ``<family>_<agent>_vs_rule`` / ``_vs_best``, and the nine mixture agents' range against the best other
    (``<family>_mixture_agents_vs_best``, %). Per crossval (``mix``, ``real``, ``end``, ``start``, and
    ``startonly``: the first-seconds decisions alone): the
    crossval's decisions, its realised gain at the fitted margin and the clairvoyant gain (% of the base per
    decision), and where the crossval lists them each action's mean gain (``<collection>_gain_<action index>``)."""
    out = _rounds_vs_rule_and_best(PLANNER_MIX, PLANNER_MIX_ROUNDS, {"mixture_agents": ("mix", "end", "start")})
    for name, path in PLANNER_MIX_CROSSVAL.items():
        cv = _json(path)
        margin = cv["recommended_margin"] if cv["recommended_margin"] is not None else 0.0
        gain, half = cv[f"realised_gain_pct_margin_{margin}"]
        out.update({f"{name}_decisions": str(cv["decisions"]), f"{name}_oracle": f"{cv['clairvoyant_gain_pct']:.2f}%",
                    f"{name}_gain": f"{gain:+.2f} ± {half:.2f}%", f"{name}_margin": f"{margin:g}"})
        for action, (mean, half) in enumerate(cv.get("action_gain_pct", [])):
            out[f"{name}_gain_{action}"] = f"{mean:+.2f} ± {half:.2f}%"
    return out


def _val_reference_scores(refs) -> list[str]:
    """rl_cem.py's val references (``val_reference_goodput``: one row per reference policy, one column per val
    job): each reference's own val score on the search's scale, the mean shortfall to the best reference per
    job (%)."""
    return [f"{(row / refs.max(axis=0) - 1.0).mean() * 100.0:+.1f}%" for row in refs]


PLANNER_CEM = {"test": "docs/results/rl_throttle/planner_cem_test_results.csv",
               "heldout": "docs/results/rl_throttle/planner_cem_heldout_results.csv",
               "conv": "docs/results/rl_throttle/planner_cem_conv_results.csv"}
PLANNER_CEM_ROUNDS = {"cem": "throttle_planner_mix-cem-seed", "cemmean": "throttle_planner_mix-cemmean-seed",
                      "cemload": "throttle_planner_mix-cemload-seed"}
PLANNER_CEM_AGENTS = {f"{name}_seed{k}": f"docs/results/agents/{stem}{k}/cem.json"
                      for name, stem in PLANNER_CEM_ROUNDS.items() for k in ((0,) if name == "cemmean" else (0, 1, 2))}


@source("planner_cem", "cheap", *PLANNER_CEM.values(), *PLANNER_CEM_AGENTS.values())
def planner_cem() -> dict[str, str]:
    """Sessions 51-52's policy-search agents on ``throttle_planner_mix`` (docs/rl.md, "Whole episodes searched
    directly"; scripts/rl_cem.py, 60 s windows, selected on every family's val split): ``cem_seed<k>`` scored
    against the best of the rule and fixed 0.0 on each job (``--references 1``), ``cemmean_seed0`` against the
    rule alone, ``cemload_seed<k>`` choosing between fixed 0.0 and the rule on load features, selected at every
    training load too (``--val-loads``). Per family (``test``: throttle_planner's test split, 60 seeds;
    ``heldout``, ``conv``: the held-out tasks) and agent, keys ``<family>_<agent>_vs_rule`` / ``_vs_best`` as in
    ``planner_mix`` and ``_vs_fixed0`` (against fixed 0.0), and the range over the three agents of ``cem`` and of
    ``cemload`` (``<family>_cem_agents_vs_best``, ``<family>_cemload_agents_vs_best``, %). Per agent its selected val gain
    (``<agent>_val_gain``, %, over the base or the reference) and the generation it came from (``_val_generation``).
    From the seed-0 search's val references: per family ``k`` of the mixture, fixed 0.0's mean gain over the rule on
    the val seeds (``val_fixed0_vs_rule_family<k>``, %); and fixed 0.0's paired difference to the rule on the trace's
    test split (``test_fixed0_vs_rule``); from the ``cemload`` search's val references (every family at every
    training load), the rule's and fixed 0.0's own val score on its scale (``cemload_val_rule``,
    ``cemload_val_fixed0``, %: the mean shortfall to the better of the two per job) and fixed 0.0's mean gain
    over the rule per family ``f`` and training load ``l`` (``cemload_val_fixed0_vs_rule_f<f>_l<l>``, %)."""
    import numpy as np

    from kvrl.analysis.stats import paired_compare

    out = _rounds_vs_rule_and_best(PLANNER_CEM, PLANNER_CEM_ROUNDS, {"cem_agents": ("cem",), "cemload_agents": ("cemload",)},
                                   also_vs={"fixed0": "fixed(fraction=0.0)"})
    runs = _by_policy(PLANNER_CEM["test"], "goodput_tok_s", skip_kinds=("sweep",))
    rule = next(p for p in PLANNER_RULES if p in runs)
    out["test_fixed0_vs_rule"] = _compare_cell(paired_compare(runs["fixed(fraction=0.0)"], runs[rule], "goodput_tok_s"), 1)
    searches = {name: _json(path) for name, path in PLANNER_CEM_AGENTS.items()}
    seed0 = searches["cem_seed0"]
    rule_val, fixed0_val = (np.asarray(v) for v in seed0["val_reference_goodput"])
    n_families = len(rule_val) // len(seed0["args"]["val_seeds"].split(","))
    gains = (fixed0_val / rule_val - 1.0).reshape(-1, n_families).mean(axis=0) * 100.0
    out.update({f"val_fixed0_vs_rule_family{k}": f"{g:+.1f}%" for k, g in enumerate(gains)})
    load0 = np.asarray(searches["cemload_seed0"]["val_reference_goodput"])   # rows: the base (rule), fixed 0.0
    out.update({f"cemload_val_{name}": score for name, score in zip(("rule", "fixed0"), _val_reference_scores(load0))})
    cells = searches["cemload_seed0"]["val_cells"]
    per_cell = (load0[1] / load0[0] - 1.0).reshape(-1, len(cells)).mean(axis=0) * 100.0
    out.update({f"cemload_val_fixed0_vs_rule_f{family}_l{load}": f"{g:+.1f}%"
                for (family, _, load), g in zip(cells, per_cell)})
    for name, search in searches.items():
        best = search["best"]
        out[f"{name}_val_gain"] = f"{best['val_gain_pct']:+.1f}%"
        out[f"{name}_val_generation"] = str(best["generation"])
    return out


PLANNER_GATE = {"test": "docs/results/rl_throttle/planner_gate_test_results.csv",
                "heldout": "docs/results/rl_throttle/planner_gate_heldout_results.csv",
                "conv": "docs/results/rl_throttle/planner_gate_conv_results.csv"}
PLANNER_GATE_ROUNDS = {"gate": "throttle_planner_mix-gate-seed", "base": "throttle_planner-rcpi-seed"}
PLANNER_GATE_SEARCHES = {k: f"docs/results/agents/throttle_planner_mix-gate-seed{k}/cem.json" for k in (0, 1, 2)}
PLANNER_GATE_LIVE = "docs/results/rl_live_h200/planner_gate_s53/live_results.csv"


@source("planner_gate", "cheap", *PLANNER_GATE.values(), *PLANNER_GATE_SEARCHES.values(), PLANNER_GATE_LIVE)
def planner_gate() -> dict[str, str]:
    """Session 53's gates on ``throttle_planner_mix`` (docs/rl.md, "Gating the planner's agent"): each chooses on
    load features between fixed 0.0 and session 44's seed-0 agent (its base). Per family (``test``, ``heldout``,
    ``conv``, as ``planner_cem``) and agent (``gate_seed<k>``, the base ``base_seed0``) the keys of
    ``_rounds_vs_rule_and_best`` with ``_vs_fixed0``, and the gates' range against the best other policy
    (``<family>_gate_agents_vs_best``, %). Per gate its selected val score (``gate_seed<k>_val_gain``, %: the mean
    shortfall to the better of the base and fixed 0.0 per val job, every family at every training load) and
    generation (``_val_generation``); the base's and fixed 0.0's own val score on that scale (``val_base``,
    ``val_fixed0``, from seed 0's search). Live (one H200, fresh test seeds): the seed-0 gate's paired difference to
    the rule and to fixed 0.0 (``live_vs_rule_{live,sim,host}``, ``live_vs_fixed0_...``, see ``_live_vs``) and the
    seeds served (``live_seeds``)."""
    import numpy as np

    out = _rounds_vs_rule_and_best(PLANNER_GATE, PLANNER_GATE_ROUNDS, {"gate_agents": ("gate",)},
                                   also_vs={"fixed0": "fixed(fraction=0.0)"})
    for k, path in PLANNER_GATE_SEARCHES.items():
        search = _json(path)
        out[f"gate_seed{k}_val_gain"] = f"{search['best']['val_gain_pct']:+.1f}%"
        out[f"gate_seed{k}_val_generation"] = str(search["best"]["generation"])
        if k == 0:   # rows: the base agent, fixed 0.0
            refs = np.asarray(search["val_reference_goodput"])
            out.update({f"val_{name}": score for name, score in zip(("base", "fixed0"), _val_reference_scores(refs))})
    live = _live_rows(PLANNER_GATE_LIVE)
    gate = next(v for label, v in live.items() if label.startswith("agent"))
    rule = next(live[p] for p in PLANNER_RULES if p in live)
    for name, ref in (("rule", rule), ("fixed0", live["fixed(fraction=0.0)"])):
        out.update({f"live_vs_{name}_{suffix}": cell for suffix, cell in _live_vs(gate, ref).items()})
    out["live_seeds"] = str(len(gate))
    return out


PLANNER_RPPO = {"test": "docs/results/rl_throttle/planner_rppo_test_results.csv",
                "heldout": "docs/results/rl_throttle/planner_rppo_heldout_results.csv",
                "conv": "docs/results/rl_throttle/planner_rppo_conv_results.csv"}
PLANNER_RPPO_TRAINING = {k: f"docs/results/agents/throttle_planner_mix-rppo-seed{k}/summary.json" for k in (0, 1, 2)}


@source("planner_rppo", "cheap", *PLANNER_RPPO.values(), *PLANNER_RPPO_TRAINING.values())
def planner_rppo() -> dict[str, str]:
    """Session 54's recurrent agents (``agent=recurrent_ppo``, an LSTM policy) trained on ``throttle_planner_mix``
    (docs/rl.md, "A recurrent policy"): per family and agent ``rppo_seed<k>`` the keys of ``_rounds_vs_rule_and_best``
    with ``_vs_fixed0``, the agents' range against the best other policy (``<family>_rppo_agents_vs_best``, %), and
    their training (``decisions``, ``train_min``: the range of the three runs' wall minutes)."""
    out = _rounds_vs_rule_and_best(PLANNER_RPPO, {"rppo": "throttle_planner_mix-rppo-seed"}, {"rppo_agents": ("rppo",)},
                                   also_vs={"fixed0": "fixed(fraction=0.0)"})
    runs = [_json(path) for path in PLANNER_RPPO_TRAINING.values()]
    out["decisions"] = _span([r["timesteps"] for r in runs], ",.0f")
    out["train_min"] = _span([r["wall_s"] / 60 for r in runs], ".0f")
    return out


THROTTLE_LIVE = "docs/results/rl_live_h200/throttle_s42/live_results.csv"
THROTTLE_LIVE_POLICIES = {"agent": "agent dqn", "token_ratio": "token_ratio(", "ttft_slack": "ttft_slack("}


@source("throttle_live_host", "cheap", THROTTLE_LIVE)
def throttle_live_host() -> dict[str, str]:
    """``throttle`` live over 16 seeds (sessions 41-42, merged): per policy (``agent``, ``token_ratio``,
    ``ttft_slack``) its paired goodput difference to fixed 0.01 live (``<policy>_live``), in the sim beside each
    live run (``<policy>_sim``) and in that sim priced at the run's measured host speed (``<policy>_host``:
    kvrl-eval's ``sim_host_goodput_tok_s``)."""
    by_policy = _live_rows(THROTTLE_LIVE)
    ref = by_policy["fixed(fraction=0.01)"]
    out = {}
    for key, prefix in THROTTLE_LIVE_POLICIES.items():
        mine = next(v for label, v in by_policy.items() if label.startswith(prefix))
        out.update({f"{key}_{suffix}": cell for suffix, cell in _live_vs(mine, ref).items()})
    return out


def _live_rows(path: str) -> dict[str, dict[int, dict]]:
    """A live kvrl-eval results.csv (rl_live.sh, merged) as policy -> seed -> row."""
    by_policy: dict[str, dict[int, dict]] = {}
    for r in _csv(path):
        by_policy.setdefault(r["policy"], {})[int(r["seed"])] = r
    return by_policy


def _live_vs(mine: dict[int, dict], ref: dict[int, dict]) -> dict[str, str]:
    """Paired goodput differences of one policy's live rows to another's over their common seeds: live
    (``live``), in the sim beside each live run (``sim``) and in that sim priced at the run's measured host
    speed (``host``)."""
    from kvrl.analysis.stats import paired_compare

    cols = (("live", "goodput_tok_s"), ("sim", "sim_goodput_tok_s"), ("host", "sim_host_goodput_tok_s"))
    return {suffix: _compare_cell(paired_compare({s: float(r[col]) for s, r in mine.items()},
                                                 {s: float(r[col]) for s, r in ref.items()}, "goodput_tok_s"), 1)
            for suffix, col in cols}


PLANNER_LIVE = "docs/results/rl_live_h200/throttle_planner_s45/live_results.csv"


@source("planner_live", "cheap", PLANNER_LIVE)
def planner_live() -> dict[str, str]:
    """Session 45's ``throttle_planner`` agents live on two H200s (three calls, merged): per agent ``seed<k>`` and
    for ``token_ratio(4096, 0.05)`` (``rule``) the paired goodput difference to fixed 0.01
    (``<key>_vs_fixed_{live,sim,host}``, see ``_live_vs``), and per agent to the rule
    (``<key>_vs_rule_{live,sim,host}``); the test seeds served (``seeds``) and the span of the runs' measured
    host speed against the profile's (``host_ratio``, kvrl-eval's ``host_probe_ratio``: 1.3 = 30% slower); and
    the live seeds an agent-rule difference of 1% needs (``diff_sd``, ``seeds_ci``, ``seeds_power80``: see
    ``_seeds_to_resolve``)."""
    by_policy = _live_rows(PLANNER_LIVE)
    fixed = by_policy["fixed(fraction=0.01)"]
    rule = next(v for label, v in by_policy.items() if label.startswith("token_ratio("))
    out = {f"rule_vs_fixed_{suffix}": cell for suffix, cell in _live_vs(rule, fixed).items()}
    for label, mine in sorted(by_policy.items()):
        if label.startswith("agent"):
            key = _agent_key(label)
            out.update({f"{key}_vs_fixed_{suffix}": cell for suffix, cell in _live_vs(mine, fixed).items()})
            out.update({f"{key}_vs_rule_{suffix}": cell for suffix, cell in _live_vs(mine, rule).items()})
    ratios = [float(r["host_probe_ratio"]) for runs in by_policy.values() for r in runs.values()]
    out.update(seeds=str(len(fixed)), host_ratio=_span([min(ratios), max(ratios)], ".2f"))
    out.update(_seeds_to_resolve(by_policy, rule, 0.01))
    return out


PLANNER_LIVE_MORE = "docs/results/rl_live_h200/throttle_planner_s46/live_results.csv"
PLANNER_LIVE_FINAL = "docs/results/rl_live_h200/throttle_planner_s48/live_results.csv"


@source("planner_live_more", "cheap", PLANNER_LIVE_MORE, PLANNER_LIVE)
def planner_live_more() -> dict[str, str]:
    """Session 46's fresh live seeds for session 44's seed-0 ``throttle_planner`` agent against
    ``token_ratio(4096, 0.05)`` (one H200, three calls, merged), joined with session 45's seeds of the same two
    policies: see :func:`_seed0_agent_vs_rule`."""
    return _seed0_agent_vs_rule(_seed0_pair(PLANNER_LIVE_MORE, []), _seed0_pair(PLANNER_LIVE_MORE, [PLANNER_LIVE]))


@source("planner_live_final", "cheap", PLANNER_LIVE_FINAL, PLANNER_LIVE_MORE, PLANNER_LIVE)
def planner_live_final() -> dict[str, str]:
    """Session 48's fresh live seeds (70-97) for the same agent and rule, the third and last look at that
    comparison, joined with sessions 45 and 46's seeds (:func:`_seed0_agent_vs_rule`); ``alpha_looks``: the
    Bonferroni level over the three looks (30, 70 and all seeds) at a family level of 5%."""
    from kvrl.analysis.stats import paired_compare

    agent, rule = _seed0_pair(PLANNER_LIVE_FINAL, [PLANNER_LIVE_MORE, PLANNER_LIVE])
    out = _seed0_agent_vs_rule(_seed0_pair(PLANNER_LIVE_FINAL, []), (agent, rule))
    out["alpha_looks"] = f"{0.05 / 3:.3f}"
    c = paired_compare({s: float(r["goodput_tok_s"]) for s, r in agent.items()},
                       {s: float(r["goodput_tok_s"]) for s, r in rule.items()}, "goodput_tok_s")
    rule_mean = statistics.fmean(float(r["goodput_tok_s"]) for r in rule.values())
    out.update(all_live_interval=f"{c.delta - c.delta_ci:+.1f} to {c.delta + c.delta_ci:+.1f}",
               all_live_upper_pct=f"{100 * (c.delta + c.delta_ci) / rule_mean:.1f}%")
    return out


def _seed0_pair(fresh_path: str, before_paths: list[str]) -> tuple[dict[int, dict], dict[int, dict]]:
    """Session 44's seed-0 ``throttle_planner`` agent's and ``token_ratio(4096, 0.05)``'s live rows (seed -> row)
    of ``fresh_path`` joined with those of ``before_paths``; a seed in two files is an error."""
    def pick(by_policy: dict[str, dict[int, dict]], start: str) -> dict[int, dict]:
        return next(runs for label, runs in by_policy.items() if label.startswith(start))

    agent, rule = {}, {}
    for path in [fresh_path, *before_paths]:
        by_policy = _live_rows(path)
        mine, ref = pick(by_policy, "agent dqn (agents/throttle_planner-rcpi-seed0/"), pick(by_policy, "token_ratio(")
        if set(rule) & set(ref):
            raise ValueError(f"{path} repeats seeds: {sorted(set(rule) & set(ref))}")
        agent.update(mine)
        rule.update(ref)
    return agent, rule


def _seed0_agent_vs_rule(fresh: tuple[dict[int, dict], dict[int, dict]],
                         joined: tuple[dict[int, dict], dict[int, dict]]) -> dict[str, str]:
    """Session 44's seed-0 ``throttle_planner`` agent against ``token_ratio(4096, 0.05)`` live, each an
    (agent, rule) pair of :func:`_seed0_pair`: the paired goodput difference over the ``fresh`` seeds
    (``fresh_vs_rule_{live,sim,host}``, see ``_live_vs``) and over the ``joined`` ones (``all_vs_rule_*``); the seeds
    (``seeds``, ``seeds_all``), the span of the fresh runs' host speed against the profile's (``host_ratio``), the
    rule's mean goodput on the fresh seeds live and in the sim beside (``rule_live``, ``rule_sim``), and the seeds a
    1% difference needs over all of them (``diff_sd``, ``seeds_ci``, ``seeds_power80``: ``_seeds_to_resolve``)."""
    (agent, rule), (agent_all, rule_all) = fresh, joined
    out = {f"fresh_vs_rule_{suffix}": cell for suffix, cell in _live_vs(agent, rule).items()}
    out.update({f"all_vs_rule_{suffix}": cell for suffix, cell in _live_vs(agent_all, rule_all).items()})
    ratios = [float(r["host_probe_ratio"]) for runs in (agent, rule) for r in runs.values()]
    out.update(seeds=str(len(rule)), seeds_all=str(len(rule_all)), host_ratio=_span([min(ratios), max(ratios)], ".2f"),
               rule_live=f"{statistics.fmean(float(r['goodput_tok_s']) for r in rule.values()):.0f}",
               rule_sim=f"{statistics.fmean(float(r['sim_goodput_tok_s']) for r in rule.values()):.0f}")
    out.update(_seeds_to_resolve({"agent": agent_all}, rule_all, 0.01))
    return out


def _seeds_to_resolve(by_policy: dict[str, dict[int, dict]], ref: dict[int, dict], effect: float) -> dict[str, str]:
    """How many live seeds resolve a gain of ``effect`` (a fraction of ``ref``'s mean goodput) between each agent
    of ``by_policy`` and ``ref``, from the spread of their paired per-seed differences (normal approximation):
    ``diff_sd`` (tok/s, the span over agents), ``seeds_ci`` (a 95% interval of half-width ``effect``) and
    ``seeds_power80`` (80% power to find ``effect`` at the 5% level)."""
    import numpy as np
    from scipy import stats

    goodput = {s: float(r["goodput_tok_s"]) for s, r in ref.items()}
    delta = effect * float(np.mean(list(goodput.values())))
    sds = [float(np.std([float(r["goodput_tok_s"]) - goodput[s] for s, r in runs.items()], ddof=1))
           for label, runs in sorted(by_policy.items()) if label.startswith("agent")]
    z, power = stats.norm.ppf(0.975), stats.norm.ppf(0.8)
    return {"diff_sd": _span(sds, ".0f"), "seeds_ci": _span([(z * sd / delta) ** 2 for sd in sds], ".0f"),
            "seeds_power80": _span([((z + power) * sd / delta) ** 2 for sd in sds], ".0f")}


AZURE_CODE_TRACE = "kvrl/workloads/data/azure_llm_2023_code.csv"


@source("azure_code_lengths", "cheap", AZURE_CODE_TRACE)
def azure_code_lengths() -> dict[str, str]:
    """What the packaged Azure code trace's prompt lengths say about its output lengths: the number of
    requests, the correlation of log prompt and log output length, the standard deviation of log output
    length, and that of its residual within each prompt-length decile (a predictor from the prompt length
    alone; equal to the first: it predicts nothing)."""
    import numpy as np

    rows = _csv(AZURE_CODE_TRACE)
    lp = np.log([float(r["ContextTokens"]) for r in rows])
    lo = np.log([max(float(r["GeneratedTokens"]), 1.0) for r in rows])
    edges = np.quantile(lp, np.linspace(0, 1, 11))
    decile = np.clip(np.searchsorted(edges, lp, "right") - 1, 0, 9)
    residual = np.concatenate([lo[decile == k] - lo[decile == k].mean() for k in range(10) if (decile == k).any()])
    return {"requests": f"{len(rows):,}", "corr": f"{np.corrcoef(lp, lo)[0, 1]:.3f}",
            "log_std": f"{lo.std():.2f}", "residual_std": f"{residual.std():.2f}"}


# --- docs/fidelity.md: host speed on the GPU, and the pressure set beside three busy GPUs (run 34) --

HOST_SPEED_GPU = "docs/results/host_speed_h200_run34.md"
RUN34 = "docs/results/fidelity_h200_run34.json"


@source("host_speed_gpu", "cheap", HOST_SPEED_GPU)
def host_speed_gpu() -> dict[str, str]:
    """The host-time error of run 34's pairs at host speed 1.0 and with ``host_speed=probe``
    (scripts/host_speed_table.py's table: the last two columns of each pair's row)."""
    pairs = []
    for line in _text(HOST_SPEED_GPU).splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 8 and cells[-1].endswith("%") and cells[-2].endswith("%"):
            pairs.append((abs(float(cells[-2].rstrip("%"))), abs(float(cells[-1].rstrip("%")))))
    before, after = (sum(p[i] for p in pairs) / len(pairs) for i in (0, 1))
    return {"err_before": f"{before:.1f}%", "err_after": f"{after:.1f}%",
            "better_worse": f"{sum(b > a for b, a in pairs)} / {sum(a > b for b, a in pairs)}"}


def _errors_vs_live_mean(run: str | dict, metric: str) -> list[float]:
    """Per pair of a kvrl-fidelity ``fidelity.json`` (its path, or its pairs as loaded) with both sides,
    in file order: the sim's absolute relative error in ``metric`` against the mean of the pair's live
    runs (kvrl.fidelity.report)."""
    from kvrl.fidelity.compare import rel_err
    from kvrl.fidelity.report import live_mean_and_spread

    pairs = _json(run) if isinstance(run, str) else run
    return [abs(rel_err(live_mean_and_spread(p, metric)[0], p["sim"][metric]))
            for p in pairs.values() if p.get("live") and p.get("sim")]


@source("run34", "cheap", RUN34)
def run34() -> dict[str, str]:
    """Run 34's sim throughput error against the mean of each pair's three live runs."""
    errors = _errors_vs_live_mean(RUN34, "throughput_tok_s")
    return {"tput_mean": f"{100 * sum(errors) / len(errors):.1f}%", "tput_max": f"{100 * max(errors):.1f}%",
            "tput_within": f"{sum(e < 0.03 for e in errors)} of {len(errors)}"}



RUN35 = "docs/results/fidelity_llama_h200_run35.json"


def _target_facts(path: str | dict) -> dict[str, str]:
    """Per target metric of kvrl.fidelity.compare.TARGETS, over the pairs of the kvrl-fidelity
    ``fidelity.json`` at ``path`` (or its pairs as loaded): the mean absolute error of the sim against the mean of each pair's
    live runs (``<metric>_mean``) and how many pairs are within the target (``<metric>_within``); how
    many meet every target at once (``every_target``)."""
    from kvrl.fidelity.compare import TARGETS

    out, within = {}, []
    for metric, bound in TARGETS.items():
        errors = _errors_vs_live_mean(path, metric)
        within.append([e < bound for e in errors])
        name = metric.removesuffix("_s").removesuffix("_tok")
        out[f"{name}_mean"] = f"{100 * sum(errors) / len(errors):.1f}%"
        out[f"{name}_within"] = f"{sum(within[-1])} of {len(errors)}"
    every = [all(pair) for pair in zip(*within)]
    out["every_target"] = f"{sum(every)} of {len(every)}"
    return out


@source("run35", "cheap", RUN35)
def run35() -> dict[str, str]:
    """Run 35 (Llama-3-8B, the pressure set, whole-step graphs): :func:`_target_facts`."""
    return _target_facts(RUN35)


SAME_HOST = "docs/results/fidelity_same_host"
#: run -> (its directory, {profile: the merged fidelity.json's directory}); the first profile's live runs
#: are every profile's (the others re-price the same live runs offline)
#: (``other_host``: re-priced with the other run's host profile of the same shape, 37 <-> 38 and 39 <-> 40)
SAME_HOST_RUNS = {
    "run37": ("run37_qwen", {"shipped": "pressure", "same_host": "fresh_pressure", "other_host": "other_host_pressure"}),
    "run38": ("run38_qwen", {"shipped": "pressure", "same_host": "fresh_pressure", "same_host_b": "fresh3_pressure",
                             "other_host": "other_host_pressure"}),
    "run39": ("run39_llama", {"shipped": "pressure", "same_host": "fresh_pressure", "other_host": "other_host_pressure"}),
    "run40": ("run40_llama", {"shipped": "pressure", "same_host": "fresh_pressure", "other_host": "other_host_pressure"}),
    # runs 41-43: single-H200 VMs, the shipped profiles' own host class (other_host: 41 <-> 42; h200x4: the
    # four-GPU-host profile of the shape, kvrl/executors/profiles/h200x4/); run 43 served 7 of the 16 pairs
    "run41": ("run41_qwen_1gpu", {"shipped": "pressure", "same_host": "fresh_pressure", "other_host": "other_host_pressure",
                                  "h200x4": "h200x4_pressure"}),
    "run42": ("run42_qwen_1gpu", {"shipped": "pressure", "same_host": "fresh_pressure", "other_host": "other_host_pressure",
                                  "h200x4": "h200x4_pressure"}),
    "run43": ("run43_llama_1gpu", {"shipped": "pressure", "h200x4": "h200x4_pressure"}),
    # runs 44-45: one more single-H200 VM, Llama-3-8B: the whole pressure set over three calls (44), then six of
    # its pairs again (45); same_host: the VM's own profile, measured between the calls
    "run44": ("run44_llama_1gpu", {"shipped": "pressure", "same_host": "same_host_pressure", "h200x4": "h200x4_pressure"}),
    "run45": ("run45_llama_1gpu", {"shipped": "pressure", "same_host": "same_host_pressure", "h200x4": "h200x4_pressure"}),
    # runs 46-47: one more single-H200 VM, kvrl-fidelity profile=select live (Qwen3-0.6B in one call, Llama-3-8B
    # over three); selected: as served; shipped and h200x4: the same live runs re-priced by each candidate
    "run46": ("run46_qwen_1gpu", {"shipped": "shipped_pressure", "selected": "pressure", "h200x4": "h200x4_pressure"}),
    "run47": ("run47_llama_1gpu", {"shipped": "shipped_pressure", "selected": "pressure", "h200x4": "h200x4_pressure"}),
    # runs 48-49: one more single-H200 VM, the blind set (conf/fidelity.yaml's blind_* workloads, never used to fit
    # or tune), served with kvrl-fidelity's default profile=select (Qwen3-0.6B in one call, Llama-3-8B over two)
    "run48": ("run48_qwen_blind", {"shipped": "shipped_pressure", "selected": "pressure", "h200x4": "h200x4_pressure"}),
    "run49": ("run49_llama_blind", {"shipped": "shipped_pressure", "selected": "pressure", "h200x4": "h200x4_pressure"}),
    # runs 51-52: one more single-H200 VM, three workloads from the public Mooncake traces (kept out of the
    # repository), profile=select (Qwen3-0.6B and Llama-3-8B, one call each)
    "run51": ("run51_qwen_mooncake", {"shipped": "shipped_pressure", "selected": "pressure", "h200x4": "h200x4_pressure"}),
    "run52": ("run52_llama_mooncake", {"shipped": "shipped_pressure", "selected": "pressure", "h200x4": "h200x4_pressure"}),
}
#: runs served with profile=select: run -> its shares (one device call each), whose first pair chose
LIVE_SELECT_RUNS = {"run46": ("pressure_0",), "run47": ("pressure_0", "pressure_1", "pressure_2"),
                    "run48": ("pressure_0",), "run49": ("pressure_0", "pressure_1"),
                    "run51": ("pressure_0",), "run52": ("pressure_0",)}
#: runs whose every candidate profile kept the replay: profile=select's rule, applied offline to the candidates
#: an H200 has (the shipped default and the h200x4/ profile), each as its SAME_HOST_RUNS profile key (run 38's
#: same-host profile is the one shipped in h200x4/)
SELECT_CANDIDATES = ("shipped", "h200x4")
SELECT_RUNS = {"run38": {"shipped": "shipped", "h200x4": "same_host"},
               **{run: {"shipped": "shipped", "h200x4": "h200x4"}
                  for run in ("run41", "run42", "run43", "run44", "run45", "run46", "run47", "run48", "run49")}}
#: subsets of SELECT_RUNS pooled apart: the runs the rule was first applied to offline (session 24, docs/fidelity.md
#: "Runs 44-45"), the calls on the pressure set, and those on the blind set (runs 48-49)
SELECT_GROUPS = {"s24": ("run38", "run41", "run42", "run43", "run44", "run45"),
                 "pressure": ("run38", "run41", "run42", "run43", "run44", "run45", "run46", "run47"),
                 "blind": ("run48", "run49")}
#: two calls of one host class and shape: the first call's live means are the truth and the second's the
#: prediction, so what a perfect copy of one call's engine would score against another's (runs 41-43)
SAME_HOST_CALLS = (("run41", "run42"), ("run37", "run38"), ("run39", "run40"), ("run43", "run44"), ("run44", "run45"),
                   ("run44", "run47"), ("run42", "run46"))
#: slo_shift's traffic: host -> profile -> the kvrl-fidelity directory of the sim with that profile
SAME_HOST_SLO = {
    "run37": {"shipped": "run37_qwen/fidelity_slo_shift", "same_host": "run37_qwen/slo_shift_fresh"},
    "run38": {"shipped": "run38_qwen/slo_shift_shipped", "same_host": "run38_qwen/slo_shift_fresh",
              "same_host_b": "run38_qwen/fidelity_slo_shift"},
}


#: runs with scripts/fidelity_small_decode.py's output (small_decode.json beside their replay.tar.xz)
SMALL_DECODE_RUNS = ("run46", "run48", "run49")
#: run 50: benchmarks/diag_steps.py --twins on blind_short_chat under each policy (Qwen3-0.6B, one H200)
TWINS50 = {p: f"{SAME_HOST}/run50_twins/twins_short_chat_{p}.json" for p in ("vllm", "sjf_swap")}


@source("same_host", "cheap",
        *(f"{SAME_HOST}/{d}/{sub}/fidelity.json" for d, subs in SAME_HOST_RUNS.values() for sub in subs.values()),
        *(f"{SAME_HOST}/{sub}/fidelity.json" for subs in SAME_HOST_SLO.values() for sub in subs.values()),
        *(f"{SAME_HOST}/{SAME_HOST_RUNS[run][0]}/{share}/fidelity.json"
          for run, shares in LIVE_SELECT_RUNS.items() for share in shares),
        f"{SAME_HOST}/step_scale_rule.jsonl",
        *(f"{SAME_HOST}/{SAME_HOST_RUNS[run][0]}/small_decode.json" for run in SMALL_DECODE_RUNS),
        *TWINS50.values())
def same_host() -> dict[str, str]:
    """Runs 37-49 (docs/fidelity.md, "A profile of the host at hand", "The shipped profiles on their
    own host class" and "Runs 44-45"): per run and profile, :func:`_target_facts` and the resolved live orders that
    profile's sim reverses (kvrl.fidelity.report.resolved_rankings), keys ``<run>_<profile>_<fact>``;
    per pair of calls of :data:`SAME_HOST_CALLS`, :func:`_target_facts` of the second call's live means
    taken as the first's sim, and the pairs whose live throughput differs by more than 3%
    (``calls_<first>_<second>_<fact>``); runs 39-40's profiles on run 43's seven pairs
    (``llama7_<run>_<profile>_<fact>``); run 41's replay by the shipped profile (``replay41_*``);
    profile=select's rule offline (:func:`_select_facts`, ``select_*``); runs 48-49's decode-step replay
    span per candidate (``replay48_*``, ``replay49_*``); scripts/fidelity_small_decode.py's spans over the pairs
    of :data:`SMALL_DECODE_RUNS` (``small_decode_*``); scripts/fidelity_scale_rule.py's totals
    (``scale_rule_*``); on slo_shift's traffic,
    per host and profile, the sim's p50 TTFT error against the live mean (slo_mix / fixed 0.2) and how
    many pairs meet every target at once."""
    from kvrl.fidelity.compare import TARGETS, rel_err
    from kvrl.fidelity.report import live_mean_and_spread, resolved_rankings

    out = {}
    for first, second in SAME_HOST_CALLS:
        truth, other = (_json(f"{SAME_HOST}/{SAME_HOST_RUNS[r][0]}/pressure/fidelity.json") for r in (first, second))
        as_sim = {k: {**p, "sim": {m: live_mean_and_spread(other[k], m)[0] for m in TARGETS}}
                  for k, p in truth.items() if k in other}
        out.update({f"calls_{first}_{second}_{k}": v for k, v in _target_facts(as_sim).items()})
        tput = _errors_vs_live_mean(as_sim, "throughput_tok_s")
        out[f"calls_{first}_{second}_throughput_over"] = f"{sum(e > 0.03 for e in tput)} of {len(tput)}"
    # run 43's seven Llama-3-8B pairs: how runs 39-40's profiles price the same pairs on the four-GPU hosts
    llama7 = list(_json(f"{SAME_HOST}/{SAME_HOST_RUNS['run43'][0]}/pressure/fidelity.json"))
    for run in ("run39", "run40"):
        d, subs = SAME_HOST_RUNS[run]
        for prof, sub in subs.items():
            pairs = _json(f"{SAME_HOST}/{d}/{sub}/fidelity.json")
            facts = _target_facts({k: pairs[k] for k in llama7})
            out[f"llama7_{run}_{prof}_throughput_mean"] = facts["throughput_mean"]
            out[f"llama7_{run}_{prof}_every_target"] = facts["every_target"]
    for run, (d, subs) in SAME_HOST_RUNS.items():
        files = {prof: f"{SAME_HOST}/{d}/{sub}/fidelity.json" for prof, sub in subs.items()}
        live = _json(files["shipped"])
        rows = resolved_rankings(live, {prof: _json(f) for prof, f in files.items()})
        resolved = [r for r in rows if r["resolved"]]
        for prof, f in files.items():
            out.update({f"{run}_{prof}_{k}": v for k, v in _target_facts(f).items()})
            out[f"{run}_{prof}_reversed"] = f"{sum(not r['same'][prof] for r in resolved)} of {len(resolved)}"
    for run, subs in SAME_HOST_SLO.items():
        for prof, sub in subs.items():
            path = f"{SAME_HOST}/{sub}/fidelity.json"
            res = _json(path)
            out[f"slo_{run}_{prof}_ttft"] = " / ".join(
                f"{100 * rel_err(live_mean_and_spread(res[p], 'ttft_p50_s')[0], res[p]['sim']['ttft_p50_s']):+.1f}%"
                for p in ("slo_shift_mix/slo_mix", "slo_shift_mix/fixed_0_2"))
            out[f"slo_{run}_{prof}_every"] = _target_facts(path)["every_target"]
    # run 37's replay as served (the shipped profile): decode and host-time totals per pair
    by_kind = [r["replay"]["by_kind"] for r in _json(f"{SAME_HOST}/run37_qwen/pressure/fidelity.json").values()]
    dec = [k["decode"]["sim_s"] / k["decode"]["live_s"] - 1 for k in by_kind]
    host = [k["host"]["sim_s"] / k["host"]["live_s"] - 1 for k in by_kind]
    out["replay37_decode_above"] = f"{sum(e > 0 for e in dec)} of {len(dec)}"
    out["replay37_decode_max"] = f"{100 * max(dec):.1f}%"
    out["replay37_host_max"] = f"{100 * max(host):.0f}%"
    # run 38's live steps re-priced by its same-host profile (the replay kept): all steps, and the steps
    # taken while the host was fast (kvrl.fidelity.replay's host_slow_share / fast_host)
    replays = {p: r["replay"] for p, r in _json(f"{SAME_HOST}/run38_qwen/fresh_pressure/fidelity.json").items()}
    fast = {p: rp["fast_host"]["all"]["sim_s"] / rp["fast_host"]["all"]["live_s"] - 1 for p, rp in replays.items()}
    out["replay38_all"] = f"{100 * sum(abs(rp['total_rel_err']) for rp in replays.values()) / len(replays):.1f}%"
    out["replay38_fast"] = f"{100 * sum(map(abs, fast.values())) / len(fast):.1f}%"
    worst = max(replays, key=lambda p: abs(replays[p]["total_rel_err"]))
    out["replay38_worst"] = (f"{worst} ({100 * replays[worst]['host_slow_share']:.0f}% of its live time on a slow "
                               f"host): {100 * replays[worst]['total_rel_err']:+.1f}% over all steps, "
                               f"{100 * fast[worst]:+.1f}% over the fast-host ones")
    # run 41's live steps priced by the shipped profile, as served: the steps taken while the host was fast
    replays = [r["replay"] for r in _json(f"{SAME_HOST}/run41_qwen_1gpu/pressure/fidelity.json").values()]
    fast = [rp["fast_host"]["all"]["sim_s"] / rp["fast_host"]["all"]["live_s"] - 1 for rp in replays]
    out["replay41_fast_above"] = f"{sum(e > 0 for e in fast)} of {len(fast)}"
    out["replay41_fast_mean"] = f"{100 * sum(fast) / len(fast):+.1f}%"
    out["replay41_all_mean"] = f"{100 * sum(rp['total_rel_err'] for rp in replays) / len(replays):+.1f}%"
    # runs 48-49 (the blind set): per shape and candidate, the span of the pairs' decode-step replay totals
    for run in ("run48", "run49"):
        d, subs = SAME_HOST_RUNS[run]
        for prof in ("shipped", "h200x4"):
            dec = [r["replay"]["by_kind"]["decode"] for r in _json(f"{SAME_HOST}/{d}/{subs[prof]}/fidelity.json").values()]
            errs = sorted(100 * (k["sim_s"] / k["live_s"] - 1) for k in dec)
            out[f"replay{run[3:]}_{prof}_decode_span"] = f"{errs[0]:+.0f}% to {errs[-1]:+.0f}%"
    # runs 51-52 (the Mooncake traces): per shape and policy, the span of the pairs' decode and host-time replay
    # totals as served
    for run in ("run51", "run52"):
        d, subs = SAME_HOST_RUNS[run]
        served = _json(f"{SAME_HOST}/{d}/{subs['selected']}/fidelity.json")
        for pol in ("vllm", "sjf_swap"):
            for kind in ("decode", "host"):
                totals = [r["replay"]["by_kind"][kind] for pair, r in served.items() if pair.endswith(f"/{pol}")]
                errs = [100 * (k["sim_s"] / k["live_s"] - 1) for k in totals]
                out[f"replay{run[3:]}_{pol}_{kind}_span"] = _span(errs, "+.0f") + "%"
    shipped48 = _json(f"{SAME_HOST}/{SAME_HOST_RUNS['run48'][0]}/shipped_pressure/fidelity.json")
    out["replay48_shipped_decode_short_chat"] = ", ".join(
        f"{pol} {100 * (k['sim_s'] / k['live_s'] - 1):+.0f}%" for pol in ("vllm", "sjf_swap")
        for k in (shipped48[f"blind_short_chat/{pol}"]["replay"]["by_kind"]["decode"],))
    # scripts/fidelity_small_decode.py: quiet decode steps of at most 4 sequences, per pair: live ms and priced error
    for run in SMALL_DECODE_RUNS:
        cells = [c for pols in _json(f"{SAME_HOST}/{SAME_HOST_RUNS[run][0]}/small_decode.json")["workloads"].values()
                 for c in pols.values() if c["steps"]]
        out[f"small_decode_{run}_live"] = _span([c["live_ms"] for c in cells], ".2f") + " ms"
        out[f"small_decode_{run}_err"] = _span([100 * c["priced_err"] for c in cells], "+.0f") + "%"
        out[f"small_decode_{run}_above"] = f"{sum(c['priced_err'] > 0 for c in cells)} of {len(cells)}"
    # run 50: the sampled small decode steps (<= 4 sequences) in the engine, re-executed back to back, and their twins
    for pol, path in TWINS50.items():
        twins = [t for t in _json(path)["twins"] if t["kind"] == "decode" and len(t["items"]) <= 4]
        out[f"twins50_{pol}_in_engine"] = f"{1e3 * statistics.fmean(t['in_engine_s'] for t in twins):.2f} ms"
        out[f"twins50_{pol}_in_vs_repeated"] = f"{statistics.median(t['in_engine_s'] / t['repeated_s'] for t in twins):.3f}"
        out[f"twins50_{pol}_repeated_vs_twin"] = f"{statistics.median(t['repeated_s'] / t['twin_s'] for t in twins):.3f}"
        out[f"twins50_{pol}_steps"] = str(len(twins))
    # scripts/fidelity_scale_rule.py: profile=select with and without a step scale calibrated on the first pair
    total = _jsonl(f"{SAME_HOST}/step_scale_rule.jsonl")[-1]["total"]
    for key in ("chosen_every", "chosen+scale_every", "shipped", "shipped+scale", "h200x4", "h200x4+scale"):
        out[f"scale_rule_{key.replace('+', '_').removesuffix('_every')}"] = f"{total[key]} of {total['pairs']}"
    out.update(_select_facts())
    out.update(_live_select_facts())
    return out


WAIT_TERM = f"{SAME_HOST}/wait_term_loo.jsonl"


@source("wait_term", "cheap", WAIT_TERM)
def wait_term() -> dict[str, str]:
    """scripts/fidelity_wait_term.py (docs/fidelity.md, "The queue's price"): per held-out run, the
    ``per_waiting`` fitted on the shape's other runs' live steps (``<run>_us``) and, for the shipped profile
    and its copy with that value, the pairs meeting every target, throughput within 3% and orders reversed
    (``<run>_<shipped|wait>_<fact>``); the shipped values (``shipped_us_<shape>``), the fitted range per shape
    (``fitted_us_<shape>``) and the totals (``total_*``)."""
    rows = _jsonl(WAIT_TERM)
    out = {}
    for r in rows[:-1]:
        out[f"{r['run']}_us"] = f"{r['per_waiting_us']:.2f}"
        for name in ("shipped", "wait"):
            for key, v in r[name].items():
                out[f"{r['run']}_{name}_{key}"] = v
        out[f"shipped_us_{r['shape']}"] = f"{r['shipped_per_waiting_us']:.2f}"
    for shape in {r["shape"] for r in rows[:-1]}:
        out[f"fitted_us_{shape}"] = _span([r["per_waiting_us"] for r in rows[:-1] if r["shape"] == shape], ".2f")
    total = rows[-1]["total"]
    for key in ("every_target", "throughput_within"):
        for name in ("shipped", "wait"):
            out[f"total_{name}_{key}"] = f"{total[f'{name}_{key}']} of {total['pairs']}"
    out["total_runs"] = str(len(rows) - 1)
    return out


def _live_select_facts() -> dict[str, str]:
    """The choices profile=select made live (:data:`LIVE_SELECT_RUNS`): per run, each call's chosen profile
    (``shipped`` or ``h200x4``) and every candidate's replay error on that call's first pair, as
    ``live_select_<run>`` (calls joined by ``; ``)."""
    out = {}
    for run, shares in LIVE_SELECT_RUNS.items():
        d = SAME_HOST_RUNS[run][0]
        calls = []
        for share in shares:
            sel = next(iter(_json(f"{SAME_HOST}/{d}/{share}/fidelity.json").values()))["profile_select"]
            name = {p: ("h200x4" if "/h200x4/" in p else "shipped") for p in sel["replay_errors"]}
            errs = ", ".join(f"{name[p]} {100 * e:+.1f}%" for p, e in sorted(sel["replay_errors"].items(),
                                                                              key=lambda kv: name[kv[0]] != "shipped"))
            calls.append(f"{name[sel['profile']] if sel['profile'] in name else sel['profile']} ({errs})")
        out[f"live_select_{run}"] = "; ".join(calls)
    return out


def _select_facts() -> dict[str, str]:
    """profile=select's rule applied offline to :data:`SELECT_RUNS`: on each call's first pair (the first of
    its merged fidelity.json), the candidate of :data:`SELECT_CANDIDATES` whose replay total is closest to
    the live time; then how many of the call's other pairs meet every target at once under each candidate
    and under the one chosen (``select_<run>_*``; pooled over every run: ``select_all_*``, and over each
    group of :data:`SELECT_GROUPS`: ``select_<group>_*``). Two more choices on the same pairs: ``cumulative``
    (before each pair, the candidate whose mean replay error over the pairs already served is closest to zero)
    and ``hindsight`` (the one closest on the pair's own replay: a bound on any choice between the candidates)."""
    from kvrl.fidelity.report import meets_every_target

    out = {}
    met_by_run: dict[str, dict[str, int]] = {}
    rest_by_run: dict[str, int] = {}
    for run, keys in SELECT_RUNS.items():
        d, subs = SAME_HOST_RUNS[run]
        res = {c: _json(f"{SAME_HOST}/{d}/{subs[keys[c]]}/fidelity.json") for c in SELECT_CANDIDATES}
        first = next(iter(res["shipped"]))
        err = {c: res[c][first]["replay"]["total_rel_err"] for c in SELECT_CANDIDATES}
        chosen = min(SELECT_CANDIDATES, key=lambda c: abs(err[c]))
        rest = [p for p in res["shipped"] if p != first]
        met = {c: sum(meets_every_target(res["shipped"][p], res[c][p]["sim"]) for p in rest) for c in SELECT_CANDIDATES}
        met["chosen"] = met[chosen]
        # two other rules on the same pairs: before each pair, the candidate whose mean replay error over the
        # pairs served so far is closest to zero (cumulative); the one closest on the pair's own replay
        # (hindsight: not a rule a sim can follow, the most any choice between the candidates could meet)
        closest = lambda seen: min(SELECT_CANDIDATES, key=lambda c: abs(
            sum(res[c][q]["replay"]["total_rel_err"] for q in seen) / len(seen)))
        pairs = list(res["shipped"])
        met["cumulative"] = sum(meets_every_target(res["shipped"][p], res[closest(pairs[:k])][p]["sim"])
                                for k, p in enumerate(pairs) if k)
        met["hindsight"] = sum(meets_every_target(res["shipped"][p], res[closest([p])][p]["sim"]) for p in rest)
        out[f"select_{run}_pair"] = first
        out[f"select_{run}_errors"] = " / ".join(f"{100 * err[c]:+.1f}%" for c in SELECT_CANDIDATES)
        out[f"select_{run}_chosen"] = chosen
        out.update({f"select_{run}_{c}": f"{m} of {len(rest)}" for c, m in met.items()})
        met_by_run[run], rest_by_run[run] = met, len(rest)
    for group, runs in {"all": tuple(SELECT_RUNS), **SELECT_GROUPS}.items():
        n = sum(rest_by_run[r] for r in runs)
        out.update({f"select_{group}_{c}": f"{sum(met_by_run[r][c] for r in runs)} of {n}"
                    for c in (*SELECT_CANDIDATES, "chosen", "cumulative", "hindsight")})
    return out


#: the step-graph profiles of the H200 shapes, default and four-GPU hosts' (kvrl/executors/profiles), as shipped in
#: session 27: the defaults the fit-11 ones, archived since session 39's re-profile
SCATTER_PROFILES = {f"{host} {shape}": f"kvrl/executors/profiles/{where}"
                    for shape in ("qwen3-0.6b", "llama-3-8b")
                    for host, where in (("default", f"archive/h200_{shape}_bfloat16_step_graphs_fit11.json"),
                                        ("h200x4", f"h200x4/h200_{shape}_bfloat16_step_graphs.json"))}


@source("profile_scatter", "cheap", *SCATTER_PROFILES.values())
def profile_scatter() -> dict[str, str]:
    """What scattering a decode batch's KV blocks over the pool costs, as each shipped H200 step-graph profile
    measured it (its ``fit.scatter`` points: batch, context, time scattered over time on consecutive blocks):
    per shape, the span of the ratios over both profiles (``<shape>_ratios``), and the ratio of 16 sequences
    of 1,024 tokens (``<shape>_16x1024``)."""
    out = {}
    for shape in ("qwen3-0.6b", "llama-3-8b"):
        points = [pt for name, path in SCATTER_PROFILES.items() if name.endswith(shape)
                  for pt in _json(path)["fit"]["scatter"]["points"]]
        out[f"{shape}_ratios"] = _span([100 * (r - 1) for _, _, r in points], "+.1f") + "%"
        out[f"{shape}_16x1024"] = _span([100 * (r - 1) for b, L, r in points if (b, L) == (16, 1024)], "+.1f") + "%"
    return out


RUN36 = "docs/results/fidelity_slo_shift_run36"
RUN36_SCALES = ("1.0", "0.98", "0.97", "0.95")


@source("run36", "cheap", f"{RUN36}/fidelity.json", *(f"{RUN36}/resim_scale_{s}.json" for s in RUN36_SCALES))
def run36() -> dict[str, str]:
    """Run 36 (env=slo_shift's traffic, one live run per policy): the sim's error per metric, as run and
    re-simulated with every step's compute scaled (``sim_step_scale``), per policy (slo_mix, fixed_0_2),
    and the replay's per-kind totals."""
    out = {}
    run = _json(f"{RUN36}/fidelity.json")
    for kind in ("decode", "mixed", "host"):
        errs = [r["replay"]["by_kind"][kind] for r in run.values()]
        out[f"replay_{kind}"] = " / ".join(f"{100 * (k['sim_s'] / k['live_s'] - 1):+.1f}%" for k in errs)
    for scale in RUN36_SCALES:
        res = _json(f"{RUN36}/resim_scale_{scale}.json")
        for metric, name in (("ttft_p50_s", "ttft"), ("goodput_tok_s", "goodput"), ("tpot_p50_s", "tpot"),
                             ("throughput_tok_s", "throughput")):
            out[f"{name}_{scale}"] = " / ".join(f"{100 * (r['sim'][metric] / r['live'][metric] - 1):+.1f}%"
                                               for r in res.values())
    return out


# --- docs/results.md: the session-4 leaderboards, re-run on the archived profile (committed) -----

SESSION4 = "docs/results/rl_session4"


def _delta(row: dict, ref: str, digits: int = 1) -> str:
    """``+39.8 ± 11.3 tok/s, +11%``: the paired goodput difference against ``ref``."""
    mean, ci = float(row[f"Δgoodput_tok_s {ref}_mean"]), float(row[f"Δgoodput_tok_s {ref}_ci95"])
    return f"{mean:+.{digits}f} ± {ci:.{digits}f} tok/s, {float(row[f'{ref}_pct_change']):+.0f}%".replace("-", "−")


@source("session4", "cheap", *(f"{SESSION4}/{n}_leaderboard.csv" for n in ("watermark", "watermark_hindsight",
                                                                            "preemption")),
        f"{SESSION4}/preemption_results.csv")
def session4() -> dict[str, str]:
    out = {}
    rows = {r["kind"]: r for r in _csv(f"{SESSION4}/watermark_leaderboard.csv")}
    ref = next(k[:-len("_pct_change")] for k in rows["agent"] if k.endswith("_pct_change") and "val-best" in k)
    out["wm_agent_vs_001"] = _delta(rows["agent"], ref)
    beaten = all(float(r[f"Δgoodput_tok_s {ref}_mean"]) < float(rows["agent"][f"Δgoodput_tok_s {ref}_mean"])
                 for kind, r in rows.items() if kind != "agent")
    out["wm_agent_beats_all"] = "and every heuristic" if beaten else "but not every heuristic"
    hind = {r["kind"]: r for r in _csv(f"{SESSION4}/watermark_hindsight_leaderboard.csv")}
    best = hind["val-best"]
    href = next(k[:-len("_pct_change")] for k in best if k.endswith("_pct_change") and "val-best" in k)
    out["wm_hindsight"] = (f"{best['policy'].split('=')[1].split(')')[0]}: {float(best['goodput_tok_s_mean']):.1f} ± "
                           f"{float(best['goodput_tok_s_ci95']):.1f}, paired {_delta(hind['agent'], href).split(' tok/s')[0]} tok/s")
    pre = {r["policy"]: r for r in _csv(f"{SESSION4}/preemption_leaderboard.csv")}
    agent = next(r for r in pre.values() if r["kind"] == "agent")
    pref = next(k[:-len("_pct_change")] for k in agent if k.endswith("_pct_change"))
    out["pre_agent_vs_lifo"] = _delta(agent, pref, 0).split(" tok/s")[0] + " tok/s"
    runs = _by_policy(f"{SESSION4}/preemption_results.csv", "goodput_tok_s")
    for name, key in (("cost_aware", "cost_aware"), ("lifo(mode=swap)", "lifo_swap")):
        out[f"pre_agent_vs_{key}"] = _paired(runs[agent["policy"]], runs[name])
    return out


def _paired(a: dict[int, float], b: dict[int, float], digits: int = 0) -> str:
    """``+212 ± 315``: mean per-seed difference a - b with its 95% t half-width (scipy), ``digits``
    decimals."""
    from scipy import stats

    diffs = [a[s] - b[s] for s in sorted(a) if s in b]
    mean = sum(diffs) / len(diffs)
    half = stats.t.ppf(0.975, len(diffs) - 1) * stats.sem(diffs)
    return f"{mean:+.{digits}f} ± {half:.{digits}f}".replace("-", "−")


# --- docs/results.md: the watermark agent live on an H200 beside the sim ---------------------------

LIVE = ("docs/results/rl_live_h200_results.csv", "docs/results/rl_live_h200_sim_results.csv")


@source("live_h200", "cheap", *LIVE)
def live_h200() -> dict[str, str]:
    out = {}
    mean = lambda values: sum(values) / len(values)          # noqa: E731
    live, sim = _by_policy(LIVE[0], "goodput_tok_s"), _by_policy(LIVE[1], "goodput_tok_s")
    agent = next(p for p in live if p.startswith("agent"))
    out["agent_live_vs_sim"] = f"{mean(list(live[agent].values())):.1f} live vs {mean(list(sim[agent].values())):.1f} sim"
    fixed = [p for p in live if p.startswith("fixed(fraction=0.01)")]
    both = [v for p in fixed for v in live[p].values()]
    out["fixed_runs_mean"] = f"{mean(both):.1f}"
    out["agent_above_fixed"] = f"{100 * (mean(list(live[agent].values())) / mean(both) - 1):.0f}%"
    plain, again = fixed
    gaps = [(abs(live[again][s] - live[plain][s]), min(live[again][s], live[plain][s])) for s in live[plain]]
    gap, low = max(gaps)
    out["same_policy_gap"] = f"{gap:.0f} tok/s ({100 * gap / low:.0f}%)"
    for name, path in zip(("live", "sim"), LIVE):
        thr = _by_policy(path, "throughput_tok_s")
        out[f"throughput_{name}"] = _span([mean(list(v.values())) for v in thr.values()], ".0f")
    return out


LIVE_CEILING = "docs/results/fidelity_same_host/live_ceiling_s36.json"
LIVE_CEILING_SIMS = ("docs/results/fidelity_same_host/ensemble_s35.jsonl",
                     "docs/results/fidelity_same_host/ensemble_live54_s35.jsonl",
                     "docs/results/fidelity_same_host/ensemble_live_s35.jsonl",
                     "docs/results/fidelity_same_host/ensemble_live_s36.jsonl")


@source("ceiling_s36", "cheap", LIVE_CEILING, *LIVE_CEILING_SIMS)
def ceiling_s36() -> dict[str, str]:
    """The live engine as its own sim across VMs (``scripts/fidelity_live_ceiling.py``), per shape
    (``<qwen|llama>_<group>_<every|throughput|reversed>``, ``"k of n (p%)"``; ``reversed`` ``"k of n"``), the groups:
    ``other`` (another VM's live mean), ``same`` (the same VM's), ``other_scored`` (another VM's, on the runs the sim
    scores) and ``priced``, ``cal``, ``own`` (the 16-run sim ensemble as priced, calibrated on earlier pairs and at
    each pair's own speed, from the ``--sims`` files); ``couple_<a>_<b>``: run ``a``'s live mean as the sim of run
    ``b``, every target."""
    ceiling = _sibling("fidelity_live_ceiling")
    rows = _json(LIVE_CEILING)["couples"]
    scored = {r["run"]: r for path in LIVE_CEILING_SIMS for r in _jsonl(path) if "run" in r}
    short = {"another VM's live mean": "other", "the same VM's live mean": "same",
             "another VM's live mean, on the runs the sim scores": "other_scored",
             **{f"the sim, {name}": sim for name, sim in CALIBRATED_SIMS.items()}}
    out = {}
    for shape, groups in ceiling.shape_totals(rows, scored).items():
        for label, t in groups.items():
            key = f"{'qwen' if shape.startswith('qwen') else 'llama'}_{short[label]}"
            out[f"{key}_every"] = ceiling.frac(t["every_target"], t["pairs"])
            out[f"{key}_throughput"] = ceiling.frac(t["throughput_within"], t["pairs"])
            out[f"{key}_reversed"] = f"{t['reversed']} of {t['resolved']}"
    for r in rows:
        out[f"couple_{r['a']}_{r['b']}"] = f"{r['every_target']} of {r['pairs']}"
    return out


# --- docs/rl.md, "The admission order: a lever the agents do not hold" (session 54) -------------------------------

SCHEDULER_ORDER = "docs/results/rl_scheduler"
SCHEDULER_RUNS = {"pressure": ("fcfs", "sjf", "sjf_oracle"), "tenants": ("fcfs", "sjf", "sjf_oracle", "lpm"),
                  "tenants_heldout": ("fcfs", "sjf", "sjf_oracle", "lpm")}
SCHEDULER_AGENTS = f"{SCHEDULER_ORDER}/tenants_lpm_agents_results.csv"
SCHEDULER_LIVE = {(sched, stage): f"docs/results/rl_live_h200/scheduler_s54/{sched}/tenants/{stage}/results.csv"
                  for sched in ("fcfs", "lpm") for stage in ("live", "sim")}


@source("scheduler_order", "cheap", SCHEDULER_AGENTS, *SCHEDULER_LIVE.values(),
        *(f"{SCHEDULER_ORDER}/{task}_{name}_results.csv" for task, names in SCHEDULER_RUNS.items() for name in names))
def scheduler_order() -> dict[str, str]:
    """Session 54's admission-order study (benchmarks/rl_scheduler_study.sh): per task and scheduler, its
    hindsight-best fixed watermark against fcfs's, paired per seed (``<task>_<scheduler>_vs_fcfs``); the best
    scheduler per seed (clairvoyant) against the scheduler of the highest mean (``<task>_clairvoyant_vs_strongest``); and
    the FCFS-trained ``tenants`` agents served under lpm: the span of their goodput differences to the strongest
    other policy there (``lpm_agents_vs_best``, naming it in ``lpm_best``); live on an H200
    (benchmarks/rl_scheduler_live.sh), fixed 0.01 under lpm against under fcfs, live and in the sim stage beside it
    (``<stage>_lpm_vs_fcfs``), and the sim's error on each scheduler's mean goodput (``sim_error_<scheduler>``)."""
    from kvrl.analysis.stats import paired_compare

    table = _sibling("rl_scheduler_table")
    out = {}
    for task, names in SCHEDULER_RUNS.items():
        by = {n: table.with_hindsight(table.by_policy(_csv(f"{SCHEDULER_ORDER}/{task}_{n}_results.csv"))) for n in names}
        best = {n: runs[table.HINDSIGHT] for n, runs in by.items()}
        for n in names[1:]:
            out[f"{task}_{n}_vs_fcfs"] = _compare_cell(paired_compare(best[n], best["fcfs"], "goodput_tok_s"))
        per_seed, strongest = table.clairvoyant(by)
        out[f"{task}_clairvoyant_vs_strongest"] = _compare_cell(paired_compare(per_seed, best[strongest], "goodput_tok_s"))
    runs = _by_policy(SCHEDULER_AGENTS, "goodput_tok_s", skip_kinds=("sweep",))
    others = {p: v for p, v in runs.items() if not p.startswith("agent") and "[oracle" not in p}
    best_label = max(others, key=lambda p: sum(others[p].values()) / len(others[p]))
    deltas = [paired_compare(v, others[best_label], "goodput_tok_s").pct_change
              for p, v in runs.items() if p.startswith("agent")]
    out["lpm_best"] = best_label
    out["lpm_agents_vs_best"] = _span(deltas, "+.1f") + "%"
    fixed = {key: _by_policy(path, "goodput_tok_s")["fixed(fraction=0.01)"] for key, path in SCHEDULER_LIVE.items()}
    for stage in ("live", "sim"):
        out[f"{stage}_lpm_vs_fcfs"] = _compare_cell(paired_compare(fixed["lpm", stage], fixed["fcfs", stage], "goodput_tok_s"))
    for sched in ("fcfs", "lpm"):
        live, sim = (sum(fixed[sched, st].values()) / len(fixed[sched, st]) for st in ("live", "sim"))
        out[f"sim_error_{sched}"] = f"{100 * (sim - live) / live:+.1f}%"
    return out


LPM_FIDELITY = "docs/results/fidelity_tenants"
LPM_FIDELITY_RUNS = ("run68", "run69")


@source("lpm_fidelity", "cheap", *(f"{LPM_FIDELITY}/{run}/{name}" for run in LPM_FIDELITY_RUNS
                                   for name in ("fidelity.csv", "residuals.csv")))
def lpm_fidelity() -> dict[str, str]:
    """Session 55's fidelity runs of the multi-tenant task's test jobs under fcfs (``vllm``) and lpm
    (benchmarks/fidelity_tenants.sh; run 68 before the kept prefix peeks, run 69 after): per run, lpm against
    fcfs paired over the workloads, live and in the sim (``<run>_<stage>_<metric>``, scripts/fidelity_policy_pairs.py),
    the sim's error on each policy's mean (``<run>_sim_error_<policy>_<metric>``), and the engine's time between
    steps, live against the profile's host terms, summed over each policy's pairs (``<run>_host_error_<policy>``;
    scripts/fidelity_residuals.py) and as a share of the live run's time (``<run>_host_share_<policy>``)."""
    from kvrl.analysis.stats import paired_compare

    pairs = _sibling("fidelity_policy_pairs")
    out = {}
    for run in LPM_FIDELITY_RUNS:
        values = pairs.read(_csv(f"{LPM_FIDELITY}/{run}/fidelity.csv"))
        for metric, short in (("goodput_tok_s", "goodput"), ("throughput_tok_s", "throughput")):
            for stage in ("live", "sim"):
                c = paired_compare(values[(metric, "lpm", stage)], values[(metric, "vllm", stage)], metric)
                out[f"{run}_{stage}_{short}"] = _compare_cell(c)
            for pol in ("vllm", "lpm"):
                live, sim = values[(metric, pol, "live")], values[(metric, pol, "sim")]
                out[f"{run}_sim_error_{pol}_{short}"] = _pct(100 * (sum(sim[w] for w in live) / sum(live.values()) - 1))
        rows = _csv(f"{LPM_FIDELITY}/{run}/residuals.csv")
        for pol in ("vllm", "lpm"):
            mine = [r for r in rows if r["pair"].endswith("/" + pol)]
            host = [r for r in mine if r["kind"] == "host"]
            live_host, sim_host = sum(_f(r, "live_s") for r in host), sum(_f(r, "sim_s_before") for r in host)
            out[f"{run}_host_error_{pol}"] = _pct(100 * (sim_host / live_host - 1))
            forward = sum(_f(r, "live_s") for r in mine if r["kind"] != "host")
            out[f"{run}_host_share_{pol}"] = f"{100 * live_host / (live_host + forward):.1f}%"
    return out


ORDER = "docs/results/rl_order"
ORDER_HEADROOM = ("headroom", "headroom_present", "headroom_present_blind4")


@source("order_choice", "cheap", *(f"{ORDER}/{p}{h}.jsonl" for p in ("", "heldout_") for h in ORDER_HEADROOM),
        f"{ORDER}/lpm_val_constants.jsonl", f"{ORDER}/bandit_val.jsonl",
        *(f"{ORDER}/{t}_merged_leaderboard.csv" for t in ("tenants", "tenants_heldout")))
def order_choice() -> dict[str, str]:
    """Session 55's adaptive admission order (benchmarks/rl_order_study.sh): the order planners against their
    base lpm, paired per test seed (``<task>_<planner>``: clairvoyant ``headroom``, ``headroom_present``,
    ``headroom_present_blind4``; task ``tenants`` or ``heldout``); the val split's lpm constants and order
    bandits (``val_lpm_<fraction>``, ``val_bandit_best`` naming the best setting, ``val_bandit_best_goodput``); and
    each merged leaderboard's rows against lpm (``<task>_<row>``: ``fcfs``, ``sjf``, ``bandit``, ``agents``: the
    agents' span)."""
    from kvrl.analysis.stats import paired_compare

    out = {}
    for prefix, task in (("", "tenants"), ("heldout_", "heldout")):
        for h in ORDER_HEADROOM:
            rows = _jsonl(f"{ORDER}/{prefix}{h}.jsonl")
            c = paired_compare({r["seed"]: r["planner_goodput"] for r in rows},
                               {r["seed"]: r["rule_goodput"] for r in rows}, "goodput_tok_s")
            out[f"{task}_{h}"] = _compare_cell(c)
    val = {}
    for r in _jsonl(f"{ORDER}/lpm_val_constants.jsonl") + _jsonl(f"{ORDER}/bandit_val.jsonl"):
        val.setdefault(r["name"], []).append(r["goodput"])
    means = {name: sum(g) / len(g) for name, g in val.items()}
    for name in ("f0", "f0.01", "f0.03", "f0.05"):
        out[f"val_lpm_{name[1:]}"] = f"{means[name]:,.0f}"
    bandits = {n: m for n, m in means.items() if n.startswith("b")}
    best = max(bandits, key=bandits.get)
    out["val_bandit_best"], out["val_bandit_best_goodput"] = best, f"{bandits[best]:,.0f}"
    out["val_bandit_span"] = f"{min(bandits.values()):,.0f}-{max(bandits.values()):,.0f}"
    ref = "fixed(fraction=0.01) [val-best, given] [lpm]"
    for task in ("tenants", "tenants_heldout"):
        rows = _csv(f"{ORDER}/{task}_merged_leaderboard.csv")
        by = {r["policy"]: r for r in rows}
        key = "tenants" if task == "tenants" else "heldout"
        for name, label in (("fcfs", "fixed(fraction=0.01) [val-best, given] [fcfs]"),
                            ("sjf", "fixed(fraction=0.01) [val-best, given] [sjf]"),
                            ("bandit", "fixed(fraction=0.01) [order_bandit]")):
            out[f"{key}_{name}"] = _paired_cell(by[label], ref)
        agents = [r for r in rows if r["policy"].startswith("agent")]
        out[f"{key}_agents"] = _pct_change_span(agents, ref)
    return out


SCORED = "docs/results/rl_scored"
SCORED_HEUR, SCORED_LPM = "fixed(fraction=0.01) [lpm_late_p1]", "fixed(fraction=0.01) [lpm]"


@source("scored_order", "cheap", f"{SCORED}/val_orders.jsonl", f"{SCORED}/live_s56/fidelity.csv",
        *(f"{SCORED}/{t}_merged_leaderboard.csv" for t in ("tenants", "tenants_heldout", "throttle", "pressure")),
        f"{SCORED}/throttle_planner_agents_lpm_late_p1_leaderboard.csv",
        *(f"docs/results/agents/tenants-{k}-seed{s}/search.json" for k, s in
          (("scored", 0), ("scored", 1), ("scored", 2), ("scoredinit", 10), ("scoredinit", 11), ("scoredinit", 12))))
def scored_order() -> dict[str, str]:
    """Session 56's learned admission order (benchmarks/order_study.sh, benchmarks/order_live.sh): the val split's
    hand-written orders (``val_<name>`` mean goodput; ``val_pick`` the best); per test family (``tenants`` or
    ``heldout``) the val-picked hand-written order and ``fcfs``/``sjf`` against lpm (``<key>_heur``, ``<key>_fcfs``,
    ``<key>_sjf``), each learned order against lpm and against the hand-written one (``<key>_<name>_vs_lpm``,
    ``<key>_<name>_vs_heur``; ``<key>_learned_vs_heur`` the span of the three searched from lpm, ``<key>_init_vs_heur`` of the three searched
    from the hand-written order); each search's
    generations and best val gain over lpm (``search_<name>``); the hand-written order under other tasks' policies
    (``throttle_heur_<policy>`` against token_ratio under fcfs; ``throttle_agents_under_heur`` the span of session
    44's throttle_planner agents under the order against token_ratio under it; ``pressure_heur_<fraction>`` against fixed 0.0 under
    fcfs); and the live run (``live_<a>_vs_<b>`` and
    ``sim_<a>_vs_<b>`` paired over the workloads; ``sim_error_<policy>`` on the policy's mean goodput)."""
    from kvrl.analysis.stats import paired_compare

    out = {}
    val: dict[str, list[float]] = {}
    for r in _jsonl(f"{SCORED}/val_orders.jsonl"):
        val.setdefault(r["name"], []).append(r["goodput"])
    means = {name: sum(g) / len(g) for name, g in val.items()}
    for name, m in means.items():
        out[f"val_{name}"] = f"{m:,.0f}"
    out["val_pick"] = max(means, key=means.get)
    for task, key in (("tenants", "tenants"), ("tenants_heldout", "heldout")):
        by = {r["policy"]: r for r in _csv(f"{SCORED}/{task}_merged_leaderboard.csv")}
        out[f"{key}_heur"] = _paired_cell(by[SCORED_HEUR], SCORED_LPM)
        for name in ("fcfs", "sjf"):
            out[f"{key}_{name}"] = _paired_cell(by[f"fixed(fraction=0.01) [{name}]"], SCORED_LPM)
        learned = {p.split()[1]: r for p, r in by.items() if p.startswith("agent ")}
        for name, r in learned.items():
            out[f"{key}_{name}_vs_lpm"] = _paired_cell(r, SCORED_LPM)
            out[f"{key}_{name}_vs_heur"] = _paired_cell(r, SCORED_HEUR)
        out[f"{key}_learned_vs_heur"] = _pct_change_span(
            [r for n, r in learned.items() if n.startswith("scored_")], SCORED_HEUR)
        out[f"{key}_init_vs_heur"] = _pct_change_span(
            [r for n, r in learned.items() if n.startswith("scoredinit_")], SCORED_HEUR)
        out[f"{key}_learned_vs_lpm"] = _pct_change_span(
            [r for n, r in learned.items() if n.startswith("scored_")], SCORED_LPM)
    for kind, seed in (("scored", 0), ("scored", 1), ("scored", 2), ("scoredinit", 10), ("scoredinit", 11), ("scoredinit", 12)):
        search = _json(f"docs/results/agents/tenants-{kind}-seed{seed}/search.json")
        out[f"search_{kind}_seed{seed}"] = (f"{len(search['history'])} generations, val {search['best']['val_gain_pct']:+.1f}% "
                                            f"over lpm (generation {search['best']['generation']})")
    tr = "token_ratio(clip_max_new_tokens=4096, min_ratio=0.05)"
    by = {r["policy"]: r for r in _csv(f"{SCORED}/throttle_merged_leaderboard.csv")}
    for name, label in (("token_ratio", tr), ("ttft_slack", "ttft_slack"), ("fixed", "fixed(fraction=0.01)")):
        out[f"throttle_heur_{name}"] = _paired_cell(by[f"{label} [lpm_late_p1]"], f"{tr} [fcfs]")
    rows = _csv(f"{SCORED}/throttle_planner_agents_lpm_late_p1_leaderboard.csv")
    out["throttle_agents_under_heur"] = _pct_change_span([r for r in rows if r["policy"].startswith("agent")], tr)
    by = {r["policy"]: r for r in _csv(f"{SCORED}/pressure_merged_leaderboard.csv")}
    for name, label in (("0", "fixed(fraction=0.0)"), ("001", "fixed(fraction=0.01)")):
        out[f"pressure_heur_{name}"] = _paired_cell(by[f"{label} [lpm_late_p1]"], "fixed(fraction=0.0) [fcfs]")
    values = _sibling("fidelity_policy_pairs").read(_csv(f"{SCORED}/live_s56/fidelity.csv"))
    metric = "goodput_tok_s"
    for a, b in (("lpm_late_p1", "lpm"), ("scored2", "lpm"), ("scored2", "lpm_late_p1")):
        for stage in ("live", "sim"):
            c = paired_compare(values[(metric, a, stage)], values[(metric, b, stage)], metric)
            out[f"{stage}_{a}_vs_{b}"] = _compare_cell(c)
    for pol in ("lpm", "lpm_late_p1", "scored2"):
        live, sim = values[(metric, pol, "live")], values[(metric, pol, "sim")]
        out[f"sim_error_{pol}"] = _pct(100 * (sum(sim[w] for w in live) / sum(live.values()) - 1))
    return out


DEVIATION = ("docs/results/rl_slots/round4_deviation_val_seeds0-4.jsonl",
             "docs/results/rl_slots/round4_deviation_val_seeds5-9.jsonl")


@source("rl", "cheap", *DEVIATION)
def rl() -> dict[str, str]:
    """Session 9's one-step deviations from slo_slack (scripts/rl_victim_deviation.py --fit)."""
    deviation = _sibling("rl_victim_deviation")
    s = deviation.summarise([json.loads(line) for path in DEVIATION for line in _text(path).splitlines()])
    fitted = [m for m, _, _ in s["fitted"].values()]
    return {"deviation_best": f"{s['best'][0]:+.2f} ± {s['best'][1]:.2f}%",
            "deviation_fitted": f"{min(fitted):+.2f} to {max(fitted):+.2f}%".replace("-", "−")}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("source", help="a source name, or 'list'")
    args = parser.parse_args(argv)
    if args.source == "list":
        for name, src in SOURCES.items():
            print(f"{name}  [{src.kind}]  {command(name)}  reads {', '.join(src.inputs)}")
        return 0
    if args.source not in SOURCES:
        parser.error(f"unknown source {args.source!r} (known: {', '.join(SOURCES)})")
    json.dump(SOURCES[args.source].facts(), sys.stdout, indent=1, ensure_ascii=False, sort_keys=True)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
