"""How much a profile's engine-run steps steer its fitted step model: the profile's samples fitted
again (this kvrl's code) with the engine-run steps left out, once, or repeated ``k`` times, and the
fit's errors on the grid groups and its eager terms for each.

    python scripts/fidelity_engine_weight.py <profile.json> [--repeat 0 1 8] [--groups shared_mixed shared mixed] \
        [--out-prefix <path>]

``kvrl-profile`` fits the grid together with every step of its engine runs (about 5,000 on an H200,
of which some 500 eager), timed inside the engine; the file keeps 600 of them, evenly thinned
(``kvrl/profiling/run.py``), so ``--repeat 8`` weighs them about as the device fit did and
``--repeat 1`` as a refit from the file does. Repeat 0 is a fit of the grid alone (the engine-context
factor is then still taken from the engine-run steps). Prints a Markdown table (median absolute
relative error per group, signed mean in brackets; eager ``has_pre``, ``has_dec``, ``dec_shared``,
``mixed_shared`` and the eager engine factor). ``--out-prefix P`` also writes each fit as a profile,
``P_x<k>.json`` (for ``kvrl-fidelity resim=<run> profile=P_x0.json``).
"""
from __future__ import annotations

import argparse


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("profile")
    ap.add_argument("--repeat", type=int, nargs="+", default=[0, 1, 8])
    ap.add_argument("--out-prefix", default=None, help="write each fit as <prefix>_x<k>.json")
    ap.add_argument("--groups", nargs="+", default=["shared_mixed", "shared", "mixed", "mixed_long", "decode",
                                                    "prefill", "random"])
    args = ap.parse_args(argv)
    if any(k < 0 for k in args.repeat):
        raise SystemExit(f"--repeat {args.repeat}: counts must be >= 0")

    from dataclasses import replace

    from kvrl.executors.profile import StepModel, StepProfile, fit_engine_factor, fit_errors, refit_report

    prof = StepProfile.load(args.profile)
    meta = prof.meta
    terms = ("has_pre", "has_dec", "dec_shared", "mixed_shared")
    lines = [f"Profile {args.profile}: {len(prof.samples)} grid samples, {len(prof.engine_samples)} engine-run steps "
             f"({sum(not s['graph'] for s in prof.engine_samples)} eager).", "",
             "| engine steps x | grid | held out | " + " | ".join(args.groups) + " | " + " | ".join(terms) +
             " | engine factor eager |", "|---:|" + "---:|" * (2 + len(args.groups) + len(terms) + 1)]
    for k in args.repeat:
        model = StepModel.fit(prof.samples + prof.engine_samples * k, meta.get("graph_batch_sizes", ()),
                              prof.host_samples, token_sizes=meta.get("piecewise_token_sizes", ()))
        model.engine_factor = fit_engine_factor(model, prof.engine_samples)
        model.rebuild()
        err = fit_errors(model, prof.samples)
        if args.out_prefix:
            replace(prof, model=model, fit_report={"engine_steps_repeat": k, **refit_report(
                model, prof.samples, prof.host_samples)}).save(f"{args.out_prefix}_x{k}.json")
        cell = lambda st: f"{st['median_abs_rel_err']:.1%} ({st['mean_rel_err']:+.1%})" if st.get("n") else "-"
        coef = model.eager["coef"]
        lines.append(f"| {k} | {cell(err['grid'])} | {cell(err['holdout'])} | " +
                     " | ".join(cell(err["by_group"].get(g, {})) for g in args.groups) + " | " +
                     " | ".join(f"{coef[t]:.3g}" if t in coef else "-" for t in terms) +
                     f" | {model.engine_factor['eager']:.3f} |")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
