"""The serving loop: requests enter an engine by arrival time and engine steps run until the end or
a limit. :meth:`Engine.run <kvrl.engine.engine.Engine.run>`, the Gymnasium environments and the
apps all serve through one :class:`ServingLoop`, so an episode that serves a whole split is the
same computation as ``kvrl-run`` on it (tested bit for bit in tests/test_envs.py).

One iteration (:meth:`ServingLoop.step`, or :meth:`ServingLoop.step_iter` to take the decisions):

1. idling: if the engine holds no unfinished request and the next arrival lies in the future, the
   engine clock jumps to it;
2. arrivals: every request that arrived by the engine clock is submitted (a request that can never
   be served is rejected and recorded by :meth:`Engine.submit`);
3. progress: if anything is unfinished, one engine step runs.

The loop is :attr:`~ServingLoop.done` when every request was submitted and nothing is unfinished
(:attr:`~ServingLoop.finished`), or at the first limit reached (:attr:`~ServingLoop.stop_reason`):
a callback's ``on_step`` returned False (``engine.stopped_by``), ``max_steps`` (engine steps since
the engine was built), ``end_s`` (engine clock, seconds) or ``max_wall_s`` (host seconds since the
loop was made). Limits are checked between iterations: what is in flight stays unfinished.

:meth:`ServingLoop.run` serves until done inside the run's set-up: callbacks registered for the
run (their ``on_run_start``/``on_run_end``), the cyclic garbage collector paused with
``engine.pause_gc`` (see :class:`~kvrl.engine.config.EngineConfig`), an optional progress bar.
"""
from __future__ import annotations

import gc
import logging
from contextlib import contextmanager
from time import perf_counter
from typing import TYPE_CHECKING, Callable, Generator, Iterable, Iterator, Optional

from kvrl.engine.batch import ScheduledBatch
from kvrl.engine.request import Request

if TYPE_CHECKING:    # the engine imports this module
    from kvrl.engine.decisions import Shortage
    from kvrl.engine.engine import Engine

log = logging.getLogger(__name__)

#: a run collects the process's garbage before freezing it when the heap (counted as the objects frozen) has
#: grown by this factor since the last such collection, as CPython's own collector does a full collection when a
#: quarter more objects reach the oldest generation
HEAP_GROWTH_COLLECT = 1.25


class _FullCollections:
    """How many objects the heap held after the last full collection a run made (:func:`_freeze_heap`)."""

    heap_objects = 0


def _freeze_heap() -> None:
    """``gc.freeze()``, after a full collection where the heap has grown by :data:`HEAP_GROWTH_COLLECT` since the
    last one. Frozen objects are never collected, and each run's objects join the oldest generation unwalked
    (``_run_setup``), where no automatic collection reaches them: without this, the garbage of every earlier run
    (its engine, once dropped) would be frozen again by the next and a process serving many runs (kvrl-eval's
    jobs, kvrl-fidelity's sim ensembles) would grow without bound (a few MB per run)."""
    gc.freeze()
    if gc.get_freeze_count() > HEAP_GROWTH_COLLECT * _FullCollections.heap_objects:
        gc.unfreeze()
        collect_garbage()
        gc.freeze()


def collect_garbage() -> None:
    """A full collection now, which the next runs count as their last (:func:`_freeze_heap`): call it before a run
    whose wall time is measured from outside (kvrl-bench), so that the run does not make one itself. When something
    else froze objects, only the collection is made."""
    gc.collect()
    if gc.get_freeze_count() == 0:
        gc.freeze()
        _FullCollections.heap_objects = gc.get_freeze_count()
        gc.unfreeze()


