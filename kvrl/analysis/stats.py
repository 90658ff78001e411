"""Statistics of repeated runs, one implementation for every app (kvrl-eval's leaderboards,
kvrl-report, kvrl-attack, kvrl-fidelity), on ``scipy.stats``.

* :func:`mean_ci`: mean and the half-width of the two-sided Student-t confidence interval;
* :func:`paired_compare`: a setting against a baseline on the seeds both ran (per seed the same
  requests, so the per-seed differences remove the workload's variance): mean difference with its
  t-interval, % change against the baseline's mean, the paired t-test's p-value and a
  :func:`verdict` read in the metric's direction (docs/design.md §5, :mod:`kvrl.analysis.metrics`);
* :func:`compare_to_baseline`: every setting against one baseline, optionally with Holm's
  step-down correction of the p-values (:func:`holm`) when many settings are compared at once;
* :func:`paired_adjusted`: a paired comparison adjusted for a per-run covariate that differs between
  the two runs of a pair (live: the host's speed during each run, which the policy does not choose).

Values that are None or not finite are left out of every statistic (a missing p99 of a run that
finished nothing); a comparison counts only the seeds where both sides have a finite value.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Hashable, Iterable, Mapping, Optional, Sequence

import numpy as np
from scipy import stats as sps

from kvrl.analysis.metrics import spec

CONFIDENCE = 0.95

BETTER, WORSE, SAME = "better", "worse", "no significant difference"
HIGHER, LOWER = "higher", "lower"            # verdicts of a metric without a direction
TOO_FEW = "too few pairs"


def _finite(values: Iterable[Optional[float]]) -> np.ndarray:
    return np.asarray([float(v) for v in values if v is not None and math.isfinite(float(v))], dtype=np.float64)


def t_quantile(df: float, confidence: float = CONFIDENCE) -> float:
    """The two-sided ``confidence`` quantile of Student's t with ``df`` degrees of freedom."""
    return float(sps.t.ppf(0.5 + confidence / 2, df))


def z_quantile(confidence: float = CONFIDENCE) -> float:
    """The two-sided ``confidence`` quantile of the standard normal (1.95996... for 95%)."""
    return float(sps.norm.ppf(0.5 + confidence / 2))


def mean_ci(values: Iterable[Optional[float]], confidence: float = CONFIDENCE) -> tuple[float, float]:
    """``(mean, half-width)`` of the Student-t ``confidence`` interval of the finite ``values``; the
    half-width is NaN for fewer than two values, the mean NaN for none."""
    x = _finite(values)
    if x.size == 0:
        return math.nan, math.nan
    if x.size == 1:
        return float(x[0]), math.nan
    return float(x.mean()), t_quantile(x.size - 1, confidence) * float(x.std(ddof=1)) / math.sqrt(x.size)


def verdict(delta: float, p_value: float, direction: Optional[str], alpha: float = 1 - CONFIDENCE) -> str:
    """``better`` / ``worse`` (in the metric's ``direction``: "higher" or "lower" is better) when
    ``p_value`` < ``alpha``, else ``no significant difference``; a metric without a direction gets
    ``higher`` / ``lower``; a NaN p-value (fewer than two pairs) gives ``too few pairs``."""
    if math.isnan(p_value):
        return TOO_FEW
    if p_value >= alpha or delta == 0:
        return SAME
    if direction is None:
        return HIGHER if delta > 0 else LOWER
    if direction not in (HIGHER, LOWER):
        raise ValueError(f"direction must be 'higher', 'lower' or None, got {direction!r}")
    return BETTER if (delta > 0) == (direction == HIGHER) else WORSE


@dataclass(frozen=True)
class Comparison:
    """A setting against the baseline on one metric, over ``n`` paired seeds: the mean per-seed
    difference (setting - baseline) and its CI half-width, ``pct_change`` (mean difference /
    baseline mean, in %; NaN when the baseline mean is 0), the paired t-test's two-sided p-value,
    the p-value used for the verdict (``p_adjusted``: Holm-corrected, or equal to ``p_value``) and
    the :func:`verdict`."""

    metric: str
    n: int
    delta: float
    delta_ci: float
    pct_change: float
    p_value: float
    p_adjusted: float
    verdict: str

    def text(self) -> str:
        """``+12.3% (better)``-style cell text."""
        pct = f"{self.pct_change:+.1f}%" if math.isfinite(self.pct_change) else f"{self.delta:+.4g}"
        return f"{pct} ({self.verdict})"


def _paired_p(diff: np.ndarray) -> float:
    """Two-sided p-value of the paired t-test on the differences ``diff``; NaN for fewer than two.
    Without spread the t statistic is undefined: 1 when every difference is 0, and when they are
    all equal and non-zero the exact sign test's (``2 * 0.5**n``: two equal differences of a count
    such as preemptions are no evidence, six are)."""
    if diff.size < 2:
        return math.nan
    if np.all(diff == diff[0]):
        return 1.0 if diff[0] == 0 else float(sps.binomtest(diff.size, diff.size, 0.5).pvalue)
    return float(sps.ttest_1samp(diff, 0.0).pvalue)


