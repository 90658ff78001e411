"""Built-in eviction (preemption) policies: ``lifo``, ``fewest_computed``, ``most_blocks``,
``priority``, ``longest_remaining``, ``slo_slack``, ``cost_aware``.

Each picks a victim among the candidates (running sequences not yet scheduled this step, always
including the one that needs a block) and a mode. ``mode`` is ``recompute``, ``swap``, or ``auto``
(swap when the CPU pool has room for the victim, else recompute).
"""
from __future__ import annotations

import abc
from dataclasses import dataclass

from kvrl.plugins.base import EvictionDecision, EvictionPolicy, PreemptionMode, check_choice, check_range
from kvrl.plugins.lengths import LENGTH_KEYS, RemainingOutput
from kvrl.plugins.registry import register
from kvrl.plugins.slack import slo_slack

_MODES = ("recompute", "swap", "auto")


@dataclass
class ModeParams:
    mode: str = "recompute"

    def __post_init__(self):
        check_choice("mode", self.mode, _MODES)


class _ByKey(EvictionPolicy):
    """Victim = the candidate with the largest ``key``; mode from ``params.mode``."""

    Params = ModeParams

    @abc.abstractmethod
    def key(self, seq):
        """Victim order: the candidate with the largest key is preempted."""

    def mode_for(self, seq) -> PreemptionMode:
        mode = self.params.mode
        if mode == "auto":
            return PreemptionMode.SWAP if seq.num_blocks <= self.engine.num_free_cpu_blocks else PreemptionMode.RECOMPUTE
        return PreemptionMode(mode)

    def select(self, candidates):
        victim = max(candidates, key=self.key)
        return EvictionDecision(victim.seq_id, self.mode_for(victim))


@register("eviction", "lifo")
class LIFO(_ByKey):
    """Newest admitted first (last in, first out): vLLM's rule, which protects the requests that
    have waited longest. Parameter ``mode`` (default recompute, vLLM V1's default)."""

    def key(self, seq):
        return seq.admit_order


@register("eviction", "fewest_computed")
class FewestComputed(_ByKey):
    """The sequence with the fewest computed tokens: the least work lost by recompute and the
    fewest blocks to swap per victim. Ties go to the newest. Parameter ``mode``."""

    def key(self, seq):
        return (-seq.num_computed, seq.admit_order)


@register("eviction", "most_blocks")
class MostBlocks(_ByKey):
    """The sequence holding the most blocks: frees the most memory with one preemption, so fewer
    preemptions happen. Ties go to the newest. Parameter ``mode``."""

    def key(self, seq):
        return (seq.num_blocks, seq.admit_order)


@register("eviction", "priority")
class PriorityEviction(_ByKey):
    """The least important request (largest ``priority`` value), newest among equals: vLLM's
    priority-scheduling preemption order. Parameter ``mode``."""

    def key(self, seq):
        return (seq.priority, seq.admit_order)


class _Predicting(_ByKey):
    """A key that uses the predicted remaining output (:class:`~kvrl.plugins.lengths.RemainingOutput`),
    fed by this plugin's ``on_finish``."""

    def __init__(self, params) -> None:
        super().__init__(params)
        self.remaining = RemainingOutput(params.key, params.min_class_history)

    def on_finish(self, seq) -> None:
        self.remaining.add(seq)


@dataclass
class PredictingParams(ModeParams):
    key: str = "none"
    min_class_history: int = 8

    def __post_init__(self):
        super().__post_init__()
        check_choice("key", self.key, LENGTH_KEYS)
        check_range("min_class_history", self.min_class_history, 1)


@register("eviction", "longest_remaining")
class LongestRemaining(_Predicting):
    """The sequence predicted to generate the most tokens still: it would hold its blocks longest,
    so preempting it frees memory for the most future work per preemption. Remaining output is
    predicted from the finished requests (:class:`~kvrl.plugins.lengths.RemainingOutput`: the mean
    length of those that outlived the sequence's output so far, minus it), with ``key=tenant``
    from the sequence's own tenant once it has ``min_class_history`` finished requests. Ties go to
    the newest. Parameters: ``mode``, ``key`` (none | tenant | hint), ``min_class_history`` (8)."""

    Params = PredictingParams

    def key(self, seq):
        return (self.remaining.of(seq), seq.admit_order)


@register("eviction", "slo_slack")
class SloSlack(_Predicting):
    """SLO-aware: a sequence that has already failed its SLO (missed its TTFT, or behind its TPOT
    objective on the predicted course) first, the one holding most blocks among those; else the
    one with the most slack (:func:`~kvrl.plugins.slack.slo_slack`: how long it can be stalled and
    still meet its SLO, its remaining output predicted as for ``longest_remaining``). A preemption
    then costs goodput only when every candidate's slack is short. Ties go to the newest.
    Parameters: ``mode``, ``key`` (none | tenant | hint), ``min_class_history`` (8), ``pace`` (time per
    future token as a fraction of the TPOT objective, (0, 1], default 0.8)."""

    @dataclass
    class Params(PredictingParams):
        pace: float = 0.8

        def __post_init__(self):
            super().__post_init__()
            check_range("pace", self.pace, 1e-6, 1.0)

    def key(self, seq):
        slack = slo_slack(seq, self.engine.now, self.remaining.of(seq), self.params.pace)
        if slack < 0:
            return (1, seq.num_blocks, seq.admit_order)
        return (0, slack, seq.admit_order)


@register("eviction", "cost_aware")
class CostAware(EvictionPolicy):
    """Victim by ``victim`` rule (lifo or most_blocks); mode by estimated time: swap when moving
    the victim's blocks out and back over PCIe (2 x blocks / PCIe bandwidth, from the executor's
    cost model) is cheaper than prefilling its computed tokens again, and the CPU pool has room;
    recompute otherwise. Parameters: ``victim`` (lifo | most_blocks), ``swap_penalty`` (factor on
    the swap estimate, default 1.0). Source: the swap-vs-recompute analysis of the vLLM paper
    (Kwon et al. 2023, section 7.3)."""

    @dataclass
    class Params:
        victim: str = "lifo"
        swap_penalty: float = 1.0

        def __post_init__(self):
            check_choice("victim", self.victim, ("lifo", "most_blocks"))
            if not self.swap_penalty > 0:
                raise ValueError(f"swap_penalty must be > 0, got {self.swap_penalty}")

    def select(self, candidates):
        if self.params.victim == "lifo":
            victim = max(candidates, key=lambda s: s.admit_order)
        else:
            victim = max(candidates, key=lambda s: (s.num_blocks, s.admit_order))
        swap_s = 2.0 * self.engine.estimate_swap_s(victim.num_blocks) * self.params.swap_penalty
        recompute_s = self.engine.estimate_recompute_s(victim.num_computed)
        fits = victim.num_blocks <= self.engine.num_free_cpu_blocks
        mode = PreemptionMode.SWAP if fits and swap_s < recompute_s else PreemptionMode.RECOMPUTE
        return EvictionDecision(victim.seq_id, mode)
