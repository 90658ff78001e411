"""Step-time profiles: live step times measured per (GPU, model shape), and the fitted step-time
model the sim uses instead of its roofline when a profile matches.

A profile is one JSON file (format ``kvrl-step-profile``, written by ``kvrl-profile``)::

    {"format": "kvrl-step-profile", "version": 1,
     "key":     {"device": "h200", "gpu_name": "NVIDIA H200", "num_layers": 28, "hidden_size": 1024,
                 "num_heads": 16, "num_kv_heads": 8, "head_dim": 128, "intermediate_size": 3072,
                 "vocab_size": 151936, "dtype": "bfloat16", "dtype_bytes": 2},
     "meta":    {block_size, cuda_graphs, graph_batch_sizes, torch/triton versions, host, created, ...},
     "samples": [{"group": "decode", "graph": true, <features>, "t": median s, "t_p10", "t_p90", "reps"}, ...],
     "host_samples": [[num_seqs, num_prefill_seqs, gap_s], ...],
     "engine_samples": [{"group": "engine", "graph": ..., <features>, "t": s}, ...],   # an engine run's steps
     "model":   StepModel.to_dict(),            # coefficients fitted from the samples
     "fit":     {"grid": {...}, "holdout": {...}, "host": {...}}}   # errors of the fit

The sim matches a profile on ``key``: the device name of its :class:`DeviceSpec` (``h200``,
``h100``, ``a100``, ``cpu`` or the slug of another GPU's name) and the model shape (layers,
hidden, heads, kv heads, head dim, intermediate, vocab, dtype width). See docs/fidelity.md.

Features of a step (:data:`FEATURES`), all computed from the :class:`ScheduledBatch` alone:
``n_pre`` prefill items (more than one query token), ``pre_tok`` their query tokens,
``pre_pairs`` their causal (query, key) pairs, ``pre_ctx`` the KV tokens they attend over,
``pre_max_ctx`` the longest of those contexts (prefill attention runs one program per query tile
and head, which walks its whole context: with few tiles the longest context is the critical path),
``n_dec`` decode items (one query token), ``dec_kv`` the KV tokens they read, ``dec_max`` the
longest decode context, ``dec_shared`` how many of ``dec_kv`` come from a prefix-cache hit (blocks
other sequences read too: served from L2 more often than from HBM), ``rows`` items that sample
(LM-head rows), ``copies``, ``swap_out`` and ``swap_in`` block counts.

The model (:class:`StepModel`), all terms non-negative, fitted by non-negative least squares on
relative error, prices the compute stream of a step::

    t = host(S, n_pre) + fwd + copy(copies) + swap_out(n) + swap_in(n)

    fwd (CUDA-graph decode) = G(Bpad) + a(B) * (dec_kv - dec_shared) + s * dec_shared + m(B) * B * dec_max
    fwd (eager)             = D(N) + a_e(B) * (dec_kv - dec_shared) + s_e * dec_shared + m_e(B) * B * dec_max
                              + c_pairs * pre_pairs + c_ctx * pre_ctx + c_pre * n_pre + c_dec * B
                              + c_has_pre * [n_pre > 0] + c_has_dec * [B > 0] + c_rows * rows

with ``B = n_dec``, ``Bpad`` the captured graph size that serves B, ``N = pre_tok + n_dec``
padded to the token bucket of the live executor's piecewise graphs when the profile had them
(``token_sizes``; see :mod:`kvrl.executors.piecewise`);
``G, a, m, D, a_e, m_e`` piecewise linear between measured knots (linear "hat" bases, so the
fit stays one linear least-squares problem); block operations ``c0 * [n > 0] + c1 * n``, for swaps
the part on the compute stream (gather / launching the copies); ``host`` the engine's own Python
time between steps (live ``elapsed_s`` counts it), ``h0 + h1 * S + h2 * n_pre``.

Swap transfers run on the live executor's swap stream, overlapping compute: their durations
``swap_out_xfer(n)`` and ``swap_in_xfer(n)`` (same linear form) drive the sim's
:class:`~kvrl.executors.sim.SwapStream`, which makes a step wait for the swap-ins issued before it.
Profiles of fit version 4 (synchronous swaps, before the swap stream) are refitted from their
samples when loaded: with no transfer timings, their swap terms become transfer times and the
compute-stream parts zero.
"""
from __future__ import annotations

import bisect
import json
import logging
import math
import os
import re
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence, Union

import numpy as np

from kvrl.executors.hardware import DeviceSpec, ModelShape

log = logging.getLogger(__name__)

FORMAT = "kvrl-step-profile"
VERSION = 1
FIT_VERSION = 8
#: stored models of these fit versions load as they are (version 5 lacks ``pre_max_ctx`` and
#: ``token_sizes``, versions 5-6 lack the ``dec_shared`` terms: those then price as zero / no
#: padding / as private KV tokens, and the old predictions are unchanged)
LOADABLE_FIT_VERSIONS = (5, 6, 7, 8)
FEATURES = ("n_pre", "pre_tok", "pre_pairs", "pre_ctx", "pre_max_ctx", "n_dec", "dec_kv", "dec_max", "dec_shared",
            "rows", "copies", "swap_out", "swap_in")
