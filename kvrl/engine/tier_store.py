"""The tier stores under :class:`~kvrl.engine.tiers.TieredAllocator` (issue #20): :class:`CpuTier`
(tier blocks, identity index, least-recently-stored replacement, the one-step reuse rule), the
:class:`TierEntry` a tier block holds besides its KV, the tier levels :data:`CPU` and :data:`DISK`,
and :class:`TierStats` (the ``tier_*`` counters of ``metrics.json``). The disk tier's index is a
:class:`CpuTier` too (its bytes live in :class:`~kvrl.engine.disk_tier.DiskStore`).

Units: blocks; ``bytes`` = blocks x the executor's ``kv_block_bytes``; seconds as in
:mod:`kvrl.engine.tiers`.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional

from kvrl.engine.hashing import BlockHash


class TierEntry(NamedTuple):
    """What a tier block holds besides its KV: identity, chain position and identity record
    (``parent``/``tokens``/``salt`` are None under an unchecked hash, as on the GPU)."""

    block_hash: BlockHash
    index: int
    parent: Optional[BlockHash]
    tokens: Optional[bytes]
    salt: Optional[bytes]


class CpuTier:
    """Tier blocks ``0..num_blocks-1``: identity -> block, replacement least recently stored first."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self._block_of: dict[BlockHash, int] = {}
        self._entry: list[Optional[TierEntry]] = [None] * num_blocks
        self._order: OrderedDict[int, None] = OrderedDict()     # stored blocks, oldest store first
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        self._released: list[int] = []                          # given up this step: free from the next
        self._stored_now: set[int] = set()                       # written this step: not replaced before the next
        self.num_replaced = 0                                    # stored blocks pushed out by a newer one
        #: called with (block, entry) when a stored block is replaced, before the block is reused
        #: (the CPU tier demotes the entry to the disk tier there; None: the entry is dropped)
        self.on_replace: Optional[Callable[[int, TierEntry], None]] = None

    @property
    def num_stored(self) -> int:
        return len(self._order)

    @property
    def num_free(self) -> int:
        return len(self._free)

    def lookup(self, block_hash: BlockHash) -> Optional[int]:
        return self._block_of.get(block_hash)

    def entry(self, block: int) -> TierEntry:
        return self._entry[block]

    def num_replaceable(self) -> int:
        """Stored blocks a :meth:`store` may replace in this step (not written in it)."""
        return len(self._order) - sum(1 for b in self._stored_now if b in self._order)

    def stored_now(self, block: int) -> bool:
        """Whether ``block`` was written in this step (its copy may still be in flight: no hit yet)."""
        return block in self._stored_now

    def store(self, entry: TierEntry) -> Optional[int]:
        """A tier block for ``entry`` (a free one, else the oldest stored one, replaced); None when
        none is free and the oldest was written in this step (no tier block is written twice, or
        written and read, in one step)."""
        if entry.block_hash in self._block_of:     # cannot happen while identities are exclusive
            raise AssertionError("identity already in the CPU tier")
        if self._free:
            block = self._free.pop()
        elif self._order and next(iter(self._order)) not in self._stored_now:
            block, _ = self._order.popitem(last=False)
            old = self._entry[block]
            del self._block_of[old.block_hash]
            self.num_replaced += 1
            if self.on_replace is not None:
                self.on_replace(block, old)
        else:
            return None
        self._entry[block] = entry
        self._block_of[entry.block_hash] = block
        self._order[block] = None
        self._stored_now.add(block)
        return block

    def take(self, block: int) -> TierEntry:
        """Remove a stored block (it is being loaded back); reusable from the next step on."""
        entry = self._entry[block]
        del self._block_of[entry.block_hash]
        del self._order[block]
        self._entry[block] = None
        self._released.append(block)
        return entry

    def discard(self, block_hash: BlockHash) -> bool:
        """Forget ``block_hash`` if stored (the GPU registered the identity again)."""
        block = self._block_of.get(block_hash)
        if block is None:
            return False
        self.take(block)
        return True

    def end_step(self) -> None:
        self._free.extend(self._released)
        self._released = []
        self._stored_now.clear()

    def check_invariants(self) -> None:
        stored = set(self._order)
        assert len(self._block_of) == len(stored), "tier index and store order differ"
        for h, b in self._block_of.items():
            assert b in stored and self._entry[b].block_hash == h, f"tier block {b}: identity drift"
        parts = [*stored, *self._free, *self._released]
        assert len(parts) == len(set(parts)) == self.num_blocks, "tier blocks leaked or double-booked"
        assert all(self._entry[b] is None for b in (*self._free, *self._released)), "free tier block holds an entry"


