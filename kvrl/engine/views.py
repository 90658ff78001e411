"""Read-only views of engine state handed to policies.

Views expose counts, per-request lengths and histories as properties; they hold no setters, and
their lists are fresh tuples, so a policy cannot change engine state through them. Both view kinds
are live: they read the current state on every access.

They are read-only in the Python sense: ``__slots__`` leave no instance ``__dict__``, so no
attribute can be set or added (``AttributeError``), and the engine and sequence they read are kept
in name-mangled slots with no public or single-underscore name (``view._seq`` and
``view._engine`` do not exist). Python cannot hide an object from introspection, so this stops
mistakes and casual reach-through, not a policy determined to cheat.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvrl.engine.engine import Engine
    from kvrl.engine.request import Sequence


class SeqView:
    """One sequence as a policy sees it (lengths in tokens, times in engine seconds)."""

    __slots__ = ("__seq", "__engine")

    def __init__(self, seq: "Sequence", engine: "Engine") -> None:
        self.__seq = seq
        self.__engine = engine

    seq_id = property(lambda self: self.__seq.seq_id)
    request_id = property(lambda self: self.__seq.request.request_id)
    tenant = property(lambda self: self.__seq.request.tenant)
    priority = property(lambda self: self.__seq.request.priority)
    arrival_s = property(lambda self: self.__seq.request.arrival_s)
    prompt_len = property(lambda self: self.__seq.request.prompt_len)
    num_output = property(lambda self: self.__seq.num_output)
    num_tokens = property(lambda self: self.__seq.num_tokens)
    num_computed = property(lambda self: self.__seq.num_computed)
    num_blocks = property(lambda self: len(self.__seq.block_table))
    num_cpu_blocks = property(lambda self: len(self.__seq.cpu_block_table))
    admitted_s = property(lambda self: self.__seq.admitted_s)
    admit_order = property(lambda self: self.__seq.admit_order)
    @property
    def first_token_s(self) -> "float | None":
        """Engine time of the first output token; None while the sequence has none (the engine's
        own record keeps -1.0 there, which a policy must never read as a time)."""
        first = self.__seq.first_token_s
        return first if first >= 0.0 else None

    num_preemptions = property(lambda self: self.__seq.num_preemptions)
    status = property(lambda self: self.__seq.status)
    n = property(lambda self: self.__seq.request.n)

    @property
    def output_len(self) -> int:
        """Tokens this sequence will generate in total. Oracle knowledge: exact in a trace, unknown
        to a real server; policies that use it say so."""
        return self.__seq.request.output_len

    @property
    def output_len_hint(self) -> "int | None":
        """The workload's predicted output length (tokens; not the truth), None where it has none."""
        return self.__seq.request.output_len_hint

    @property
    def max_tokens(self) -> int:
        """Client-visible cap on output tokens (what a real server knows): the model's maximum
        length minus the prompt."""
        return self.__engine.config.max_model_len - self.__seq.request.prompt_len

    @property
    def slo_ttft_s(self) -> "float | None":
        """The TTFT objective this request is judged by (its own, else the run's; None = none)."""
        own = self.__seq.request.slo_ttft_s
        return own if own is not None else self.__engine.metrics.default_slo_ttft_s

    @property
    def slo_tpot_s(self) -> "float | None":
        """The TPOT objective this request is judged by (its own, else the run's; None = none)."""
        own = self.__seq.request.slo_tpot_s
        return own if own is not None else self.__engine.metrics.default_slo_tpot_s

    @property
    def cached_prefix_tokens(self) -> int:
        """Prompt tokens a new admission would find in the prefix cache now (0 if disabled)."""
        return self.__engine.allocator.peek_cached_tokens(self.__seq)


class EngineView:
    """The engine as a policy sees it. Block counts are GPU blocks unless named ``cpu``. Weakly
    referenceable: a plugin may key per-engine state on its view (kvrl.plugins.joint)."""

    __slots__ = ("__engine", "__weakref__")

    def __init__(self, engine: "Engine") -> None:
        self.__engine = engine

    now = property(lambda self: self.__engine.now)
    step_index = property(lambda self: self.__engine.step_index)
    num_blocks = property(lambda self: self.__engine.config.num_blocks)
    block_size = property(lambda self: self.__engine.config.block_size)
    max_model_len = property(lambda self: self.__engine.config.max_model_len)
    num_free_blocks = property(lambda self: self.__engine.allocator.num_free_blocks)
    num_used_blocks = property(lambda self: self.__engine.allocator.num_used_blocks)
    num_cpu_blocks = property(lambda self: self.__engine.config.num_cpu_blocks)
    num_free_cpu_blocks = property(lambda self: self.__engine.allocator.num_free_cpu_blocks)
    num_running = property(lambda self: len(self.__engine.running))
    num_waiting = property(lambda self: len(self.__engine.waiting) + len(self.__engine.preempted))
    num_swapped = property(lambda self: len(self.__engine.swapped))
    num_preemptions = property(lambda self: self.__engine.metrics.preemptions)
    finished_output_lens = property(lambda self: tuple(self.__engine.metrics.finished_output_lens))
    num_arrived = property(lambda self: len(self.__engine.metrics.requests) + len(self.__engine.metrics.rejected))
    num_accepted = property(lambda self: len(self.__engine.metrics.requests))
    arrived_prompt_tokens = property(lambda self: self.__engine.metrics.arrived_prompt_tokens)
    recomputed_tokens = property(lambda self: self.__engine.metrics.recomputed_tokens)
    swapped_out_blocks = property(lambda self: self.__engine.metrics.swapped_out_blocks)
    swapped_in_blocks = property(lambda self: self.__engine.metrics.swapped_in_blocks)
    prompt_tokens_looked_up = property(lambda self: self.__engine.metrics.prompt_tokens_looked_up)  # prefix cache
    prompt_tokens_hit = property(lambda self: self.__engine.metrics.prompt_tokens_hit)   # ... of those, found cached
    num_cached_blocks = property(lambda self: self.__engine.prefix_cache.num_cached)    # blocks in the prefix cache
    num_cached_free_blocks = property(lambda self: self.__engine.prefix_cache.num_evictable)  # ... held by no one
    slo_ttft_s = property(lambda self: self.__engine.metrics.default_slo_ttft_s)   # the run's TTFT SLO (s) or None
    slo_tpot_s = property(lambda self: self.__engine.metrics.default_slo_tpot_s)   # the run's TPOT SLO (s) or None

    @property
    def reserved_blocks(self) -> int:
        """Blocks the watermark policy holds back now (0 while nothing runs)."""
        return self.__engine._reserved_blocks()

    @property
    def running(self) -> tuple[SeqView, ...]:
        return tuple(self.__engine.view_of(s) for s in self.__engine.running)

    @property
    def waiting(self) -> tuple[SeqView, ...]:
        return tuple(self.__engine.view_of(s) for s in (*self.__engine.preempted, *self.__engine.waiting))

    @property
    def swapped(self) -> tuple[SeqView, ...]:
        return tuple(self.__engine.view_of(s) for s in self.__engine.swapped)

    def estimate_recompute_s(self, num_tokens: int) -> float:
        """Executor's estimate of the seconds to prefill ``num_tokens`` again."""
        return self.__engine.executor.estimate_prefill_s(num_tokens)

    def estimate_swap_s(self, num_blocks: int) -> float:
        """Executor's estimate of the seconds to move ``num_blocks`` one way over PCIe."""
        return self.__engine.executor.estimate_swap_s(num_blocks)
