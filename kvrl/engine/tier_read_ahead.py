"""Disk-tier read-ahead (issue #20): disk hits read into bounded host staging buffers as soon as a
prefix lookup finds them, so the reads of queued requests overlap the running steps' compute.

Without read-ahead (``engine.disk_tier_read_ahead_blocks=0``, the default) a disk hit is read when
its step is planned and the step waits for it (:meth:`TieredAllocator._move_disk
<kvrl.engine.tier_disk_io.TierDiskIOMixin._move_disk>`). With read-ahead, every prefix lookup that finds
blocks on disk (``TieredAllocator.match_prefix``: the scheduler looks up each waiting request it
considers, every step until it is admitted) *issues* their reads at once, each into a staging buffer
of its own; the step that loads the block later waits only for what is left of its read and
copies the buffer into the block's CPU tier block (the executor loads the GPU from there). A
request that waits one step or more has its reads run during the steps it waits; one admitted in
the step that looks it up waits as long as without read-ahead.

Contracts:

* **Bounded memory**: ``capacity`` buffers of ``block_bytes`` each, allocated once
  (:attr:`DiskReadAhead.staging_bytes`); a lookup that finds no free buffer issues nothing for that
  block (counted, ``full_blocks``), and its step reads it synchronously as before.
* **Never stale**: an entry holds one disk block's content as of its issue. The allocator calls
  :meth:`DiskReadAhead.invalidate` whenever a disk block is written anew, and each step
  :meth:`DiskReadAhead.sweep` drops entries whose disk block no longer holds their identity; a
  step consumes an entry only for the same disk block and identity (:meth:`take`). The store
  orders every I/O on a block after the block's previous one, so a read issued before a rewrite
  reads the old content, and its entry was dropped by the rewrite. Dropped entries free their
  buffer when their read has finished.
* **Errors stay with the block**: a read that failed is found either at a later lookup
  (:meth:`failed`: the allocator ends the match there, so the block is a miss and recomputed) or
  when its step needs it (:meth:`finish_into` returns False: the allocator reads the block again
  synchronously, and raises an ``IOError`` naming the file if that fails too). No wrong bytes are
  ever copied: a buffer is copied only after its read returned every byte.

In the sim (no store) the same bookkeeping runs, and the reads are priced by the executor's
read queue: ``issue_sim(n)`` queues ``n`` block reads at the executor's clock and returns when
they land (:meth:`kvrl.executors.sim.SimExecutor.issue_disk_read_ahead`); the step that uses them
waits only for the part past its start.

Units: blocks, bytes, seconds.
"""
from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

import numpy as np

if TYPE_CHECKING:
    from kvrl.engine.disk_tier import DiskStore
    from kvrl.engine.hashing import BlockHash


@dataclass
class ReadAheadStats:
    """Counters of :class:`DiskReadAhead` (``tier_disk_read_ahead_*`` keys of ``metrics.json``)."""

    issued_blocks: int = 0      # reads issued at a lookup
    used_blocks: int = 0        # of those, consumed by the step that loaded the block
    dropped_blocks: int = 0     # of those, dropped unused (the disk block was rewritten or left the disk)
    full_blocks: int = 0        # lookups' disk hits left unissued: no free staging buffer
    errors: int = 0             # issued reads that failed (block made a miss, or read again at its step)
    wait_s: float = 0.0         # seconds steps waited for issued reads (live: wall; sim: priced remainder)


@dataclass
class _Entry:
    slot: int                   # disk block
    block_hash: "BlockHash"     # the identity it held when the read was issued
    buffer: int                 # staging buffer index
    future: Optional[Future]    # live: the store's read
    ready_s: float = 0.0        # sim: when the read lands (executor clock)


