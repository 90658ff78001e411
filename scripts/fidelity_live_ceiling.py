"""How closely the live engine reproduces itself on another VM: one committed fidelity run's live means taken as a
perfect sim of another run's, scored with issue 16's targets. No sim can be expected to beat the live engine
itself at predicting a live run on a VM it has not seen, so this is the ceiling the sim's counts are read against.

    python scripts/fidelity_live_ceiling.py --out docs/results/fidelity_same_host/live_ceiling_s36.json
    python scripts/fidelity_live_ceiling.py --table FILE [--sims JSONL ...]   # an --out file as a Markdown table
    python scripts/fidelity_live_ceiling.py --order RUN_DIR RUN_DIR   # two processes' replay errors by position

Every run directory under ``docs/results/fidelity_same_host/`` with live runs is read: its merged
``pressure/fidelity.json`` where it has one, else every ``pressure_<i>/fidelity.json`` share. For each ordered
couple of runs of one shape (``A`` predicts ``B``), on the pairs both served with the same requests (equal request
count and output tokens): how many pairs ``A``'s live mean puts within every target of ``B``'s live mean
(:func:`kvrl.fidelity.report.meets_every_target`), within 3% on throughput, and how many of ``B``'s resolved policy
orders it reverses (:func:`kvrl.fidelity.report.resolved_rankings`). Couples with fewer than
:data:`MIN_PAIRS` shared pairs are left out. The live mean of ``A`` carries ``A``'s own run-to-run noise, which a
deterministic sim does not, so the ceiling is a little pessimistic. CPU, a few seconds. ``--sims`` puts beside
each run the sim's own every-target counts from ``scripts/fidelity_calibrated.py`` ``--out`` files (as priced,
calibrated on earlier pairs, at the pair's own speed; those leave out each process's first pair). ``--order`` lays
two single-process runs of the same workloads served in different orders side by side: each pair's position in its
process and the total replay error of its first live run (``sum(sim) / sum(live) - 1`` over its steps), to tell a
misprice that follows the workload from one that grows with the process's age.
"""
from __future__ import annotations

import argparse
import itertools
import json
import statistics
from pathlib import Path
from typing import Optional

from kvrl.fidelity.compare import TARGETS, rel_err
from kvrl.fidelity.report import live_mean_and_spread, meets_every_target, resolved_rankings

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs/results/fidelity_same_host"
#: runs served on one VM (or one host's GPUs) share a label, from the sections of docs/fidelity.md that ran them:
#: runs 37-40 on one four-H200 host (session 22), 44-45, 46-47, 48-49, 51-52, 54-57, 58-60 and 61-62 each on one VM;
#: 41, 42 and 43 each on their own single-H200 VM (session 23)
VMS = {"run37": "s22", "run38": "s22", "run39": "s22", "run40": "s22", "run41": "s23a", "run42": "s23b",
       "run43": "s23c", "run44": "s24", "run45": "s24", "run46": "s25", "run47": "s25", "run48": "s26",
       "run49": "s26", "run51": "s29", "run52": "s29", "run54": "s34", "run55": "s34", "run56": "s34",
       "run57": "s34", "run58": "s35", "run59": "s35", "run60": "s35", "run61": "s36", "run62": "s36"}
MIN_PAIRS = 4


def load_run(path: Path) -> dict[str, dict]:
    """The pairs of one run directory that finished live with at least two live runs (``workload/policy`` -> result)."""
    merged = path / "pressure" / "fidelity.json"
    files = [merged] if merged.exists() else sorted(path.glob("pressure_*/fidelity.json"))
    pairs = {}
    for f in files:
        for pair, res in json.loads(f.read_text()).items():
            if res.get("live") and res.get("live_repeats") and "error" not in res:
                pairs[pair] = res
    return pairs


def load_runs(results: Path = RESULTS) -> dict[str, tuple[str, dict[str, dict]]]:
    """``run<N>`` -> (shape, its pairs) for every run directory of :data:`VMS` under ``results``."""
    runs = {}
    for path in sorted(results.glob("run*")):
        name = path.name.split("_")[0]
        if name in VMS:
            pairs = load_run(path)
            if pairs:
                runs[name] = ("qwen3-0.6b" if "qwen" in path.name else "llama-3-8b", pairs)
    return runs


def same_requests(a: dict, b: dict) -> bool:
    return (a["live"]["requests"], a["live"]["output_tokens"]) == (b["live"]["requests"], b["live"]["output_tokens"])


