"""The sim's prediction beside each live number of an RL evaluation (benchmarks/rl_live.sh).

    python scripts/rl_live_compare.py <sim results.csv> <live results.csv>[,<more live results.csv>] <scenario> \
        [--reference <policy label prefix>] > compare.md

Per policy: test-split goodput in the sim and live (mean ± 95% CI over the seeds both served), and
the paired per-seed difference to the reference (default fixed 0.01) in each, with its verdict (kvrl.analysis.stats); where
the sim's difference is significant, whether live has the same sign. The val-picked constant is
matched across backends by its plugin, whatever its label says about where it was picked.
"""
from __future__ import annotations

import argparse
import csv
import re
from collections import defaultdict

from kvrl.analysis.stats import mean_ci, paired_compare, sign_holds

METRIC = "goodput_tok_s"


def policy_key(label: str) -> str:
    """A policy's label without where its value was picked (``[val-best in sim]`` = ``[val-best]``)."""
    return re.sub(r"\[val-best[^\]]*\]", "[val-best]", label)


def load(paths: str) -> dict[str, dict[int, float]]:
    """Test-split goodput per policy and seed from one results.csv, or several joined by commas (the
    seed shares of a live stage split over GPUs); a (policy, seed) found twice is an error."""
    out: dict[str, dict[int, float]] = defaultdict(dict)
    for path in paths.split(","):
        for r in csv.DictReader(open(path)):
            if r["split"] == "test":
                key, seed = policy_key(r["policy"]), int(r["seed"])
                if seed in out[key]:
                    raise ValueError(f"{path}: {key} seed {seed} is in more than one results file")
                out[key][seed] = float(r[METRIC])
    return out


def resolve_reference(reference: str, labels) -> "str | None":
    """The policy label ``reference`` names among ``labels``: that label exactly, else the first
    that starts with it; None if none does."""
    return reference if reference in labels else next((p for p in labels if p.startswith(reference)), None)


def sign_agreement(sim_cmp, live_cmp) -> str:
    """The last column: ``(sim n.s.)`` unless the sim's paired difference is significant (better or
    worse; a comparison of too few pairs is not), else ``yes`` when the live difference has the same
    strict sign (a live difference of exactly 0 does not) and ``**no**`` otherwise."""
    holds = sign_holds(sim_cmp.verdict, sim_cmp.delta, live_cmp.delta)
    return "(sim n.s.)" if holds is None else "yes" if holds else "**no**"


def render(sim: dict, live: dict, name: str, reference: str = "fixed(fraction=0.01)") -> str:
    """The Markdown table; ``reference``: the label (prefix) of the policy differences are taken to
    (:func:`resolve_reference` over the sim's policies)."""
    ref = resolve_reference(reference, list(sim))
    lines = [f"## {name}: sim prediction vs live ({METRIC}, mean ± 95% CI over seeds; Δ = paired per-seed "
             f"difference to {ref})", "",
             "| policy | sim | live | Δ sim (verdict) | Δ live (verdict) | same sign where sim is significant |",
             "|---|---|---|---|---|---|"]
    served, counts = 0, {}
    for p in sim:
        seeds = sorted(set(sim[p]) & set(live.get(p, {})))
        served, counts[p] = max(served, len(seeds)), len(seeds)
        s = mean_ci([sim[p][k] for k in seeds]) if seeds else mean_ci(sim[p].values())
        l = mean_ci([live[p][k] for k in seeds]) if seeds else (float("nan"), float("nan"))
        cells = [f"{s[0]:.1f} ± {s[1]:.1f}", f"{l[0]:.1f} ± {l[1]:.1f}"]
        if ref and p != ref and seeds and ref in live:
            ds = paired_compare({k: sim[p][k] for k in seeds}, sim[ref], METRIC)
            dl = paired_compare({k: live[p][k] for k in seeds}, live[ref], METRIC)
            agree = sign_agreement(ds, dl)
            cells += [f"{ds.delta:+.1f} ± {ds.delta_ci:.1f} ({ds.verdict})",
                      f"{dl.delta:+.1f} ± {dl.delta_ci:.1f} ({dl.verdict})", agree]
        else:
            cells += ["reference" if p == ref else "", "", ""]
        lines.append(f"| {p} | " + " | ".join(cells) + " |")
    lines += ["", f"{served} seeds served live of {len(next(iter(sim.values()), {}))} in the sim."]
    if len(set(counts.values())) > 1:       # e.g. a live stage stopped by its limit (results.partial.csv)
        lines += ["Live seeds per policy (each row's cells are over its own): "
                  + ", ".join(f"{p} {n}" for p, n in counts.items()) + "."]
    return "\n".join(lines)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sim"), ap.add_argument("live", help="results.csv, or several joined by commas")
    ap.add_argument("scenario")
    ap.add_argument("--reference", default="fixed(fraction=0.01)", help="label prefix of the reference policy")
    a = ap.parse_args()
    print(render(load(a.sim), load(a.live), a.scenario, a.reference))