#: the features of the forward pass (the arguments of :meth:`StepModel.forward_s`)
FORWARD_FEATURES = FEATURES[:10]
#: what the engine did on the host around a step (the :class:`~kvrl.engine.batch.ScheduledBatch`
#: counters): priced by the host model, not the forward pass
HOST_WORK = ("n_admit", "n_preempt", "n_finish", "n_wait", "pre_tok")
HOST_WORK_TERMS = ("per_admit", "per_preempt", "per_finish", "per_waiting", "per_prefill_token")
#: where ``profile: auto`` looks: the profiles shipped with kvrl, then ``$KVRL_PROFILE_PATH``
#: (directories or files, separated by ``os.pathsep``).
PACKAGED_DIR = Path(__file__).parent / "profiles"
ENV_PATH = "KVRL_PROFILE_PATH"
SHAPE_FIELDS = ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "intermediate_size",
                "vocab_size", "dtype_bytes")


class ProfileError(ValueError):
    """A profile file that cannot be used (wrong format, missing fields)."""


# ============================================================================ keys
def device_key(name: str) -> str:
    """Normalised device name: ``h200``/``h100``/``a100`` for those GPUs (as the live executor's
    :func:`_device_spec` maps them), ``cpu``, or a slug of any other name."""
    low = name.lower()
    for key in ("h200", "h100", "a100"):
        if key in low:
            return key
    if low in ("cpu", "") or low.startswith("cpu"):
        return "cpu"
    return re.sub(r"[^a-z0-9]+", "-", low).strip("-")


@dataclass(frozen=True)
class ProfileKey:
    """What a profile is valid for: a device and a model shape."""

    device: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    dtype_bytes: int

    @classmethod
    def of(cls, shape: ModelShape, device: Union[DeviceSpec, str]) -> "ProfileKey":
        name = device.name if isinstance(device, DeviceSpec) else device
        return cls(device_key(name), *(int(getattr(shape, f)) for f in SHAPE_FIELDS))

    @classmethod
    def from_dict(cls, d: dict) -> "ProfileKey":
        try:
            return cls(device_key(str(d["device"])), *(int(d[f]) for f in SHAPE_FIELDS))
        except KeyError as exc:
            raise ProfileError(f"profile key lacks {exc.args[0]!r}") from None

    def describe(self) -> str:
        return (f"device={self.device} layers={self.num_layers} hidden={self.hidden_size} heads={self.num_heads}/"
                f"{self.num_kv_heads}x{self.head_dim} inter={self.intermediate_size} vocab={self.vocab_size} "
                f"dtype_bytes={self.dtype_bytes}")

    def mismatch(self, other: "ProfileKey") -> list[str]:
        """Fields that differ, as ``name: mine != theirs``."""
        return [f"{k}: {v} != {getattr(other, k)}" for k, v in asdict(self).items() if getattr(other, k) != v]


# ============================================================================ features
def batch_features(batch) -> dict[str, int]:
    """The :data:`FEATURES` of a :class:`~kvrl.engine.batch.ScheduledBatch`."""
    f = dict.fromkeys(FEATURES, 0)
    for item in batch.seqs:
        k, start = item.num_tokens, item.start
        if k == 1:
            f["n_dec"] += 1
            f["dec_kv"] += start + 1
            f["dec_max"] = max(f["dec_max"], start + 1)
            f["dec_shared"] += min(item.seq.shared_prefix_tokens, start + 1)
        else:
            f["n_pre"] += 1
            f["pre_tok"] += k
            f["pre_pairs"] += k * start + k * (k + 1) // 2
            f["pre_ctx"] += start + k
            f["pre_max_ctx"] = max(f["pre_max_ctx"], start + k)
        if item.num_samples:
            f["rows"] += 1
    f["copies"], f["swap_out"], f["swap_in"] = len(batch.copies), len(batch.swap_out), len(batch.swap_in)
    return f


def host_work(batch) -> dict[str, int]:
    """The :data:`HOST_WORK` counters of a :class:`~kvrl.engine.batch.ScheduledBatch` (``pre_tok``,
    the prefill tokens whose full blocks the engine hashes after the step, as in :func:`batch_features`)."""
    return {"n_admit": batch.num_admitted, "n_preempt": batch.num_preempted, "n_finish": batch.num_finished,
            "n_wait": batch.num_waiting, "pre_tok": sum(s.num_tokens for s in batch.seqs if s.num_tokens > 1)}


