"""Defences against memory-pressure attacks by one tenant on the others (fill-and-squeeze, thrash):
``watermark=tenant_quota``, ``watermark=thrash_guard``, ``eviction=capped``, ``eviction=tenant_fair``.

Each defence wraps an *inner* policy of the same kind, named by the parameter ``inner`` (any
registered plugin, defences included, so they compose: ``watermark=tenant_quota
watermark.inner=thrash_guard``) with its parameters in ``inner_params`` (a mapping, e.g.
``watermark.inner_params={fraction:0.05}``); ``inner_fraction`` / ``inner_mode`` are shortcuts for the
one parameter of the default inner rules (``fixed``'s ``fraction``, the victim rules' ``mode``). The
wrapper forwards every hook and binds the inner policy to the same engine view; a failure of the
inner policy is the wrapper's failure (the engine's ``policy_errors`` handling applies).

Measured costs and effects: ``docs/security.md``.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any, Dict, Optional

from kvrl.plugins.base import (EvictionPolicy, Policy, WatermarkPolicy, check_choice, check_range)
from kvrl.plugins.registry import inner_plugin_spec, register

_RUNNING = "running"
_DONE = ("finished", "aborted")


class _Wrapper(Policy):
    """Holds the inner policy; binds it and forwards the hooks."""

    def __init__(self, params) -> None:
        super().__init__(params)
        from kvrl.plugins.registry import create
        name, inner_params = params.inner_spec()
        self.inner = create(self.plugin_kind, name, **inner_params)

    def bind(self, engine) -> None:
        super().bind(engine)
        self.inner.bind(engine)

    def on_step_end(self) -> None:
        self.inner.on_step_end()

    def on_finish(self, seq) -> None:
        self.inner.on_finish(seq)

    def on_preempt(self, seq, mode) -> None:
        self.inner.on_preempt(seq, mode)


# =============================================================================== watermarks
@dataclass
class _WatermarkInner:
    inner: str = "fixed"
    inner_fraction: Optional[float] = None
    inner_params: Optional[Dict[str, Any]] = None

    def inner_spec(self) -> tuple[str, dict]:
        return inner_plugin_spec("watermark", self.inner, self.inner_params, "inner_fraction", self.inner_fraction,
                           "fraction", ("fixed",))


@register("watermark", "tenant_quota")
class TenantQuota(_Wrapper, WatermarkPolicy):
    """Per-tenant KV quota (fair share): its per-request :meth:`admit` veto refuses a request when
    its tenant already holds blocks and would exceed its share with this request's prompt blocks;
    the refused request waits while other tenants' requests behind it are admitted (no head-of-line
    blocking by a hog). A tenant holding nothing is always allowed one request, so nobody starves.
    Held blocks = block-table entries of the tenant's running sequences (shared prefix blocks count
    for each holder). Share = ``share`` of the pool when > 0, else the fair share ``1 / (tenants
    with a running, swapped or waiting request)`` (a tenant alone gets the whole pool and is not
    vetoed at all), times ``burst``. With ``contended_only`` (default) a tenant above its share is
    vetoed only while another tenant has a request waiting or swapped out (work-conserving: memory
    nobody else asks for is not held back); ``contended_only=false`` makes the share a hard quota.
    The reservation rule is the inner watermark's. Parameters: ``share`` (0 = fair share, default),
    ``burst`` (>= 1, default 1.0), ``contended_only`` (default true), ``inner`` (default ``fixed``),
    ``inner_fraction``, ``inner_params``. Source: per-tenant memory quotas / fair sharing of the KV
    cache (the max-min fairness of "Fairness in Serving Large Language Models", Sheng et al., OSDI
    2024, applied to blocks) against the fill-and-squeeze attack of docs/security.md."""

    @dataclass
    class Params(_WatermarkInner):
        share: float = 0.0
        burst: float = 1.0
        contended_only: bool = True

        def __post_init__(self):
            check_range("share", self.share, 0.0, 1.0)
            check_range("burst", self.burst, 1.0)
            if not isinstance(self.contended_only, bool):
                raise ValueError(f"contended_only must be true or false, got {self.contended_only!r}")
            self.inner_spec()

    def __init__(self, params) -> None:
        super().__init__(params)
        self._key = None
        self._held: dict[str, int] = {}
        self._waiting: dict[str, int] = {}
        self._limit = 0

    def _refresh(self) -> None:
        """Blocks held per tenant and the share limit, once per scheduling pass (step)."""
        eng = self.engine
        key = eng.step_index
        if key == self._key:
            return
        self._key = key
        held: dict[str, int] = {}
        for s in eng.running:
            held[s.tenant] = held.get(s.tenant, 0) + s.num_blocks
        self._held = held
        waiting: dict[str, int] = {}
        for s in (*eng.waiting, *eng.swapped):
            waiting[s.tenant] = waiting.get(s.tenant, 0) + 1
        self._waiting = waiting
        share = self.params.share
        if not share:
            share = 1.0 / max(len(set(held) | set(waiting)), 1)
        limit = math.ceil(self.params.burst * share * eng.num_blocks)
        self._limit = limit if limit < eng.num_blocks else None   # None: no quota (a tenant alone)

    def admit(self, seq, blocks_needed: int) -> bool:
        self._refresh()
        tenant = seq.tenant
        held = self._held.get(tenant, 0)
        if self._limit is not None and held and held + blocks_needed > self._limit:
            if not self.params.contended_only or any(t != tenant for t in self._waiting):
                return False
        if not self.inner.admit(seq, blocks_needed):
            return False
        self._held[tenant] = held + blocks_needed   # admissions later in this step see it
        left = self._waiting.get(tenant, 0) - 1
        if left > 0:
            self._waiting[tenant] = left
        else:
            self._waiting.pop(tenant, None)
        return True

    def reserved_blocks(self) -> int:
        return self.inner.reserved_blocks()


@register("watermark", "thrash_guard")
class ThrashGuard(_Wrapper, WatermarkPolicy):
    """Thrash detection with admission back-off: a *cycle* is a preempted sequence being readmitted
    (swap-in or recompute) within ``window_s`` of its preemption; when ``threshold`` cycles happen
    within ``window_s``, the reservation is raised by ``step_fraction`` of the pool (up to
    ``max_fraction``), so fewer requests are admitted and the running ones can grow without
    preempting each other; the extra reservation decays back with half-life ``half_life_s``.
    Reservation = inner watermark's + extra (the engine ignores it when nothing runs, so it never
    stalls). Parameters: ``window_s`` (2.0), ``threshold`` (4), ``step_fraction`` (0.05),
    ``max_fraction`` (0.5), ``half_life_s`` (5.0), ``inner`` (default ``fixed``), ``inner_fraction``,
    ``inner_params``. Source: load control against thrashing in paged virtual memory (Denning,
    "Thrashing: its causes and prevention", AFIPS 1968), applied to KV preemption."""

    @dataclass
    class Params(_WatermarkInner):
        window_s: float = 2.0
        threshold: int = 4
        step_fraction: float = 0.05
        max_fraction: float = 0.5
        half_life_s: float = 5.0

        def __post_init__(self):
            check_range("window_s", self.window_s, 0.0)
            if not self.window_s > 0:
                raise ValueError(f"window_s must be > 0, got {self.window_s}")
            check_range("threshold", self.threshold, 1)
            check_range("step_fraction", self.step_fraction, 0.0, 1.0)
            check_range("max_fraction", self.max_fraction, 0.0, 1.0)
            check_range("half_life_s", self.half_life_s, 0.0)
            if not self.half_life_s > 0:
                raise ValueError(f"half_life_s must be > 0, got {self.half_life_s}")
            self.inner_spec()

    def __init__(self, params) -> None:
        super().__init__(params)
        self.extra = 0.0                      # extra reservation, fraction of the pool
        self.num_boosts = 0
        self.num_cycles = 0
        self._pending: dict[int, tuple[Any, float]] = {}   # seq_id -> (view, preemption time)
        self._cycles: deque[float] = deque()
        self._last = 0.0

    def on_preempt(self, seq, mode) -> None:
        self._pending[seq.seq_id] = (seq, self.engine.now)
        self.inner.on_preempt(seq, mode)

    def on_step_end(self) -> None:
        p = self.params
        now = self.engine.now
        if self.extra:
            self.extra *= 0.5 ** (max(now - self._last, 0.0) / p.half_life_s)
            if self.extra * self.engine.num_blocks < 0.5:
                self.extra = 0.0
        self._last = now
        if self._pending:
            for sid, (view, t) in list(self._pending.items()):
                status = view.status.value
                if status == _RUNNING:
                    del self._pending[sid]
                    if now - t <= p.window_s:
                        self._cycles.append(now)
                        self.num_cycles += 1
                elif status in _DONE or now - t > p.window_s:
                    del self._pending[sid]
        cycles = self._cycles
        while cycles and cycles[0] < now - p.window_s:
            cycles.popleft()
        if len(cycles) >= p.threshold:
            self.extra = min(p.max_fraction, self.extra + p.step_fraction)
            self.num_boosts += 1
            cycles.clear()
        self.inner.on_step_end()

    @property
    def vetoes(self) -> bool:
        return self.inner.vetoes

    def admit(self, seq, blocks_needed: int) -> bool:
        return self.inner.admit(seq, blocks_needed)

    def reserved_blocks(self) -> int:
        return self.inner.reserved_blocks() + int(self.extra * self.engine.num_blocks)


# =============================================================================== evictions
@dataclass
class _EvictionInner:
    inner: str = "lifo"
    inner_mode: Optional[str] = None
    inner_params: Optional[Dict[str, Any]] = None

    def inner_spec(self) -> tuple[str, dict]:
        if self.inner_mode is not None:
            check_choice("inner_mode", self.inner_mode, ("recompute", "swap", "auto"))
        return inner_plugin_spec("eviction", self.inner, self.inner_params, "inner_mode", self.inner_mode, "mode",
                           ("lifo", "fewest_computed", "most_blocks", "priority", "tenant_fair"))


@register("eviction", "capped")
class CappedPreemptions(_Wrapper, EvictionPolicy):
    """Cap on preemptions per request: never picks a victim already preempted ``max_preemptions``
    times unless every candidate has been (then the inner rule picks among all), so no request can
    be squeezed out over and over while others take its memory; the inner victim rule picks among
    the others. Parameters: ``max_preemptions`` (>= 0, default 2), ``inner`` (victim rule, default
    ``lifo``), ``inner_mode`` (recompute | swap | auto; default: the inner rule's), ``inner_params``.
    Source: bounded preemption against starvation (as in Llumnix's and vLLM's discussions of
    repeatedly preempted requests), here a hard per-request cap."""

    @dataclass
    class Params(_EvictionInner):
        max_preemptions: int = 2

        def __post_init__(self):
            check_range("max_preemptions", self.max_preemptions, 0)
            if int(self.max_preemptions) != self.max_preemptions:
                raise ValueError(f"max_preemptions must be an integer, got {self.max_preemptions!r}")
            self.inner_spec()

    def select(self, candidates):
        cap = self.params.max_preemptions
        eligible = [c for c in candidates if c.num_preemptions < cap]
        return self.inner.select(eligible or list(candidates))


@register("eviction", "tenant_fair")
class TenantFair(EvictionPolicy):
    """Fair-share victim rule: the victim is the newest admitted sequence of the tenant that holds
    the most GPU blocks among the running sequences (block-table entries), so the tenant furthest
    above an equal share gives memory back first and a tenant's newcomers are not squeezed out by
    another tenant's growth. With one tenant it is ``lifo``. Parameter ``mode`` (recompute | swap |
    auto, default recompute). Source: max-min fair sharing of the KV cache (cf. "Fairness in Serving
    Large Language Models", Sheng et al., OSDI 2024), as the eviction half of ``tenant_quota``."""

    @dataclass
    class Params:
        mode: str = "recompute"

        def __post_init__(self):
            check_choice("mode", self.mode, ("recompute", "swap", "auto"))

    def select(self, candidates):
        from kvrl.plugins.base import EvictionDecision, PreemptionMode
        held: dict[str, int] = {}
        for s in self.engine.running:
            held[s.tenant] = held.get(s.tenant, 0) + s.num_blocks
        victim = max(candidates, key=lambda s: (held.get(s.tenant, 0), s.admit_order))
        mode = self.params.mode
        if mode == "auto":
            fits = victim.num_blocks <= self.engine.num_free_cpu_blocks
            return EvictionDecision(victim.seq_id, PreemptionMode.SWAP if fits else PreemptionMode.RECOMPUTE)
        return EvictionDecision(victim.seq_id, PreemptionMode(mode))
