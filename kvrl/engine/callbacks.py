"""Engine callbacks: observe a run step by step, and stop it, without wrapping the executor.

The shape follows Stable-Baselines3's ``BaseCallback``: an object whose :meth:`EngineCallback.on_step`
returns ``True`` to go on and ``False`` to stop. Register one with :meth:`Engine.add_callback
<kvrl.engine.engine.Engine.add_callback>` (for every later step) or for one run with
``Engine.run(requests, callbacks=[...])``.

Contract:

- ``on_step`` runs at the end of every :meth:`Engine.step <kvrl.engine.engine.Engine.step>` that
  executed a batch, after the batch was applied (tokens appended, finished sequences released) and
  the step recorded in the metrics. It must return a ``bool`` (anything else is a ``TypeError``).
- Returning ``False`` sets ``engine.stopped_by`` to the callback; :meth:`Engine.run` returns after
  that step (with the summary so far; requests not yet submitted are not submitted). Every
  registered callback still sees the step. A caller driving :meth:`Engine.step` itself checks
  ``engine.stopped_by``.
- A callback's wall time is not policy time; on a live executor it falls into the host gap before
  the next step (``elapsed_s`` of the next step includes it), so keep ``on_step`` cheap.
- Exceptions raised by a callback propagate (callbacks are the caller's code, not plugins).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvrl.engine.batch import ScheduledBatch, StepOutput

if TYPE_CHECKING:
    from kvrl.engine.engine import Engine


@dataclass(frozen=True, slots=True)
class StepEvent:
    """One executed engine step, as a callback sees it."""

    step_index: int          #: index of this step (1 for the first executed step of the engine)
    now_s: float             #: engine clock after the step, seconds
    batch: ScheduledBatch    #: the executed batch (its sequences already show this step's tokens)
    output: StepOutput       #: the executor's result (``output.elapsed_s``: the executor's seconds)
    duration_s: float        #: seconds the engine clock advanced (elapsed_s plus charged policy time)
    execute_wall_s: float    #: wall seconds spent inside ``executor.execute`` (host clock)


class EngineCallback:
    """Base class for engine callbacks; override what you need (each default does nothing)."""

    def on_run_start(self, engine: "Engine") -> None:
        """Called by :meth:`Engine.run` before its first step."""

    def on_step(self, event: StepEvent) -> bool:
        """Called after each executed step; return ``False`` to stop the run."""
        return True

    def on_run_end(self, engine: "Engine") -> None:
        """Called by :meth:`Engine.run` after its last step (also after a stop; not after an exception)."""
