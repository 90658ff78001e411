"""Built-in watermark policies: ``fixed``, ``opt_factor``, ``avg_block_len``, ``token_ratio``,
``past_future``.

A watermark policy answers one question, "how many free blocks must remain after this
admission?", through :meth:`reserved_blocks`; it is asked before every admission and swap-in.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Literal

import numpy as np

from kvrl.plugins.base import WatermarkPolicy, check_range
from kvrl.plugins.lengths import completion_demand
from kvrl.plugins.registry import register


@register("watermark", "fixed")
class FixedWatermark(WatermarkPolicy):
    """Keep ``fraction`` of all GPU blocks free: ``int(fraction * num_blocks)``. vLLM's rule, with
    its default fraction 0.01 (``watermark`` in vLLM's BlockSpaceManager); 0 admits until the
    pool is full. Parameter ``fraction`` in [0, 1), default 0.01."""

    @dataclass
    class Params:
        fraction: float = 0.01

        def __post_init__(self):
            check_range("fraction", self.fraction, 0.0, 1.0, hi_inclusive=False)

    def reserved_blocks(self) -> int:
        return int(self.params.fraction * self.engine.num_blocks)


@register("watermark", "opt_factor")
class OptFactorWatermark(WatermarkPolicy):
    """Reserve ``a * N / 16`` blocks for ``N`` running requests (rounded up): headroom that grows
    with the batch, since every running request will need a new block every ``block_size``
    decode steps (at most the whole pool). From the CPEN 511 watermark study, which swept ``a``
    over [0, 12]. Parameter ``a`` >= 0, default 1.0."""

    @dataclass
    class Params:
        a: float = 1.0

        def __post_init__(self):
            check_range("a", self.a, 0.0)

    def reserved_blocks(self) -> int:
        return min(math.ceil(self.params.a * self.engine.num_running / 16), self.engine.num_blocks)


@register("watermark", "avg_block_len")
class AvgBlockLenWatermark(WatermarkPolicy):
    """Stop admitting while the running requests hold more than ``t`` blocks each on average
    (allocated blocks / running requests > t): long-context batches get no new company until
    they shrink. Expressed as a reservation of the whole pool while closed, 0 while open. From
    the CPEN 511 watermark study, which swept ``t`` over [1.8, 7.5]. Parameter ``t`` > 0,
    default 4.0."""

    @dataclass
    class Params:
        t: float = 4.0

        def __post_init__(self):
            check_range("t", self.t, 0.0)

    def reserved_blocks(self) -> int:
        running = self.engine.num_running
        if running and self.engine.num_used_blocks / running > self.params.t:
            return self.engine.num_blocks
        return 0


@register("watermark", "token_ratio")
class TokenRatioWatermark(WatermarkPolicy):
    """SGLang's new-token-ratio reservation: keep room for ``ratio`` times the future decode tokens
    of the running requests, each counted as ``min(max_tokens - generated, clip_max_new_tokens)``.
    The ratio starts at ``init_ratio``, decays linearly to ``min_ratio`` over ``decay_steps``
    steps, and jumps back to ``init_ratio`` after any preemption (SGLang's retract). Uses only
    what a real server knows (the client's max_tokens). A reservation beyond the pool is the
    whole pool (it admits nothing either way). Parameters: ``init_ratio`` (0.7),
    ``min_ratio`` (0.1), ``decay_steps`` (600), ``clip_max_new_tokens`` (4096). Source: SGLang
    scheduler (``new_token_ratio``)."""

    @dataclass
    class Params:
        init_ratio: float = 0.7
        min_ratio: float = 0.1
        decay_steps: int = 600
        clip_max_new_tokens: int = 4096

        def __post_init__(self):
            check_range("init_ratio", self.init_ratio, 0.0, 1.0)
            check_range("min_ratio", self.min_ratio, 0.0, self.init_ratio)
            check_range("decay_steps", self.decay_steps, 1)
            check_range("clip_max_new_tokens", self.clip_max_new_tokens, 1)

    def __init__(self, params) -> None:
        super().__init__(params)
        self.ratio = params.init_ratio

    def on_step_end(self) -> None:
        p = self.params
        self.ratio = max(p.min_ratio, self.ratio - (p.init_ratio - p.min_ratio) / p.decay_steps)

    def on_preempt(self, seq, mode) -> None:
        self.ratio = self.params.init_ratio

    def reserved_blocks(self) -> int:
        clip = self.params.clip_max_new_tokens
        future = sum(min(max(s.max_tokens - s.num_output, 0), clip) for s in self.engine.running)
        return min(math.ceil(self.ratio * future / self.engine.block_size), self.engine.num_blocks)


@register("watermark", "past_future")
class PastFutureWatermark(WatermarkPolicy):
    """Reserve the growth to the *peak* future KV demand of the running requests, predicted from
    the past: each running request that has generated ``g`` tokens is predicted to generate the
    ``quantile`` of the finished output lengths longer than ``g`` (the last ``history`` finished
    requests); the batch's demand is then evaluated at each predicted completion time and the
    largest value, minus the blocks in use now, is reserved (at most the whole pool). With fewer
    than ``min_history`` finished requests it predicts ``max_tokens``. Parameters: ``quantile`` (0.9), ``history``
    (1000), ``min_history`` (20), ``key`` (``none``; ``tenant``: predict each request from its own
    tenant's finished requests once the tenant has ``min_history`` of them, else from all;
    ``hint``: scale each request's ``output_len_hint`` by the ``quantile`` of the finished hinted
    requests' ratios ``output / hint`` above its ``generated / hint`` once ``min_history`` of them
    finished, before that the hint as it is; as ``none`` past the hint or without one);
    ``overcommit`` (0.0): let the predicted peak exceed the pool by this fraction of it (preemption
    then settles the excess; 0 = the paper's rule). Source:
    Past-Future scheduling (Gong et al. 2025, "Past-Future Scheduler for LLM Serving under SLA
    Guarantees"); the per-tenant and hint keys and the overcommit are kvrl's."""

    _RATIOS = "__hint_ratio__"   # history key of the finished hinted requests' output / hint ratios

    @dataclass
    class Params:
        quantile: float = 0.9
        history: int = 1000
        min_history: int = 20
        key: Literal["none", "tenant", "hint"] = "none"
        overcommit: float = 0.0

        def __post_init__(self):
            check_range("quantile", self.quantile, 0.0, 1.0)
            check_range("history", self.history, 1)
            check_range("min_history", self.min_history, 1)
            check_range("overcommit", self.overcommit, 0.0)

    def __init__(self, params) -> None:
        super().__init__(params)
        self._history: dict[str | None, deque[float]] = {None: deque(maxlen=params.history)}
        self._sorted: dict[str | None, np.ndarray] = {}

    def on_finish(self, seq) -> None:
        entries: list[tuple[str | None, float]] = [(None, seq.num_output)]
        if self.params.key == "tenant":
            entries.append((seq.tenant, seq.num_output))
        elif self.params.key == "hint" and seq.output_len_hint:
            entries.append((self._RATIOS, seq.num_output / seq.output_len_hint))
        for k, v in entries:
            self._history.setdefault(k, deque(maxlen=self.params.history)).append(v)
            self._sorted.pop(k, None)

    def _quantile_beyond(self, key: str | None, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per element of ``x``: the ``quantile`` of history ``key``'s values above it, and whether
        any value is above it."""
        hist = self._sorted.get(key)
        if hist is None:
            hist = self._sorted[key] = np.sort(np.fromiter(self._history[key], dtype=np.float64))
        lo = np.searchsorted(hist, x, side="right")   # first finished value > x
        span = len(hist) - 1 - lo
        idx = np.minimum(lo + np.floor(self.params.quantile * np.maximum(span, 0)).astype(np.int64), len(hist) - 1)
        return hist[idx], lo < len(hist)

    def _predict_remaining(self, generated: np.ndarray, cap: np.ndarray, key: str | None = None) -> np.ndarray:
        if len(self._history.get(key, ())) < self.params.min_history:
            key = None
        if len(self._history[key]) < self.params.min_history:
            return np.maximum(cap - generated, 0)
        total, known = self._quantile_beyond(key, generated)
        pred = np.where(known, total - generated, 1)  # outlived all history: one more
        return np.minimum(np.maximum(pred, 1), np.maximum(cap - generated, 1)).astype(np.int64)

    def _predict_hinted(self, generated: np.ndarray, cap: np.ndarray, hints: np.ndarray) -> np.ndarray:
        out = self._predict_remaining(generated, cap)
        has = hints > 0
        if not has.any():
            return out
        if len(self._history.get(self._RATIOS, ())) < self.params.min_history:   # no error model yet:
            pred = np.where(generated[has] < hints[has], hints[has] - generated[has], out[has])  # the hint as told
        else:
            ratio, known = self._quantile_beyond(self._RATIOS, generated[has] / hints[has])
            pred = np.where(known, np.ceil(ratio * hints[has]) - generated[has], out[has])  # outlived every ratio: as unhinted
        out[has] = np.minimum(np.maximum(pred, 1), np.maximum(cap[has] - generated[has], 1))
        return out

    def _predict_running(self, running, generated: np.ndarray, cap: np.ndarray) -> np.ndarray:
        if self.params.key == "none":
            return self._predict_remaining(generated, cap)
        if self.params.key == "hint":
            hints = np.fromiter((s.output_len_hint or 0 for s in running), dtype=np.int64, count=len(running))
            return self._predict_hinted(generated, cap, hints)
        tenants = np.array([s.tenant for s in running], dtype=object)
        out = np.empty(len(running), dtype=np.int64)
        for t in set(tenants):
            mask = tenants == t
            out[mask] = self._predict_remaining(generated[mask], cap[mask], t)
        return out

    def reserved_blocks(self) -> int:
        running = self.engine.running
        if not running:
            return 0
        bs = self.engine.block_size
        tokens = np.fromiter((s.num_tokens for s in running), dtype=np.int64, count=len(running))
        generated = np.fromiter((s.num_output for s in running), dtype=np.int64, count=len(running))
        cap = np.fromiter((s.max_tokens for s in running), dtype=np.int64, count=len(running))
        demand, alive = completion_demand(tokens, self._predict_running(running, generated, cap))
        peak = int(math.ceil((demand / bs + alive).max()))               # + one partial block each
        allowed = int(self.params.overcommit * self.engine.num_blocks)   # predicted peak may exceed the pool by this
        return min(max(peak - self.engine.num_used_blocks - allowed, 0), self.engine.num_blocks)
