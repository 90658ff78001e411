"""Fitting helpers of the step model: non-negative least squares (:func:`scipy.optimize.nnls`) on
relative error, knots and hat bases of piecewise-linear terms, the max-affine host-bound floor,
the host model, and relative-error summaries.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np
import scipy.optimize

from kvrl.executors.profile.features import HOST_WORK, HOST_WORK_TERMS, QUEUE_STEP_TERM


def nnls(A: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Non-negative least squares ``argmin ||A x - b||, x >= 0`` (:func:`scipy.optimize.nnls`,
    Lawson-Hanson). Where columns of ``A`` are exactly collinear the minimiser is not unique and
    the split between them is the solver's; ``A @ x`` is the same."""
    return scipy.optimize.nnls(np.asarray(A, dtype=np.float64), np.asarray(b, dtype=np.float64))[0]


def choose_knots(values: Iterable[float], max_knots: int = 10, min_ratio: float = 1.4) -> list[float]:
    """Knots for a piecewise-linear term over ``values``: the distinct values, keeping only those at
    least ``min_ratio`` times the previous kept one (clusters like 128/132/144 from mixed steps
    would otherwise get a knot each and overfit), thinned to ``max_knots`` evenly on a log scale;
    the smallest and the largest value are always knots."""
    vals = sorted({float(v) for v in values if v > 0})
    if len(vals) <= 2:
        return vals
    kept = [vals[0]]
    for v in vals[1:-1]:
        if v >= kept[-1] * min_ratio:
            kept.append(v)
    if vals[-1] < kept[-1] * min_ratio and len(kept) > 1:
        kept[-1] = vals[-1]
    else:
        kept.append(vals[-1])
    if len(kept) <= max_knots:
        return kept
    logs = np.log(kept)
    targets = np.linspace(logs[0], logs[-1], max_knots)
    picked = sorted({int(np.argmin(np.abs(logs - t))) for t in targets})
    return [kept[i] for i in picked]


def hat_basis(knots: Sequence[float], x: np.ndarray) -> np.ndarray:
    """``[len(x), len(knots)]`` weights of piecewise-linear interpolation between ``knots``
    (clamped below the first knot, linear extrapolation beyond the last)."""
    x = np.asarray(x, dtype=np.float64)
    k = np.asarray(knots, dtype=np.float64)
    out = np.zeros((x.shape[0], k.shape[0]))
    if k.shape[0] == 1:
        out[:, 0] = 1.0
        return out
    for r, v in enumerate(x):
        if v <= k[0]:
            out[r, 0] = 1.0
            continue
        i = min(int(np.searchsorted(k, v, side="right")) - 1, k.shape[0] - 2)
        u = (v - k[i]) / (k[i + 1] - k[i])
        out[r, i], out[r, i + 1] = 1.0 - u, u
    return out


def _rel_errors(pred: np.ndarray, t: np.ndarray) -> np.ndarray:
    return (pred - t) / np.maximum(t, 1e-12)


def error_stats(pred: Sequence[float], t: Sequence[float]) -> dict[str, float]:
    """Relative-error summary of predictions against measurements."""
    e = _rel_errors(np.asarray(pred, float), np.asarray(t, float))
    if e.size == 0:
        return {"n": 0}
    a = np.abs(e)
    return {"n": int(e.size), "median_abs_rel_err": float(np.median(a)), "p90_abs_rel_err": float(np.percentile(a, 90)),
            "max_abs_rel_err": float(a.max()), "mean_rel_err": float(e.mean()),
            "total_rel_err": float((np.sum(pred) - np.sum(t)) / max(np.sum(t), 1e-12))}


def column(samples: list[dict], name: str) -> np.ndarray:
    return np.asarray([float(s.get(name, 0)) for s in samples], dtype=np.float64)


def fit_weighted(columns: list[np.ndarray], t: np.ndarray) -> np.ndarray:
    """NNLS of ``t ~ sum_j x_j * columns[j]`` on relative error, with column scaling."""
    A = np.stack(columns, axis=1) / t[:, None]
    scale = np.linalg.norm(A, axis=0)
    scale[scale == 0] = 1.0
    x = nnls(A / scale, np.ones_like(t))
    return x / scale


FLOOR_TERMS = ("base", "per_seq", "per_kv_token", "per_token")


