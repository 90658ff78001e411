"""Decision points of an engine step, for callers that take the decisions themselves.

:meth:`Engine.step_iter <kvrl.engine.engine.Engine.step_iter>` is a generator over one step: it
yields a :class:`Shortage` each time a running sequence needs a KV block while none is free, and
receives the decision through ``send``: an :class:`~kvrl.plugins.base.EvictionDecision` naming one
of the candidates (``seq_id``) and a preemption mode. A decision that names no candidate, or an
exception sent in its place, is an eviction policy error, handled exactly as a failing eviction
plugin (``engine.policy_errors``: the request that needed the block is aborted alone, or
:class:`~kvrl.engine.engine.PolicyError` is raised). :meth:`Engine.step` is the same generator with
every shortage answered by the engine's eviction plugin (``plugin.select(shortage.candidates)``).
"""
from __future__ import annotations

from dataclasses import dataclass

from kvrl.engine.views import SeqView


@dataclass(frozen=True, slots=True)
class Shortage:
    """A running sequence needs KV blocks and the pool has too few free: pick a victim."""

    seq: SeqView                 #: the sequence that needs the blocks (itself a candidate)
    candidates: list[SeqView]    #: sequences that may be preempted: ``seq`` and every running one scheduled after it
    blocks_needed: int           #: blocks ``seq`` needs for this step's tokens
    free_blocks: int             #: blocks free now