# ============================================================================ fitting helpers
def nnls(A: np.ndarray, b: np.ndarray, max_iter: Optional[int] = None) -> np.ndarray:
    """Non-negative least squares ``argmin ||A x - b||, x >= 0`` (Lawson-Hanson active set).

    Kept here (numpy only) so profiling needs no scipy on the GPU machine."""
    A = np.asarray(A, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    m, n = A.shape
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    w = A.T @ (b - A @ x)
    tol = 10 * np.finfo(float).eps * max(m, n) * max(np.abs(A).sum(axis=0).max(initial=0.0), 1e-300)
    max_iter = max_iter or 3 * n + 10
    for _ in range(max_iter):
        free = ~passive
        if not free.any() or w[free].max() <= tol:
            break
        j = int(np.argmax(np.where(free, w, -np.inf)))
        passive[j] = True
        while True:
            s = np.zeros(n)
            s[passive] = np.linalg.lstsq(A[:, passive], b, rcond=None)[0]
            if s[passive].min() > 0:
                break
            neg = passive & (s <= 0)
            alpha = np.min(x[neg] / np.maximum(x[neg] - s[neg], 1e-300))
            x = x + alpha * (s - x)
            passive &= x > tol
            x[~passive] = 0.0
            if not passive.any():
                s = np.zeros(n)
                break
        x = s
        w = A.T @ (b - A @ x)
    return np.maximum(x, 0.0)


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


class Linear1D:
    """Piecewise-linear function through ``(knots, values)``: clamped below the first knot,
    extrapolated beyond the last with the last segment's slope (floored at 0). Pure Python, for
    the sim's hot path."""

    __slots__ = ("knots", "values", "_last_slope")

    def __init__(self, knots: Sequence[float], values: Sequence[float]) -> None:
        if len(knots) != len(values) or not knots:
            raise ProfileError("piecewise-linear term needs as many values as knots (at least one)")
        self.knots = [float(k) for k in knots]
        self.values = [float(v) for v in values]
        self._last_slope = 0.0
        if len(knots) > 1:
            dk = self.knots[-1] - self.knots[-2]
            self._last_slope = max((self.values[-1] - self.values[-2]) / dk, 0.0) if dk > 0 else 0.0

    def __call__(self, x: float) -> float:
        k = self.knots
        if x <= k[0]:
            return self.values[0]
        if x >= k[-1]:
            return self.values[-1] + self._last_slope * (x - k[-1])
        i = bisect.bisect_right(k, x) - 1
        u = (x - k[i]) / (k[i + 1] - k[i])
        return self.values[i] + u * (self.values[i + 1] - self.values[i])

    def to_dict(self) -> dict:
        return {"knots": self.knots, "values": self.values}

    @classmethod
    def from_dict(cls, d: dict) -> "Linear1D":
        return cls(d["knots"], d["values"])


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


# ============================================================================ the model
def _col(samples: list[dict], name: str) -> np.ndarray:
    return np.asarray([float(s.get(name, 0)) for s in samples], dtype=np.float64)


def _fit_weighted(columns: list[np.ndarray], t: np.ndarray) -> np.ndarray:
    """NNLS of ``t ~ sum_j x_j * columns[j]`` on relative error, with column scaling."""
    A = np.stack(columns, axis=1) / t[:, None]
    scale = np.linalg.norm(A, axis=0)
    scale[scale == 0] = 1.0
    x = nnls(A / scale, np.ones_like(t))
    return x / scale


FLOOR_TERMS = ("base", "per_seq", "per_kv_token", "per_token")


def _fit_max_once(A: np.ndarray, F: np.ndarray, t: np.ndarray, iters: int = 30) -> tuple[np.ndarray, np.ndarray]:
    """Alternating-partition fit of ``t ~ max(F @ xf, A @ xq)`` (max-affine regression)."""
    xq = _fit_weighted(list(A.T), t)
    low = t <= np.quantile(t, 0.3)          # start: the fastest steps are the host-bound ones
    xf = _fit_weighted(list(F[low].T), t[low])
    obj = lambda xq_, xf_: float(np.sum(((np.maximum(F @ xf_, A @ xq_) - t) / t) ** 2))
    best = (obj(xq, np.zeros_like(xf)), xq, np.zeros_like(xf))
    mask = None
    for _ in range(iters):
        new = F @ xf > A @ xq
        if mask is not None and np.array_equal(new, mask):
            break
        mask = new
        if mask.sum() >= F.shape[1]:
            xf = _fit_weighted(list(F[mask].T), t[mask])
        if (~mask).sum() >= 4:
            xq = _fit_weighted(list(A[~mask].T), t[~mask])
        o = obj(xq, xf)
        if o < best[0]:
            best = (o, xq, xf)
    return best[1], best[2]


def _fit_max(cols: list[np.ndarray], floor_cols: list[np.ndarray], t: np.ndarray,
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
    x_add = _fit_weighted(cols, t)
    none = np.zeros(F.shape[1])
    if len(t) < 4 * folds + 2 * F.shape[1]:
        return x_add, none
    fold = np.arange(len(t)) % folds
    cv_add = cv_max = 0.0
    for k in range(folds):
        tr, te = fold != k, fold == k
        xa = _fit_weighted(list(A[tr].T), t[tr])
        xq, xf = _fit_max_once(A[tr], F[tr], t[tr])
        cv_add += float(np.sum(((A[te] @ xa - t[te]) / t[te]) ** 2))
        cv_max += float(np.sum(((np.maximum(F[te] @ xf, A[te] @ xq) - t[te]) / t[te]) ** 2))
    if cv_max > 0.9 * cv_add:
        return x_add, none
    return _fit_max_once(A, F, t)


@dataclass
class _LinearOp:
    """``c0 * [n > 0] + c1 * n`` seconds for a block operation of ``n`` blocks."""

    c0: float = 0.0
    c1: float = 0.0

    def __call__(self, n: int) -> float:
        return self.c0 + self.c1 * n if n > 0 else 0.0


class StepModel:
    """The fitted step-time model (see the module doc). :meth:`predict` is pure Python."""

    #: block operations: ``copy``, the compute-stream parts of ``swap_out`` / ``swap_in``, and the
    #: swap-stream transfers ``swap_out_xfer`` / ``swap_in_xfer``; each ``[c0, c1]`` seconds
    OPS = ("copy", "swap_out", "swap_in", "swap_out_xfer", "swap_in_xfer")

    def __init__(self, graph_sizes: Sequence[int], graph: Optional[dict], eager: dict, ops: dict,
                 host: dict, engine_factor: Optional[dict] = None, token_sizes: Sequence[int] = ()) -> None:
        self.graph_sizes = sorted(int(b) for b in graph_sizes)
        self.max_graph = self.graph_sizes[-1] if self.graph_sizes else 0
        #: token buckets of the live executor's piecewise graphs: a non-graph step of N tokens
        #: costs the dense work of the bucket it is padded to (empty: none, N as is)
        self.token_sizes = sorted(int(t) for t in token_sizes)
        self.graph = graph
        self.eager = eager
        self.ops = ops
        self.host = host
        #: forward passes inside an engine run vs the same shapes timed by the grid (see fit_engine_factor)
        self.engine_factor = dict(engine_factor or {"graph": 1.0, "eager": 1.0})
        self._build()

    def _build(self) -> None:
        g = self.graph
        self._g_floor, self._g_has_floor = (0.0, 0.0, 0.0, 0.0), False
        if g is not None:
            self._g_base, self._g_kv, self._g_kvmax = (Linear1D.from_dict(g[k]) for k in ("base", "kv", "kvmax"))
            self._g_shared = float(g.get("shared", 0.0))
            f = g.get("floor") or dict.fromkeys(FLOOR_TERMS, 0.0)
            self._g_floor = tuple(float(f[k]) for k in FLOOR_TERMS)
            self._g_has_floor = any(self._g_floor)
        e = self.eager
        self._e_dense, self._e_kv, self._e_kvmax = (Linear1D.from_dict(e[k]) for k in ("dense", "kv", "kvmax"))
        c = e["coef"]
        self._e_shared = float(c.get("dec_shared", 0.0))
        self._c = (c["pre_pairs"], c["pre_ctx"], c.get("pre_max_ctx", 0.0), c["n_pre"], c["has_pre"], c["has_dec"],
                   c["rows"], c["n_dec"])
        f = e.get("floor") or dict.fromkeys(FLOOR_TERMS, 0.0)
        self._floor = tuple(float(f[k]) for k in FLOOR_TERMS)
        self._has_floor = any(self._floor)
        self._copy, self._swap_out, self._swap_in, self.swap_out_xfer, self.swap_in_xfer = (
            _LinearOp(*self.ops[k]) for k in self.OPS)
        h = self.host
        self._h = (h["base"], h["per_seq"], h["per_prefill"])
        #: host work around a step (fit version 8; older profiles price it as zero)
        self._hw = tuple(float(h.get(k, 0.0)) for k in HOST_WORK_TERMS)
        self._k_graph, self._k_eager = float(self.engine_factor["graph"]), float(self.engine_factor["eager"])

    # ------------------------------------------------------------------ prediction
    def pad(self, b: int) -> int:
        """The captured graph size that serves a decode batch of ``b`` (0 if none)."""
        sizes = self.graph_sizes
        i = bisect.bisect_left(sizes, b)
        return sizes[i] if i < len(sizes) else 0

    def pad_tokens(self, n: int) -> int:
        """Tokens a non-graph step of ``n`` tokens computes: its piecewise bucket, or ``n`` (none
        holds it, or the profile's executor had no piecewise graphs). A profile describes the
        executor it measured: a sim asked for ``cuda_graphs=False`` still pads when its profile did."""
        if not self.token_sizes:
            return n
        sizes = self.token_sizes
        i = bisect.bisect_left(sizes, n)
        return sizes[i] if i < len(sizes) else n

    def uses_graph(self, n_pre: int, n_dec: int, cuda_graphs: bool = True) -> bool:
        return cuda_graphs and self.graph is not None and n_pre == 0 and 0 < n_dec <= self.max_graph

    def forward_s(self, n_pre: int, pre_tok: int, pre_pairs: int, pre_ctx: int, pre_max_ctx: int, n_dec: int,
                  dec_kv: int, dec_max: int, dec_shared: int, rows: int, cuda_graphs: bool = True) -> float:
        """Seconds of the forward pass and sampling (no block operations, no host overhead)."""
        if n_pre == 0 and n_dec == 0:
            return 0.0
        if cuda_graphs and self.graph is not None and n_pre == 0 and n_dec <= self.max_graph:
            b = n_dec
            t = (self._g_base(self.pad(b)) + self._g_kv(b) * (dec_kv - dec_shared) + self._g_shared * dec_shared
                 + self._g_kvmax(b) * b * dec_max)
            if self._g_has_floor:
                f0, f_seq, f_kv, f_tok = self._g_floor
                floor = f0 + (f_seq + f_tok) * b + f_kv * dec_kv
                if floor > t:
                    t = floor
            return self._k_graph * t
        b = n_dec
        c_pairs, c_ctx, c_max_ctx, c_pre, c_has_pre, c_has_dec, c_rows, c_dec = self._c
        n = self.pad_tokens(pre_tok + b)
        t = (self._e_dense(n) + c_pairs * pre_pairs + c_ctx * pre_ctx + c_max_ctx * pre_max_ctx + c_pre * n_pre
             + c_rows * rows)
        if n_pre:
            t += c_has_pre
        if b:
            t += (c_has_dec + c_dec * b + self._e_kv(b) * (dec_kv - dec_shared) + self._e_shared * dec_shared
                  + self._e_kvmax(b) * b * dec_max)
        if self._has_floor:
            f0, f_seq, f_kv, f_tok = self._floor
            floor = f0 + f_seq * (n_pre + b) + f_kv * (dec_kv + pre_ctx) + f_tok * n
            if floor > t:
                t = floor
        return self._k_eager * t

    def host_s(self, num_seqs: int, n_pre: int, n_admit: int = 0, n_preempt: int = 0, n_finish: int = 0,
               n_wait: int = 0, pre_tok: int = 0) -> float:
        """Seconds of the engine's own Python between two steps: per scheduled sequence, per
        prefill sequence, and per unit of host work (:data:`HOST_WORK`: admissions, preemptions,
        finishes, queued sequences, prefill tokens)."""
        h0, h1, h2 = self._h
        return h0 + h1 * num_seqs + h2 * n_pre + self.host_work_s(n_admit, n_preempt, n_finish, n_wait, pre_tok)

    def host_work_s(self, n_admit: int, n_preempt: int, n_finish: int, n_wait: int, pre_tok: int) -> float:
        """The part of :meth:`host_s` that depends on what the engine did around the step."""
        a, p, f, w, t = self._hw
        return a * n_admit + p * n_preempt + f * n_finish + w * n_wait + t * pre_tok

    def predict(self, n_pre: int, pre_tok: int, pre_pairs: int, pre_ctx: int, pre_max_ctx: int, n_dec: int,
                dec_kv: int, dec_max: int, dec_shared: int, rows: int, copies: int = 0, swap_out: int = 0,
                swap_in: int = 0, cuda_graphs: bool = True, host: bool = True) -> float:
        """Seconds of one engine step's compute stream as the live executor reports it when no
        swap-in delays it (``host`` adds the engine's own time between steps, which live
        ``elapsed_s`` includes). The sim's hot path: a few microseconds, block-operation terms
        inlined."""
        if n_pre == 0 and n_dec == 0:
            t = 0.0
        else:
            t = self.forward_s(n_pre, pre_tok, pre_pairs, pre_ctx, pre_max_ctx, n_dec, dec_kv, dec_max, dec_shared,
                               rows, cuda_graphs)
            if host:
                h0, h1, h2 = self._h
                t += h0 + h1 * (n_pre + n_dec) + h2 * n_pre
        if copies:
            t += self._copy.c0 + self._copy.c1 * copies
        if swap_out:
            t += self._swap_out.c0 + self._swap_out.c1 * swap_out
        if swap_in:
            t += self._swap_in.c0 + self._swap_in.c1 * swap_in
        return t

    def predict_features(self, f: dict, cuda_graphs: bool = True, host: bool = False) -> float:
        """:meth:`predict` of a feature dict; with ``host``, also the :data:`HOST_WORK` terms of
        the keys ``f`` has."""
        t = self.predict(*(int(f.get(k, 0)) for k in FEATURES), cuda_graphs=cuda_graphs, host=host)
        if host and (f.get("n_pre") or f.get("n_dec")):
            t += self.host_work_s(*(int(f.get(k, 0)) for k in HOST_WORK))
        return t

    def swap_s(self, num_blocks: int) -> float:
        """One-way transfer seconds for ``num_blocks`` blocks (mean of swap-out and swap-in)."""
        return 0.5 * (self.swap_out_xfer(num_blocks) + self.swap_in_xfer(num_blocks))

    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> dict:
        return {"fit_version": FIT_VERSION, "graph_sizes": self.graph_sizes, "graph": self.graph,
                "eager": self.eager, "ops": self.ops, "host": self.host, "engine_factor": self.engine_factor,
                "token_sizes": self.token_sizes}

    @classmethod
    def from_dict(cls, d: dict) -> "StepModel":
        try:
            return cls(d["graph_sizes"], d["graph"], d["eager"], d["ops"], d["host"], d.get("engine_factor"),
                       d.get("token_sizes", ()))
        except (KeyError, TypeError) as exc:
            raise ProfileError(f"profile model is incomplete: {exc}") from None

    # ------------------------------------------------------------------ fitting
    @classmethod
    def fit(cls, samples: list[dict], graph_sizes: Sequence[int] = (),
            host_samples: Sequence[Sequence[float]] = (), max_knots: int = 10,
            token_sizes: Sequence[int] = ()) -> "StepModel":
        """Fit every term from measured samples (dicts of :data:`FEATURES` plus ``graph`` (bool,
        the live executor used a CUDA graph) and ``t`` (median seconds of ``execute``)).

        Samples flagged ``holdout`` are ignored. ``host_samples`` are ``(num_seqs, n_pre, gap_s)``
        rows from an engine run (the time between two ``execute`` calls)."""
        use = [s for s in samples if not s.get("holdout")]
        fwd_only = [s for s in use if not (s.get("copies") or s.get("swap_out") or s.get("swap_in"))
                    and (s.get("n_pre") or s.get("n_dec"))]
        graph_s = [s for s in fwd_only if s.get("graph")]
        eager_s = [s for s in fwd_only if not s.get("graph")]
        if not eager_s:
            raise ProfileError("no eager forward samples to fit")

        graph = None
        if graph_s:
            b = _col(graph_s, "n_dec")
            sizes = sorted(graph_sizes) if graph_sizes else sorted(set(b.astype(int)))
            pad = np.asarray([next((g for g in sizes if g >= v), v) for v in b])
            knots_pad = choose_knots(pad, max_knots)
            knots_b = choose_knots(b, max_knots)
            hb = hat_basis(knots_b, b)
            kv, kvmax, shared = _col(graph_s, "dec_kv"), b * _col(graph_s, "dec_max"), _col(graph_s, "dec_shared")
            cols = [*hat_basis(knots_pad, pad).T, *(hb * (kv - shared)[:, None]).T, *(hb * kvmax[:, None]).T, shared]
            x, xf = _fit_max(cols, [np.ones_like(b), b, kv, np.zeros_like(b)], _col(graph_s, "t"))
            p, q = len(knots_pad), len(knots_b)
            graph = {"base": {"knots": knots_pad, "values": x[:p].tolist()},
                     "kv": {"knots": knots_b, "values": x[p:p + q].tolist()},
                     "kvmax": {"knots": knots_b, "values": x[p + q:p + 2 * q].tolist()},
                     "shared": float(x[p + 2 * q]),
                     "floor": dict(zip(FLOOR_TERMS, xf.tolist()))}

        sizes = sorted(token_sizes)
        n = np.asarray([next((t for t in sizes if t >= v), v) for v in
                        (_col(eager_s, "pre_tok") + _col(eager_s, "n_dec")).astype(int)], dtype=float)
        b = _col(eager_s, "n_dec")
        knots_n = choose_knots(n, max_knots)
        knots_b = choose_knots(b, max_knots) or [1.0]
        hb = hat_basis(knots_b, np.maximum(b, 1.0))
        kv, kvmax, shared = _col(eager_s, "dec_kv"), b * _col(eager_s, "dec_max"), _col(eager_s, "dec_shared")
        names = ("pre_pairs", "pre_ctx", "pre_max_ctx", "n_pre", "has_pre", "has_dec", "rows", "n_dec", "dec_shared")
        extra = [_col(eager_s, "pre_pairs"), _col(eager_s, "pre_ctx"), _col(eager_s, "pre_max_ctx"), _col(eager_s, "n_pre"),
                 (_col(eager_s, "n_pre") > 0).astype(float), (b > 0).astype(float), _col(eager_s, "rows"), b, shared]
        cols = [*hat_basis(knots_n, n).T, *(hb * (kv - shared)[:, None]).T, *(hb * kvmax[:, None]).T, *extra]
        floor_cols = [np.ones_like(n), b + _col(eager_s, "n_pre"), kv + _col(eager_s, "pre_ctx"), n]
        x, xf = _fit_max(cols, floor_cols, _col(eager_s, "t"))
        p, q = len(knots_n), len(knots_b)
        eager = {"dense": {"knots": knots_n, "values": x[:p].tolist()},
                 "kv": {"knots": knots_b, "values": x[p:p + q].tolist()},
                 "kvmax": {"knots": knots_b, "values": x[p + q:p + 2 * q].tolist()},
                 "coef": dict(zip(names, x[p + 2 * q:].tolist())),
                 "floor": dict(zip(FLOOR_TERMS, xf.tolist()))}

        ops = {}
        for op in ("copies", "swap_out", "swap_in"):
            only = [s for s in use if s.get(op) and not (s.get("n_pre") or s.get("n_dec"))
                    and all(not s.get(o) for o in ("copies", "swap_out", "swap_in") if o != op)]
            key = "copy" if op == "copies" else op
            nb = _col(only, op)
            ops[key] = _fit_weighted([np.ones_like(nb), nb], _col(only, "t")).tolist() if only else [0.0, 0.0]
            if op != "copies":   # the swap stream's transfer time, measured up to its completion
                xfer = [s for s in only if s.get("t_xfer")]
                nb = _col(xfer, op)
                if xfer:
                    ops[op + "_xfer"] = _fit_weighted([np.ones_like(nb), nb], _col(xfer, "t_xfer")).tolist()
                else:   # samples of a synchronous swap path (fit version 4): all of it is transfer
                    ops[op + "_xfer"], ops[key] = ops[key], [0.0, 0.0]
        model = cls(graph_sizes if graph is not None else [], graph, eager, ops,
                    {"base": 0.0, "per_seq": 0.0, "per_prefill": 0.0}, token_sizes=sizes)
        model.host = fit_host(host_samples)
        model._build()
        return model


def fit_engine_factor(model: StepModel, samples: Sequence[dict], min_rows: int = 20) -> dict:
    """Per forward kind (CUDA-graph decode, eager), the median ratio of the time ``execute`` took
    inside an engine run to the model's prediction for the same step (steps without block
    operations; ``samples`` have the :data:`FEATURES`, ``t`` seconds and ``graph``). The grid times each shape in
    rounds of the same points; inside an engine a step follows steps of other shapes and the
    engine's Python, which measured up to ~10% slower for eager steps on an H200. 1.0 with fewer
    than ``min_rows`` steps of a kind."""
    factor = {"graph": 1.0, "eager": 1.0}
    for kind, want_graph in (("graph", True), ("eager", False)):
        ratios = [s["t"] / model.forward_s(*(int(s.get(k, 0)) for k in FORWARD_FEATURES), cuda_graphs=bool(s["graph"]))
                  for s in samples if bool(s["graph"]) == want_graph and (s.get("n_pre") or s.get("n_dec"))
                  and not (s.get("copies") or s.get("swap_out") or s.get("swap_in"))]
        ratios = [r for r in ratios if math.isfinite(r) and r > 0]
        if len(ratios) >= min_rows:
            factor[kind] = float(np.median(ratios))
    return factor


def fit_model(samples: list, engine_samples: list, host_samples: Sequence, meta: dict) -> StepModel:
    """The step model of a profile's samples: :meth:`StepModel.fit` over the grid and engine-run
    samples, then :func:`fit_engine_factor` over the engine run's."""
    model = StepModel.fit(samples + engine_samples, meta.get("graph_batch_sizes", ()), host_samples,
                          token_sizes=meta.get("piecewise_token_sizes", ()))
    model.engine_factor = fit_engine_factor(model, engine_samples)
    model._build()
    return model


def fit_host(rows: Sequence[Sequence[float]]) -> dict:
    """The host model from an engine run's gaps: ``gap = h0 + h1 * num_seqs + h2 * n_pre +
    per_admit * n_admit + per_preempt * n_preempt + per_finish * n_finish + per_waiting * n_wait``
    by NNLS on absolute error, refitted once without gaps more than 5 MADs above the first fit
    (GC pauses, page faults). A row is ``[num_seqs, n_pre, gap_s, *HOST_WORK]``; rows of profiles
    older than fit version 8 have only the first three (their host-work terms fit as zero)."""
    names = ("base", "per_seq", "per_prefill", *HOST_WORK_TERMS)
    if len(rows) < 3:
        return dict.fromkeys(names, 0.0)
    a = np.asarray([list(r) + [0.0] * (3 + len(HOST_WORK) - len(r)) for r in rows], dtype=np.float64)
    A = np.column_stack([np.ones(len(a)), a[:, 0], a[:, 1], a[:, 3:]])
    y = a[:, 2]
    x = nnls(A, y)
    r = y - A @ x
    mad = np.median(np.abs(r - np.median(r))) + 1e-9
    keep = r < np.median(r) + 5 * mad
    if keep.sum() >= 3:
        x = nnls(A[keep], y[keep])
    return {k: float(v) for k, v in zip(names, x)}


# ============================================================================ profiles
@dataclass
class StepProfile:
    """A loaded profile: its key, metadata, samples and fitted model."""

    key: ProfileKey
    model: StepModel
    meta: dict
    samples: list
    host_samples: list
    fit_report: dict
    raw_key: dict
    path: Optional[str] = None
    engine_samples: list = field(default_factory=list)   # the engine run's steps (engine_factor)

    def matches(self, shape: ModelShape, device: Union[DeviceSpec, str]) -> bool:
        return ProfileKey.of(shape, device) == self.key

    def describe(self) -> str:
        ho = self.fit_report.get("holdout", {})
        err = f", held-out median error {ho['median_abs_rel_err']:.1%}" if ho.get("n") else ""
        return f"{self.path or '<in memory>'} ({self.raw_key.get('gpu_name', self.key.device)}{err})"

    def to_dict(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "key": self.raw_key, "meta": self.meta,
                "samples": self.samples, "host_samples": self.host_samples, "engine_samples": self.engine_samples,
                "model": self.model.to_dict(), "fit": self.fit_report}

    def save(self, path: Union[str, os.PathLike]) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(_round_floats(self.to_dict()), separators=(",", ":")))
        os.replace(tmp, path)
        self.path = str(path)

    @classmethod
    def from_dict(cls, d: dict, path: Optional[str] = None) -> "StepProfile":
        if d.get("format") != FORMAT:
            raise ProfileError(f"{path or 'profile'}: not a {FORMAT} file (format={d.get('format')!r})")
        if int(d.get("version", 0)) > VERSION:
            raise ProfileError(f"{path or 'profile'}: version {d.get('version')} is newer than this kvrl ({VERSION})")
        raw_key = dict(d["key"])
        model_d = d.get("model")
        if model_d is None or int(model_d.get("fit_version", 0)) not in LOADABLE_FIT_VERSIONS:
            model = fit_model(d["samples"], d.get("engine_samples", []), d.get("host_samples", ()), d.get("meta", {}))
        else:
            model = StepModel.from_dict(model_d)
        return cls(ProfileKey.from_dict(raw_key), model, d.get("meta", {}), d.get("samples", []),
                   d.get("host_samples", []), d.get("fit", {}), raw_key, path, d.get("engine_samples", []))

    def refitted(self) -> "StepProfile":
        """This profile with its model fitted again from its samples by this kvrl's fitting code."""
        model = fit_model(self.samples, self.engine_samples, self.host_samples, self.meta)
        return replace(self, model=model, path=f"{self.path} (refitted)" if self.path else None)

    @classmethod
    def load(cls, path: Union[str, os.PathLike]) -> "StepProfile":
        path = os.fspath(path)
        try:
            with open(path) as f:
                data = json.load(f)
        except FileNotFoundError:
            raise ProfileError(f"profile file {path!r} does not exist (profile=auto|none|<path>)") from None
        except json.JSONDecodeError as exc:
            raise ProfileError(f"{path}: not valid JSON ({exc})") from None
        return cls.from_dict(data, path)


def _round_floats(x: Any, digits: int = 6) -> Any:
    """Round floats to ``digits`` significant digits (keeps profile files small)."""
    if isinstance(x, float):
        return float(f"{x:.{digits}g}") if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _round_floats(v, digits) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_round_floats(v, digits) for v in x]
    return x


