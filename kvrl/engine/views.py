"""Read-only views of engine state handed to policies.

Views expose counts, per-request lengths and histories as properties; they hold no setters, and
their lists are fresh tuples, so a policy cannot change engine state through them. Both view kinds
are live: they read the current state on every access.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvrl.engine.engine import Engine
    from kvrl.engine.request import Sequence


class SeqView:
    """One sequence as a policy sees it (lengths in tokens, times in engine seconds)."""

    __slots__ = ("_seq", "_engine")

    def __init__(self, seq: "Sequence", engine: "Engine") -> None:
        self._seq = seq
        self._engine = engine

    seq_id = property(lambda self: self._seq.seq_id)
    request_id = property(lambda self: self._seq.request.request_id)
    tenant = property(lambda self: self._seq.request.tenant)
    priority = property(lambda self: self._seq.request.priority)
    arrival_s = property(lambda self: self._seq.request.arrival_s)
    prompt_len = property(lambda self: self._seq.request.prompt_len)
    num_output = property(lambda self: self._seq.num_output)
    num_tokens = property(lambda self: self._seq.num_tokens)
    num_computed = property(lambda self: self._seq.num_computed)
    num_blocks = property(lambda self: len(self._seq.block_table))
    num_cpu_blocks = property(lambda self: len(self._seq.cpu_block_table))
    admitted_s = property(lambda self: self._seq.admitted_s)
    admit_order = property(lambda self: self._seq.admit_order)
    first_token_s = property(lambda self: self._seq.first_token_s)
    num_preemptions = property(lambda self: self._seq.num_preemptions)
    status = property(lambda self: self._seq.status)
    n = property(lambda self: self._seq.request.n)

    @property
    def output_len(self) -> int:
        """Tokens this sequence will generate in total. Oracle knowledge: exact in a trace, unknown
        to a real server; policies that use it say so."""
        return self._seq.request.output_len

    @property
    def max_tokens(self) -> int:
        """Client-visible cap on output tokens (what a real server knows): the model's maximum
        length minus the prompt."""
        return self._engine.config.max_model_len - self._seq.request.prompt_len

    @property
    def slo_ttft_s(self) -> "float | None":
        """The TTFT objective this request is judged by (its own, else the run's; None = none)."""
        own = self._seq.request.slo_ttft_s
        return own if own is not None else self._engine.metrics.default_slo_ttft_s

    @property
    def slo_tpot_s(self) -> "float | None":
        """The TPOT objective this request is judged by (its own, else the run's; None = none)."""
        own = self._seq.request.slo_tpot_s
        return own if own is not None else self._engine.metrics.default_slo_tpot_s

    @property
    def cached_prefix_tokens(self) -> int:
        """Prompt tokens a new admission would find in the prefix cache now (0 if disabled)."""
        return self._engine.allocator.peek_cached_tokens(self._seq)


class EngineView:
    """The engine as a policy sees it. Block counts are GPU blocks unless named ``cpu``."""

    __slots__ = ("_engine",)

    def __init__(self, engine: "Engine") -> None:
        self._engine = engine

    now = property(lambda self: self._engine.now)
    step_index = property(lambda self: self._engine.step_index)
    num_blocks = property(lambda self: self._engine.config.num_blocks)
    block_size = property(lambda self: self._engine.config.block_size)
    max_model_len = property(lambda self: self._engine.config.max_model_len)
    num_free_blocks = property(lambda self: self._engine.allocator.num_free_blocks)
    num_used_blocks = property(lambda self: self._engine.allocator.num_used_blocks)
    num_cpu_blocks = property(lambda self: self._engine.config.num_cpu_blocks)
    num_free_cpu_blocks = property(lambda self: self._engine.allocator.num_free_cpu_blocks)
    num_running = property(lambda self: len(self._engine.running))
    num_waiting = property(lambda self: len(self._engine.waiting) + len(self._engine.preempted))
    num_swapped = property(lambda self: len(self._engine.swapped))
    num_preemptions = property(lambda self: self._engine.metrics.preemptions)
    finished_output_lens = property(lambda self: tuple(self._engine.metrics.finished_output_lens))
    num_arrived = property(lambda self: len(self._engine.metrics.requests) + len(self._engine.metrics.rejected))
    num_accepted = property(lambda self: len(self._engine.metrics.requests))
    arrived_prompt_tokens = property(lambda self: self._engine.metrics.arrived_prompt_tokens)
    recomputed_tokens = property(lambda self: self._engine.metrics.recomputed_tokens)
    swapped_out_blocks = property(lambda self: self._engine.metrics.swapped_out_blocks)
    swapped_in_blocks = property(lambda self: self._engine.metrics.swapped_in_blocks)
    slo_ttft_s = property(lambda self: self._engine.metrics.default_slo_ttft_s)   # the run's TTFT SLO (s) or None
    slo_tpot_s = property(lambda self: self._engine.metrics.default_slo_tpot_s)   # the run's TPOT SLO (s) or None

    @property
    def reserved_blocks(self) -> int:
        """Blocks the watermark policy holds back now (0 while nothing runs)."""
        return self._engine._reserved_blocks()

    @property
    def running(self) -> tuple[SeqView, ...]:
        return tuple(self._engine.view_of(s) for s in self._engine.running)

    @property
    def waiting(self) -> tuple[SeqView, ...]:
        return tuple(self._engine.view_of(s) for s in (*self._engine.preempted, *self._engine.waiting))

    @property
    def swapped(self) -> tuple[SeqView, ...]:
        return tuple(self._engine.view_of(s) for s in self._engine.swapped)

    def estimate_recompute_s(self, num_tokens: int) -> float:
        """Executor's estimate of the seconds to prefill ``num_tokens`` again."""
        return self._engine.executor.estimate_prefill_s(num_tokens)

    def estimate_swap_s(self, num_blocks: int) -> float:
        """Executor's estimate of the seconds to move ``num_blocks`` one way over PCIe."""
        return self._engine.executor.estimate_swap_s(num_blocks)
