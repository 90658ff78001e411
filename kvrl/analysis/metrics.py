"""The metric registry: one entry per run metric (``metrics.json`` keys, docs/design.md §5) with
its label, unit, direction (is higher or lower better) and range.

Figures take their axis labels from it, confidence intervals are clipped to a metric's range (a
non-negative quantity never gets a band below zero), and a comparison's verdict reads its
direction (a lower p99 TTFT is *better*). A key not registered here gets a neutral spec: its name
as label, no unit, no direction, no range.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Optional

Direction = Optional[Literal["higher", "lower"]]


@dataclass(frozen=True)
class MetricSpec:
    """A metric: ``name`` (its key), ``label`` (for axes and tables), ``unit`` ("" if none),
    ``direction`` ("higher" or "lower" is better, None when neither is), and the closed range
    ``[low, high]`` its values can take (None: unbounded on that side)."""

    name: str
    label: str
    unit: str = ""
    direction: Direction = None
    low: Optional[float] = 0.0
    high: Optional[float] = None

    @property
    def axis_label(self) -> str:
        """``label (unit)``, or the label alone for a unitless metric."""
        return f"{self.label} ({self.unit})" if self.unit else self.label

    def clip(self, value: float) -> float:
        """``value`` clipped to the metric's range (NaN stays NaN)."""
        if math.isnan(value):
            return value
        if self.low is not None:
            value = max(value, self.low)
        if self.high is not None:
            value = min(value, self.high)
        return value


def _specs(*specs: MetricSpec) -> dict[str, MetricSpec]:
    return {s.name: s for s in specs}


FRACTION = dict(unit="", low=0.0, high=1.0)

REGISTRY: dict[str, MetricSpec] = _specs(
    MetricSpec("requests", "requests", ""),
    MetricSpec("finished", "finished requests", "", "higher"),
    MetricSpec("rejected", "rejected requests", "", "lower"),
    MetricSpec("aborted", "aborted requests", "", "lower"),
    MetricSpec("clipped", "clipped requests", "", "lower"),
    MetricSpec("dropped", "dropped requests", "", "lower"),
    MetricSpec("policy_errors", "policy errors", "", "lower"),
    MetricSpec("policy_time_s", "time in policy calls", "s", "lower"),
    MetricSpec("output_tokens", "output tokens", "", "higher"),
    MetricSpec("duration_s", "engine time", "s", "lower"),
    MetricSpec("throughput_tok_s", "throughput", "tok/s", "higher"),
    MetricSpec("goodput_tok_s", "goodput", "tok/s", "higher"),
    MetricSpec("slo_attainment", "SLO attainment", direction="higher", **FRACTION),
    MetricSpec("ttft_p50_s", "p50 TTFT", "s", "lower"),
    MetricSpec("ttft_p99_s", "p99 TTFT", "s", "lower"),
    MetricSpec("tpot_p50_s", "p50 TPOT", "s", "lower"),
    MetricSpec("tpot_p99_s", "p99 TPOT", "s", "lower"),
    MetricSpec("kv_utilization", "KV utilization", direction="higher", **FRACTION),
    MetricSpec("kv_occupancy", "KV occupancy", **FRACTION),
    MetricSpec("preemptions", "preemptions", "", "lower"),
    MetricSpec("swapped_out_blocks", "blocks swapped out", "", "lower"),
    MetricSpec("swapped_in_blocks", "blocks swapped in", "", "lower"),
    MetricSpec("recomputed_tokens", "recomputed tokens", "", "lower"),
    MetricSpec("prefix_hit_rate", "prefix hit rate", direction="higher", **FRACTION),
    MetricSpec("wall_s", "wall time", "s", "lower"),
    MetricSpec("steps", "engine steps", ""),
    MetricSpec("num_blocks", "GPU KV blocks", ""),
)


def spec(name: str) -> MetricSpec:
    """The registered spec of ``name``; an unregistered name gets a neutral one (label = name, no
    unit, no direction, unbounded)."""
    return REGISTRY.get(name) or MetricSpec(name, name, low=None)


def axis_label(name: str) -> str:
    """The axis label of metric ``name``: ``label (unit)``."""
    return spec(name).axis_label


def clip_band(name: str, mean: float, half: float) -> tuple[float, float]:
    """``mean ± half`` clipped to the range of metric ``name`` (a NaN half-width gives the mean
    twice)."""
    s = spec(name)
    half = 0.0 if math.isnan(half) else half
    return s.clip(mean - half), s.clip(mean + half)
