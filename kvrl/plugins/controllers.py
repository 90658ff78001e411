"""Adaptive watermark controllers that need no training: ``pi`` (feedback control), ``bandit``
(an online discounted-UCB bandit over watermark values, :class:`EpochBandit`, which the ``order_bandit``
scheduler of :mod:`kvrl.plugins.orders` plays over admission orders), ``slo_mix`` (a rule on the share of
tight-TPOT requests) and ``ttft_slack`` (a rule on how long the oldest waiting request has waited).

They move the watermark (reserved / total GPU blocks) while the engine serves, from what a real
server knows: preemptions, the latencies of finished requests against their SLOs, goodput, the
objectives its requests carry. They are the non-learning bar a learned watermark policy has to
clear (issue 17).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

import numpy as np

from kvrl.envs.config import FeatureConfig
from kvrl.envs.features import FeatureTracker
from kvrl.plugins.base import WatermarkPolicy, check_choice, check_range
from kvrl.plugins.registry import create, inner_plugin_spec, register
from kvrl.plugins.slack import tight_tpot_share

if TYPE_CHECKING:
    from kvrl.engine.views import SeqView

SIGNALS = ("slo", "preemptions", "both")


def balance(x: float, y: float) -> float:
    """``(x - y) / (x + y)`` for ``x, y >= 0``: in [-1, 1], 0 where they are equal (and when
    both are 0)."""
    total = x + y
    return (x - y) / total if total > 0 else 0.0


@register("watermark", "pi")
class PIWatermark(WatermarkPolicy):
    """A PI feedback controller on the watermark. Every ``interval_s`` engine seconds it measures
    a signal and moves the reserved fraction to ``clip(init + kp * e + ki * I, low, high)``, with
    error ``e = signal - setpoint`` and integral ``I`` (the sum of ``e * interval_s`` over
    updates); positive error raises the reserve. Anti-windup by clamping: the integral term
    ``ki * I`` is kept within [low - init, high - init], so it never holds more than it takes to
    reach a bound and leaves a bound as soon as the error changes sign. Signals (``signal``):
    ``slo``: ``m_tpot - m_ttft`` in [-1, 1], the recent shares of finished requests that missed
    their TPOT and their TTFT objective (moving averages, weight ``latency_alpha`` per finished
    request): positive when TPOT is missed more (admitting less shortens the batches that
    prefills slow down), negative when TTFT is (admit more); ``preemptions``: ``(r - r*) / (r +
    r*)`` in [-1, 1) with ``r`` the preemption rate (per engine second, moving average with time
    constant ``tau_s``, from :class:`kvrl.envs.features.FeatureTracker`, the agents' features)
    and ``r*`` = ``preemption_target``: -1 with no preemptions, 0 at the target; ``both``: the
    ``slo`` signal plus the ``preemptions`` signal where that is positive (preemptions above the
    target raise the reserve; below it, the latencies decide). With ``setpoint`` > 0 the reserve
    drifts down while nothing is wrong (memory is used). Parameters: ``signal`` (both),
    ``setpoint`` (0.05, in [-1, 1]), ``kp`` (0.1), ``ki`` (0.05 per engine second), ``low`` (0.0),
    ``high`` (0.5), ``init`` (0.01, the reserve before the first update and the output's bias, in
    [low, high]), ``interval_s`` (0.5), ``preemption_target`` (1.0 per second), ``tau_s`` (5.0),
    ``latency_alpha`` (0.05)."""

    @dataclass
    class Params:
        signal: str = "both"
        setpoint: float = 0.05
        kp: float = 0.1
        ki: float = 0.05
        low: float = 0.0
        high: float = 0.5
        init: float = 0.01
        interval_s: float = 0.5
        preemption_target: float = 1.0
        tau_s: float = 5.0
        latency_alpha: float = 0.05

        def __post_init__(self):
            check_choice("signal", self.signal, SIGNALS)
            check_range("setpoint", self.setpoint, -1.0, 1.0)
            check_range("kp", self.kp, 0.0)
            check_range("ki", self.ki, 0.0)
            check_range("low", self.low, 0.0, 1.0, hi_inclusive=False)
            check_range("high", self.high, self.low, 1.0, hi_inclusive=False)
            check_range("init", self.init, self.low, self.high)
            check_range("interval_s", self.interval_s, 1e-9)
            check_range("preemption_target", self.preemption_target, 1e-9)
            check_range("tau_s", self.tau_s, 1e-9)
            check_range("latency_alpha", self.latency_alpha, 1e-9, 1.0)

    def __init__(self, params) -> None:
        super().__init__(params)
        self.fraction = params.init
        self.integral = 0.0
        self.error = 0.0
        self.ttft_misses = 0.0      # moving share of finished requests that missed their TTFT objective
        self.tpot_misses = 0.0      # ... their TPOT objective
        self.tracker: Optional[FeatureTracker] = None
        self._last_update = 0.0

    def bind(self, engine) -> None:
        super().bind(engine)
        self.tracker = FeatureTracker(FeatureConfig(tau_s=self.params.tau_s))     # for its preemption rate
        self.tracker.bind(engine)
        self._last_update = engine.now

    def measure(self) -> float:
        """The controlled signal now (``slo``, ``preemptions``: in [-1, 1]; ``both``: [-1, 2))."""
        p = self.params
        preempt = balance(self.tracker.preemption_rate, p.preemption_target)
        slo = self.tpot_misses - self.ttft_misses
        return {"preemptions": preempt, "slo": slo, "both": slo + max(preempt, 0.0)}[p.signal]

    def update(self) -> None:
        """One controller update: measure, integrate (clamped), set the fraction."""
        p = self.params
        e = self.measure() - p.setpoint
        if p.ki > 0:
            lo, hi = (p.low - p.init) / p.ki, (p.high - p.init) / p.ki
            self.integral = min(max(self.integral + e * p.interval_s, lo), hi)
        self.error = e
        self.fraction = min(max(p.init + p.kp * e + p.ki * self.integral, p.low), p.high)

    def on_step_end(self) -> None:
        self.tracker.on_step_end()
        if self.engine.now - self._last_update >= self.params.interval_s:
            self._last_update = self.engine.now
            self.update()

    def on_finish(self, seq) -> None:
        ttft_miss, tpot_miss = slo_misses(seq, self.engine.now)
        a = self.params.latency_alpha
        self.ttft_misses += a * (ttft_miss - self.ttft_misses)
        self.tpot_misses += a * (tpot_miss - self.tpot_misses)

    def reserved_blocks(self) -> int:
        return int(self.fraction * self.engine.num_blocks)


def slo_misses(seq: "SeqView", now: float) -> tuple[bool, bool]:
    """``(missed TTFT, missed TPOT)`` of a sequence finishing at ``now``, by the engine's rule for
    a one-sample request (TTFT from arrival to first token, TPOT over the decode; no objective,
    no miss)."""
    ttft_slo, tpot_slo = seq.slo_ttft_s, seq.slo_tpot_s
    ttft_miss = ttft_slo is not None and seq.first_token_s - seq.arrival_s > ttft_slo
    tpot_miss = (tpot_slo is not None and seq.num_output > 1
                 and (now - seq.first_token_s) / (seq.num_output - 1) > tpot_slo)
    return ttft_miss, tpot_miss


class EpochBandit:
    """Discounted UCB (Garivier and Moulines 2011) over ``k`` arms, one arm per epoch of ``params.epoch_s``
    engine seconds, each epoch rewarded with its goodput: output tokens per engine second of the sequences that
    finished in it and met their SLOs. The mixin of the plugins that play it (the ``bandit`` watermark, the
    ``order_bandit`` scheduler); they call :meth:`_start_bandit` from ``__init__`` and :meth:`_start_epochs` from
    ``bind``, and read :attr:`arm`, the arm in force. An epoch's arm: each arm once in order, then the largest
    ``m_i / M + exploration * sqrt(ln n / n_i)`` (``n_i``, ``m_i``: discounted count and mean reward of arm i;
    ``n``: their sum; ``M``: the largest epoch goodput seen, so means are in [0, 1]); ties go to the first arm.
    Deterministic: no random numbers."""

    def _start_bandit(self, k: int) -> None:
        self.counts = np.zeros(k)        # discounted epochs per arm
        self.sums = np.zeros(k)          # discounted goodput (tok/s) per arm
        self.best_reward = 0.0           # largest epoch goodput seen (tok/s): the reward scale
        self.epochs_played = np.zeros(k, dtype=np.int64)   # undiscounted epochs per arm
        self.arm = 0
        self._good_tokens = 0
        self._epoch_start = 0.0

    def _start_epochs(self, now: float) -> None:
        self._epoch_start = now

    def choose(self) -> int:
        """The arm of the next epoch."""
        untried = np.flatnonzero(self.epochs_played == 0)
        if untried.size:
            return int(untried[0])
        scale = self.best_reward if self.best_reward > 0 else 1.0
        means = self.sums / self.counts / scale
        bonus = self.params.exploration * np.sqrt(math.log(self.counts.sum()) / self.counts) \
            if self.counts.sum() > 1 else np.zeros_like(means)
        return int(np.argmax(means + bonus))

    def reward(self, arm: int, goodput: float) -> None:
        """Fold one epoch's goodput (tok/s) of ``arm`` into the discounted statistics."""
        g = self.params.discount
        self.counts *= g
        self.sums *= g
        self.counts[arm] += 1.0
        self.sums[arm] += goodput
        self.epochs_played[arm] += 1
        self.best_reward = max(self.best_reward, goodput)

    def on_finish(self, seq) -> None:
        if not any(slo_misses(seq, self.engine.now)):
            self._good_tokens += seq.num_output

    def on_step_end(self) -> None:
        now = self.engine.now
        elapsed = now - self._epoch_start
        if elapsed < self.params.epoch_s:
            return
        self.reward(self.arm, self._good_tokens / elapsed)
        self._good_tokens, self._epoch_start = 0, now
        self.arm = self.choose()


def check_bandit_params(epoch_s: float, discount: float, exploration: float) -> None:
    """The shared :class:`EpochBandit` parameters' ranges (``ValueError`` naming the first out of range)."""
    check_range("epoch_s", epoch_s, 1e-9)
    check_range("discount", discount, 1e-9, 1.0)
    check_range("exploration", exploration, 0.0)


@register("watermark", "bandit")
class BanditWatermark(EpochBandit, WatermarkPolicy):
    """An online bandit over watermark values that needs no training (:class:`EpochBandit`: discounted
    UCB, for rewards that drift): each epoch of ``epoch_s`` engine seconds holds one arm, a fraction of
    ``fractions``, and earns its goodput; past epochs count with weight ``discount`` per epoch since, so
    the bandit follows a changing best arm. Parameters: ``fractions`` ([0.0, 0.01, 0.05, 0.1, 0.2, 0.3],
    each in [0, 1)), ``epoch_s`` (2.0), ``discount`` (0.9, in (0, 1]), ``exploration`` (0.5)."""

    @dataclass
    class Params:
        fractions: list[float] = field(default_factory=lambda: [0.0, 0.01, 0.05, 0.1, 0.2, 0.3])
        epoch_s: float = 2.0
        discount: float = 0.9
        exploration: float = 0.5

        def __post_init__(self):
            if isinstance(self.fractions, (str, bytes)) or not hasattr(self.fractions, "__len__") \
                    or len(self.fractions) == 0:
                raise ValueError(f"fractions must be a non-empty list of numbers, got {self.fractions!r}")
            for i, f in enumerate(self.fractions):
                check_range(f"fractions[{i}]", f, 0.0, 1.0, hi_inclusive=False)
            check_bandit_params(self.epoch_s, self.discount, self.exploration)

    def __init__(self, params) -> None:
        super().__init__(params)
        self._start_bandit(len(params.fractions))

    @property
    def fraction(self) -> float:
        return float(self.params.fractions[self.arm])

    def bind(self, engine) -> None:
        super().bind(engine)
        self._start_epochs(engine.now)

    def reserved_blocks(self) -> int:
        return int(self.fraction * self.engine.num_blocks)


@register("watermark", "slo_mix")
class SloMixWatermark(WatermarkPolicy):
    """A rule on the requests' own TPOT objectives, for traffic whose mix of tight- and loose-SLO
    requests shifts. After every engine step it counts the running and waiting sequences whose TPOT
    objective (their own, else the run's) is at most ``tight_tpot_s`` seconds, and keeps
    ``tight`` of the GPU blocks free while their share is at least ``share``, else ``loose``. A
    higher reserve admits less, so decode batches stay smaller and faster, which a tight TPOT
    needs; a loose one is better served by admitting (docs/rl.md, "Regime headroom"). It needs no
    training, and sees only what a server knows: the objectives its requests carry. Parameters:
    ``tight_tpot_s`` (0.005 s), ``share`` (0.5, in [0, 1]), ``tight`` (0.2) and ``loose`` (0.0),
    each in [0, 1)."""

    @dataclass
    class Params:
        tight_tpot_s: float = 0.005
        share: float = 0.5
        tight: float = 0.2
        loose: float = 0.0

        def __post_init__(self):
            check_range("tight_tpot_s", self.tight_tpot_s, 1e-9)
            check_range("share", self.share, 0.0, 1.0)
            check_range("tight", self.tight, 0.0, 1.0, hi_inclusive=False)
            check_range("loose", self.loose, 0.0, 1.0, hi_inclusive=False)

    def __init__(self, params) -> None:
        super().__init__(params)
        self.fraction = params.loose
        self.tight_share = 0.0        # the share of tight-TPOT sequences after the last step

    def on_step_end(self) -> None:
        seqs = (*self.engine.running, *self.engine.waiting)
        self.tight_share = tight_tpot_share(seqs, self.params.tight_tpot_s, inclusive=True)
        self.fraction = self.params.tight if seqs and self.tight_share >= self.params.share else self.params.loose

    def reserved_blocks(self) -> int:
        return int(self.fraction * self.engine.num_blocks)


@register("watermark", "ttft_slack")
class TtftSlackWatermark(WatermarkPolicy):
    """A rule on the waiting queue's TTFT slack, for traffic where the watermark trades TTFT against
    TPOT (an admission throttle): admitting less keeps decode batches small and fast, which the
    TPOT objective needs, until a waiting request's first token is at risk. After every engine step
    it finds the longest wait, ``now - arrival``, among the waiting requests that have no first
    token yet and carry a TTFT objective (their own, else the run's), and keeps ``high`` of the GPU
    blocks free while that wait is below ``urgency`` x the request's objective, else ``low`` (admit
    until nearly full). With nothing waiting it holds ``high``. It needs no training and sees only
    what a server knows: arrival times and objectives. Parameters: ``urgency`` (0.5, in [0, 1]),
    ``high`` (0.1) and ``low`` (0.01), each in [0, 1); ``inner`` (a watermark plugin name, default
    none) with ``inner_params``: that policy decides in place of ``high`` while no request is urgent
    (its reservation and its admit answers; it is bound to the engine and sees every event all
    along), so the rule becomes a TTFT guard around it, e.g. around a saved agent
    (``inner: agent, inner_params: {policy_path: ...}``)."""

    @dataclass
    class Params:
        urgency: float = 0.5
        high: float = 0.1
        low: float = 0.01
        inner: Optional[str] = None
        inner_params: Optional[dict] = None

        def __post_init__(self):
            check_range("urgency", self.urgency, 0.0, 1.0)
            check_range("high", self.high, 0.0, 1.0, hi_inclusive=False)
            check_range("low", self.low, 0.0, 1.0, hi_inclusive=False)
            if self.inner is None:
                if self.inner_params:
                    raise ValueError("inner_params without inner: name the watermark plugin they are for")
                return
            if self.inner == "agent" and not (self.inner_params or {}).get("policy_path"):
                raise ValueError("inner=agent needs inner_params.policy_path (a saved agent that decides by itself)")
            inner_plugin_spec("watermark", self.inner, self.inner_params)

    def __init__(self, params) -> None:
        super().__init__(params)
        self.fraction = params.high
        self.urgent = False           # a waiting request had used ``urgency`` of its TTFT objective after the last step
        self.inner: Optional[WatermarkPolicy] = (create("watermark", params.inner, **dict(params.inner_params or {}))
                                                 if params.inner else None)

    def bind(self, engine) -> None:
        super().bind(engine)
        if self.inner is not None:
            self.inner.bind(engine)

    def on_step_end(self) -> None:
        if self.inner is not None:
            self.inner.on_step_end()
        now, urgency = self.engine.now, self.params.urgency
        self.urgent = any(s.first_token_s is None and s.slo_ttft_s is not None
                          and now - s.arrival_s >= urgency * s.slo_ttft_s for s in self.engine.waiting)
        self.fraction = self.params.low if self.urgent else self.params.high

    def on_finish(self, seq) -> None:
        if self.inner is not None:
            self.inner.on_finish(seq)

    def on_preempt(self, seq, mode) -> None:
        if self.inner is not None:
            self.inner.on_preempt(seq, mode)

    @property
    def vetoes(self) -> bool:
        return self.inner is not None and not self.urgent and self.inner.vetoes

    def admit(self, seq, blocks_needed: int) -> bool:
        return self.inner.admit(seq, blocks_needed) if self.inner is not None and not self.urgent else True

    def reserved_blocks(self) -> int:
        if self.inner is not None and not self.urgent:
            return self.inner.reserved_blocks()
        return int(self.fraction * self.engine.num_blocks)