class ServingLoop:
    """Serve ``requests`` on ``engine`` by arrival time (see the module docstring).

    Making the loop starts the engine clock at the first arrival (``engine.now`` and
    ``engine.metrics.start_s``) and clears ``engine.stopped_by``. ``on_submit(request)`` is called
    for every request the engine accepted, when it is submitted. Limits that are ``None`` do not
    apply; a limit that is not positive is a ``ValueError`` naming it.
    """

    def __init__(self, engine: "Engine", requests: Iterable[Request], *, end_s: Optional[float] = None,
                 max_steps: Optional[int] = None, max_wall_s: Optional[float] = None,
                 on_submit: Optional[Callable[[Request], None]] = None) -> None:
        for name, value in (("max_steps", max_steps), ("max_wall_s", max_wall_s)):
            if value is not None and not value > 0:
                raise ValueError(f"{name}={value!r}: must be positive (or None for no limit)")
        self.engine = engine
        self.pending: list[Request] = sorted(requests, key=lambda r: r.arrival_s)
        self.end_s = end_s
        self.max_steps = max_steps
        self.max_wall_s = max_wall_s
        self.on_submit = on_submit
        self.next_index = 0                  # pending[next_index] is the next request to submit
        engine.metrics.start_s = engine.now = self.pending[0].arrival_s if self.pending else 0.0
        engine.stopped_by = None
        self._t0 = perf_counter()

    # ------------------------------------------------------------------ state
    @property
    def finished(self) -> bool:
        """Every request was submitted and none is unfinished (the trace's end)."""
        return self.next_index >= len(self.pending) and not self.engine.has_unfinished

    @property
    def stop_reason(self) -> Optional[str]:
        """The first limit reached, or ``None``: ``"callback"``, ``"max_steps"``, ``"end_s"``, ``"max_wall_s"``."""
        engine = self.engine
        if engine.stopped_by is not None:
            return "callback"
        if self.max_steps is not None and engine.step_index >= self.max_steps:
            return "max_steps"
        if self.end_s is not None and engine.now >= self.end_s:
            return "end_s"
        if self.max_wall_s is not None and perf_counter() - self._t0 > self.max_wall_s:
            return "max_wall_s"
        return None

    @property
    def timed_out(self) -> bool:
        """The engine clock reached ``end_s``."""
        return self.end_s is not None and self.engine.now >= self.end_s

    @property
    def done(self) -> bool:
        return self.finished or self.stop_reason is not None

    # ------------------------------------------------------------------ one iteration
    def _arrivals(self) -> None:
        """Steps 1 and 2 of an iteration: idle until the next arrival, submit what is due."""
        engine, pending = self.engine, self.pending
        i = self.next_index
        if i < len(pending) and not engine.has_unfinished and pending[i].arrival_s > engine.now:
            engine.now = pending[i].arrival_s
        while i < len(pending) and pending[i].arrival_s <= engine.now:
            request = pending[i]
            i += 1
            if engine.submit(request) and self.on_submit is not None:
                self.on_submit(request)
        self.next_index = i

    def step(self) -> Optional[ScheduledBatch]:
        """One iteration, the eviction plugin answering every block shortage; returns the executed
        batch (``None`` when no step ran). Call only while not :attr:`finished`."""
        self._arrivals()
        if self.engine.has_unfinished:
            return self.engine.step()
        return None

    def step_iter(self) -> Generator["Shortage", object, Optional[ScheduledBatch]]:
        """One iteration as a generator: yields each block shortage of the engine step
        (:meth:`Engine.step_iter <kvrl.engine.engine.Engine.step_iter>`) and receives its
        decision; returns the executed batch (``None`` when no step ran)."""
        self._arrivals()
        if self.engine.has_unfinished:
            return (yield from self.engine.step_iter())
        return None

    def serve_iter(self) -> Generator["Shortage", object, None]:
        """Iterations until :attr:`done`, as one generator of every block shortage (see
        :meth:`step_iter`); no run set-up (callbacks, GC, progress) around it."""
        while not self.done:
            yield from self.step_iter()

    def _serve(self) -> None:
        """:meth:`step` until :attr:`done` where only a callback can stop the run (no limits): the
        same iterations without evaluating :attr:`done` through its properties each time (a long
        sim run has about one iteration per 50 us of engine work)."""
        engine, n = self.engine, len(self.pending)
        while engine.stopped_by is None:
            if self.next_index < n:
                self._arrivals()
            elif not engine.has_unfinished:
                return                               # finished: every request submitted, none unfinished
            if engine.has_unfinished:
                engine.step()

    # ------------------------------------------------------------------ a whole run
    @contextmanager
    def _run_setup(self, callbacks: Iterable, progress: bool) -> Iterator[Optional[object]]:
        engine = self.engine
        bar = None
        if progress:
            from tqdm.auto import tqdm
            bar = tqdm(total=len(self.pending), desc="requests", unit="req", mininterval=0.5)
        pause = engine.config.pause_gc and gc.isenabled()
        freeze = pause and gc.get_freeze_count() == 0     # never unfreeze what someone else froze
        if freeze:
            _freeze_heap()
        if pause:
            gc.disable()
        added: list = []
        try:
            for cb in callbacks:                  # registered for this run only (removed below)
                added.append(engine.add_callback(cb))
            for cb in engine.callbacks:
                if hasattr(cb, "on_run_start"):
                    cb.on_run_start(engine)
            yield bar
            for cb in engine.callbacks:
                if hasattr(cb, "on_run_end"):
                    cb.on_run_end(engine)
        finally:
            for cb in added:
                engine.remove_callback(cb)
            if freeze:       # what the run made joins the oldest generation with what was frozen, so
                gc.freeze()  # the first young collection does not walk every object the run kept
                gc.unfreeze()
            if pause:
                gc.enable()
            if bar is not None:
                bar.close()

    def run(self, callbacks: Iterable = (), progress: bool = False) -> dict:
        """Serve until :attr:`done` (the eviction plugin answering every shortage) with the run's
        set-up (module docstring); returns ``engine.metrics.summary()``. ``callbacks`` are
        registered for this run only; every registered callback's ``on_run_start`` /
        ``on_run_end`` (where it has them) run around the loop (``on_run_end`` not after an
        exception). Policy errors are logged with their counts at the end."""
        engine = self.engine
        metrics = engine.metrics
        with self._run_setup(callbacks, progress) as bar:
            if bar is None and self.max_steps is None and self.end_s is None and self.max_wall_s is None:
                self._serve()
            while not self.done:
                before = metrics.num_finished
                self.step()
                if bar is not None:
                    bar.update(metrics.num_finished - before)
        for key, count in metrics.policy_error_counts.items():
            log.warning("policy errors: %s x %d", key, count)
        return metrics.summary()
