"""What ``kvrl-fidelity`` compares: the metrics (with the direction in which each is better), the
issue's targets, a run's summary, the sim's relative error against live, and the step-time scale
that calibrates the sim to a host's measured speed.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np


#: (key, label, better): better = +1 when larger is better, -1 when smaller is, 0 for neither.
METRICS = (
    ("throughput_tok_s", "throughput tok/s", +1),
    ("goodput_tok_s", "goodput tok/s", +1),
    ("ttft_p50_s", "TTFT p50 s", -1),
    ("ttft_mean_s", "TTFT mean s", -1),
    ("ttft_p99_s", "TTFT p99 s", -1),
    ("tpot_p50_s", "TPOT p50 s", -1),
    ("tpot_mean_s", "TPOT mean s", -1),
    ("tpot_p99_s", "TPOT p99 s", -1),
    ("preemptions", "preemptions", 0),
    ("kv_utilization", "KV utilization", 0),
)


RANK_METRICS = ("goodput_tok_s", "throughput_tok_s", "ttft_p99_s", "tpot_mean_s")


#: docs/design.md §11 / issue targets: metric -> largest acceptable absolute relative error
TARGETS = {"throughput_tok_s": 0.03, "ttft_p50_s": 0.10, "tpot_p50_s": 0.10, "ttft_p99_s": 0.20}


def summarize(engine) -> dict:
    """The engine's summary plus mean TTFT and TPOT over finished requests."""
    m = engine.metrics.summary()
    done = [r for r in engine.metrics.requests.values() if r.finish_s is not None and not r.error]
    ttft = [r.ttft_s for r in done if r.ttft_s is not None]
    tpot = [r.tpot_s for r in done if r.tpot_s is not None]
    m["ttft_mean_s"] = float(np.mean(ttft)) if ttft else float("nan")
    m["tpot_mean_s"] = float(np.mean(tpot)) if tpot else float("nan")
    return m


def mean_summary(runs: Sequence[Mapping]) -> dict:
    """The mean of every numeric metric over ``runs`` (summaries of runs of one pair, same keys), as a pair's
    live runs are compared by their mean."""
    return {k: float(np.mean([r[k] for r in runs])) for k, v in runs[0].items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}


def rel_err(live: float, sim: float) -> float:
    if live is None or sim is None or not (math.isfinite(live) and math.isfinite(sim)):
        return float("nan")
    if live == 0:
        return 0.0 if sim == 0 else float("inf")
    return (sim - live) / abs(live)


def within_targets(live: Mapping[str, float], sim: Mapping[str, float]) -> bool:
    """Whether ``sim``'s value of every :data:`TARGETS` metric is within that metric's bound of ``live``'s (both
    e.g. means over a pair's or a policy's runs); a missing or non-finite value misses."""
    return all(abs(rel_err(live.get(k, math.nan), sim.get(k, math.nan))) < bound for k, bound in TARGETS.items())


def speed_scale(replay_errors: Sequence[float]) -> float:
    """The sim's ``step_time_scale`` for a host whose live runs had these replay errors (the total
    relative error of the sim pricing a live run's own executed steps, ``sum(sim) / sum(live) - 1``):
    ``1 / (1 + their mean)`` over the finite ones above -1 (NaN where there is none)."""
    usable = [e for e in replay_errors if math.isfinite(e) and e > -1.0]
    return 1.0 / (1.0 + sum(usable) / len(usable)) if usable else math.nan