def _fit_max_once(A: np.ndarray, F: np.ndarray, t: np.ndarray, iters: int = 30) -> tuple[np.ndarray, np.ndarray]:
    """Alternating-partition fit of ``t ~ max(F @ xf, A @ xq)`` (max-affine regression)."""
    xq = fit_weighted(list(A.T), t)
    low = t <= np.quantile(t, 0.3)          # start: the fastest steps are the host-bound ones
    xf = fit_weighted(list(F[low].T), t[low])
    obj = lambda xq_, xf_: float(np.sum(((np.maximum(F @ xf_, A @ xq_) - t) / t) ** 2))
    best = (obj(xq, np.zeros_like(xf)), xq, np.zeros_like(xf))
    mask = None
    for _ in range(iters):
        new = F @ xf > A @ xq
        if mask is not None and np.array_equal(new, mask):
            break
        mask = new
        if mask.sum() >= F.shape[1]:
            xf = fit_weighted(list(F[mask].T), t[mask])
        if (~mask).sum() >= 4:
            xq = fit_weighted(list(A[~mask].T), t[~mask])
        o = obj(xq, xf)
        if o < best[0]:
            best = (o, xq, xf)
    return best[1], best[2]


def fit_max(cols: list[np.ndarray], floor_cols: list[np.ndarray], t: np.ndarray,
             folds: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """Fit ``t ~ max(F, Q)`` with ``Q = cols @ x`` (the additive model) and ``F = floor_cols @ xf``
    (a host-bound floor: eager steps of a small model on a GPU take max(CPU time to prepare inputs
    and launch kernels, GPU time), as the GPU runs behind the CPU issuing its kernels), by
    alternating partition: each sample goes to the larger piece, each piece is refitted by NNLS on
    its samples, until the partition is stable. The max form is kept only if it lowers the
    ``folds``-fold cross-validated relative squared error by 10% against the additive fit (on a CPU,
    where nothing overlaps, it rarely does); otherwise ``xf = 0``."""
    A = np.stack(cols, axis=1)
    F = np.stack(floor_cols, axis=1)
    x_add = fit_weighted(cols, t)
    none = np.zeros(F.shape[1])
    if len(t) < 4 * folds + 2 * F.shape[1]:
        return x_add, none
    fold = np.arange(len(t)) % folds
    cv_add = cv_max = 0.0
    for k in range(folds):
        tr, te = fold != k, fold == k
        xa = fit_weighted(list(A[tr].T), t[tr])
        xq, xf = _fit_max_once(A[tr], F[tr], t[tr])
        cv_add += float(np.sum(((A[te] @ xa - t[te]) / t[te]) ** 2))
        cv_max += float(np.sum(((np.maximum(F[te] @ xf, A[te] @ xq) - t[te]) / t[te]) ** 2))
    if cv_max > 0.9 * cv_add:
        return x_add, none
    return _fit_max_once(A, F, t)


#: where ``n_wait`` sits in :data:`HOST_WORK`
_N_WAIT = HOST_WORK.index("n_wait")


#: the host model's terms, in the order :func:`identified_terms` considers them: the per-step queue
#: term (:data:`QUEUE_STEP_TERM`) before the per-request one, so where the rows cannot tell them
#: apart (one request waits at most) the step term takes the weight
HOST_TERMS = ("base", "per_seq", "per_prefill", *HOST_WORK_TERMS[:_N_WAIT], QUEUE_STEP_TERM,
              *HOST_WORK_TERMS[_N_WAIT:])


#: a host term is fitted only if at least this share of its count (the norm of its least-squares
#: residual on the earlier terms' counts, relative to its own norm) is not a linear combination of
#: the earlier terms' counts in the fitted rows
HOST_IDENTIFY_TOL = 0.1


def host_design(rows: Sequence[Sequence[float]]) -> tuple[np.ndarray, np.ndarray]:
    """The host model's design matrix (one column per :data:`HOST_TERMS`) and gaps (seconds) of
    ``[num_seqs, n_pre, gap_s, *HOST_WORK]`` rows; shorter rows (profiles older than fit version 9
    stored fewer counters, before version 8 none) are padded with zeros. The queue-step column is
    ``n_wait > 0``, derived from the row (so rows of every stored version have it)."""
    a = np.asarray([list(r) + [0.0] * (3 + len(HOST_WORK) - len(r)) for r in rows], dtype=np.float64)
    work = a[:, 3:]
    return np.column_stack([np.ones(len(a)), a[:, 0], a[:, 1], work[:, :_N_WAIT], work[:, _N_WAIT] > 0,
                            work[:, _N_WAIT:]]), a[:, 2]


def identified_terms(A: np.ndarray, tol: float = HOST_IDENTIFY_TOL) -> np.ndarray:
    """Which columns of ``A`` the rows identify, taken in order: a column is kept if the part of it
    that the kept earlier columns cannot explain by least squares is at least ``tol`` of its norm
    (an all-zero column never is). Of a group of columns that move together in the data, the first
    is kept and takes the group's weight; the others are not fitted (0), as the data cannot tell
    them apart and a coefficient split between them by the solver would be extrapolated wherever
    they part (fit version 9's profile put the engine runs' admission cost on ``per_waiting``:
    in those runs every waiting request was admitted at once, so n_wait == n_admit == n_pre on
    every step, while under pressure hundreds wait and few are admitted)."""
    keep = np.zeros(A.shape[1], dtype=bool)
    for j in range(A.shape[1]):
        c = A[:, j]
        norm = float(np.linalg.norm(c))
        if norm == 0.0:
            continue
        if keep.any():
            B = A[:, keep]
            r = c - B @ np.linalg.lstsq(B, c, rcond=None)[0]
            if float(np.linalg.norm(r)) < tol * norm:
                continue
        keep[j] = True
    return keep


def unidentified_host_terms(rows: Sequence[Sequence[float]]) -> list[str]:
    """The :data:`HOST_TERMS` that :func:`fit_host` leaves at zero because ``rows`` do not
    identify them (no such work in the rows, or it always moves with an earlier term's)."""
    if len(rows) < 3:
        return list(HOST_TERMS)
    keep = identified_terms(host_design(rows)[0])
    return [k for k, kept in zip(HOST_TERMS, keep) if not kept]


def gap_inliers(residuals: np.ndarray) -> np.ndarray:
    """Which gaps :func:`fit_host` keeps for its refit: those whose residual is at most 5 MADs above
    the median residual (the others are GC pauses, page faults)."""
    med = np.median(residuals)
    return residuals < med + 5 * (np.median(np.abs(residuals - med)) + 1e-9)


def fit_host(rows: Sequence[Sequence[float]], exclude: Sequence[str] = ()) -> dict:
    """The host model from an engine run's gaps: ``gap = h0 + h1 * num_seqs + h2 * n_pre +
    sum(term * count)`` over :data:`HOST_WORK_TERMS` / :data:`HOST_WORK` (admissions, preemptions,
    finishes, queued sequences, prefill tokens of this and the previous step, swapped blocks, swap
    steps) ``+ per_wait_step * [n_wait > 0]`` by NNLS on absolute error over the terms the rows
    identify (:func:`identified_terms`; the others are 0), refitted once without gaps more than 5 MADs above the first fit (GC pauses,
    page faults). A row is ``[num_seqs, n_pre, gap_s, *HOST_WORK]``; shorter rows (profiles older
    than fit version 9 stored fewer counters, before version 8 none) are padded with zeros: the
    terms they lack fit as zero. ``exclude``: :data:`HOST_TERMS` held at 0 (a study of what a term
    buys: ``exclude=("per_wait_step",)`` fits the host model as fit version 10 had it)."""
    unknown = set(exclude) - set(HOST_TERMS)
    if unknown:
        raise ValueError(f"fit_host: unknown host term(s) {sorted(unknown)} (terms: {', '.join(HOST_TERMS)})")
    if len(rows) < 3:
        return dict.fromkeys(HOST_TERMS, 0.0)
    A, y = host_design(rows)
    A[:, [HOST_TERMS.index(k) for k in exclude]] = 0.0     # an all-zero column is never identified
    keep = identified_terms(A)
    x = np.zeros(A.shape[1])
    x[keep] = nnls(A[:, keep], y)
    ok = gap_inliers(y - A @ x)
    if ok.sum() >= 3:
        x[keep] = nnls(A[ok][:, keep], y[ok])
    return {k: float(v) for k, v in zip(HOST_TERMS, x)}
