"""The trials of an Optuna study (a ``hydra/sweeper=tune_*`` sweep's storage) as a CSV, best first.

    python scripts/optuna_trials.py sqlite:///runs/optuna.db kvrl-dqn --out trials.csv

Columns: ``number``, ``value`` (the app's return value: kvrl-train's best mean return on split=val,
kvrl-run's goodput), ``state``, then one column per parameter (its Hydra override key). Complete
trials first, by value (highest first); then the others by number.
"""
from __future__ import annotations

import argparse
import csv
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("storage", help="the study's storage URL (sqlite:///<path>, or $KVRL_OPTUNA_STORAGE)")
    ap.add_argument("study", help="the study name (hydra.sweeper.study_name)")
    ap.add_argument("--out", help="CSV path (default: stdout)")
    args = ap.parse_args(argv)

    import optuna

    trials = optuna.load_study(study_name=args.study, storage=args.storage).trials
    done = sorted((t for t in trials if t.state == optuna.trial.TrialState.COMPLETE), key=lambda t: -t.value)
    rest = [t for t in trials if t.state != optuna.trial.TrialState.COMPLETE]
    params = sorted({k for t in trials for k in t.params})
    out = open(args.out, "w", newline="") if args.out else sys.stdout
    writer = csv.writer(out)
    writer.writerow(["number", "value", "state", *params])
    for t in done + rest:
        writer.writerow([t.number, "" if t.value is None else f"{t.value:.6g}", t.state.name,
                         *(t.params.get(k, "") for k in params)])
    if args.out:
        out.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