def live_mean(res: dict) -> dict:
    """A pair's live means of the target and ranked metrics, as a sim's metrics dict."""
    keys = set(TARGETS) | {"goodput_tok_s", "tpot_mean_s"}
    return {k: live_mean_and_spread(res, k)[0] for k in keys}


def predict(a: dict[str, dict], b: dict[str, dict]) -> dict:
    """``a``'s live means as the sim of ``b``'s pairs (those served with the same requests): counts."""
    shared = [p for p in b if p in a and same_requests(a[p], b[p])]
    sims = {p: live_mean(a[p]) for p in shared}
    every = sum(meets_every_target(b[p], sims[p]) for p in shared)
    thr = sum(abs(rel_err(live_mean_and_spread(b[p], "throughput_tok_s")[0], sims[p]["throughput_tok_s"])) < 0.03
              for p in shared)
    rows = [r for r in resolved_rankings({p: b[p] for p in shared}, {"a": {p: {"sim": sims[p]} for p in shared}})
            if r["resolved"]]
    return {"pairs": len(shared), "every_target": every, "throughput_within": thr,
            "reversed": sum(not r["same"]["a"] for r in rows), "resolved": len(rows)}


def couples(runs: dict) -> list[dict]:
    """Every ordered couple of runs of one shape with at least :data:`MIN_PAIRS` shared pairs."""
    out = []
    for a, b in itertools.permutations(sorted(runs, key=lambda r: int(r[3:])), 2):
        (shape_a, pairs_a), (shape_b, pairs_b) = runs[a], runs[b]
        if shape_a == shape_b:
            counts = predict(pairs_a, pairs_b)
            if counts["pairs"] >= MIN_PAIRS:
                out.append({"a": a, "b": b, "shape": shape_a, "same_vm": VMS[a] == VMS[b], **counts})
    return out


def totals(rows: list[dict]) -> dict:
    """Summed counts and the median every-target fraction over ``rows``."""
    every, pairs = sum(r["every_target"] for r in rows), sum(r["pairs"] for r in rows)
    return {"couples": len(rows), "pairs": pairs, "every_target": every,
            "throughput_within": sum(r["throughput_within"] for r in rows),
            "reversed": sum(r["reversed"] for r in rows), "resolved": sum(r["resolved"] for r in rows),
            "median_every": statistics.median(r["every_target"] / r["pairs"] for r in rows) if rows else float("nan")}


#: the sims of a ``scripts/fidelity_calibrated.py`` ``--out`` line, in the table's order
SIMS = ("as priced", "calibrated", "own speed")


def sim_scores(paths: list[Path]) -> dict[str, dict]:
    """``run<N>`` -> its line in the ``scripts/fidelity_calibrated.py`` ``--out`` files ``paths`` (the last file that
    has the run wins)."""
    out = {}
    for path in paths:
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if "run" in row:
                out[row["run"]] = row
    return out


def shape_totals(rows: list[dict], scored: dict[str, dict]) -> dict[str, dict[str, dict]]:
    """Per shape, pooled counts (:func:`totals`) of the couples ``rows`` predicted by another VM's live mean, by the
    same VM's, and by another VM's on the runs ``scored`` has (:func:`sim_scores`); then, over those runs, each sim's
    summed counts (``pairs``, ``every_target``, ``throughput_within``, ``reversed``, ``resolved``)."""
    out: dict[str, dict[str, dict]] = {}
    for shape in ("qwen3-0.6b", "llama-3-8b"):
        mine = [r for r in rows if r["shape"] == shape]
        groups = {"another VM's live mean": [r for r in mine if not r["same_vm"]],
                  "the same VM's live mean": [r for r in mine if r["same_vm"]],
                  "another VM's live mean, on the runs the sim scores":
                      [r for r in mine if not r["same_vm"] and r["b"] in scored]}
        out[shape] = {label: totals(group) for label, group in groups.items() if group}
        runs = [scored[b] for b in sorted({r["b"] for r in mine} & set(scored))]
        for name in SIMS if runs else ():
            split = lambda key: [tuple(int(x) for x in row[name][key].split(" of ")) for row in runs]
            every, thr, rev = split("every_target"), split("throughput_within"), split("reversed")
            out[shape][f"the sim, {name}"] = {
                "pairs": sum(n for _, n in every), "every_target": sum(k for k, _ in every),
                "throughput_within": sum(k for k, _ in thr), "reversed": sum(k for k, _ in rev),
                "resolved": sum(n for _, n in rev)}
    return out


