"""How well a timing attacker did, from its own measurements and the probes' true labels.

The attacker's label-free threshold (2-means on the TTFTs, fast cluster = cache hit), then
the harness's scoring against the labels: accuracy with a Wilson interval, Fisher's exact test,
the TTFT gap with a bootstrap interval and a permutation test, and the AUC.
"""
from __future__ import annotations

import math

import numpy as np

from kvrl.analysis.stats import z_quantile


def two_means_threshold(x: np.ndarray) -> float:
    """Threshold between the two clusters of an exact 1-D 2-means (k-means, k=2) of ``x``: the
    midpoint of the split that minimises the within-cluster sum of squares. Label-free. With no
    spread at all, returns the common value (every point is then "fast": ``x <= threshold``)."""
    xs = np.sort(np.asarray(x, dtype=np.float64))
    n = len(xs)
    if n < 2 or xs[-1] - xs[0] <= 1e-12 * max(abs(xs[-1]), 1e-300):
        return float(xs[-1]) if n else float("nan")
    z = xs - xs.mean()
    c, c2 = np.cumsum(z), np.cumsum(z * z)
    k = np.arange(1, n)
    left = c2[:-1] - c[:-1] ** 2 / k
    right = (c2[-1] - c2[:-1]) - (c[-1] - c[:-1]) ** 2 / (n - k)
    sse = left + right
    sse[xs[1:] == xs[:-1]] = np.inf          # split only between distinct values
    best = int(np.argmin(sse))
    return float((xs[best] + xs[best + 1]) / 2)


def fisher_exact_p(table: list[list[int]]) -> float:
    """Two-sided p-value of Fisher's exact test of a 2x2 table (``scipy.stats.fisher_exact``):
    the probability, under independence with the margins fixed (hypergeometric), of a table at
    most as likely as the observed one."""
    from scipy.stats import fisher_exact
    return float(fisher_exact(table, alternative="two-sided").pvalue)


def wilson_interval(successes: int, n: int, z: float = z_quantile()) -> tuple[float, float]:
    if n == 0:
        return float("nan"), float("nan")
    p = successes / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return max(0.0, mid - half), min(1.0, mid + half)


def mean_gap_stats(fast: np.ndarray, slow: np.ndarray, seed: int = 0, resamples: int = 2000) -> dict:
    """Mean of ``slow`` minus mean of ``fast`` with a percentile-bootstrap 95% interval (groups
    resampled separately) and a two-sided permutation-test p-value (``resamples`` each)."""
    fast, slow = np.asarray(fast, dtype=np.float64), np.asarray(slow, dtype=np.float64)
    if not len(fast) or not len(slow):
        return {"gap_s": float("nan"), "gap_ci_s": [float("nan")] * 2, "gap_perm_p": float("nan")}
    rng = np.random.default_rng(seed)
    gap = float(slow.mean() - fast.mean())
    boot = rng.choice(slow, (resamples, len(slow))).mean(1) - rng.choice(fast, (resamples, len(fast))).mean(1)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    pooled = np.concatenate([fast, slow])
    perm = np.empty(resamples)
    for i in range(resamples):
        p = rng.permutation(pooled)
        perm[i] = p[len(fast):].mean() - p[:len(fast)].mean()
    tol = 1e-12 * max(float(np.abs(pooled).max()), 1e-300)
    p_value = (1 + int(np.sum(np.abs(perm) >= abs(gap) - tol))) / (1 + resamples)
    return {"gap_s": gap, "gap_ci_s": [float(lo), float(hi)], "gap_perm_p": float(p_value)}


def auc_fast(fast: np.ndarray, slow: np.ndarray) -> float:
    """P(a ``fast``-group value < a ``slow``-group value) + P(equal)/2 (Mann-Whitney AUC)."""
    fast, slow = np.asarray(fast, dtype=np.float64), np.asarray(slow, dtype=np.float64)
    if not len(fast) or not len(slow):
        return float("nan")
    less = (fast[:, None] < slow[None, :]).sum()
    equal = (fast[:, None] == slow[None, :]).sum()
    return float((less + 0.5 * equal) / (len(fast) * len(slow)))


THRESHOLDS = ("kmeans_log", "kmeans")


def score_probes(ttft_s: np.ndarray, correct: np.ndarray, seed: int = 0, resamples: int = 2000,
                 threshold: str = "kmeans_log") -> dict:
    """The attacker's label-free inference scored against the labels. The attacker calls a probe
    a hit ("correct") when its TTFT is at most a threshold from 2-means on the TTFTs
    (``kmeans``) or on their logarithms (``kmeans_log``, default: latency noise is multiplicative
    and its long tail would otherwise drag one cluster onto a few queueing outliers)."""
    ttft_s, correct = np.asarray(ttft_s, dtype=np.float64), np.asarray(correct, dtype=bool)
    if threshold not in THRESHOLDS:
        raise ValueError(f"attack.threshold must be one of {list(THRESHOLDS)}, got {threshold!r}")
    if threshold == "kmeans_log":
        thr = float(np.exp(two_means_threshold(np.log(np.maximum(ttft_s, 1e-12)))))
    else:
        thr = two_means_threshold(ttft_s)
    pred = ttft_s <= thr
    hits = int(np.sum(pred == correct))
    n = len(correct)
    table = [[int(np.sum(pred & correct)), int(np.sum(pred & ~correct))],
             [int(np.sum(~pred & correct)), int(np.sum(~pred & ~correct))]]
    out = {
        "probes": n, "correct_probes": int(correct.sum()), "threshold": threshold, "threshold_s": thr,
        "accuracy": hits / n if n else float("nan"), "accuracy_ci": list(wilson_interval(hits, n)),
        "fisher_p": fisher_exact_p(table) if n else float("nan"), "confusion": table,
        "ttft_correct_mean_s": float(ttft_s[correct].mean()) if correct.any() else float("nan"),
        "ttft_wrong_mean_s": float(ttft_s[~correct].mean()) if (~correct).any() else float("nan"),
        "auc": auc_fast(ttft_s[correct], ttft_s[~correct]),
    }
    out.update(mean_gap_stats(ttft_s[correct], ttft_s[~correct], seed=seed, resamples=resamples))
    return out