# ============================================================================ lookup
_INDEX: Optional[list[tuple[str, ProfileKey, float, int]]] = None
_LOADED: dict[str, StepProfile] = {}


def clear_cache() -> None:
    """Forget the scanned profile directories and loaded profiles (tests; new files)."""
    global _INDEX
    _INDEX = None
    _LOADED.clear()


def search_paths() -> list[Path]:
    paths = [PACKAGED_DIR]
    for p in os.environ.get(ENV_PATH, "").split(os.pathsep):
        if p:
            paths.append(Path(p).expanduser())
    return paths


def _index() -> list[tuple[str, ProfileKey, float, int]]:
    """(path, key, created, block_size) of every readable profile on the search paths."""
    global _INDEX
    if _INDEX is None:
        found = []
        for root in search_paths():
            files = sorted(root.glob("*.json")) if root.is_dir() else ([root] if root.is_file() else [])
            for f in files:
                try:
                    with open(f) as fh:
                        d = json.load(fh)
                    if d.get("format") != FORMAT:
                        continue
                    meta = d.get("meta", {})
                    found.append((str(f), ProfileKey.from_dict(d["key"]), float(meta.get("created", 0.0)),
                                  int(meta.get("block_size", 16))))
                except (OSError, ValueError, KeyError, TypeError) as exc:
                    log.warning("ignoring unreadable profile %s: %s", f, exc)
        _INDEX = found
    return _INDEX


