"""The sim calibrated on earlier pairs, offline, on every committed single-H200 fidelity run that kept its
live steps: does the host speed measured before a pair predict that pair's live run?

    python scripts/fidelity_calibrated.py [--work DIR] [--out FILE] [run ...]
    python scripts/fidelity_calibrated.py --table FILE    # an --out file as a Markdown table

The runs of ``fidelity_candidate.RUNS`` (the pressure set, the blind set and the Mooncake workloads; the
Mooncake runs 51-52 need the traces at ``.dev/traces/``) are re-simulated share by share with the shipped
profile of their shape (``kvrl-fidelity resim=``, this tree's code). Each share is one kvrl-fidelity process,
and resim serves every pair after a share's first also at the host speed that the re-priced replays of the
pairs before it measured (``sim_cal``; kvrl-fidelity does the same live since session 34). Scored on those
pairs, against the mean of each pair's live runs: the sim as priced and calibrated, per target metric, every
target at once, and the resolved live orders each reverses (``fidelity_candidate.scores``); beside them the
sim at each pair's own replay's host speed (``sim_host``), a calibration after the fact that bounds what any
host-speed calibration could do. One JSON line per
run to ``--out``, then one per shape with the totals. CPU, about a minute per run.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fidelity_candidate import RUNS, count, scores, table  # noqa: E402
from fidelity_scale_rule import profile_path, resim, unpack  # noqa: E402

#: the sims scored (keys of each JSON line) and the keys of resim's results they come from
SIMS = {"as priced": "sim", "calibrated": "sim_cal", "own speed": "sim_host"}
NAMES = tuple(SIMS)


def score_run(run: str, shape: str, work: Path) -> dict:
    """One run's JSON line: its pairs after each share's first, scored as priced and calibrated."""
    dst, shares, _ = unpack(run, work)
    live, sims = {}, {name: {} for name in NAMES}
    scales = []
    for share in shares:
        for pair, res in resim(dst / share, profile_path(shape, "shipped"), 1.0, dst / f"cal_{share}").items():
            if "sim_cal" in res:
                live[pair] = res
                for name, key in SIMS.items():
                    sims[name][pair] = {"sim": res[key]}
                scales.append(res["calibration_scale"])
    return {"run": run, "shape": shape, "pairs": len(live), "shares": len(shares),
            "scales": [min(scales), max(scales)], **scores(live, sims)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="*", help="runs of fidelity_candidate.RUNS (default: all)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/kvrl-calibrated"))
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--table", type=Path, default=None, help="print this --out file as a Markdown table and stop")
    args = ap.parse_args()
    if args.table:
        print(table(args.table, NAMES))
        return
    lines = []
    for shape, runs in RUNS.items():
        rows = []
        for run in runs:
            if args.runs and run not in args.runs:
                continue
            rows.append(score_run(run, shape, args.work))
            print(json.dumps(rows[-1]), flush=True)
        if not rows:
            continue
        keys = [k for k in rows[0][NAMES[0]] if k.endswith("_within") or k in ("every_target", "reversed")]
        total = {"total": shape, **{name: {k: count(rows, name, k) for k in keys} for name in NAMES}}
        print(json.dumps(total), flush=True)
        lines += [*rows, total]
    if args.out:
        args.out.write_text("".join(json.dumps(r) + "\n" for r in lines))


if __name__ == "__main__":
    main()
