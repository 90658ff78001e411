"""A profile refitted from its own samples without the path term (fit version 13's ``step_rule``), for the
ablation of docs/fidelity.md, "Session 39": the same samples, engine runs and host model, every step priced
as if no step ran on a split whole-step graph. CPU, seconds.

    python scripts/profile_without_path_term.py PROFILE.json OUT.json
"""
from __future__ import annotations

import argparse
import dataclasses


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("profile")
    ap.add_argument("out")
    args = ap.parse_args()
    from kvrl.executors.profile import StepProfile, fit_model

    prof = StepProfile.load(args.profile)
    meta = {**prof.meta, "step_rule": None, "derived": f"{args.profile} refitted without its path term"}
    model = fit_model(prof.samples, prof.engine_samples, prof.host_samples, meta)
    model.host = prof.model.host          # the host terms as fitted with the profile (from its engine runs)
    model._build()
    dataclasses.replace(prof, model=model, meta=meta).save(args.out)
    print(f"{args.out}: eager terms {sorted(model.eager['coef'])}")


if __name__ == "__main__":
    main()
