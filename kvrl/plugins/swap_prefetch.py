"""Proactive swap-in of preempted requests (issue #20, the CPEN 511 prefetching question): the
``swap_prefetch`` watermark.

kvrl's engine swaps sequences back in strictly in swap-out order (FIFO) while the watermark
allows: the head of the swapped queue comes back once ``free - its blocks >= reserved``. A
*proactive* swap-in brings the sequence that will come back next in as soon as its blocks fit,
ignoring the reservation (its copy is issued in this step and overlaps the step's compute, so it
computes from the next step on). Which sequence comes next is what a predictor answers; the
plugin asks one of two rules (:mod:`kvrl.analysis.swap_predict` measures learned predictors
against them): ``fifo`` names the oldest swapped-out sequence (the engine's own order, so it is
always right), ``lifo`` the newest (wrong whenever more than one sequence is swapped out).
With ``predictor=none`` it is the ``fixed`` watermark.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kvrl.plugins.base import WatermarkPolicy, check_range
from kvrl.plugins.registry import register


@register("watermark", "swap_prefetch")
class SwapPrefetchWatermark(WatermarkPolicy):
    """Keep ``fraction`` of all GPU blocks free (as ``fixed``), except while sequences are swapped
    out and the predicted next one fits in the free blocks: then reserve only what leaves room for
    it (``free - its blocks``), so the engine swaps it in now (see module doc). Parameters:
    ``fraction`` in [0, 1) (default 0.1), ``predictor`` fifo | lifo | none (default fifo)."""

    @dataclass
    class Params:
        fraction: float = 0.1
        predictor: Literal["fifo", "lifo", "none"] = "fifo"

        def __post_init__(self):
            check_range("fraction", self.fraction, 0.0, 1.0, hi_inclusive=False)

    def reserved_blocks(self) -> int:
        view = self.engine
        base = int(self.params.fraction * view.num_blocks)
        if self.params.predictor == "none" or not view.num_swapped:
            return base
        swapped = view.swapped
        target = swapped[0] if self.params.predictor == "fifo" else swapped[-1]
        free = view.num_free_blocks
        need = target.num_cpu_blocks
        return min(base, free - need) if need <= free else base

