"""How far step-time profiles of the same code differ: in what they measured, in their fitted terms,
and in what they predict for the steps of a recorded ``kvrl-fidelity`` run.

    python scripts/fidelity_profile_drift.py --run <fidelity run dir> a.json b.json [c.json ...] [--out <name>]

Against the first profile, per other profile:

* **measured**: per grid group, the median ratio of the time of each grid point that both
  profiles timed (same group, graph flag and features) to the first profile's time; and the
  median ratio of the engine-run steps' times to the first profile's model (in-engine time,
  eager and CUDA-graph steps apart), so a move of the engine runs shows beside the grid's;
* **terms**: the eager coefficients (``has_pre``, ``has_dec``, ``n_dec``, ``pre_ctx``,
  ``dec_shared``, ``mixed_shared``, ...), the engine-context factors and the host terms, each
  profile's value and its change from the first;
* **predictions**: per step kind of the run's recorded live steps (``runs/*/*/replay.csv``;
  decode, mixed, prefill, without block operations), the summed compute-stream price relative to
  the first profile's, and the median and 90th percentile over steps of the absolute per-step
  change; for the host term, its sum.

Writes ``<out>.md`` (else prints it). Numbers only, no judgement: a term can move while the
predictions stay, when the samples identify a sum of terms better than each.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from fidelity_residuals import load_pairs, price   # scripts/ is on sys.path when run as a script

FEATURE_KEY = ("n_pre", "pre_tok", "pre_pairs", "pre_ctx", "n_dec", "dec_kv", "dec_max", "dec_shared", "copies",
               "swap_out", "swap_in")
KINDS = ("decode", "mixed", "prefill")


def point_key(s: dict) -> tuple:
    return (s["group"], bool(s["graph"]), *(int(s.get(k, 0)) for k in FEATURE_KEY))


def measured(first, other) -> dict[str, float]:
    """Per grid group: median ratio of ``other``'s time to ``first``'s over the points both timed;
    ``engine eager`` / ``engine graph``: median ratio of ``other``'s engine-run steps to ``first``'s
    model (each profile's model carries its own engine factor, so both use factor 1 here)."""
    ref = {point_key(s): s["t"] for s in first.samples}
    by: dict[str, list[float]] = {}
    for s in other.samples:
        t0 = ref.get(point_key(s))
        if t0:
            by.setdefault(s["group"], []).append(s["t"] / t0)
    out = {g: float(np.median(v)) for g, v in sorted(by.items())}
    model = first.model
    k = model.engine_factor
    for kind, graph in (("engine eager", False), ("engine graph", True)):
        r = [s["t"] / (model.predict_features(s, graph) / k["graph" if graph else "eager"])
             for s in other.engine_samples if bool(s["graph"]) == graph and (s.get("n_pre") or s.get("n_dec"))
             and not (s.get("copies") or s.get("swap_out") or s.get("swap_in"))]
        if r:
            out[kind] = float(np.median(r))
    return out


def terms(prof) -> dict[str, float]:
    m = prof.model
    out = {f"eager {k}": float(v) for k, v in m.eager["coef"].items()}
    out.update({f"engine factor {k}": float(v) for k, v in m.engine_factor.items()})
    out.update({f"host {k}": float(v) for k, v in m.host.items()})
    return out


def predictions(prof, steps: list[dict]) -> dict[str, np.ndarray]:
    fwd, host = price(prof.model, steps)
    kind = np.asarray([s["kind"] for s in steps])
    plain = np.asarray([not (s.get("copies") or s.get("swap_out") or s.get("swap_in")) for s in steps])
    out = {k: fwd[(kind == k) & plain] for k in KINDS}
    out["host"] = host
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", required=True, type=Path, help="a kvrl-fidelity run dir (runs/*/*/replay.csv)")
    ap.add_argument("profiles", nargs="+", help="profile files; the first is the reference")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if len(args.profiles) < 2:
        raise SystemExit("give at least two profiles")

    from kvrl.executors.profile import StepProfile

    profs = [StepProfile.load(p) for p in args.profiles]
    names = [Path(p).stem for p in args.profiles]
    pairs = load_pairs(args.run)
    if not pairs:
        raise SystemExit(f"--run {args.run}: no runs/*/*/replay.csv")
    steps = [s for ss in pairs.values() for s in ss]
    md = [f"# Profile drift: {', '.join(names)}", "", f"Reference: {args.profiles[0]}. Recorded steps: {args.run} "
          f"({len(pairs)} pairs, {len(steps)} steps).", "", "## Measured (median ratio to the reference)", "",
          "| group | " + " | ".join(names[1:]) + " |", "|---|" + "---:|" * (len(names) - 1)]
    meas = [measured(profs[0], p) for p in profs[1:]]
    for g in sorted({g for m in meas for g in m}):
        md.append(f"| {g} | " + " | ".join(f"{m[g]:.3f}" if g in m else "-" for m in meas) + " |")
    md += ["", "## Terms (value; change from the reference)", "", "| term | " + " | ".join(names) + " |",
           "|---|" + "---:|" * len(names)]
    tv = [terms(p) for p in profs]
    for k in sorted({k for t in tv for k in t}, key=lambda k: (k.split()[0], k)):
        ref = tv[0].get(k)
        cells = []
        for t in tv:
            v = t.get(k)
            if v is None:
                cells.append("-")
            elif ref and t is not tv[0]:
                cells.append(f"{v:.3g} ({(v - ref) / abs(ref):+.0%})")
            else:
                cells.append(f"{v:.3g}")
        md.append(f"| {k} | " + " | ".join(cells) + " |")
    md += ["", "## Predictions on the recorded steps (sum relative to the reference; per step: median / p90 of "
               "the absolute change)", "", "| kind | steps | " + " | ".join(names[1:]) + " |",
           "|---|---:|" + "---:|" * (len(names) - 1)]
    pv = [predictions(p, steps) for p in profs]
    for k in (*KINDS, "host"):
        a = pv[0][k]
        cells = []
        for p in pv[1:]:
            b = p[k]
            if k == "host":
                cells.append(f"{b.sum() / a.sum() - 1:+.1%}")
            else:
                d = np.abs(b / a - 1)
                cells.append(f"{b.sum() / a.sum() - 1:+.1%} ({np.median(d):.1%} / {np.percentile(d, 90):.1%})")
        md.append(f"| {k} | {len(a)} | " + " | ".join(cells) + " |")
    text = "\n".join(md) + "\n"
    if args.out:
        Path(args.out).with_suffix(".md").write_text(text)
        print(f"wrote {Path(args.out).with_suffix('.md')}")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
