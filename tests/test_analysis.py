"""kvrl.analysis: the metric registry and the one statistics module every app reports with."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from kvrl.analysis import stats
from kvrl.analysis.metrics import axis_label, clip_band, spec


def test_mean_ci_is_the_student_t_interval_at_any_degrees_of_freedom():
    rng = np.random.default_rng(0)
    for n in (2, 5, 31, 41, 200):        # the hand tables of kvrl-report / kvrl-eval disagreed above 30
        x = rng.normal(10, 2, n)
        mean, half = stats.mean_ci(x)
        lo, hi = sps.t.interval(0.95, n - 1, loc=x.mean(), scale=sps.sem(x))
        assert mean == pytest.approx(x.mean()) and half == pytest.approx((hi - lo) / 2, rel=1e-12)
    assert stats.mean_ci([3.0])[0] == 3.0 and math.isnan(stats.mean_ci([3.0])[1])
    assert stats.mean_ci([1.0, None, float("nan"), 3.0]) == pytest.approx((2.0, stats.t_quantile(1) / 1))
    assert stats.z_quantile() == pytest.approx(1.959963984540054)


def test_every_app_uses_the_same_interval():
    from kvrl.apps import leaderboard, report
    x = list(np.linspace(1, 50, 41))
    assert report.mean_ci(x) == leaderboard.mean_ci(x) == stats.mean_ci(x)


def test_paired_comparison_reads_the_metrics_direction():
    base = {s: 100.0 + 10 * s for s in range(6)}                 # large spread between seeds
    up = {s: v * 1.05 for s, v in base.items()}                  # +5% on every seed
    c = stats.paired_compare(up, base, "goodput_tok_s")
    assert c.n == 6 and c.verdict == stats.BETTER and c.pct_change == pytest.approx(5.0)
    assert c.p_value < 0.05 and c.delta > 0
    assert stats.paired_compare(up, base, "ttft_p99_s").verdict == stats.WORSE     # lower is better
    assert stats.paired_compare(up, base, "kv_occupancy").verdict == stats.HIGHER  # no direction
    # unpaired, the 95% intervals overlap; paired, the shift is significant
    (m1, h1), (m0, h0) = stats.mean_ci(up.values()), stats.mean_ci(base.values())
    assert m1 - h1 < m0 + h0


def test_paired_comparison_edge_cases():
    base = {0: 1.0, 1: 2.0, 2: 3.0}
    same = stats.paired_compare(dict(base), base, "goodput_tok_s")
    assert same.verdict == stats.SAME and same.p_value == 1.0 and same.delta == 0
    noisy = stats.paired_compare({0: 1.1, 1: 1.9, 2: 3.05}, base, "goodput_tok_s")
    assert noisy.verdict == stats.SAME and noisy.p_value > 0.05
    shift2 = stats.paired_compare({0: 3.0, 1: 4.0}, {0: 1.0, 1: 2.0}, "preemptions")     # no spread, 2 pairs
    assert shift2.p_value == pytest.approx(0.5) and shift2.verdict == stats.SAME
    shift6 = stats.paired_compare({s: s + 2.0 for s in range(6)}, {s: float(s) for s in range(6)}, "preemptions")
    assert shift6.p_value == pytest.approx(2 * 0.5 ** 6) and shift6.verdict == stats.WORSE
    one = stats.paired_compare({0: 5.0, 7: 1.0}, {0: 1.0, 8: 1.0}, "goodput_tok_s")     # one shared seed
    assert one.n == 1 and one.verdict == stats.TOO_FEW
    missing = stats.paired_compare({0: None, 1: 3.0, 2: 4.0}, base, "goodput_tok_s")
    assert missing.n == 2
    with pytest.raises(ValueError, match="direction"):
        stats.verdict(1.0, 0.0, "up")


def test_holm_adjusts_step_down_and_can_remove_a_marginal_verdict():
    assert stats.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert stats.holm([0.5, float("nan")])[0] == 0.5 and math.isnan(stats.holm([0.5, float("nan")])[1])
    rng = np.random.default_rng(3)
    base = {s: float(v) for s, v in enumerate(rng.normal(100, 10, 8))}
    groups = {"base": base, "strong": {s: v + 5 for s, v in base.items()}}
    # a marginal setting: p just under 0.05 on its own
    shift = np.array([1.0, 2.5, -0.4, 1.8, 0.2, 2.2, -0.6, 1.9])
    groups["marginal"] = {s: v + shift[s] for s, v in base.items()}
    for i in range(3):
        groups[f"null{i}"] = {s: v + rng.normal(0, 1) for s, v in base.items()}
    plain = stats.compare_to_baseline(groups, "base", "goodput_tok_s")
    corrected = stats.compare_to_baseline(groups, "base", "goodput_tok_s", correct=True)
    assert plain["marginal"].p_value < 0.05 and plain["marginal"].verdict == stats.BETTER
    assert corrected["marginal"].p_adjusted >= 0.05 and corrected["marginal"].verdict == stats.SAME
    assert corrected["strong"].verdict == stats.BETTER
    with pytest.raises(KeyError, match="base, strong"):
        stats.compare_to_baseline(groups, "nope", "goodput_tok_s")


def test_registry_labels_units_and_ranges():
    assert axis_label("goodput_tok_s") == "goodput (tok/s)"
    assert axis_label("ttft_p99_s") == "p99 TTFT (s)"
    assert spec("ttft_p99_s").direction == "lower" and spec("goodput_tok_s").direction == "higher"
    assert clip_band("goodput_tok_s", 10.0, 25.0) == (0.0, 35.0)          # non-negative
    assert clip_band("slo_attainment", 0.9, 0.2) == pytest.approx((0.7, 1.0))   # a fraction
    assert clip_band("my_metric", 1.0, 5.0) == (-4.0, 6.0)                # unregistered: unbounded
    assert spec("my_metric").axis_label == "my_metric" and spec("my_metric").direction is None


def test_sign_holds_checks_only_significant_sim_differences_and_needs_a_strict_live_sign():
    assert stats.sign_holds(stats.SAME, 5.0, -5.0) is None
    assert stats.sign_holds(stats.WORSE, -3.0, -0.1) is True
    assert stats.sign_holds(stats.BETTER, 3.0, -0.1) is False
    assert stats.sign_holds(stats.BETTER, 3.0, 0.0) is False      # a live tie does not hold the sign


def test_paired_adjusted_removes_a_covariate_that_differs_between_the_runs_of_a_pair():
    """Each run's value moves with a per-run covariate (live: the host's speed). The raw paired difference
    carries the covariate's difference; the adjusted one is the difference at equal covariate: the
    regression's intercept, with its t-interval on n - 2 degrees of freedom, matching statsmodels-style OLS."""
    rng = np.random.default_rng(0)
    n = 12
    host_a, host_b = rng.normal(0.0, 0.02, n), rng.normal(-0.015, 0.02, n)    # b's runs on a slower host
    base = {s: 3000.0 + 20000.0 * host_a[s] + rng.normal(0, 5) for s in range(n)}
    same = {s: 3000.0 + 20000.0 * host_b[s] + rng.normal(0, 5) for s in range(n)}   # the same policy
    cov_b, cov_a = dict(enumerate(host_b)), dict(enumerate(host_a))
    c = stats.paired_adjusted(same, base, cov_b, cov_a)
    assert c.n == n and c.raw < -150                                     # raw: looks like a loss
    assert abs(c.adjusted) < c.adjusted_ci and c.adjusted_p > 0.05       # at equal host speed: none
    assert c.slope == pytest.approx(20000.0, rel=0.05) and c.r2 > 0.95
    d = np.array([same[s] - base[s] for s in range(n)])
    x = host_b - host_a
    fit = sps.linregress(x, d)
    assert c.adjusted == pytest.approx(fit.intercept) and c.covariate_delta == pytest.approx(x.mean())
    # a real difference survives the adjustment
    better = {s: v + 100.0 for s, v in same.items()}
    assert stats.paired_adjusted(better, base, cov_b, cov_a).adjusted == pytest.approx(c.adjusted + 100.0)
    # too few pairs, or no spread in the covariate: no adjustment (NaN), the raw difference still reported
    few = stats.paired_adjusted({0: 1.0, 1: 2.0}, {0: 0.0, 1: 0.0}, {0: 0.1, 1: 0.2}, {0: 0.0, 1: 0.0})
    assert few.n == 2 and math.isnan(few.adjusted) and few.raw == pytest.approx(1.5)
    flat = stats.paired_adjusted(dict(enumerate([1.0, 2.0, 3.0])), dict.fromkeys(range(3), 0.0),
                                 dict.fromkeys(range(3), 0.1), dict.fromkeys(range(3), 0.0))
    assert math.isnan(flat.adjusted)
