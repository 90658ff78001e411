"""A CPU tier under the GPU prefix cache (issue #20): reclaimed prefix blocks offloaded, hits loaded back.

With ``engine.cpu_tier_blocks`` > 0 the engine uses :class:`TieredAllocator`, a
:class:`~kvrl.engine.paged_allocator.PagedAllocator` whose reclaim path asks the ``tier`` policy
(:mod:`kvrl.plugins.tiers`) whether an evictable cached block that the prefix cache gives up is
offloaded to the tier (:class:`CpuTier`) or dropped. With 0 (the default) the plain allocator
runs, so every result is unchanged bit for bit.

Identity and isolation: a tier block keeps the GPU block's chained identity and its identity
record (parent identity, token bytes, salt; :mod:`kvrl.engine.hashing`). A prefix match runs over
the GPU-cached blocks first and then continues into the tier, block by block, with the same check
as on the GPU: under a checked hash a tier block is a hit only if its record equals the
requester's parent, tokens and salt, so tenant scoping and ``cache_salt`` hold in the tier
exactly as on the GPU. An identity is in at most one tier: loading a block back removes it from
the tier, and a block newly registered on the GPU removes the tier's copy of its identity.

Block operations (carried out by the executor, like swaps): ``tier_out`` (gpu_block, tier_block)
copies a reclaimed block's KV to the tier (gathered before anything in the step may overwrite
it; the host copy overlaps the step); ``tier_in`` (tier_block, gpu_block) loads a hit into a fresh
GPU block before the forward pass that reads it. No step both reads and writes one tier block: a
tier block given up in a step (loaded back or superseded) is reused only from the next step on,
and a block written in a step is no hit before the next.

Units: blocks; ``bytes`` = blocks x the executor's ``kv_block_bytes``; seconds are the executor's
transfer times (priced by the sim, measured live).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from time import perf_counter
from typing import TYPE_CHECKING, Callable, NamedTuple, Optional

from kvrl.engine.hashing import BlockHash, block_bytes
from kvrl.engine.paged_allocator import OutOfBlocks, PagedAllocator, PrefixMatch
from kvrl.engine.request import Sequence

if TYPE_CHECKING:
    from kvrl.engine.guards import PolicyTimer
    from kvrl.plugins.tiers import TierPolicy


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
            del self._block_of[self._entry[block].block_hash]
            self.num_replaced += 1
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


@dataclass
class TierStats:
    """Per-tier counters (summed into ``metrics.json`` under ``tier_*`` keys)."""

    block_bytes: int
    offloaded_blocks: int = 0       # GPU -> CPU tier copies
    loaded_blocks: int = 0          # CPU tier -> GPU copies (hits)
    dropped_blocks: int = 0         # reclaimed blocks the policy (or a full, busy tier) dropped
    prompt_tokens_hit_gpu: int = 0  # first-admission prompt tokens found on the GPU
    prompt_tokens_hit_cpu: int = 0  # ... and in the CPU tier
    prompt_tokens_looked_up: int = 0
    transfer_s: Callable[[], tuple[float, float]] = lambda: (0.0, 0.0)   # (load s, store s) from the executor

    def summary(self, tier: CpuTier) -> dict[str, float]:
        looked = self.prompt_tokens_looked_up
        load_s, store_s = self.transfer_s()
        return {
            "tier_cpu_blocks": tier.num_blocks,
            "tier_gpu_hit_rate": self.prompt_tokens_hit_gpu / looked if looked else 0.0,
            "tier_cpu_hit_rate": self.prompt_tokens_hit_cpu / looked if looked else 0.0,
            "tier_offloaded_blocks": self.offloaded_blocks,
            "tier_loaded_blocks": self.loaded_blocks,
            "tier_dropped_blocks": self.dropped_blocks,
            "tier_replaced_blocks": tier.num_replaced,
            "tier_bytes_offloaded": self.offloaded_blocks * self.block_bytes,
            "tier_bytes_loaded": self.loaded_blocks * self.block_bytes,
            "tier_load_s": load_s,
            "tier_store_s": store_s,
        }


@dataclass
class TieredMatch(PrefixMatch):
    """A prefix match that ran past the GPU-cached blocks into the CPU tier (``tier_blocks``,
    in chain order after ``block_ids``)."""

    tier_blocks: list[int] = None

    def __post_init__(self) -> None:
        if self.tier_blocks is None:
            self.tier_blocks = []

    def num_tokens(self, block_size: int) -> int:
        return (len(self.block_ids) + len(self.tier_blocks)) * block_size


class TieredAllocator(PagedAllocator):
    """:class:`PagedAllocator` plus a :class:`CpuTier` (see module doc).

    Extra args: ``tier_blocks`` (CPU tier size), ``policy`` (the ``tier`` plugin), ``block_bytes``,
    ``timer`` (policy wall time) and ``on_error(call, exc)`` (policy-error accounting; a failing
    ``offload`` call drops the block).
    """

    def __init__(self, *args, tier_blocks: int, policy: "TierPolicy", block_bytes: int,
                 timer: "PolicyTimer", on_error: Callable[[str, Exception], object], **kw) -> None:
        super().__init__(*args, **kw)
        if not self.prefix_cache.enabled:
            raise ValueError("engine.cpu_tier_blocks > 0 needs a prefix cache (prefix_cache=none caches nothing "
                             "to offload); set prefix_cache=hash_lru or engine.cpu_tier_blocks=0")
        self.tier = CpuTier(tier_blocks)
        self.tier_policy = policy
        self.stats = TierStats(block_bytes)
        self._timer = timer
        self._on_error = on_error
        # cached block -> (identity, chain index)
        self._meta: list[Optional[tuple[BlockHash, int]]] = [None] * self.num_blocks
        self._tier_out: list[tuple[int, int]] = []
        self._tier_in: list[tuple[int, int]] = []

    # ----------------------------------------------------------------- reclaim -> offload
    def _allocate(self) -> int:
        if self._free:
            return super()._allocate()
        block = self.prefix_cache.evict()
        if block is None:
            raise OutOfBlocks("no free GPU block")
        self._reclaimed(block)
        self._cached[block] = False
        self._identity[block] = None
        self._meta[block] = None
        self.ref_counts[block] = 1
        self._fill[block] = 0
        self._num_used += 1
        return block

    def _decide(self, index: int) -> bool:
        from kvrl.plugins.tiers import ReclaimedBlock
        timer = self._timer
        t0 = perf_counter()
        timer.depth += 1
        try:
            decision = self.tier_policy.offload(ReclaimedBlock(index, self.block_size, self.tier.num_free,
                                                               self.tier.num_blocks))
            if not isinstance(decision, bool):
                raise ValueError(f"offload() returned {decision!r}, not a bool")
        except Exception as exc:
            decision, error = False, exc
        else:
            error = None
        finally:
            timer.depth -= 1
            if not timer.depth:
                timer.total_s += perf_counter() - t0
        if error is not None:
            self._on_error("offload", error)
        return decision

    def _reclaimed(self, block: int) -> None:
        block_hash, index = self._meta[block]
        if not self._decide(index):
            self.stats.dropped_blocks += 1
            return
        if self._checked:
            parent, tokens, salt = self._registered_identity(block)
        else:
            parent = tokens = salt = None
        slot = self.tier.store(TierEntry(block_hash, index, parent, tokens, salt))
        if slot is None:
            self.stats.dropped_blocks += 1
            return
        self._tier_out.append((block, slot))
        self.stats.offloaded_blocks += 1

    # ----------------------------------------------------------------- registration keeps identities exclusive
    def on_computed(self, seq: Sequence, old: int, new: int) -> None:
        super().on_computed(seq, old, new)
        bs = self.block_size
        first, last = old // bs, new // bs
        if last <= first:
            return
        table, meta, cached, hashes = seq.block_table, self._meta, self._cached, seq.block_hashes
        discard = self.tier.discard
        for i in range(first, last):
            block = table[i]
            if cached[block] and meta[block] is None:
                meta[block] = (hashes[i], i)
                discard(hashes[i])

    # ----------------------------------------------------------------- matching into the tier
    def match_prefix(self, seq: Sequence) -> TieredMatch:
        gpu = super().match_prefix(seq)
        match = TieredMatch(gpu.block_ids, gpu.num_evictable, gpu.check_failed)
        if gpu.check_failed or not self.tier.num_stored:
            return match
        bs = self.block_size
        max_blocks = (seq.num_tokens - 1) // bs
        hashes = seq.block_hashes
        tier = self.tier
        data = salt = None
        width = bs * 8
        for i in range(len(gpu.block_ids), max_blocks):
            slot = tier.lookup(hashes[i])
            if slot is None or tier.stored_now(slot):
                break
            if self._checked:
                if data is None:
                    data = block_bytes(seq.token_slice(0, max_blocks * bs))
                    salt = self._salt(seq)
                entry = tier.entry(slot)
                if (entry.parent != (hashes[i - 1] if i else None) or entry.salt != salt
                        or entry.tokens != data[i * width:(i + 1) * width]):
                    match.check_failed = True
                    break
            match.tier_blocks.append(slot)
        return match

    def admit(self, seq: Sequence, match: PrefixMatch, upto: int) -> list[tuple[int, int]]:
        """As :meth:`PagedAllocator.admit`, plus: tier hits are taken out of the tier, loaded into
        fresh GPU blocks (``tier_in``) and registered in the GPU prefix cache."""
        tier_blocks = getattr(match, "tier_blocks", None)
        stats = self.stats
        if seq.num_preemptions == 0:
            stats.prompt_tokens_looked_up += seq.prompt_len
            stats.prompt_tokens_hit_gpu += len(match.block_ids) * self.block_size
            if tier_blocks:
                stats.prompt_tokens_hit_cpu += len(tier_blocks) * self.block_size
        if not tier_blocks:
            return super().admit(seq, match, upto)
        now = self._clock()
        for block in match.block_ids:
            self._incref(block)
            self.prefix_cache.on_hit(block, now)
        entries = [self.tier.take(slot) for slot in tier_blocks]   # out of reach of offloads below
        table = list(match.block_ids)
        hashes = seq.block_hashes
        bs = self.block_size
        for slot, entry in zip(tier_blocks, entries):
            i = len(table)
            block = self._allocate()
            self._fill[block] = bs
            self._tokens_in_use += bs
            if self.prefix_cache.insert(entry.block_hash, hashes[i - 1] if i else None, block, now):
                self._cached[block] = True
                self._meta[block] = (entry.block_hash, i)
                if self._checked:
                    self._identity[block] = (entry.parent, entry.tokens, entry.salt)
            self._tier_in.append((slot, block))
            table.append(block)
        stats.loaded_blocks += len(entries)
        seq.block_table = table
        seq.num_computed = len(table) * bs
        return self.extend(seq, upto)

    # ----------------------------------------------------------------- per step
    def take_tier_ops(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """This step's (tier_out, tier_in) operations; tier blocks given up become reusable."""
        out, into = self._tier_out, self._tier_in
        self._tier_out, self._tier_in = [], []
        self.tier.end_step()
        return out, into

    def summary(self) -> dict[str, float]:
        return self.stats.summary(self.tier)

    def check_invariants(self, live_seqs: list[Sequence]) -> None:
        """The pool's invariants, the tier's, and across them: every GPU-cached block has its
        identity recorded and that identity is not in the tier (one tier per identity); every
        cached block a live sequence holds was registered under that sequence's salt."""
        super().check_invariants(live_seqs)
        self.tier.check_invariants()
        for b in range(self.num_blocks):
            assert (self._meta[b] is not None) == self._cached[b], f"block {b}: identity meta drift"
            if self._cached[b]:
                assert self.tier.lookup(self._meta[b][0]) is None, f"block {b}: identity on the GPU and in the CPU tier"
        if self._checked:
            for seq in live_seqs:
                salt = self._salt(seq)
                for block in seq.block_table:
                    if self._cached[block]:
                        assert self._registered_identity(block)[2] == salt, "a cached block crossed salts"


def make_tiered_allocator(config, prefix_cache, clock, policy: "TierPolicy", block_bytes: int,
                          timer: "PolicyTimer", on_error) -> TieredAllocator:
    """The allocator ``engine.cpu_tier_blocks`` > 0 selects (paged allocator only)."""
    from kvrl.engine.allocators import _salt_fn
    from kvrl.engine.hashing import make_hasher
    if config.allocator != "paged":
        raise ValueError("engine.cpu_tier_blocks > 0 needs engine.allocator=paged")
    return TieredAllocator(config.num_blocks, config.block_size, config.num_cpu_blocks, prefix_cache, clock,
                           _salt_fn(config.prefix_cache_scope),
                           make_hasher(config.prefix_hash, config.prefix_hash_key, config.seed),
                           tier_blocks=config.cpu_tier_blocks, policy=policy, block_bytes=block_bytes,
                           timer=timer, on_error=on_error)