def frac(k: int, n: int) -> str:
    """``"k of n (p%)"``; ``-`` for no pairs."""
    return f"{k} of {n} ({k / n:.0%})" if n else "-"


def table(path: Path, sims: list[Path] = ()) -> str:
    """An ``--out`` file as Markdown: per predicted run, the other runs' live means as its sim, on another VM and on
    the same VM, and the sim's every-target counts from ``sims`` where they score that run; then per shape the
    totals."""
    rows = json.loads(path.read_text())["couples"]
    scored = sim_scores(list(sims))
    lines = ["| run predicted | shape | runs on other VMs | pairs each | every target, median (range) | "
             "throughput within 3%, median | resolved orders reversed | runs on the same VM: every target | "
             "the sim, every target: " + " / ".join(SIMS) + " |",
             "|---|---|---:|---|---|---|---:|---|---|"]
    for b in sorted({r["b"] for r in rows}, key=lambda r: int(r[3:])):
        other = [r for r in rows if r["b"] == b and not r["same_vm"]]
        same = [r for r in rows if r["b"] == b and r["same_vm"]]
        if not other:
            continue
        fr = sorted(r["every_target"] / r["pairs"] for r in other)
        thr = statistics.median(r["throughput_within"] / r["pairs"] for r in other)
        t = totals(other)
        lo, hi = min(r["pairs"] for r in other), max(r["pairs"] for r in other)
        lines.append(f"| {b} | {other[0]['shape']} | {len(other)} | {lo if lo == hi else f'{lo}-{hi}'} | "
                     f"{statistics.median(fr):.0%} ({fr[0]:.0%}-{fr[-1]:.0%}) | {thr:.0%} | "
                     f"{t['reversed']} of {t['resolved']} | "
                     + (", ".join(f"{r['a']}: {r['every_target']} of {r['pairs']}" for r in same) or "-") + " | "
                     + (" / ".join(scored[b][name]["every_target"] for name in SIMS) if b in scored else "-") + " |")
    lines += ["", "| shape: predicted by | couples | every target (pooled) | median couple | throughput within 3% | "
                  "resolved orders reversed |", "|---|---:|---|---:|---|---|"]
    for shape, groups in shape_totals(rows, scored).items():
        for label, t in groups.items():
            couples_, median = (t["couples"], f"{t['median_every']:.0%}") if "couples" in t else ("-", "-")
            lines.append(f"| {shape}: {label} | {couples_} | {frac(t['every_target'], t['pairs'])} | {median} | "
                         f"{frac(t['throughput_within'], t['pairs'])} | {t['reversed']} of {t['resolved']} |")
    return "\n".join(lines)


def order_table(runs: list[Path]) -> str:
    """Per pair served by every run of ``runs`` (directories with one ``pressure_0`` process each): its position in
    each process (1-based) and its total replay error there, then each run's errors of the pairs the others lack."""
    served = [load_run(run) for run in runs]
    positions = [{pair: i for i, pair in enumerate(results, 1)} for results in served]
    common = [p for p in served[0] if all(p in results for results in served[1:])]
    head = " | ".join(f"{run.name}: position, replay error" for run in runs)
    lines = [f"| pair | {head} |", "|---|" + "---:|" * len(runs)]
    for pair in dict.fromkeys([*common, *(p for results in served for p in results)]):
        cells = [f"{pos[pair]}, {results[pair]['replay']['total_rel_err']:+.1%}" if pair in results else "-"
                 for pos, results in zip(positions, served)]
        lines.append(f"| {pair} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def emit(data: dict, out: Optional[Path]) -> None:
    """``data`` as indented JSON into the file ``out``, or to stdout when it is None."""
    text = json.dumps(data, indent=1) + "\n"
    if out:
        out.write_text(text)
    else:
        print(text, end="")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="write the couples' counts here (JSON)")
    ap.add_argument("--table", type=Path, default=None, help="print this --out file as a Markdown table and stop")
    ap.add_argument("--sims", type=Path, nargs="*", default=[],
                    help="scripts/fidelity_calibrated.py --out files: the sim's counts beside each run")
    ap.add_argument("--order", type=Path, nargs="+", default=None, help="run directories: the replay error by position")
    args = ap.parse_args()
    if args.order:
        print(order_table(args.order))
        return
    if args.table:
        print(table(args.table, args.sims))
        return
    emit({"min_pairs": MIN_PAIRS, "targets": TARGETS, "couples": couples(load_runs())}, args.out)


if __name__ == "__main__":
    main()
