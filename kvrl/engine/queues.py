"""The engine's queues of sequences waiting for admission, with O(1) removal.

A :class:`SeqQueue` keeps sequences in a fixed order: insertion order, or ascending key (ties in
insertion order, as ``bisect.insort_right`` gives) when built with ``keyed=True``. Removal is lazy:
a removed sequence's slot stays in the list but no longer counts (a slot is live while the
sequence's ticket still names it), the head index skips dead slots at the front, and the lists are
compacted once dead slots outnumber live ones. So admitting the first ``k`` of ``n`` waiting
sequences costs O(k) amortised instead of rebuilding an ``n``-long list every step, and the live
order is exactly the one a plain sorted list would have.
"""
from __future__ import annotations

from bisect import bisect_right
from typing import Any, Iterator, Optional

from kvrl.engine.request import Sequence


class SeqQueue:
    """Ordered sequences with O(1) ``remove`` / ``in`` / ``len`` (see module doc)."""

    __slots__ = ("_seqs", "_keys", "_tickets", "_ticket_of", "_head", "_next")

    def __init__(self, keyed: bool = False) -> None:
        self._seqs: list[Sequence] = []
        self._tickets: list[int] = []
        self._keys: Optional[list] = [] if keyed else None
        self._ticket_of: dict[int, int] = {}    # seq_id -> ticket of its live slot
        self._head = 0
        self._next = 0

    def __len__(self) -> int:
        return len(self._ticket_of)

    def __bool__(self) -> bool:
        return bool(self._ticket_of)

    def __contains__(self, seq: Sequence) -> bool:
        return seq.seq_id in self._ticket_of

    def __iter__(self) -> Iterator[Sequence]:
        """Live sequences in queue order. Do not add or remove while iterating."""
        seqs, tickets, live = self._seqs, self._tickets, self._ticket_of
        for i in range(self._head, len(seqs)):
            seq = seqs[i]
            if live.get(seq.seq_id) == tickets[i]:
                yield seq

    def push(self, seq: Sequence, key: Any = None) -> None:
        """Add ``seq`` (not already queued): at the end, or after every key <= ``key`` if keyed.
        A key that cannot be compared with the queued ones raises ``TypeError`` and adds nothing."""
        if self._keys is None:
            i = len(self._seqs)
        else:
            i = bisect_right(self._keys, key, self._head)
        ticket = self._next
        self._next += 1
        if i == len(self._seqs):
            self._seqs.append(seq)
            self._tickets.append(ticket)
            if self._keys is not None:
                self._keys.append(key)
        else:
            self._seqs.insert(i, seq)
            self._tickets.insert(i, ticket)
            self._keys.insert(i, key)
        self._ticket_of[seq.seq_id] = ticket

    def remove(self, seq: Sequence) -> bool:
        """Remove ``seq``; False if it was not queued."""
        if self._ticket_of.pop(seq.seq_id, None) is None:
            return False
        seqs, tickets, live = self._seqs, self._tickets, self._ticket_of
        head = self._head
        while head < len(seqs) and live.get(seqs[head].seq_id) != tickets[head]:
            head += 1
        self._head = head
        if len(seqs) - head > 2 * len(live) + 64:
            self._compact()
        elif head > len(live) + 64:
            del seqs[:head], tickets[:head]
            if self._keys is not None:
                del self._keys[:head]
            self._head = 0
        return True

    def _compact(self) -> None:
        live = self._ticket_of
        keep = [i for i in range(self._head, len(self._seqs)) if live.get(self._seqs[i].seq_id) == self._tickets[i]]
        self._seqs = [self._seqs[i] for i in keep]
        self._tickets = [self._tickets[i] for i in keep]
        if self._keys is not None:
            self._keys = [self._keys[i] for i in keep]
        self._head = 0
