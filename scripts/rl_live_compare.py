"""The sim's prediction beside each live number of an RL evaluation (benchmarks/rl_live.sh).

    python scripts/rl_live_compare.py <sim results.csv> <live results.csv> <scenario> > compare.md

Per policy: test-split goodput in the sim and live (mean ± 95% CI over the seeds both served), and
the paired per-seed difference to fixed 0.01 in each, with its verdict (kvrl.analysis.stats); where
the sim's difference is significant, whether live has the same sign. The val-picked constant is
matched across backends by its plugin, whatever its label says about where it was picked.
"""
from __future__ import annotations

import csv
import re
import sys
from collections import defaultdict

from kvrl.analysis.stats import SAME, mean_ci, paired_compare

METRIC = "goodput_tok_s"


def policy_key(label: str) -> str:
    """A policy's label without where its value was picked (``[val-best in sim]`` = ``[val-best]``)."""
    return re.sub(r"\[val-best[^\]]*\]", "[val-best]", label)


def load(path: str) -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = defaultdict(dict)
    for r in csv.DictReader(open(path)):
        if r["split"] == "test":
            out[policy_key(r["policy"])][int(r["seed"])] = float(r[METRIC])
    return out


def render(sim: dict, live: dict, name: str) -> str:
    ref = next((p for p in sim if p.startswith("fixed(fraction=0.01)")), None)
    lines = [f"## {name}: sim prediction vs live ({METRIC}, mean ± 95% CI over seeds; Δ = paired per-seed "
             f"difference to {ref})", "",
             "| policy | sim | live | Δ sim (verdict) | Δ live (verdict) | same sign where sim is significant |",
             "|---|---|---|---|---|---|"]
    served = 0
    for p in sim:
        seeds = sorted(set(sim[p]) & set(live.get(p, {})))
        served = max(served, len(seeds))
        s = mean_ci([sim[p][k] for k in seeds]) if seeds else mean_ci(sim[p].values())
        l = mean_ci([live[p][k] for k in seeds]) if seeds else (float("nan"), float("nan"))
        cells = [f"{s[0]:.1f} ± {s[1]:.1f}", f"{l[0]:.1f} ± {l[1]:.1f}"]
        if ref and p != ref and seeds and ref in live:
            ds = paired_compare({k: sim[p][k] for k in seeds}, sim[ref], METRIC)
            dl = paired_compare({k: live[p][k] for k in seeds}, live[ref], METRIC)
            agree = "(sim n.s.)" if ds.verdict == SAME else ("yes" if (ds.delta > 0) == (dl.delta > 0) else "**no**")
            cells += [f"{ds.delta:+.1f} ± {ds.delta_ci:.1f} ({ds.verdict})",
                      f"{dl.delta:+.1f} ± {dl.delta_ci:.1f} ({dl.verdict})", agree]
        else:
            cells += ["reference" if p == ref else "", "", ""]
        lines.append(f"| {p} | " + " | ".join(cells) + " |")
    lines += ["", f"{served} seeds served live of {len(next(iter(sim.values()), {}))} in the sim."]
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: rl_live_compare.py <sim results.csv> <live results.csv> <scenario>")
    print(render(load(sys.argv[1]), load(sys.argv[2]), sys.argv[3]))
