"""KV tiers under the GPU prefix cache (issue #20): reclaimed prefix blocks offloaded to CPU memory
and on to disk, hits loaded back.

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

Disk tier (``engine.disk_tier_blocks`` > 0, :mod:`kvrl.engine.disk_tier`): when the CPU tier is
full, the block it replaces (its oldest store) is demoted to disk if the ``tier`` policy's
``demote`` says so. A match continues through whichever tier holds the next identity, with the
same identity check; a disk hit is read into a CPU tier block and loaded to the GPU from there in
the same step (see :class:`TieredAllocator`). An identity is in at most one of GPU, CPU tier, disk.

Units: blocks; ``bytes`` = blocks x the executor's ``kv_block_bytes``; seconds are the executor's
transfer times (priced by the sim, measured live).

Where the code lives: the stores and counters (:class:`~kvrl.engine.tier_store.CpuTier`,
:class:`~kvrl.engine.tier_store.TierEntry`, :class:`~kvrl.engine.tier_store.TierStats`) in
:mod:`kvrl.engine.tier_store`, prefetch loading in :mod:`kvrl.engine.tier_prefetch`, the disk
reads and writes of a step (and read-ahead issue) in :mod:`kvrl.engine.tier_disk_io`, the
allocator logic (reclaim, matching, admission, per-step operations) here.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from time import perf_counter
from typing import TYPE_CHECKING, Callable, Optional

from kvrl.engine.disk_tier import DEFAULT_DISK_BANDWIDTH, DiskBandwidth, DiskStore
from kvrl.engine.hashing import BlockHash
from kvrl.engine.paged_allocator import OutOfBlocks, PagedAllocator, PrefixMatch
from kvrl.engine.request import Sequence
from kvrl.engine.tier_disk_io import TierDiskIOMixin
from kvrl.engine.tier_prefetch import TierPrefetchMixin
from kvrl.engine.tier_read_ahead import DiskReadAhead
from kvrl.engine.tier_store import CPU, DISK, CpuTier, TierEntry, TierStats

if TYPE_CHECKING:
    from kvrl.engine.guards import PolicyTimer
    from kvrl.plugins.tiers import TierPolicy


@dataclass
class TieredMatch(PrefixMatch):
    """A prefix match that ran past the GPU-cached blocks into the tiers: ``tier_blocks`` are
    ``(level, tier block)`` pairs (level :data:`CPU` or :data:`DISK`) in chain order after ``block_ids``."""

    tier_blocks: list[tuple[int, int]] = None

    def __post_init__(self) -> None:
        if self.tier_blocks is None:
            self.tier_blocks = []

    def num_tokens(self, block_size: int) -> int:
        return (len(self.block_ids) + len(self.tier_blocks)) * block_size


class TieredAllocator(TierPrefetchMixin, TierDiskIOMixin, PagedAllocator):
    """:class:`PagedAllocator` plus a :class:`CpuTier` and, optionally, a disk tier (see module doc).

    Extra args: ``tier_blocks`` (CPU tier size), ``policy`` (the ``tier`` plugin), ``block_bytes``,
    ``timer`` (policy wall time), ``on_error(call, exc)`` (policy-error accounting; a failing
    ``offload`` call drops the block, a failing ``demote`` call drops the CPU block), and for the
    disk tier ``disk_blocks`` (0: none), ``disk_dir`` and ``disk_threads``
    (:class:`~kvrl.engine.disk_tier.DiskStore`), and ``read_ahead_blocks`` (0: none; else the
    staging buffers of :class:`~kvrl.engine.tier_read_ahead.DiskReadAhead`, :attr:`read_ahead`).

    Disk tier: a CPU tier block that the CPU tier replaces (its oldest store, when full) is
    *demoted* to the disk tier if the policy's ``demote`` says so (else dropped); the disk tier
    replaces its own oldest block when full. A prefix match continues block by block through
    whichever tier holds the next identity (same check everywhere). A disk hit is read into a CPU
    tier block (``disk_in``: disk block -> CPU tier block) and loaded to the GPU from there in the
    same step; a match takes no more disk hits than CPU tier blocks it can stage them in. Bytes
    move only with :meth:`bind_executor` on an executor that has a host tier pool (live); in the
    sim the disk I/O is priced (:class:`~kvrl.engine.disk_tier.DiskBandwidth`).
    """

    lazy_registration = False    # a reclaimed block is stored in the tier by its identity
    keeps_peeks = False         # its matches go on into the CPU tier and the disk

    def __init__(self, *args, tier_blocks: int, policy: "TierPolicy", block_bytes: int,
                 timer: "PolicyTimer", on_error: Callable[[str, Exception], object], disk_blocks: int = 0,
                 disk_dir: Optional[str] = None, disk_threads: int = 4, read_ahead_blocks: int = 0,
                 **kw) -> None:
        super().__init__(*args, **kw)
        if not self.prefix_cache.enabled:
            raise ValueError("engine.cpu_tier_blocks > 0 needs a prefix cache (prefix_cache=none caches nothing "
                             "to offload); set prefix_cache=hash_lru or engine.cpu_tier_blocks=0")
        self.tier = CpuTier(tier_blocks)
        self.disk: Optional[CpuTier] = CpuTier(disk_blocks) if disk_blocks else None
        if self.disk is not None:
            self.tier.on_replace = self._demote
        self.tier_policy = policy
        self.stats = TierStats(block_bytes)
        self.disk_bandwidth = DEFAULT_DISK_BANDWIDTH
        self._timer = timer
        self._on_error = on_error
        # cached block -> (identity, chain index)
        self._meta: list[Optional[tuple[BlockHash, int]]] = [None] * self.num_blocks
        self._tier_out: list[tuple[int, int]] = []
        self._tier_in: list[tuple[int, int]] = []
        self._disk_out: list[tuple[int, int]] = []     # (CPU tier block, disk block): demotions
        # (disk block, CPU tier block, identity): disk hits staged in CPU tier blocks
        self._disk_in: list[tuple[int, int, BlockHash]] = []
        self._disk_dir, self._disk_threads = disk_dir, disk_threads
        self._prefetched = [False] * self.num_blocks   # GPU block loaded by a prefetch, not hit yet
        #: finished chains a prefetch may bring back: handle -> (PrefetchChain, identities), oldest first
        self.chains: OrderedDict[int, tuple] = OrderedDict()
        self.max_chains = 512
        self._next_chain = 0
        self._executor = None
        self.disk_store: Optional[DiskStore] = None
        self._host = None                              # the executor's host tier pool as bytes (live)
        self._read_ahead_blocks = read_ahead_blocks
        #: disk reads issued at lookups (engine.disk_tier_read_ahead_blocks > 0; set by bind_executor)
        self.read_ahead: Optional[DiskReadAhead] = None

    def bind_executor(self, executor) -> None:
        """Use ``executor``'s tier transfer times and estimates; with a disk tier and an executor
        holding a host tier pool (``tier_pool``, the live executor), open the disk store and move
        bytes between that pool and disk; else (the sim) price the disk I/O from the profile's
        measured disk bandwidth (``meta["disk"]``) or the documented default."""
        self._executor = executor
        self.stats.transfer_s = executor.tier_transfer_s
        profile = getattr(executor, "profile", None) or getattr(getattr(executor, "cost_model", None), "profile", None)
        self.disk_bandwidth = DiskBandwidth.from_meta(profile.meta if profile is not None else None)
        pool = getattr(executor, "tier_pool", None)
        if self.disk is not None and pool is not None:
            import torch
            host = pool.view(torch.uint8).reshape(pool.shape[0], -1)
            self._host = host.numpy()
            self.disk_store = DiskStore(self.disk.num_blocks, self._host.shape[1], self._disk_dir, self._disk_threads)
        if self.disk is not None and self._read_ahead_blocks:
            if self.disk_store is not None:
                self.read_ahead = DiskReadAhead(self._read_ahead_blocks, self._host.shape[1], store=self.disk_store)
            elif hasattr(executor, "issue_disk_read_ahead"):
                self.read_ahead = DiskReadAhead(self._read_ahead_blocks, self.stats.block_bytes,
                                                issue_sim=executor.issue_disk_read_ahead)
            else:
                raise ValueError(f"engine.disk_tier_read_ahead_blocks > 0: the {getattr(executor, 'name', '?')} "
                                 "executor has neither a host tier pool nor a sim disk read queue")

    # ----------------------------------------------------------------- reclaim -> offload
    def _reclaim(self, table: list[int], n: int) -> None:
        """Reclaimed blocks one at a time through :meth:`_allocate`, which offloads each."""
        for _ in range(n):
            table.append(self._allocate())

    def _allocate(self) -> int:
        if self._free:
            return super()._allocate()
        block = self.prefix_cache.evict()
        if block is None:
            raise OutOfBlocks("no free GPU block")
        self._reclaimed(block)
        self._cached[block] = False
        self._identity[block] = None
        self._reclaim_log.append(block)
        self._meta[block] = None
        self._prefetched[block] = False
        self.ref_counts[block] = 1
        self._fill[block] = 0
        self._num_used += 1
        return block

    def _ask(self, call: str, arg) -> bool:
        """The tier policy's ``call(arg)``, timed; a raise or a non-bool is a policy error (False)."""
        timer = self._timer
        t0 = perf_counter()
        timer.depth += 1
        try:
            decision = getattr(self.tier_policy, call)(arg)
            if not isinstance(decision, bool):
                raise ValueError(f"{call}() returned {decision!r}, not a bool")
        except Exception as exc:
            decision, error = False, exc
        else:
            error = None
        finally:
            timer.depth -= 1
            if not timer.depth:
                timer.total_s += perf_counter() - t0
        if error is not None:
            self._on_error(call, error)
        return decision

    def _decide(self, index: int) -> bool:
        from kvrl.plugins.tiers import ReclaimedBlock
        return self._ask("offload", ReclaimedBlock(index, self.block_size, self.tier.num_free, self.tier.num_blocks))

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

    def _demote(self, slot: int, entry: TierEntry) -> None:
        """CPU tier block ``slot`` is being replaced: demote ``entry`` to the disk tier or drop it."""
        from kvrl.plugins.tiers import DemotedBlock
        disk = self.disk
        read_s = self.disk_bandwidth.read_s(self.stats.block_bytes)
        if not self._ask("demote", DemotedBlock(entry.index, self.block_size, disk.num_free, disk.num_blocks, read_s)):
            self.stats.cpu_dropped_blocks += 1
            return
        dslot = disk.store(entry)
        if dslot is None:
            self.stats.cpu_dropped_blocks += 1
            return
        if self.read_ahead is not None:
            self.read_ahead.invalidate(dslot)        # a read issued before this write is stale
        self._disk_out.append((slot, dslot))
        self.stats.demoted_blocks += 1

    # ----------------------------------------------------------------- registration keeps identities exclusive
    def on_computed_batch(self, items) -> None:
        """The pool's registration, then each newly registered block's identity leaves the CPU tier
        and the disk (their copies are stale duplicates now), item by item in order."""
        super().on_computed_batch(items)
        bs, meta, cached = self.block_size, self._meta, self._cached
        discard, disk = self.tier.discard, self.disk
        for seq, old, new in items:
            table, hashes = seq.block_table, seq.block_hashes
            for i in range(old // bs, new // bs):
                block = table[i]
                if cached[block] and meta[block] is None:
                    meta[block] = (hashes[i], i)
                    if not discard(hashes[i]) and disk is not None:
                        disk.discard(hashes[i])

    # ----------------------------------------------------------------- matching into the tiers
    def match_prefix(self, seq: Sequence) -> TieredMatch:
        gpu = super().match_prefix(seq)
        match = TieredMatch(gpu.block_ids, gpu.num_evictable, gpu.check_failed)
        tier, disk = self.tier, self.disk
        if gpu.check_failed or not (tier.num_stored or (disk is not None and disk.num_stored)):
            return match
        bs = self.block_size
        max_blocks = (seq.num_tokens - 1) // bs
        hashes = seq.block_hashes
        data = salt = None
        width = bs * self._width
        found = match.tier_blocks
        n_disk = 0
        for i in range(len(gpu.block_ids), max_blocks):
            level, where = CPU, tier
            slot = tier.lookup(hashes[i])
            if slot is None and disk is not None:
                level, where = DISK, disk
                slot = disk.lookup(hashes[i])
            if slot is None or where.stored_now(slot):
                break
            if self._checked:
                if data is None:
                    data = seq.token_bytes(0, max_blocks * bs, self._width)
                    salt = self._salt(seq)
                entry = where.entry(slot)
                if (entry.parent != (hashes[i - 1] if i else None) or entry.salt != salt
                        or entry.tokens != data[i * width:(i + 1) * width]):
                    match.check_failed = True
                    break
            found.append((level, slot))
            n_disk += level == DISK
        if n_disk:
            # every disk hit is staged in a CPU tier block (a free one or a replaceable one that is
            # not itself a hit of this match): cut the match where that runs out
            room = tier.num_free + tier.num_replaceable()
            while found and n_disk > room - (len(found) - n_disk):
                n_disk -= found.pop()[0] == DISK
            if n_disk and self.read_ahead is not None:
                self._read_ahead(found, hashes, len(gpu.block_ids))
        return match

    def admit(self, seq: Sequence, match: PrefixMatch, upto: int) -> list[tuple[int, int]]:
        """As :meth:`PagedAllocator.admit`, plus: tier hits are taken out of their tier (disk hits
        staged through a CPU tier block), loaded into fresh GPU blocks (``tier_in``) and
        registered in the GPU prefix cache."""
        tier_blocks = getattr(match, "tier_blocks", None)
        stats = self.stats
        bs = self.block_size
        prefetched = self._prefetched
        for block in match.block_ids:
            if prefetched[block]:
                prefetched[block] = False
                stats.prefetch_used_blocks += 1
        if seq.num_preemptions == 0:
            stats.prompt_tokens_looked_up += seq.prompt_len
            stats.prompt_tokens_hit_gpu += len(match.block_ids) * bs
            if tier_blocks:
                self._count_hits(len(match.block_ids), tier_blocks)
        if not tier_blocks:
            return super().admit(seq, match, upto)
        now = self._clock()
        for block in match.block_ids:
            self._incref(block)
            self.prefix_cache.on_hit(block, now)
        # out of reach of the demotions and offloads below
        entries = [(self.tier if level == CPU else self.disk).take(slot) for level, slot in tier_blocks]
        sources = []
        for (level, slot), entry in zip(tier_blocks, entries):
            if level == CPU:
                sources.append(slot)
                continue
            staged = self.tier.store(entry)          # may demote the CPU tier's oldest block
            if staged is None:                       # match_prefix left room for every disk hit
                raise AssertionError("no CPU tier block to stage a disk hit in")
            self.tier.take(staged)
            self._disk_in.append((slot, staged, entry.block_hash))
            sources.append(staged)
        table = list(match.block_ids)
        hashes = seq.block_hashes
        for source, entry in zip(sources, entries):
            i = len(table)
            block = self._allocate()
            self._fill[block] = bs
            self._tokens_in_use += bs
            if self.prefix_cache.insert(entry.block_hash, hashes[i - 1] if i else None, block, now):
                self._cached[block] = True
                self._meta[block] = (entry.block_hash, i)
                if self._checked:
                    self._identity[block] = (entry.parent, entry.tokens, entry.salt)
            self._tier_in.append((source, block))
            table.append(block)
        stats.loaded_blocks += len(entries)
        stats.disk_loaded_blocks += len(entries) - sum(level == CPU for level, _ in tier_blocks)
        seq.block_table = table
        seq.num_computed = len(table) * bs
        return self.extend(seq, upto)

    def _count_hits(self, num_gpu: int, tier_blocks: list[tuple[int, int]]) -> None:
        """First-admission hit counts per tier and the estimated TTFT each tier saved: the hit span's
        prefill (the executor's estimate, after ``num_gpu`` GPU-hit blocks) shared per block, less
        each tier's transfers (PCIe load, plus the disk read for disk hits). Negative: a loss."""
        stats, bs = self.stats, self.block_size
        n_disk = sum(level == DISK for level, _ in tier_blocks)
        n_cpu = len(tier_blocks) - n_disk
        stats.prompt_tokens_hit_cpu += n_cpu * bs
        stats.prompt_tokens_hit_disk += n_disk * bs
        ex = self._executor
        if ex is None:
            return
        start = num_gpu * bs
        per_block = (ex.estimate_prefill_s(start + len(tier_blocks) * bs) - ex.estimate_prefill_s(start)) / len(tier_blocks)
        if n_cpu:
            stats.cpu_ttft_saved_s += n_cpu * per_block - ex.estimate_swap_s(n_cpu)
        if n_disk:
            stats.disk_ttft_saved_s += (n_disk * per_block - ex.estimate_swap_s(n_disk)
                                        - self.disk_bandwidth.read_s(n_disk * stats.block_bytes))

    # ----------------------------------------------------------------- prefetch (loading: kvrl.engine.tier_prefetch)
    def free(self, seq: Sequence) -> None:
        """As :meth:`PagedAllocator.free`; a finished sequence's full blocks are remembered as a chain a prefetch may bring back (:attr:`chains`, at most :attr:`max_chains`)."""
        n = min(len(seq.block_hashes), seq.num_computed // self.block_size)
        if n and len(seq.output_token_ids) >= seq.request.output_len:     # finished (not preempted or aborted)
            from kvrl.plugins.tiers import PrefetchChain
            req = seq.request
            handle = self._next_chain
            self._next_chain += 1
            self.chains[handle] = (PrefetchChain(handle, req.tenant, req.prefix_group, self._clock(), n),
                                   tuple(seq.block_hashes[:n]))
            while len(self.chains) > self.max_chains:
                self.chains.popitem(last=False)
        super().free(seq)

    # ----------------------------------------------------------------- per step
    def take_tier_ops(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]], list[tuple[int, int]],
                                     list[tuple[int, int]]]:
        """This step's (tier_out, tier_in, disk_out, disk_in) operations; tier blocks given up
        become reusable. The disk operations are carried out here, before the step runs (live:
        demoted blocks copied out of the host pool and written in the background, disk hits read
        into their CPU tier blocks and waited for; sim: priced), so the executor sees only the CPU
        tier's ``tier_out``/``tier_in``; the sim also prices ``disk_out``/``disk_in`` on its clock.
        ``disk_in`` lists the disk reads issued for this step: with :attr:`read_ahead`, disk hits
        whose read was issued at a lookup are not in it (the step waits for what is left of those
        reads: live, then their staged bytes are copied to the CPU tier blocks; sim,
        ``await_disk_reads``)."""
        self._run_prefetch()
        out, into = self._tier_out, self._tier_in
        disk_out, disk_in = self._disk_out, self._disk_in
        self._tier_out, self._tier_in, self._disk_out, self._disk_in = [], [], [], []
        if disk_out or disk_in:
            if self.disk_store is not None:
                disk_in = self._move_disk(disk_out, disk_in)
            else:
                disk_in = self._price_disk(disk_out, disk_in)
        ra = self.read_ahead
        if ra is not None:
            disk = self.disk
            ra.sweep(lambda slot, block_hash: disk.lookup(block_hash) == slot)
        self.tier.end_step()
        if self.disk is not None:
            self.disk.end_step()
        return out, into, disk_out, disk_in

    def summary(self) -> dict[str, float]:
        if self.disk_store is not None:
            self.disk_store.drain()
            self.stats.disk_store_s = self.disk_store.write_s
        out = self.stats.summary(self.tier, self.disk)
        ra = self.read_ahead
        if ra is not None:
            st = ra.stats
            out.update({"tier_disk_read_ahead_blocks": ra.capacity,
                        "tier_disk_read_ahead_staging_bytes": ra.staging_bytes,
                        "tier_disk_read_ahead_issued_blocks": st.issued_blocks,
                        "tier_disk_read_ahead_used_blocks": st.used_blocks,
                        "tier_disk_read_ahead_dropped_blocks": st.dropped_blocks,
                        "tier_disk_read_ahead_full_blocks": st.full_blocks,
                        "tier_disk_read_ahead_errors": st.errors,
                        "tier_disk_read_ahead_wait_s": st.wait_s})
        return out

    def check_invariants(self, live_seqs: list[Sequence]) -> None:
        """The pool's invariants, the tiers', and across them: every GPU-cached block has its
        identity recorded and that identity is in no tier, no identity is in the CPU and the disk
        tier at once; every cached block a live sequence holds was registered under that
        sequence's salt."""
        super().check_invariants(live_seqs)
        self.tier.check_invariants()
        disk = self.disk
        if self.read_ahead is not None:
            self.read_ahead.check_invariants()
        if disk is not None:
            disk.check_invariants()
            for h in disk._block_of:
                assert self.tier.lookup(h) is None, "an identity in the CPU tier and on disk"
        for b in range(self.num_blocks):
            assert (self._meta[b] is not None) == self._cached[b], f"block {b}: identity meta drift"
            if self._cached[b]:
                h = self._meta[b][0]
                assert self.tier.lookup(h) is None, f"block {b}: identity on the GPU and in the CPU tier"
                assert disk is None or disk.lookup(h) is None, f"block {b}: identity on the GPU and on disk"
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
                           timer=timer, on_error=on_error, disk_blocks=config.disk_tier_blocks,
                           disk_dir=config.disk_tier_dir, disk_threads=config.disk_tier_threads,
                           read_ahead_blocks=config.disk_tier_read_ahead_blocks)