def paired_compare(values: Mapping[Hashable, Optional[float]], baseline: Mapping[Hashable, Optional[float]],
                   metric: str, confidence: float = CONFIDENCE) -> Comparison:
    """``values`` (seed -> value) against ``baseline`` (seed -> value) on the seeds both have a finite
    value for; the verdict in ``metric``'s registered direction at ``confidence``."""
    seeds = [s for s in values if s in baseline and _finite([values[s], baseline[s]]).size == 2]
    mine = np.asarray([values[s] for s in seeds], dtype=np.float64)
    base = np.asarray([baseline[s] for s in seeds], dtype=np.float64)
    diff = mine - base
    delta, half = mean_ci(diff, confidence)
    base_mean = float(base.mean()) if base.size else math.nan
    pct = 100.0 * delta / base_mean if base.size and base_mean != 0 else math.nan
    p = _paired_p(diff)
    return Comparison(metric, int(diff.size), delta, half, pct, p, p,
                      verdict(delta, p, spec(metric).direction, 1 - confidence))


@dataclass(frozen=True)
class AdjustedComparison:
    """:func:`paired_adjusted`'s result over ``n`` pairs: the raw mean difference and its CI half-width,
    and the difference at equal covariate (the intercept of the per-pair regression of the difference on
    the covariate's difference) with its CI half-width and two-sided p-value (``n - 2`` degrees of
    freedom), the fitted slope (difference per unit of covariate), the regression's R², and the mean
    covariate difference."""

    n: int
    raw: float
    raw_ci: float
    raw_p: float
    adjusted: float
    adjusted_ci: float
    adjusted_p: float
    slope: float
    r2: float
    covariate_delta: float


def paired_adjusted(values: Mapping[Hashable, Optional[float]], baseline: Mapping[Hashable, Optional[float]],
                    covariate: Mapping[Hashable, Optional[float]],
                    covariate_baseline: Mapping[Hashable, Optional[float]],
                    confidence: float = CONFIDENCE) -> AdjustedComparison:
    """``values`` against ``baseline`` (seed -> value) on the seeds where all four maps have a finite value,
    adjusted for a covariate measured on each run (``covariate`` for ``values``' runs, ``covariate_baseline``
    for the baseline's): regress the per-seed difference d on the covariate's per-seed difference x,
    d = a + b x, and report ``a``, the difference expected where both runs had the same covariate. Valid where
    the covariate is not itself an effect of the setting (live: the host's speed during a run, read off
    the run's own steps against a fixed cost model). Needs at least three pairs (NaN otherwise)."""
    seeds = [k for k in values if k in baseline and k in covariate and k in covariate_baseline
             and _finite([values[k], baseline[k], covariate[k], covariate_baseline[k]]).size == 4]
    d = np.asarray([values[k] - baseline[k] for k in seeds], dtype=np.float64)
    x = np.asarray([covariate[k] - covariate_baseline[k] for k in seeds], dtype=np.float64)
    n = int(d.size)
    raw, raw_ci = mean_ci(d, confidence)
    nan = math.nan
    if n < 3 or float(np.ptp(x)) == 0.0:
        return AdjustedComparison(n, raw, raw_ci, _paired_p(d), nan, nan, nan, nan, nan,
                                  float(x.mean()) if n else nan)
    fit = sps.linregress(x, d)
    se = float(fit.intercept_stderr)
    if se > 0:
        p = 2.0 * float(sps.t.sf(abs(fit.intercept) / se, n - 2))
    else:      # a perfect fit: no evidence either way where the intercept is 0 up to rounding
        p = 1.0 if math.isclose(fit.intercept, 0.0, abs_tol=1e-9 * max(1.0, float(np.abs(d).max()))) else 0.0
    return AdjustedComparison(n, raw, raw_ci, _paired_p(d), float(fit.intercept), t_quantile(n - 2, confidence) * se,
                              p, float(fit.slope), float(fit.rvalue ** 2), float(x.mean()))


def sign_holds(sim_verdict: str, sim_delta: float, live_delta: float) -> Optional[bool]:
    """Whether a difference the sim calls significant (``sim_verdict`` better or worse) has the same
    strict sign live: None when the sim's is not significant (nothing to check), else True when
    ``sim_delta * live_delta > 0`` (a live difference of exactly 0 does not hold)."""
    if sim_verdict not in (BETTER, WORSE):
        return None
    return sim_delta * live_delta > 0


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (family-wise error control over the comparisons), in the
    order given; NaN p-values stay NaN and do not count as comparisons."""
    p = np.asarray(p_values, dtype=np.float64)
    out = np.full(p.shape, math.nan)
    idx = np.flatnonzero(~np.isnan(p))
    if idx.size == 0:
        return out.tolist()
    order = idx[np.argsort(p[idx], kind="stable")]
    m = order.size
    adjusted = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[order]))
    out[order] = adjusted
    return out.tolist()


def compare_to_baseline(groups: Mapping[str, Mapping[Hashable, Optional[float]]], baseline: str, metric: str,
                        correct: bool = False, confidence: float = CONFIDENCE) -> dict[str, Comparison]:
    """Every setting of ``groups`` (setting -> seed -> value) but ``baseline`` against ``baseline``;
    with ``correct`` the verdicts use Holm-adjusted p-values over these comparisons. A ``baseline``
    not in ``groups`` raises ``KeyError`` listing the settings."""
    if baseline not in groups:
        raise KeyError(f"baseline {baseline!r} is not one of the settings: {', '.join(map(str, groups))}")
    out = {name: paired_compare(vals, groups[baseline], metric, confidence)
           for name, vals in groups.items() if name != baseline}
    if correct and out:
        names = list(out)
        for name, p_adj in zip(names, holm([out[n].p_value for n in names])):
            c = out[name]
            out[name] = Comparison(c.metric, c.n, c.delta, c.delta_ci, c.pct_change, c.p_value, p_adj,
                                   verdict(c.delta, p_adj, spec(metric).direction, 1 - confidence))
    return out
