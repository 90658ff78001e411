"""What the engine asks the executor to do in one step, and what comes back."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from kvrl.engine.request import Sequence


@dataclass(slots=True)
class ScheduledSeq:
    """Compute tokens ``[start, start + num_tokens)`` of ``seq``; sample ``num_samples`` tokens
    from the logits of the last one (0 while a chunked prefill is unfinished; ``n`` when a
    parallel-sampling request finishes its prefill and forks)."""

    seq: Sequence
    start: int
    num_tokens: int
    num_samples: int

    @property
    def is_decode(self) -> bool:
        """One query token: served by the decode attention path."""
        return self.num_tokens == 1


@dataclass(slots=True)
class PlainDecodes:
    """The planner's summary of a batch's plain decodes, for the executor of that step only (a
    sim prices them from it without a loop over them): items ``[0, end)`` of ``seqs`` are the
    running sequences' first items, and every one of them whose index is not in ``others`` is a
    *plain decode*: one token (``num_tokens == 1``) after the first output token, sampled once.
    ``count`` of them, ``kv`` the sum of their starts, ``last`` the largest start (-1: none),
    ``shared`` the sum of ``min(seq.shared_prefix_tokens, start + 1)`` over them and ``co_read``
    that of ``min(seq.co_read_prefix_tokens, start + 1)``."""

    end: int
    others: list[int]
    count: int
    kv: int
    last: int
    shared: int
    co_read: int


@dataclass(frozen=True, slots=True)
class DecodeTokens:
    """An executor's token rule for plain decodes (:class:`PlainDecodes`): the one token of a
    plain decode item is ``(seq_id * a + start * b + c) % m``."""

    a: int
    b: int
    c: int
    m: int
    _offsets: list = field(default_factory=list, repr=False, compare=False)   # see seq_offsets

    def token(self, item: ScheduledSeq) -> int:
        return (item.seq.seq_id * self.a + item.start * self.b + self.c) % self.m

    def seq_offsets(self, n: int) -> list[int]:
        """``(seq_id * a + c) % m`` at index ``seq_id``, for every ``seq_id < n`` at least (kept
        between calls), so that a token is ``(offsets[seq_id] + start * b) % m``: the same residue
        from integers small enough for CPython's one-digit fast paths."""
        offsets = self._offsets
        if len(offsets) < n:
            a, c, m = self.a, self.c, self.m
            offsets += [(i * a + c) % m for i in range(len(offsets), n)]
        return offsets


@dataclass
class ScheduledBatch:
    """One engine step. Block operations run before the forward pass, in this order: swap-out
    (GPU -> CPU), then copy-on-write copies, then the forward pass. Swap-ins (CPU -> GPU) are
    issued in this step for sequences that first compute in the *next* step, so they can
    overlap this step's forward pass (prefetch)."""

    seqs: list[ScheduledSeq] = field(default_factory=list)
    swap_out: list[tuple[int, int]] = field(default_factory=list)   # (gpu_block, cpu_block)
    swap_in: list[tuple[int, int]] = field(default_factory=list)    # (cpu_block, gpu_block)
    copies: list[tuple[int, int]] = field(default_factory=list)     # (src_gpu_block, dst_gpu_block)
    # CPU tier (engine.cpu_tier_blocks, kvrl.engine.tiers): both run before anything else in the step
    # (tier_out first: its GPU blocks may be reused by this step); the forward pass waits for tier_in
    tier_out: list[tuple[int, int]] = field(default_factory=list)   # (gpu_block, tier_block)
    tier_in: list[tuple[int, int]] = field(default_factory=list)    # (tier_block, gpu_block)
    # disk tier (engine.disk_tier_blocks, kvrl.engine.disk_tier): carried out by the allocator before
    # the step (demoted CPU tier blocks written, disk hits read into the CPU tier blocks tier_in loads
    # from); here for the sim, which prices them, and for observers
    disk_out: list[tuple[int, int]] = field(default_factory=list)   # (cpu_tier_block, disk_block)
    disk_in: list[tuple[int, int]] = field(default_factory=list)    # (disk_block, cpu_tier_block)
    # what the engine did on the host around this step (the sim prices the engine's time between
    # steps from these; see kvrl.executors.profile.HOST_FEATURES)
    num_admitted: int = 0     # sequences admitted or swapped in while scheduling this step
    num_preempted: int = 0    # sequences preempted while scheduling this step
    num_waiting: int = 0      # waiting + recompute-preempted sequences when scheduling began
    num_finished: int = 0     # sequences finished by the previous step's apply
    # the planner's plain decodes (None: not summed up); the engine drops it once this step is
    # executed, and anything that changes ``seqs`` other than by appending must drop it too
    plain: Optional[PlainDecodes] = None

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.seqs)

    @property
    def is_empty(self) -> bool:
        return not (self.seqs or self.swap_out or self.swap_in or self.copies or self.tier_out or self.tier_in)


@dataclass
class StepOutput:
    """Executor result: sampled token ids per scheduled sequence (aligned with ``batch.seqs``),
    the step's duration in seconds, and per-sequence errors (index -> message) for sequences
    whose computation failed (e.g. non-finite logits); those are aborted by the engine.

    With ``decode_tokens`` set, the entry of a plain decode (see :class:`PlainDecodes`) may be
    ``None``: its one token follows that rule (:meth:`resolve` fills such entries in)."""

    sampled: list[Optional[list[int]]]
    elapsed_s: float
    errors: Optional[dict[int, str]] = None
    host_gap_s: Optional[float] = None   # live: wall time since the previous step ended (None: not measured)
    host_gap_counted: bool = True        # whether that gap is part of ``elapsed_s``
    decode_tokens: Optional[DecodeTokens] = None

    def resolve(self, batch: ScheduledBatch) -> None:
        """Replace every ``None`` entry of :attr:`sampled` with its token by :attr:`decode_tokens`
        (``batch``: the executed batch; its items' ``seq`` and ``start`` are read)."""
        rule = self.decode_tokens
        if rule is not None:
            self.sampled = [[rule.token(item)] if tokens is None else tokens
                            for item, tokens in zip(batch.seqs, self.sampled)]
