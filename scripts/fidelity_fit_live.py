"""Fit a profile's pressure terms (host model, ``mixed_dec``) from the recorded live steps of some
workloads of a ``kvrl-fidelity`` run, leaving the others held out (kvrl/fidelity/live_fit.py).

    python scripts/fidelity_fit_live.py --run <fidelity run dir> --profile <profile.json> \\
        --fit-workloads poisson,preempt_heavy --out <new profile.json>

Then evaluate on the held-out workloads offline:
``kvrl-fidelity resim=<run dir> profile=<new profile.json> only_workloads=[...]``.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", required=True, type=Path, help="kvrl-fidelity output directory (runs/*/*/replay.csv)")
    ap.add_argument("--profile", required=True, help="the profile whose terms are refitted (not changed)")
    ap.add_argument("--fit-workloads", required=True, help="comma-separated workloads whose live steps fit the terms")
    ap.add_argument("--policies", default=None, help="comma-separated policies (default: every recorded one)")
    ap.add_argument("--out", required=True, type=Path, help="where to write the refitted profile")
    args = ap.parse_args(argv)

    from kvrl.executors.profile import StepProfile
    from kvrl.fidelity.live_fit import fit_live_terms

    workloads = [w for w in args.fit_workloads.split(",") if w]
    policies = [p for p in args.policies.split(",") if p] if args.policies else None
    prof = fit_live_terms(StepProfile.load(args.profile), args.run, workloads, policies)
    prof.save(args.out)
    json.dump(prof.meta["live_fit"], sys.stdout, indent=1)
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
