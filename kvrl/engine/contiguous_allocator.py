"""The pre-PagedAttention baseline: each request reserves one contiguous range of blocks at
admission, first fit, sized for its prompt plus its maximum output (FasterTransformer/Orca style).

It offers the same interface as :class:`~kvrl.engine.paged_allocator.PagedAllocator` so the engine
runs unchanged, but without sharing: no prefix cache, forks copy the prompt into their own
reservation, and there is no swapping (a reservation never grows, so running requests never
need preemption). ``kv_utilization`` then measures reservation waste, as in the vLLM paper.
"""
from __future__ import annotations

import bisect
from typing import Callable

from kvrl.engine.paged_allocator import OutOfBlocks, PrefixMatch
from kvrl.engine.request import Request, Sequence


def reserved_tokens(reserve: str, request: Request, max_model_len: int) -> int:
    """Tokens one sample of ``request`` reserves under the ``reserve`` rule (max | pow2 | oracle)."""
    need = request.prompt_len + request.output_len
    if reserve == "max":
        return max_model_len
    if reserve == "pow2":
        return min(1 << (need - 1).bit_length(), max_model_len)
    return need


class ContiguousAllocator:
    """First-fit contiguous reservations over ``num_blocks`` GPU blocks (see module doc)."""

    supports_swap = False
    num_free_cpu_blocks = 0
    #: a fork's copied blocks carry the fill its parent had before the step that forked it (see
    #: :meth:`fork`); the child's first decode raises it (see PagedAllocator.exact_tail_fill)
    exact_tail_fill = False

    def __init__(self, num_blocks: int, block_size: int, reserve: str, max_model_len: int,
                 clock: Callable[[], float]) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.reserve = reserve
        self.max_model_len = max_model_len
        self._starts = [0]              # free extents, sorted by start
        self._lengths = [num_blocks]
        self._fill = [0] * num_blocks
        self._num_used = 0
        self._tokens_in_use = 0
        self._spare: dict[int, list[int]] = {}  # seq_id -> starts of reservations kept for its forks

    # ----------------------------------------------------------------- counters
    num_free_blocks = property(lambda self: sum(self._lengths))
    num_used_blocks = property(lambda self: self._num_used)
    tokens_stored = property(lambda self: self._tokens_in_use)

    def _blocks_per_sample(self, seq: Sequence) -> int:
        return -(-reserved_tokens(self.reserve, seq.request, self.max_model_len) // self.block_size)

    # ----------------------------------------------------------------- extents
    def _find(self, length: int, starts: list[int], lengths: list[int]) -> int:
        for i, free in enumerate(lengths):
            if free >= length:
                return i
        return -1

    def _take(self, length: int) -> int:
        i = self._find(length, self._starts, self._lengths)
        if i < 0:
            raise OutOfBlocks(f"no contiguous range of {length} blocks")
        start = self._starts[i]
        if self._lengths[i] == length:
            del self._starts[i], self._lengths[i]
        else:
            self._starts[i] += length
            self._lengths[i] -= length
        self._num_used += length
        for b in range(start, start + length):
            self._fill[b] = 0
        return start

    def _release(self, start: int, length: int) -> None:
        self._num_used -= length
        self._tokens_in_use -= sum(self._fill[start:start + length])
        i = bisect.bisect_left(self._starts, start)
        self._starts.insert(i, start)
        self._lengths.insert(i, length)
        if i + 1 < len(self._starts) and start + length == self._starts[i + 1]:   # merge right
            self._lengths[i] += self._lengths.pop(i + 1)
            self._starts.pop(i + 1)
        if i > 0 and self._starts[i - 1] + self._lengths[i - 1] == start:          # merge left
            self._lengths[i - 1] += self._lengths.pop(i)
            self._starts.pop(i)

    # ----------------------------------------------------------------- engine interface
    def match_prefix(self, seq: Sequence) -> PrefixMatch:
        return PrefixMatch()

    def peek_cached_tokens(self, seq: Sequence) -> int:
        return 0

    def admission_blocks(self, seq: Sequence, match: PrefixMatch) -> int:
        return self._blocks_per_sample(seq) * (seq.request.n if seq.parent_seq_id is None else 1)

    def can_admit(self, seq: Sequence, match: PrefixMatch, upto: int) -> bool:
        per = self._blocks_per_sample(seq)
        lengths = list(self._lengths)
        for _ in range(seq.request.n if seq.parent_seq_id is None else 1):
            i = self._find(per, self._starts, lengths)
            if i < 0:
                return False
            lengths[i] -= per
        return True

    def admit(self, seq: Sequence, match: PrefixMatch, upto: int) -> list[tuple[int, int]]:
        per = self._blocks_per_sample(seq)
        start = self._take(per)
        seq.block_table = list(range(start, start + per))
        seq.num_computed = 0
        if seq.parent_seq_id is None and seq.request.n > 1 and seq.num_output == 0:
            self._spare[seq.seq_id] = [self._take(per) for _ in range(seq.request.n - 1)]
        return []

    def needs_blocks(self, seq: Sequence, upto: int) -> bool:
        return upto > len(seq.block_table) * self.block_size

    def blocks_to_extend(self, seq: Sequence, upto: int) -> int:
        return 0 if upto <= len(seq.block_table) * self.block_size else 1 << 62

    def extend(self, seq: Sequence, upto: int) -> list[tuple[int, int]]:
        assert upto <= len(seq.block_table) * self.block_size, "contiguous reservation exceeded"
        return []

    @property
    def block_fill(self) -> list[int]:
        """Tokens with computed KV in each block (see :meth:`PagedAllocator.block_fill`)."""
        return self._fill

    def add_stored_tokens(self, n: int) -> None:
        """Count ``n`` tokens the caller added to :attr:`block_fill`."""
        self._tokens_in_use += n

    def on_computed(self, seq: Sequence, old: int, new: int) -> None:
        """Record that tokens ``[old, new)`` of ``seq`` now have KV (each block's fill raised to
        what it holds; a decode inside a block may be recorded by the caller on :attr:`block_fill`)."""
        bs = self.block_size
        for i in range(old // bs, (new - 1) // bs + 1):
            block = seq.block_table[i]
            f = min(bs, new - i * bs)
            if f > self._fill[block]:
                self._tokens_in_use += f - self._fill[block]
                self._fill[block] = f

    def on_computed_batch(self, items) -> None:
        """:meth:`on_computed` of each ``(seq, old, new)`` in order."""
        for seq, old, new in items:
            self.on_computed(seq, old, new)

    def fork(self, parent: Sequence, child: Sequence) -> list[tuple[int, int]]:
        """Give ``child`` one of the parent's spare reservations; returns block copies of the
        parent's computed blocks into it."""
        start = self._spare[parent.seq_id].pop()
        if not self._spare[parent.seq_id]:
            del self._spare[parent.seq_id]
        per = len(parent.block_table)
        child.block_table = list(range(start, start + per))
        child.num_computed = parent.num_computed
        used = -(-parent.num_computed // self.block_size)
        for i in range(used):
            self._fill[child.block_table[i]] = self._fill[parent.block_table[i]]
            self._tokens_in_use += self._fill[child.block_table[i]]
        return list(zip(parent.block_table[:used], child.block_table[:used]))

    def free(self, seq: Sequence) -> None:
        if seq.block_table:
            self._release(seq.block_table[0], len(seq.block_table))
        for start in self._spare.pop(seq.seq_id, []):
            self._release(start, self._blocks_per_sample(seq))
        seq.block_table = []

    def can_swap_out(self, seq: Sequence) -> bool:
        return False

    def check_invariants(self, live_seqs: list[Sequence]) -> None:
        held = sorted((s.block_table[0], len(s.block_table)) for s in live_seqs if s.block_table)
        held += [(st, len(s.block_table)) for s in live_seqs for st in self._spare.get(s.seq_id, [])]
        extents = sorted(held + list(zip(self._starts, self._lengths)))
        pos = 0
        for start, length in extents:
            assert start >= pos, "overlapping reservations"
            pos = start + length
        assert sum(l for _, l in extents) == self.num_blocks, "blocks leaked"
        assert self._num_used == sum(l for _, l in held)
