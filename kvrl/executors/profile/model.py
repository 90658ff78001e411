"""The fitted step-time model (:class:`StepModel`, the formulas in :mod:`kvrl.executors.profile`):
fitting it from a profile's samples and pricing a step in pure Python for the sim's hot path.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from kvrl.executors.profile.features import (FEATURES, FORWARD_FEATURES, HOST_WORK, HOST_WORK_TERMS, QUEUE_STEP_TERM,
                                             co_read_of, pre_max_q_of)
from kvrl.executors.profile.fit import (FLOOR_TERMS, choose_knots, column, error_stats, fit_host, fit_max,
                                        fit_weighted, hat_basis, unidentified_host_terms)
from kvrl.executors.profile.format import FIT_VERSION, ProfileError
from kvrl.executors.step_rule import StepRule


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


@dataclass
class _LinearOp:
    """``c0 * [n > 0] + c1 * n`` seconds for a block operation of ``n`` blocks."""

    c0: float = 0.0
    c1: float = 0.0

    def __call__(self, n: int) -> float:
        return self.c0 + self.c1 * n if n > 0 else 0.0


#: fewer fitted eager samples with both a prefill and shared decode KV than this: one price of a
#: shared KV token for every eager step (``dec_shared``), as before fit version 10
MIN_MIXED_SHARED = 4


#: the first fit version whose shared KV tokens are the co-read ones (:data:`~kvrl.executors.profile.features.CO_READ`)
CO_READ_FIT_VERSION = 12


#: where ``dec_shared`` sits among the forward features
_SHARED_AT = FORWARD_FEATURES.index("dec_shared")


class StepModel:
    """The fitted step-time model (see the module doc). :meth:`predict` is pure Python."""

    #: block operations: ``copy``, the compute-stream parts of ``swap_out`` / ``swap_in``, and the
    #: swap-stream transfers ``swap_out_xfer`` / ``swap_in_xfer``; each ``[c0, c1]`` seconds
    OPS = ("copy", "swap_out", "swap_in", "swap_out_xfer", "swap_in_xfer")

    def __init__(self, graph_sizes: Sequence[int], graph: Optional[dict], eager: dict, ops: dict,
                 host: dict, engine_factor: Optional[dict] = None, token_sizes: Sequence[int] = (),
                 fit_version: int = FIT_VERSION, step_rule: Optional[dict] = None) -> None:
        #: the fit version that made these terms (:data:`FIT_VERSION` for a fresh fit; a loaded profile keeps its
        #: own, so saving it again does not relabel an older fit as the current one)
        self.fit_version = int(fit_version)
        #: whether the shared KV tokens priced are the co-read ones (fit version 12): the sim then passes
        #: :data:`~kvrl.executors.profile.features.CO_READ` as ``dec_shared``; older fits price every
        #: prefix-cache token as shared
        self.co_read = self.fit_version >= CO_READ_FIT_VERSION
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
        #: the live executor's graph rule (:class:`~kvrl.executors.step_rule.StepRule` as a dict; fit version
        #: 13, recorded by ``kvrl-profile``): a mixed step it runs on a split whole-step graph is priced with
        #: its decodes' longest context cut ``decode_splits`` ways and the ``split`` terms (None: no path term)
        self.step_rule = step_rule
        self.rebuild()

    def rebuild(self) -> None:
        """Recompute the prediction's cached coefficients from the model's terms. Call it after assigning
        ``graph``, ``eager``, ``ops``, ``host``, ``engine_factor`` or ``step_rule`` (the constructor does)."""
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
        #: per shared KV token of a decode in a step that also prefills (fit version 10; older
        #: profiles: the price of a shared token in any eager step, ``dec_shared``)
        self._e_mixed_shared = float(c.get("mixed_shared", self._e_shared))
        #: per decode sequence of a step that also prefills (fit version 9; older profiles: 0)
        self._e_mixed_dec = float(c.get("mixed_dec", 0.0))
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
        #: per step with a request waiting (fit version 11; older profiles: 0)
        self._h_wait_step = float(h.get(QUEUE_STEP_TERM, 0.0))
        self._k_graph, self._k_eager = float(self.engine_factor["graph"]), float(self.engine_factor["eager"])
        self._rule = StepRule.from_dict(self.step_rule) if self.step_rule else None
        #: the split-graph terms (fit version 13): per step and per decode of a step on a split graph
        self._split_price = (float(c.get("split", 0.0)), float(c.get("split_dec", 0.0)))
        self._prices_split = self._rule is not None and "split" in c

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
                  dec_kv: int, dec_max: int, dec_shared: int, rows: int, cuda_graphs: bool = True,
                  pre_max_q: int = -1) -> float:
        """Seconds of the forward pass and sampling (no block operations, no host overhead).
        ``pre_max_q``: the longest prefill chunk's query tokens (-1: ``pre_tok``), which with a path term
        (:attr:`step_rule`) decides whether the step runs on a split graph."""
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
            split = self._rule.split_piece(pre_tok + b, n_pre, pre_tok if pre_max_q < 0 else pre_max_q, pre_max_ctx,
                                           b, dec_max) if self._prices_split else 0
            t += (c_has_dec + c_dec * b + self._e_kv(b) * (dec_kv - dec_shared)
                  + (self._e_mixed_shared if n_pre else self._e_shared) * dec_shared
                  + self._e_kvmax(b) * b * (split or dec_max))
            if n_pre:
                t += self._e_mixed_dec * b
            if split:
                t += self._split_price[0] + self._split_price[1] * b
        if self._has_floor:
            f0, f_seq, f_kv, f_tok = self._floor
            floor = f0 + f_seq * (n_pre + b) + f_kv * (dec_kv + pre_ctx) + f_tok * n
            if floor > t:
                t = floor
        return self._k_eager * t

    def host_s(self, num_seqs: int, n_pre: int, n_admit: int = 0, n_preempt: int = 0, n_finish: int = 0,
               n_wait: int = 0, pre_tok: int = 0, pre_tok_prev: int = 0, swap_blocks: int = 0,
               swap_step: int = 0) -> float:
        """Seconds of the engine's own Python between two steps: per scheduled sequence, per
        prefill sequence, and per unit of host work (:data:`HOST_WORK`: admissions, preemptions,
        finishes, queued sequences, prefill tokens of this step and of the previous one, swapped
        blocks, a step that swaps; and a step with any request queued, :data:`QUEUE_STEP_TERM`)."""
        h0, h1, h2 = self._h
        return h0 + h1 * num_seqs + h2 * n_pre + self.host_work_s(n_admit, n_preempt, n_finish, n_wait, pre_tok,
                                                                  pre_tok_prev, swap_blocks, swap_step)

    def host_work_s(self, n_admit: int, n_preempt: int, n_finish: int, n_wait: int, pre_tok: int,
                    pre_tok_prev: int = 0, swap_blocks: int = 0, swap_step: int = 0) -> float:
        """The part of :meth:`host_s` that depends on what the engine did around the step."""
        a, p, f, w, t, tp, sb, ss = self._hw
        t_work = (a * n_admit + p * n_preempt + f * n_finish + w * n_wait + t * pre_tok + tp * pre_tok_prev
                  + sb * swap_blocks + ss * swap_step)
        return t_work + self._h_wait_step if n_wait > 0 else t_work

    def predict(self, n_pre: int, pre_tok: int, pre_pairs: int, pre_ctx: int, pre_max_ctx: int, n_dec: int,
                dec_kv: int, dec_max: int, dec_shared: int, rows: int, copies: int = 0, swap_out: int = 0,
                swap_in: int = 0, cuda_graphs: bool = True, host: bool = True, host_scale: float = 1.0,
                pre_max_q: int = -1) -> float:
        """Seconds of one engine step's compute stream as the live executor reports it when no
        swap-in delays it (``host`` adds the engine's own time between steps, which live
        ``elapsed_s`` includes, times ``host_scale``: a live host that runs Python that much slower
        than the profiling one, :mod:`kvrl.executors.host_speed`). The sim's hot path: a few
        microseconds, block-operation terms inlined. ``pre_max_q``: as :meth:`forward_s`."""
        if n_pre == 0 and n_dec == 0:
            t = 0.0
        else:
            t = self.forward_s(n_pre, pre_tok, pre_pairs, pre_ctx, pre_max_ctx, n_dec, dec_kv, dec_max, dec_shared,
                               rows, cuda_graphs, pre_max_q)
            if host:
                h0, h1, h2 = self._h
                t += host_scale * (h0 + h1 * (n_pre + n_dec) + h2 * n_pre)   # exact at 1.0
        if copies:
            t += self._copy.c0 + self._copy.c1 * copies
        if swap_out:
            t += self._swap_out.c0 + self._swap_out.c1 * swap_out
        if swap_in:
            t += self._swap_in.c0 + self._swap_in.c1 * swap_in
        return t

    def forward_args(self, f: dict) -> list:
        """The :data:`FEATURES` of a feature dict as :meth:`predict`'s arguments, ``dec_shared`` being
        the shared tokens this model prices (:attr:`co_read`; :func:`~kvrl.executors.profile.features.co_read_of`)."""
        args = [int(f.get(k, 0)) for k in FEATURES]
        if self.co_read:
            args[_SHARED_AT] = co_read_of(f)
        return args

    def forward_features(self, f: dict, cuda_graphs: bool = True) -> float:
        """:meth:`forward_s` of a feature dict (:meth:`forward_args`, and its ``pre_max_q``)."""
        return self.forward_s(*self.forward_args(f)[:len(FORWARD_FEATURES)], cuda_graphs=cuda_graphs,
                              pre_max_q=pre_max_q_of(f))

    def predict_features(self, f: dict, cuda_graphs: bool = True, host: bool = False, host_scale: float = 1.0) -> float:
        """:meth:`predict` of a feature dict (:meth:`forward_args`); with ``host``, also the
        :data:`HOST_WORK` terms of the keys ``f`` has (all host terms times ``host_scale``)."""
        t = self.predict(*self.forward_args(f), cuda_graphs=cuda_graphs, host=host, host_scale=host_scale,
                         pre_max_q=pre_max_q_of(f))
        if host and (f.get("n_pre") or f.get("n_dec")):
            t += host_scale * self.host_work_s(*(int(f.get(k, 0)) for k in HOST_WORK))
        return t

    def swap_s(self, num_blocks: int) -> float:
        """One-way transfer seconds for ``num_blocks`` blocks (mean of swap-out and swap-in)."""
        return 0.5 * (self.swap_out_xfer(num_blocks) + self.swap_in_xfer(num_blocks))

    # ------------------------------------------------------------------ (de)serialisation
    def to_dict(self) -> dict:
        d = {"fit_version": self.fit_version, "graph_sizes": self.graph_sizes, "graph": self.graph,
             "eager": self.eager, "ops": self.ops, "host": self.host, "engine_factor": self.engine_factor,
             "token_sizes": self.token_sizes}
        if self.step_rule:
            d["step_rule"] = self.step_rule
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "StepModel":
        try:
            return cls(d["graph_sizes"], d["graph"], d["eager"], d["ops"], d["host"], d.get("engine_factor"),
                       d.get("token_sizes", ()), int(d.get("fit_version", FIT_VERSION)), d.get("step_rule"))
        except (KeyError, TypeError) as exc:
            raise ProfileError(f"profile model is incomplete: {exc}") from None

    # ------------------------------------------------------------------ fitting
    @classmethod
    def fit(cls, samples: list[dict], graph_sizes: Sequence[int] = (),
            host_samples: Sequence[Sequence[float]] = (), max_knots: int = 10,
            token_sizes: Sequence[int] = (), step_rule: Optional[dict] = None) -> "StepModel":
        """Fit every term from measured samples (dicts of :data:`FEATURES` plus ``graph`` (bool,
        the live executor used a CUDA graph) and ``t`` (median seconds of ``execute``)).
        ``step_rule``: the live executor's graph rule (the profile's ``meta["step_rule"]``); where it
        puts fitted samples on split graphs, the path terms ``split`` and ``split_dec`` are fitted too.

        Samples flagged ``holdout`` or ``diagnostic`` are ignored. ``host_samples`` are
        ``(num_seqs, n_pre, gap_s, *HOST_WORK)`` rows from an engine run (the time between two
        ``execute`` calls)."""
        use = [s for s in samples if not (s.get("holdout") or s.get("diagnostic"))]
        fwd_only = [s for s in use if not (s.get("copies") or s.get("swap_out") or s.get("swap_in"))
                    and (s.get("n_pre") or s.get("n_dec"))]
        graph_s = [s for s in fwd_only if s.get("graph")]
        eager_s = [s for s in fwd_only if not s.get("graph")]
        if not eager_s:
            raise ProfileError("no eager forward samples to fit")

        graph = None
        if graph_s:
            b = column(graph_s, "n_dec")
            sizes = sorted(graph_sizes) if graph_sizes else sorted(set(b.astype(int)))
            pad = np.asarray([next((g for g in sizes if g >= v), v) for v in b])
            knots_pad = choose_knots(pad, max_knots)
            knots_b = choose_knots(b, max_knots)
            hb = hat_basis(knots_b, b)
            kv, kvmax, shared = column(graph_s, "dec_kv"), b * column(graph_s, "dec_max"), shared_column(graph_s)
            cols = [*hat_basis(knots_pad, pad).T, *(hb * (kv - shared)[:, None]).T, *(hb * kvmax[:, None]).T, shared]
            x, xf = fit_max(cols, [np.ones_like(b), b, kv, np.zeros_like(b)], column(graph_s, "t"))
            p, q = len(knots_pad), len(knots_b)
            graph = {"base": {"knots": knots_pad, "values": x[:p].tolist()},
                     "kv": {"knots": knots_b, "values": x[p:p + q].tolist()},
                     "kvmax": {"knots": knots_b, "values": x[p + q:p + 2 * q].tolist()},
                     "shared": float(x[p + 2 * q]),
                     "floor": dict(zip(FLOOR_TERMS, xf.tolist()))}

        sizes = sorted(token_sizes)
        n = np.asarray([next((t for t in sizes if t >= v), v) for v in
                        (column(eager_s, "pre_tok") + column(eager_s, "n_dec")).astype(int)], dtype=float)
        b = column(eager_s, "n_dec")
        knots_n = choose_knots(n, max_knots)
        knots_b = choose_knots(b, max_knots) or [1.0]
        hb = hat_basis(knots_b, np.maximum(b, 1.0))
        rule = StepRule.from_dict(step_rule) if step_rule else None
        split_ctx = np.asarray([rule.split_piece(int(s.get("pre_tok", 0) + s.get("n_dec", 0)), int(s.get("n_pre", 0)),
                                                 pre_max_q_of(s), int(s.get("pre_max_ctx", 0)), int(s.get("n_dec", 0)),
                                                 int(s.get("dec_max", 0))) if rule else 0 for s in eager_s], dtype=float)
        on_split = (split_ctx > 0).astype(float)
        kv, shared = column(eager_s, "dec_kv"), shared_column(eager_s)
        kvmax = b * np.where(on_split > 0, split_ctx, column(eager_s, "dec_max"))
        has_pre = (column(eager_s, "n_pre") > 0).astype(float)
        names = ("pre_pairs", "pre_ctx", "pre_max_ctx", "n_pre", "has_pre", "has_dec", "rows", "n_dec", "dec_shared",
                 "mixed_dec")
        extra = [column(eager_s, "pre_pairs"), column(eager_s, "pre_ctx"), column(eager_s, "pre_max_ctx"), column(eager_s, "n_pre"),
                 has_pre, (b > 0).astype(float), column(eager_s, "rows"), b, shared, b * has_pre]
        # the shared token's price beside a prefill apart (fit version 10), where samples measure it
        if np.count_nonzero(shared * has_pre) >= MIN_MIXED_SHARED:
            names += ("mixed_shared",)
            extra[names.index("dec_shared")] = shared * (1.0 - has_pre)
            extra.append(shared * has_pre)
        if on_split.any():            # the path term (fit version 13)
            names += ("split", "split_dec")
            extra += [on_split, on_split * b]
        cols = [*hat_basis(knots_n, n).T, *(hb * (kv - shared)[:, None]).T, *(hb * kvmax[:, None]).T, *extra]
        floor_cols = [np.ones_like(n), b + column(eager_s, "n_pre"), kv + column(eager_s, "pre_ctx"), n]
        x, xf = fit_max(cols, floor_cols, column(eager_s, "t"))
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
            nb = column(only, op)
            ops[key] = fit_weighted([np.ones_like(nb), nb], column(only, "t")).tolist() if only else [0.0, 0.0]
            if op != "copies":   # the swap stream's transfer time, measured up to its completion
                xfer = [s for s in only if s.get("t_xfer")]
                nb = column(xfer, op)
                if xfer:
                    ops[op + "_xfer"] = fit_weighted([np.ones_like(nb), nb], column(xfer, "t_xfer")).tolist()
                else:   # samples of a synchronous swap path (fit version 4): all of it is transfer
                    ops[op + "_xfer"], ops[key] = ops[key], [0.0, 0.0]
        model = cls(graph_sizes if graph is not None else [], graph, eager, ops,
                    {"base": 0.0, "per_seq": 0.0, "per_prefill": 0.0}, token_sizes=sizes, step_rule=step_rule)
        model.host = fit_host(host_samples)
        model.rebuild()
        return model


def shared_column(samples: list[dict]) -> np.ndarray:
    """The shared KV tokens a fresh fit (:data:`FIT_VERSION`) prices, per sample: the co-read ones."""
    return np.asarray([co_read_of(s) for s in samples], dtype=np.float64)


def fit_engine_factor(model: StepModel, samples: Sequence[dict], min_rows: int = 20) -> dict:
    """Per forward kind (CUDA-graph decode, eager), the median ratio of the time ``execute`` took
    inside an engine run to the model's prediction for the same step (steps without block
    operations; ``samples`` have the :data:`FEATURES`, ``t`` seconds and ``graph``). The grid times each shape in
    rounds of the same points; inside an engine a step follows steps of other shapes and the
    engine's Python, which measured up to ~10% slower for eager steps on an H200. 1.0 with fewer
    than ``min_rows`` steps of a kind."""
    factor = {"graph": 1.0, "eager": 1.0}
    for kind, want_graph in (("graph", True), ("eager", False)):
        ratios = [s["t"] / model.forward_features(s, bool(s["graph"]))
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
                          token_sizes=meta.get("piecewise_token_sizes", ()), step_rule=meta.get("step_rule"))
    model.engine_factor = fit_engine_factor(model, engine_samples)
    model.rebuild()
    return model


def fit_errors(model: StepModel, samples: Sequence[dict]) -> dict:
    """Relative errors of ``model`` on a profile's samples, as ``kvrl-profile``'s fit report gives
    them: ``grid`` (the fitted grid and random steps), ``holdout`` (the held-out random steps) and
    ``by_group`` (each grid group, diagnostic ones included), each an :func:`error_stats` dict.
    As there, without the engine-context factor (the grid is timed outside an engine run)."""
    grid_model = StepModel.from_dict({**model.to_dict(), "engine_factor": None})
    pred = lambda rows: [grid_model.predict_features(s, bool(s["graph"])) for s in rows]
    grid = [s for s in samples if not (s.get("holdout") or s.get("diagnostic"))]
    held = [s for s in samples if s.get("holdout")]
    groups = sorted({s["group"] for s in samples if not s.get("holdout")})
    return {"grid": error_stats(pred(grid), [s["t"] for s in grid]),
            "holdout": error_stats(pred(held), [s["t"] for s in held]),
            "by_group": {g: error_stats(pred(sel), [s["t"] for s in sel])
                         for g in groups for sel in [[s for s in samples if s["group"] == g and not s.get("holdout")]]}}


def refit_report(model: StepModel, samples: Sequence[dict], host_samples: Sequence[Sequence[float]]) -> dict:
    """The fit report of a model fitted offline from a profile file's samples and host rows:
    :func:`fit_errors`, the host rows' count and median gap, and the host terms they leave
    unidentified (:func:`~kvrl.executors.profile.fit.unidentified_host_terms`)."""
    gaps = [float(r[2]) for r in host_samples]
    return {**fit_errors(model, samples), "host": {"steps": len(gaps), "median_gap_s": float(np.median(gaps)) if gaps else 0.0},
            "host_unidentified": unidentified_host_terms(host_samples)}
