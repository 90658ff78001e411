"""A profile refitted from its own stored samples without the path term (fit version 13's ``step_rule``), for the
ablation of docs/fidelity.md, "Split graphs where they pay": every step priced as if none ran on a split
whole-step graph. A profile file keeps a subsample of its engine run's steps, so a refit is not the shipped fit:
``--with-path-term`` writes the control, the same refit with the term. CPU, seconds.

    python scripts/profile_without_path_term.py PROFILE.json OUT.json [--with-path-term]
"""
from __future__ import annotations

import argparse
import dataclasses


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("profile")
    ap.add_argument("out")
    ap.add_argument("--with-path-term", action="store_true", help="the control: the same refit, the term kept")
    args = ap.parse_args()
    from kvrl.executors.profile import StepProfile, fit_model

    prof = StepProfile.load(args.profile)
    meta = ({**prof.meta, "derived": f"{args.profile} refitted from its stored samples"} if args.with_path_term else
            {**prof.meta, "step_rule": None, "derived": f"{args.profile} refitted without its path term"})
    model = fit_model(prof.samples, prof.engine_samples, prof.host_samples, meta)
    model.host = prof.model.host          # the host terms as fitted with the profile (from its engine runs)
    model.rebuild()
    dataclasses.replace(prof, model=model, meta=meta).save(args.out)
    print(f"{args.out}: eager terms {sorted(model.eager['coef'])}")


if __name__ == "__main__":
    main()
