"""Fit one step-time profile from several re-profiles of the same code (or refit one profile) with
this kvrl's fitting code, offline.

    python scripts/fidelity_pool_profiles.py --out pooled.json a.json b.json [c.json ...]
    python scripts/fidelity_pool_profiles.py --out refit.json a.json         # one profile: refitted

Several profiles: :meth:`kvrl.executors.profile.StepProfile.pooled` (same device, shape, block size
and code fingerprint, else an error naming the field; their samples, engine-run steps and host rows
together, fitted once). One profile: its model fitted again from its own samples
(:meth:`~kvrl.executors.profile.StepProfile.refitted`). Either way the profile's ``fit`` holds the
errors of the new model on the samples (grid, held-out, per group), and ``<out>`` minus ``.json``
plus ``.md`` gets the profile report as ``kvrl-profile`` writes it. A profile file keeps evenly
thinned subsets of its engine-run steps and host rows, so the fit is close to, not the same as,
what ``kvrl-profile`` would fit from the device run itself.
"""
from __future__ import annotations

import argparse
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("profiles", nargs="+", help="profile files (kvrl-step-profile JSON)")
    ap.add_argument("--out", required=True, type=Path, help="where to write the profile (.json)")
    args = ap.parse_args(argv)

    from dataclasses import replace

    from kvrl.executors.profile import StepProfile
    from kvrl.executors.profile.model import refit_report
    from kvrl.profiling.run import render_report

    if args.out.suffix != ".json":
        raise SystemExit(f"--out {args.out}: give a .json path")
    profiles = [StepProfile.load(p) for p in args.profiles]
    if len(profiles) == 1:
        prof = profiles[0].refitted()
        seconds = profiles[0].fit_report.get("seconds", {})
        prof = replace(prof, fit_report={"refitted_from": args.profiles[0], "seconds": seconds,
                                         **refit_report(prof.model, prof.samples, prof.host_samples)})
    else:
        prof = StepProfile.pooled(profiles)
    prof.save(args.out)
    args.out.with_suffix(".md").write_text(render_report(prof) + "\n")
    print(f"wrote {args.out} and {args.out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
