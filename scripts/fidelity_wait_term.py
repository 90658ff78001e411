"""The engine's host time per queued request: the shipped profiles' ``per_waiting`` against one fitted on
other runs' live steps, each run held out in turn, offline.

    python scripts/fidelity_wait_term.py [--work DIR] [--out FILE]
    python scripts/fidelity_wait_term.py --step-term [--work DIR]

The host model prices the engine's own time between two steps; ``per_waiting`` is its cost per request
still queued (kvrl.executors.profile.features.HOST_WORK ``n_wait``), fitted from the profile's short engine
runs. Per shape, for each run of :data:`RUNS` held out in turn: every host term is fitted
(kvrl.executors.profile.fit_host) on the live gaps between steps (``elapsed_s`` minus ``execute``) of the
shape's *other* runs, only ``per_waiting`` is taken into a copy of the shipped profile, and every share of
the held-out run is re-simulated with the shipped profile and with the copy (``kvrl-fidelity resim=``, this
tree's code for both; live step traces from the run's ``replay.tar.xz``, as scripts/fidelity_scale_rule.py
unpacks them). One JSON line per run: the fitted value, and per profile the pairs that meet every target of
issue 16 at once, those whose throughput is within 3%, and the resolved live orders its sim reverses; a last
line with the totals. The Mooncake runs (51-52) need the traces at ``.dev/traces/`` (docs/fidelity.md
"Runs 51-52"). CPU, about four minutes.

``--step-term`` (session 31, fit version 11) instead fits the host model on each run's own live gaps twice,
without and with the per-step queue term (``per_wait_step``: a constant for every step with a request
waiting), and prints one Markdown row per run: ``per_waiting`` alone, then ``per_waiting`` and
``per_wait_step`` together, and the mean absolute error of each fit over the steps it keeps. About a minute.
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import docs_facts as F  # noqa: E402  (the run registry and the target counts)
from fidelity_scale_rule import profile_path, resim, unpack  # noqa: E402

import numpy as np  # noqa: E402

from kvrl.executors.profile import HOST_TERMS, HOST_WORK, QUEUE_STEP_TERM, StepModel, StepProfile, fit_host  # noqa: E402
from kvrl.executors.profile.fit import gap_inliers, host_design  # noqa: E402
from kvrl.fidelity.live_fit import host_rows  # noqa: E402
from kvrl.fidelity.replay import read_replay_csv  # noqa: E402
from kvrl.fidelity.report import resolved_rankings  # noqa: E402

#: per shape, the runs that kept their live step traces on a single-H200 VM (runs 46-52; run 42 too for
#: Qwen3-0.6B: its config is composed and checked by ``unpack``)
RUNS = {"qwen3-0.6b": ("run42", "run46", "run48", "run51"), "llama-3-8b": ("run47", "run49", "run52")}


def live_steps(run_dir: Path) -> list:
    """Every live step of a run's unpacked shares (``pressure_*/runs/*/*/replay.csv``)."""
    return [s for f in sorted(run_dir.glob("pressure_*/runs/*/*/replay.csv")) for s in read_replay_csv(f)]


def with_waiting(shipped: StepProfile, per_waiting: float, out: Path) -> Path:
    """A copy of ``shipped`` whose host model's ``per_waiting`` is ``per_waiting`` (s), saved to ``out``."""
    prof = copy.deepcopy(shipped)
    d = copy.deepcopy(prof.model.to_dict())
    d["host"]["per_waiting"] = per_waiting
    prof.model = StepModel.from_dict(d)
    prof.save(out)
    return out


def scores(live: dict, sims: dict[str, dict]) -> dict[str, dict]:
    """Per sim: pairs meeting every target, throughput within 3%, resolved orders reversed."""
    rows = [r for r in resolved_rankings(live, sims) if r["resolved"]]
    out = {}
    for name, sim in sims.items():
        facts = F._target_facts({p: {**live[p], "sim": sim[p]["sim"]} for p in live})
        out[name] = {"every_target": facts["every_target"], "throughput_within": facts["throughput_within"],
                     "reversed": f"{sum(not r['same'][name] for r in rows)} of {len(rows)}"}
    return out


def fit_mae(rows: list, host: dict) -> float:
    """Mean absolute error (s) of ``host`` over ``rows``' gaps, without those :func:`fit_host` leaves
    out of its refit (:func:`~kvrl.executors.profile.fit.gap_inliers`)."""
    A, y = host_design(rows)
    r = y - A @ np.array([host.get(k, 0.0) for k in HOST_TERMS])
    return float(np.mean(np.abs(r[gap_inliers(r)])))


def step_term_table(work: Path) -> str:
    """``--step-term``: see the module doc."""
    lines = ["| run | shape | live steps | most waiting | fit 10 terms: per_waiting, us | mean abs error, us | "
             "fit 11 terms: per_waiting, us | per_wait_step, us | mean abs error, us |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for shape, runs in RUNS.items():
        for run in runs:
            rows = host_rows(live_steps(unpack(run, work)[0]))
            with_step = fit_host(rows)
            old = fit_host(rows, exclude=(QUEUE_STEP_TERM,))
            most = int(max(r[3 + HOST_WORK.index("n_wait")] for r in rows))
            lines.append(f"| {run} | {shape} | {len(rows)} | {most} | {old['per_waiting'] * 1e6:.2f} | "
                         f"{fit_mae(rows, old) * 1e6:.1f} | {with_step['per_waiting'] * 1e6:.2f} | "
                         f"{with_step['per_wait_step'] * 1e6:.1f} | {fit_mae(rows, with_step) * 1e6:.1f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/kvrl-wait-term"))
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--step-term", action="store_true", help="the per-run fits with and without per_wait_step")
    args = ap.parse_args()
    if args.step_term:
        print(step_term_table(args.work))
        return
    lines = []
    for shape, runs in RUNS.items():
        shipped = StepProfile.load(profile_path(shape, "shipped"))
        unpacked = {run: unpack(run, args.work) for run in runs}
        steps = {run: live_steps(unpacked[run][0]) for run in runs}
        for run in runs:
            dst, shares, _ = unpacked[run]
            pool = [s for other in runs if other != run for s in steps[other]]
            per_waiting = fit_host(host_rows(pool))["per_waiting"]
            variant = with_waiting(shipped, per_waiting, args.work / f"{run}_wait_profile.json")
            sims = {"shipped": {}, "wait": {}}
            for share in shares:
                sims["shipped"].update(resim(dst / share, profile_path(shape, "shipped"), 1.0, dst / f"shipped_{share}"))
                sims["wait"].update(resim(dst / share, str(variant), 1.0, dst / f"wait_{share}"))
            live = sims["shipped"]
            row = {"run": run, "shape": shape, "pairs": len(live), "fitted_on": [r for r in runs if r != run],
                   "per_waiting_us": round(per_waiting * 1e6, 3),
                   "shipped_per_waiting_us": round(shipped.model.host["per_waiting"] * 1e6, 3),
                   **scores(live, sims)}
            print(json.dumps(row), flush=True)
            lines.append(row)
    count = lambda name, key: sum(int(r[name][key].split(" of ")[0]) for r in lines)
    total = {"pairs": sum(r["pairs"] for r in lines),
             **{f"{name}_{key}": count(name, key) for name in ("shipped", "wait")
                for key in ("every_target", "throughput_within")}}
    print(json.dumps({"total": total}))
    if args.out:
        args.out.write_text("".join(json.dumps(r) + "\n" for r in [*lines, {"total": total}]))


if __name__ == "__main__":
    main()
