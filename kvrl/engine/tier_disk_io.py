"""Disk-tier I/O for :class:`~kvrl.engine.tiers.TieredAllocator` (issue #20): issuing a match's
disk reads ahead (:meth:`TierDiskIOMixin._read_ahead`, with
:class:`~kvrl.engine.tier_read_ahead.DiskReadAhead`) and carrying out one step's demotions
(``disk_out``) and disk hits (``disk_in``) before the step runs: priced in the sim
(:meth:`TierDiskIOMixin._price_disk`), moved between the executor's host tier pool and the
:class:`~kvrl.engine.disk_tier.DiskStore` live (:meth:`TierDiskIOMixin._move_disk`).

:class:`TierDiskIOMixin` is a base of ``TieredAllocator`` and holds no state of its own: it uses
the allocator's disk tier (``disk``), ``read_ahead``, ``disk_store``, host pool view (``_host``),
executor, ``disk_bandwidth`` and ``stats``. Both step methods return the disk reads issued in the
step, as ``(disk block, CPU tier block)`` pairs, for the executor to price (sim) or report (live).
"""
from __future__ import annotations

from time import perf_counter
from typing import TYPE_CHECKING

from kvrl.engine.tier_store import DISK

if TYPE_CHECKING:
    from kvrl.engine.hashing import BlockHash


class TierDiskIOMixin:
    """A match's disk read-ahead and one step's disk I/O (sim: priced; live: moved)."""

    def _read_ahead(self, found: list[tuple[int, int]], hashes, first: int) -> None:
        """Issue the reads of a match's disk hits (``found[j]`` is chain block ``first + j``). A hit
        whose earlier read-ahead failed ends the match there (a miss: recomputed) and leaves the disk."""
        ra, disk = self.read_ahead, self.disk
        issue = []
        for j, (level, slot) in enumerate(found):
            if level != DISK:
                continue
            block_hash = hashes[first + j]
            if ra.failed(slot, block_hash):
                disk.take(slot)
                del found[j:]
                break
            issue.append((slot, block_hash))
        ra.issue(issue)

    def _price_disk(self, disk_out: list[tuple[int, int]],
                    disk_in: list[tuple[int, int, BlockHash]]) -> list[tuple[int, int]]:
        """Sim disk I/O of one step (the executor prices the returned reads and ``disk_out`` on
        its clock): read-ahead hits cost what is left of their reads at the step's start."""
        nbytes, ra = self.stats.block_bytes, self.read_ahead
        reads = []
        ready = None
        for dslot, cpu, block_hash in disk_in:
            entry = ra.take(dslot, block_hash) if ra is not None else None
            if entry is None:
                reads.append((dslot, cpu))
            else:
                landed = ra.finish_sim(entry)
                ready = landed if ready is None else max(ready, landed)
        if ready is not None:
            waited = self._executor.await_disk_reads(ready)
            ra.stats.wait_s += waited
            self.stats.disk_load_s += waited
        self.stats.disk_load_s += self.disk_bandwidth.read_s(len(reads) * nbytes)
        self.stats.disk_store_s += self.disk_bandwidth.write_s(len(disk_out) * nbytes)
        return reads

    def _move_disk(self, disk_out: list[tuple[int, int]],
                   disk_in: list[tuple[int, int, BlockHash]]) -> list[tuple[int, int]]:
        """Live disk I/O of one step: earlier steps' host copies finish first (the swap stream),
        then demoted blocks are copied out of the host pool (their blocks may be written by this
        step) and queued for writing, then the disk hits are read into their CPU tier blocks:
        a read-ahead hit by waiting for its staged read and copying the buffer (read again here
        if it failed), the others by reading now. Returns the reads issued here. A read that
        fails here raises an ``IOError`` naming the block file (no step runs on wrong KV)."""
        sync = getattr(self._executor, "sync_swaps", None)
        if sync is not None:
            sync()
        t0 = perf_counter()
        host, store, ra = self._host, self.disk_store, self.read_ahead
        for cpu, dslot in disk_out:
            store.write(dslot, host[cpu].copy())
        issued, staged, reads = [], [], []
        for dslot, cpu, block_hash in disk_in:
            entry = ra.take(dslot, block_hash) if ra is not None else None
            if entry is None:
                issued.append((dslot, cpu))
                reads.append((dslot, store.read(dslot, host[cpu])))
            else:
                staged.append((dslot, cpu, entry))
        for dslot, cpu, entry in staged:
            t = perf_counter()
            if not ra.finish_into(entry, host[cpu]):      # its read failed: once more, now
                issued.append((dslot, cpu))
                reads.append((dslot, store.read(dslot, host[cpu])))
            ra.stats.wait_s += perf_counter() - t
        for dslot, future in reads:
            try:
                future.result()
            except Exception as exc:
                raise IOError(f"disk tier: block {dslot} ({store.path(dslot)}) could not be read for the step that "
                              f"loads it: {exc}") from exc
        self.stats.disk_load_s += perf_counter() - t0
        return issued