class DiskReadAhead:
    """Bounded read-ahead of disk-tier blocks (see module doc).

    ``store``: the live :class:`~kvrl.engine.disk_tier.DiskStore` (bytes move), or None with
    ``issue_sim`` (the sim: reads priced, no bytes). ``capacity`` >= 1 staging buffers of
    ``block_bytes``.
    """

    def __init__(self, capacity: int, block_bytes: int, store: Optional["DiskStore"] = None,
                 issue_sim: Optional[Callable[[int], float]] = None) -> None:
        if capacity < 1:
            raise ValueError(f"engine.disk_tier_read_ahead_blocks must be >= 1 to read ahead, got {capacity!r}")
        if (store is None) == (issue_sim is None):
            raise ValueError("DiskReadAhead needs a disk store (live) or a sim read queue, not both or neither")
        self.capacity, self.block_bytes = capacity, block_bytes
        self._store, self._issue_sim = store, issue_sim
        self._buffers = np.empty((capacity, block_bytes), dtype=np.uint8) if store is not None else None
        self._free = list(range(capacity - 1, -1, -1))
        self._entries: dict[int, _Entry] = {}        # disk block -> its pending or finished read
        self._draining: list[_Entry] = []            # dropped while in flight: buffer freed when done
        self.stats = ReadAheadStats()

    @property
    def staging_bytes(self) -> int:
        """Host memory held for staging (live; 0 in the sim)."""
        return 0 if self._buffers is None else self._buffers.nbytes

    @property
    def num_staged(self) -> int:
        return len(self._entries)

    @property
    def num_free(self) -> int:
        return len(self._free)

    def issue(self, hits: list[tuple[int, "BlockHash"]]) -> None:
        """Issue reads of ``hits`` (disk block, identity) not already staged, while buffers last."""
        self._reap()
        new: list[tuple[int, "BlockHash"]] = []
        for slot, block_hash in hits:
            entry = self._entries.get(slot)
            if entry is not None:
                if entry.block_hash == block_hash:
                    continue
                self._drop(entry)                    # cannot happen while invalidate() is called
            if len(new) >= len(self._free):
                self.stats.full_blocks += 1
                continue
            new.append((slot, block_hash))
        if not new:
            return
        ready_s = self._issue_sim(len(new)) if self._issue_sim is not None else 0.0
        for slot, block_hash in new:
            buffer = self._free.pop()
            future = self._store.read(slot, self._buffers[buffer]) if self._store is not None else None
            self._entries[slot] = _Entry(slot, block_hash, buffer, future, ready_s)
        self.stats.issued_blocks += len(new)

    def failed(self, slot: int, block_hash: "BlockHash") -> bool:
        """Whether the staged read of ``slot`` (for ``block_hash``) has finished with an error; such
        an entry is dropped and counted (the caller treats the block as a miss)."""
        entry = self._entries.get(slot)
        if entry is None or entry.block_hash != block_hash or entry.future is None or not entry.future.done():
            return False
        if entry.future.exception() is None:
            return False
        del self._entries[slot]
        self._free.append(entry.buffer)
        self.stats.errors += 1
        return True

    def invalidate(self, slot: int) -> None:
        """Disk block ``slot`` is being written anew: its staged read (if any) is stale."""
        entry = self._entries.pop(slot, None)
        if entry is not None:
            self._drop(entry, popped=True)

    def sweep(self, holds: Callable[[int, "BlockHash"], bool]) -> None:
        """Drop the entries whose disk block no longer holds their identity (``holds(slot, hash)``
        False), and free the buffers of dropped reads that have finished."""
        for entry in [e for e in self._entries.values() if not holds(e.slot, e.block_hash)]:
            self._drop(entry)
        self._reap()

    def take(self, slot: int, block_hash: "BlockHash") -> Optional[_Entry]:
        """The staged read of ``slot`` for ``block_hash``, removed from the index (the caller
        finishes it with :meth:`finish_into` or :meth:`finish_sim`); None when there is none."""
        entry = self._entries.get(slot)
        if entry is None or entry.block_hash != block_hash:
            return None
        del self._entries[slot]
        return entry

    def finish_into(self, entry: _Entry, dest: np.ndarray) -> bool:
        """Wait for ``entry``'s read, copy its bytes into ``dest`` and free its buffer. False (and
        counted; ``dest`` untouched) when the read failed."""
        try:
            entry.future.result()
        except Exception:
            self._free.append(entry.buffer)
            self.stats.errors += 1
            return False
        np.copyto(dest, self._buffers[entry.buffer])
        self._free.append(entry.buffer)
        self.stats.used_blocks += 1
        return True

    def finish_sim(self, entry: _Entry) -> float:
        """Free ``entry``'s buffer (sim); returns when its read lands (executor clock)."""
        self._free.append(entry.buffer)
        self.stats.used_blocks += 1
        return entry.ready_s

    def close(self) -> None:
        """Wait for every issued read (their outcome no longer matters) and free the buffers."""
        for entry in [*self._entries.values(), *self._draining]:
            if entry.future is not None:
                try:
                    entry.future.result()
                except Exception:
                    pass
        self._draining = []

    # ----------------------------------------------------------------- internals
    def _drop(self, entry: _Entry, popped: bool = False) -> None:
        if not popped:
            del self._entries[entry.slot]
        self.stats.dropped_blocks += 1
        if entry.future is None or entry.future.done():
            self._free.append(entry.buffer)
        else:
            self._draining.append(entry)

    def _reap(self) -> None:
        if self._draining:
            still = []
            for entry in self._draining:
                if entry.future.done():
                    self._free.append(entry.buffer)
                else:
                    still.append(entry)
            self._draining = still

    def check_invariants(self) -> None:
        """Every buffer is free, staged or draining, exactly once."""
        parts = [*self._free, *(e.buffer for e in self._entries.values()), *(e.buffer for e in self._draining)]
        assert len(parts) == len(set(parts)) == self.capacity, "staging buffers leaked or double-booked"


__all__ = ["DiskReadAhead", "ReadAheadStats"]