def load_cached(path: str) -> StepProfile:
    prof = _LOADED.get(path)
    if prof is None:
        prof = _LOADED[path] = StepProfile.load(path)
    return prof


def profile_file(spec: Union[str, os.PathLike]) -> str:
    """A profile's file path: ``spec`` as given (absolute or relative to the working directory) or,
    when no such file exists, relative to the shipped profiles directory (``archive/<name>.json``)."""
    if not os.path.exists(spec) and (PACKAGED_DIR / spec).is_file():
        return os.fspath(PACKAGED_DIR / spec)
    return os.fspath(spec)


def resolve_profile(spec: Union[str, StepProfile, None], shape: ModelShape, device: DeviceSpec,
                    block_size: Optional[int] = None) -> tuple[Optional[StepProfile], str]:
    """The profile to use for ``shape`` on ``device`` and why, from ``spec``: ``"auto"`` (the
    newest matching profile on :func:`search_paths`, preferring ``block_size``), ``"none"``/None
    (roofline), a file path (absolute, relative to the working directory, or relative to the
    shipped profiles directory, e.g. ``archive/<name>.json``), or a :class:`StepProfile`. A profile
    for another device or shape is never used: the reason names the mismatching fields."""
    want = ProfileKey.of(shape, device)
    if spec is None or (isinstance(spec, str) and spec.lower() in ("none", "roofline", "off", "")):
        return None, "profile disabled (profile=none)"
    if isinstance(spec, str) and spec.lower() == "auto":
        hits = [row for row in _index() if row[1] == want]
        if not hits:
            return None, f"no profile matches {want.describe()} on {[str(p) for p in search_paths()]}"
        hits.sort(key=lambda r: (r[3] == (block_size or 16), r[2]))
        return load_cached(hits[-1][0]), "auto"
    prof = spec if isinstance(spec, StepProfile) else load_cached(profile_file(spec))
    if prof.key != want:
        return None, f"profile {prof.path or '<in memory>'} is for another device/shape ({'; '.join(want.mismatch(prof.key))})"
    return prof, "explicit"


def now_stamp() -> float:
    return time.time()
