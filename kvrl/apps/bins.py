"""Watermark action bins from the scenario: a validation sweep of fixed watermarks.

``env.action.bins=auto`` (``kvrl-train``) and ``scripts/rl_scenario_table.py`` (the suggested
bins) both use :func:`sweep_fixed` + :func:`useful_bins`: every fixed watermark of the sweep serves
the whole ``val`` split once (seed 0, no resample, the scenario's ``workload.rate_scale``),
through the same ``run_job`` as ``kvrl-eval``; the bins are the sweep values from the lowest to
the highest whose val goodput is within ``tolerance`` of the best (the best always included), so
an agent acts over the range a constant could usefully take on this scenario, and values that a
constant never should take (they lose more than ``tolerance`` on val) are left out.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Sequence

log = logging.getLogger("kvrl.bins")


@dataclass(frozen=True)
class BinSweep:
    """A sweep's outcome: ``goodput[i]`` (tok/s, val) of fixed watermark ``fractions[i]``, the
    best fraction, the tolerance and the chosen ``bins``."""

    fractions: tuple[float, ...]
    goodput: tuple[float, ...]
    tolerance: float
    best: float
    bins: tuple[float, ...]

    def describe(self) -> str:
        """One line: each value's goodput, then the bins and how they were chosen."""
        cells = ", ".join(f"{f:g} {g:.1f}" for f, g in zip(self.fractions, self.goodput))
        return (f"val goodput (tok/s) of fixed watermarks: {cells}; best {self.best:g}; bins = the sweep values "
                f"from the lowest to the highest within {self.tolerance:.0%} of the best: {list(self.bins)}")

    def as_dict(self) -> dict:
        return {"fractions": list(self.fractions), "val_goodput_tok_s": list(self.goodput),
                "tolerance": self.tolerance, "best": self.best, "bins": list(self.bins)}


def useful_bins(fractions: Sequence[float], goodput: Sequence[float], tolerance: float) -> BinSweep:
    """The sweep values from the lowest to the highest whose goodput is at least ``(1 -
    tolerance)`` times the best (the best included; every value between them is kept, so the bins
    span the useful range). Ties for the best go to the lowest fraction."""
    if len(fractions) != len(goodput) or not fractions:
        raise ValueError(f"useful_bins: {len(fractions)} fractions and {len(goodput)} goodputs (need equal, > 0)")
    if not 0.0 <= tolerance <= 1.0:
        raise ValueError(f"action.auto.tolerance must be in [0, 1], got {tolerance}")
    pairs = sorted(zip((float(f) for f in fractions), (float(g) for g in goodput)))
    best_fraction, best = max(pairs, key=lambda p: (p[1], -p[0]))
    useful = [f for f, g in pairs if g >= (1.0 - tolerance) * best]
    lo, hi = min(useful), max(useful)
    bins = tuple(f for f, _ in pairs if lo <= f <= hi)
    return BinSweep(tuple(f for f, _ in pairs), tuple(g for _, g in pairs), float(tolerance), best_fraction, bins)


def sweep_fixed(run: dict, fractions: Sequence[float], tolerance: float, workers: int = 1,
                split: str = "val") -> BinSweep:
    """Serve the whole ``split`` of ``run`` (a run config, :attr:`EnvConfig.run`) once per fixed
    watermark of ``fractions`` (seed 0, no resample) and choose the bins (:func:`useful_bins`)."""
    from kvrl.apps.eval import Job, Policy, label_of, run_jobs

    plugins = [{"name": "fixed", "fraction": float(f)} for f in fractions]
    jobs = [Job(Policy(label_of(p), "sweep", p), split, 0) for p in plugins]
    results = run_jobs(run, "watermark", jobs, None, workers)
    return useful_bins([p["fraction"] for p in plugins], [r["goodput_tok_s"] for r in results], tolerance)