CPU, DISK = 1, 2          # tier levels of a TieredMatch's tier blocks


@dataclass
class TierStats:
    """Per-tier counters (summed into ``metrics.json`` under ``tier_*`` keys)."""

    block_bytes: int
    offloaded_blocks: int = 0       # GPU -> CPU tier copies
    loaded_blocks: int = 0          # CPU tier -> GPU copies (hits; disk hits pass through the CPU tier too)
    dropped_blocks: int = 0         # reclaimed blocks the policy (or a full, busy tier) dropped
    prompt_tokens_hit_gpu: int = 0  # first-admission prompt tokens found on the GPU
    prompt_tokens_hit_cpu: int = 0  # ... in the CPU tier
    prompt_tokens_hit_disk: int = 0  # ... in the disk tier
    prompt_tokens_looked_up: int = 0
    demoted_blocks: int = 0         # CPU tier -> disk copies
    disk_loaded_blocks: int = 0     # disk -> CPU tier reads (each then loaded to the GPU)
    cpu_dropped_blocks: int = 0     # CPU tier blocks replaced without a demotion (policy said no, or no disk block)
    cpu_ttft_saved_s: float = 0.0   # estimated prefill seconds the CPU tier's hits saved, less their loads
    disk_ttft_saved_s: float = 0.0  # ... the disk tier's hits, less their disk reads and loads
    prefetched_blocks: int = 0      # tier blocks loaded to the GPU ahead of need (the policy's prefetch())
    prefetch_used_blocks: int = 0   # ... of which a later admission hit on the GPU
    disk_load_s: float = 0.0        # disk reads: priced (sim) or waited for (live)
    disk_store_s: float = 0.0       # disk writes: priced (sim); live: the I/O threads' seconds
    transfer_s: Callable[[], tuple[float, float]] = lambda: (0.0, 0.0)   # (load s, store s) from the executor

    def summary(self, tier: CpuTier, disk: Optional[CpuTier]) -> dict[str, float]:
        looked = self.prompt_tokens_looked_up
        rate = lambda hit: hit / looked if looked else 0.0
        load_s, store_s = self.transfer_s()
        out = {
            "tier_cpu_blocks": tier.num_blocks,
            "tier_gpu_hit_rate": rate(self.prompt_tokens_hit_gpu),
            "tier_cpu_hit_rate": rate(self.prompt_tokens_hit_cpu),
            "tier_offloaded_blocks": self.offloaded_blocks,
            "tier_loaded_blocks": self.loaded_blocks,
            "tier_dropped_blocks": self.dropped_blocks,
            "tier_replaced_blocks": tier.num_replaced,
            "tier_bytes_offloaded": self.offloaded_blocks * self.block_bytes,
            "tier_bytes_loaded": self.loaded_blocks * self.block_bytes,
            "tier_load_s": load_s,
            "tier_store_s": store_s,
            "tier_cpu_ttft_saved_s": self.cpu_ttft_saved_s,
            "tier_prefetched_blocks": self.prefetched_blocks,
            "tier_prefetch_used_blocks": self.prefetch_used_blocks,
        }
        if disk is not None:
            out.update({
                "tier_disk_blocks": disk.num_blocks,
                "tier_disk_hit_rate": rate(self.prompt_tokens_hit_disk),
                "tier_demoted_blocks": self.demoted_blocks,
                "tier_disk_loaded_blocks": self.disk_loaded_blocks,
                "tier_cpu_dropped_blocks": self.cpu_dropped_blocks,
                "tier_disk_replaced_blocks": disk.num_replaced,
                "tier_bytes_demoted": self.demoted_blocks * self.block_bytes,
                "tier_bytes_disk_loaded": self.disk_loaded_blocks * self.block_bytes,
                "tier_disk_load_s": self.disk_load_s,
                "tier_disk_store_s": self.disk_store_s,
                "tier_disk_ttft_saved_s": self.disk_ttft_saved_s,
            })
        return out
