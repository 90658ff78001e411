"""Proactive swap-in of preempted requests (issue #20, the CPEN 511 prefetching question): the
``swap_prefetch`` watermark.

kvrl's engine swaps sequences back in strictly in swap-out order (FIFO) while the watermark
allows: the head of the swapped queue comes back once ``free - its blocks >= reserved``. A
*proactive* swap-in brings the sequence that will come back next in as soon as its blocks fit,
ignoring the reservation (its copy is issued in this step and overlaps the step's compute, so it
computes from the next step on). Which sequence comes next is what a predictor answers; the
plugin asks one of two rules or a learned model (:mod:`kvrl.analysis.swap_predict` trains and
measures them): ``fifo`` names the oldest swapped-out sequence (the engine's own order, so it is
always right), ``lifo`` the newest (wrong whenever more than one sequence is swapped out),
``model`` a TorchScript classifier (``model_path``) over the last ``window`` swap events, as
:func:`window_features` encodes them, that names the swap-out event of the next swapped-in
sequence (no proactive swap-in when it names none or a sequence no longer swapped out). With
``predictor=none`` it is the ``fixed`` watermark.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional, Sequence

import numpy as np

from kvrl.plugins.base import WatermarkPolicy, check_range
from kvrl.plugins.registry import register


def window_features(past: Sequence[tuple], window: int) -> np.ndarray:
    """(window, 5) float32 features of ``past`` swap events ``(kind, seq_id, num_blocks, time_s)``,
    oldest first, at most ``window`` of them, right-aligned (zero rows pad the front): is-out,
    is-in, sequence id relative to the last event's (/100), blocks (/100), seconds since the
    previous event. The encoding of :func:`kvrl.analysis.swap_trace.next_swap_in_samples`."""
    x = np.zeros((window, 5), dtype=np.float32)
    if not past:
        return x
    past = list(past)[-window:]
    anchor, pad, prev_t = past[-1][1], window - len(past), past[0][3]
    for k, (kind, seq_id, blocks, t) in enumerate(past):
        x[pad + k] = (kind == "out", kind == "in", (seq_id - anchor) / 100.0, blocks / 100.0, t - prev_t)
        prev_t = t
    return x


@register("watermark", "swap_prefetch")
class SwapPrefetchWatermark(WatermarkPolicy):
    """Keep ``fraction`` of all GPU blocks free (as ``fixed``), except while sequences are swapped
    out and the predicted next one fits in the free blocks: then reserve only what leaves room for
    it (``free - its blocks``), so the engine swaps it in now (see module doc). Parameters:
    ``fraction`` in [0, 1) (default 0.1), ``predictor`` fifo | lifo | model | none (default fifo),
    ``model_path`` (TorchScript classifier, for ``model``) and its ``window`` (default 8)."""

    @dataclass
    class Params:
        fraction: float = 0.1
        predictor: Literal["fifo", "lifo", "model", "none"] = "fifo"
        model_path: Optional[str] = None
        window: int = 8

        def __post_init__(self):
            check_range("fraction", self.fraction, 0.0, 1.0, hi_inclusive=False)
            check_range("window", self.window, 1)
            if self.predictor == "model" and not self.model_path:
                raise ValueError("watermark.model_path: predictor=model needs a TorchScript classifier file")

    def __init__(self, params=None) -> None:
        super().__init__(params)
        self._model = None
        self._history: list[tuple] = []          # (kind, seq_id, cpu blocks, time_s), oldest first
        self._swapped: dict[int, int] = {}        # seq_id -> cpu blocks at the last step's end
        if self.params.predictor == "model":
            import torch
            self._model = torch.jit.load(self.params.model_path)

    def on_step_end(self) -> None:
        """Record the step's swap-outs and swap-ins (the swapped queue's changes) for the model."""
        if self._model is None:
            return
        view = self.engine
        now = {s.seq_id: s.num_cpu_blocks for s in view.swapped}
        for seq_id, blocks in self._swapped.items():
            if seq_id not in now:
                self._history.append(("in", seq_id, blocks, view.now))
        for seq_id, blocks in now.items():
            if seq_id not in self._swapped:
                self._history.append(("out", seq_id, blocks, view.now))
        del self._history[:-self.params.window]
        self._swapped = now

    def _predicted(self, swapped):
        """The swapped-out sequence the predictor names, or None."""
        p = self.params
        if p.predictor == "fifo":
            return swapped[0]
        if p.predictor == "lifo":
            return swapped[-1]
        import torch
        past = self._history[-p.window:]
        if not past:
            return None
        with torch.no_grad():
            k = int(self._model(torch.from_numpy(window_features(past, p.window))[None]).argmax(1))
        pad = p.window - len(past)
        if not pad <= k < p.window:
            return None
        kind, seq_id = past[k - pad][:2]
        return next((s for s in swapped if s.seq_id == seq_id), None) if kind == "out" else None

    def reserved_blocks(self) -> int:
        view = self.engine
        base = int(self.params.fraction * view.num_blocks)
        if self.params.predictor == "none" or not view.num_swapped:
            return base
        target = self._predicted(view.swapped)
        if target is None:
            return base
        free = view.num_free_blocks
        need = target.num_cpu_blocks
        return min(base, free - need) if need <= free else base

