"""Swap traces of preempted requests (issue #20, the CPEN 511 prefetching question).

:class:`SwapTraceRecorder` is an engine callback (:mod:`kvrl.engine.callbacks`): after every step
it compares the engine's swapped queue with the previous step's and records each swap-out (a
sequence entered the queue), swap-in (it left the queue running again) and drop (it left the
queue otherwise: aborted) as a :class:`SwapEvent`, in the order the engine did them. It reads the
queue only (no engine internals are changed).

:func:`next_swap_in_samples` turns a trace into supervised samples for the predictors of
:mod:`kvrl.analysis.swap_predict`: at every swap-in, the ``window`` events before it and which
sequence came back.

Units: seconds on the engine clock; blocks.
"""
from __future__ import annotations

import csv
from dataclasses import astuple, dataclass, fields
from pathlib import Path
from typing import Optional, Union

import numpy as np

from kvrl.plugins.swap_prefetch import window_features

KINDS = ("out", "in", "drop")


@dataclass(frozen=True)
class SwapEvent:
    """One swap of one sequence: ``kind`` out | in | drop, at engine ``step`` and ``time_s``."""

    step: int
    time_s: float
    kind: str
    seq_id: int
    request_id: str
    num_blocks: int


class SwapTraceRecorder:
    """Engine callback recording every swap-out / swap-in (see module doc); ``events`` in order."""

    def __init__(self) -> None:
        self.events: list[SwapEvent] = []
        self._engine = None
        self._swapped: dict[int, tuple[str, int]] = {}      # seq_id -> (request_id, cpu blocks), queue order

    def _queue(self) -> dict[int, tuple[str, int]]:
        return {s.seq_id: (s.request.request_id, len(s.cpu_block_table)) for s in self._engine.swapped}

    def on_run_start(self, engine) -> None:
        self._engine = engine
        self._swapped = self._queue()

    def on_step(self, event) -> bool:
        from kvrl.engine.request import SeqStatus
        now = self._queue()
        before = self._swapped
        for seq_id, (rid, blocks) in before.items():       # left the queue: in FIFO order
            if seq_id not in now:
                seqs = [s for s in self._engine.sequences(rid) if s.seq_id == seq_id]
                kind = "in" if seqs and seqs[0].status is SeqStatus.RUNNING else "drop"
                self.events.append(SwapEvent(event.step_index, event.now_s, kind, seq_id, rid, blocks))
        for seq_id, (rid, blocks) in now.items():
            if seq_id not in before:
                self.events.append(SwapEvent(event.step_index, event.now_s, "out", seq_id, rid, blocks))
        self._swapped = now
        return True

    def write_csv(self, path: Union[str, Path]) -> None:
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow([f.name for f in fields(SwapEvent)])
            w.writerows(astuple(e) for e in self.events)


def read_csv(path: Union[str, Path]) -> list[SwapEvent]:
    with open(path, newline="") as f:
        return [SwapEvent(int(r["step"]), float(r["time_s"]), r["kind"], int(r["seq_id"]), r["request_id"],
                          int(r["num_blocks"])) for r in csv.DictReader(f)]


@dataclass
class Samples:
    """Supervised samples at each swap-in (see :func:`next_swap_in_samples`).

    ``x``: (n, window, 5) per past event: is-out, is-in, sequence id relative to the last event's
    (scaled by 1/100), blocks (scaled by 1/100), seconds since the previous event; zero rows pad
    windows at the trace's start. ``offset``: the swapped-in sequence's id minus the last event's
    (regression target). ``label``: the position in the window of that sequence's swap-out event
    (0 = oldest), or ``window`` when its swap-out is not in the window (classification target).
    ``fifo`` / ``lifo``: what the oldest still-swapped / the newest swapped-out sequence rule
    predicts (the engine's FIFO swap-in knows the whole queue; these rules see the whole history).
    """

    x: np.ndarray
    offset: np.ndarray
    label: np.ndarray
    target_seq: np.ndarray
    fifo: np.ndarray
    lifo: np.ndarray
    window: int


def next_swap_in_samples(events: list[SwapEvent], window: int) -> Samples:
    """One sample per swap-in event that has at least one event before it."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window!r}")
    xs, offsets, labels, targets, fifo, lifo = [], [], [], [], [], []
    outstanding: list[int] = []             # swapped-out, not yet back, oldest first
    for j, e in enumerate(events):
        if e.kind == "in" and j > 0 and outstanding:
            past = events[max(0, j - window):j]
            anchor = past[-1].seq_id
            pad = window - len(past)
            x = window_features([(p.kind, p.seq_id, p.num_blocks, p.time_s) for p in past], window)
            label = window
            for k, p in enumerate(past):
                if p.kind == "out" and p.seq_id == e.seq_id:
                    label = pad + k
            xs.append(x)
            offsets.append(e.seq_id - anchor)
            labels.append(label)
            targets.append(e.seq_id)
            fifo.append(outstanding[0])
            lifo.append(outstanding[-1])
        if e.kind == "out":
            outstanding.append(e.seq_id)
        elif e.seq_id in outstanding:
            outstanding.remove(e.seq_id)
    return Samples(np.array(xs, dtype=np.float32).reshape(-1, window, 5), np.array(offsets, dtype=np.float32),
                   np.array(labels, dtype=np.int64), np.array(targets), np.array(fifo), np.array(lifo), window)


def summary(events: list[SwapEvent]) -> dict[str, Optional[float]]:
    """Counts per kind and whether every swap-in took the oldest outstanding sequence (FIFO)."""
    samples = next_swap_in_samples(events, 1)
    n = len(samples.target_seq)
    return {**{f"swap_{k}": sum(e.kind == k for e in events) for k in KINDS},
            "fifo_share": float(np.mean(samples.fifo == samples.target_seq)) if n else None}
