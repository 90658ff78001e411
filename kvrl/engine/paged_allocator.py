"""Paged KV allocation: a GPU block pool with reference counts, per-sequence block tables,
copy-on-write, prefix caching through a :class:`PrefixCachePolicy`, and a CPU swap pool.

Block accounting (GPU):
- a block is *used* when its reference count is > 0;
- a *free* block is either on the uncached free list, or cached with reference count 0
  (evictable; the prefix-cache policy decides the order in which those are reclaimed);
- ``num_free_blocks = len(free list) + prefix_cache.num_evictable``.

Block identity (issue #14): a cached block is found by its chained identity (:mod:`kvrl.engine.hashing`),
and with a collision-resistant hash every hit is also checked: the cached block's parent identity, token
ids and salt, recorded at registration, must equal the requesting sequence's, or the hit is a miss
(counted in :attr:`PrefixMatch.check_failed`). This is the only way blocks are shared by identity: CoW
forks share a parent's block table by reference (same request, same tokens); swapped-out blocks are
private and re-enter the cache on swap-in only through :meth:`on_computed`, from their own tokens.
The allocator returns block operations (copy and swap pairs) for the executor; it never touches KV data.

Prefix matching and the lazy registration of blocks: :mod:`kvrl.engine.prefix_identity`.
"""
from __future__ import annotations

from collections import deque
from typing import Callable, Optional

from kvrl.engine.guards import PooledHashLRU
from kvrl.engine.hashing import BlockHasher
from kvrl.engine.pool_invariants import check_paged_pool
from kvrl.engine.prefix_identity import PrefixIdentityMixin, PrefixMatch, ReclaimLog
from kvrl.engine.request import Sequence
from kvrl.plugins.base import PrefixCachePolicy


class OutOfBlocks(RuntimeError):
    """Raised when an allocation is attempted without enough free blocks (an engine bug)."""


class PagedAllocator(PrefixIdentityMixin):
    """GPU block pool + CPU swap pool for the paged engine (prefix matching and identities:
    :class:`~kvrl.engine.prefix_identity.PrefixIdentityMixin`).

    Args:
        num_blocks: GPU blocks. block_size: tokens per block. num_cpu_blocks: swap pool blocks.
        prefix_cache: the prefix-cache policy behind its :class:`~kvrl.engine.guards.GuardedPrefixCache`
            (whose ``insert_blocks`` / ``on_release_blocks`` register and release blocks in bulk;
            ``none`` disables hashing entirely).
        clock: returns the engine time in seconds (for recency-based reclaim orders).
        cache_salt: maps a sequence to the salt mixed into its block hashes.
        hasher: computes block identities; with ``hasher.checked`` every hit is verified.
    """

    supports_swap = True
    #: a running sequence's partial block holds its ``num_computed % block_size`` tokens. Its entry in
    #: :attr:`block_fill` may lag behind (the engine's apply only counts a decode token inside a block);
    #: the pool settles it from the sequence before it reads it (:meth:`_settle_tail`). A partial block
    #: shared by forks is copied before a decode writes it (the copy holds what the sequence computed).
    exact_tail_fill = True
    #: register blocks lazily where the prefix cache allows it (module doc); a subclass that reads a
    #: cached block's identity outside a lookup (a tier storing reclaimed blocks by identity) sets False
    lazy_registration = True
    keeps_peeks = True     # keep prefix peeks between steps (PrefixIdentityMixin); False: matches go into tiers

    def __init__(self, num_blocks: int, block_size: int, num_cpu_blocks: int,
                 prefix_cache: PrefixCachePolicy, clock: Callable[[], float],
                 cache_salt: Callable[[Sequence], bytes], hasher: BlockHasher) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.prefix_cache = prefix_cache
        self._clock = clock
        self._salt = cache_salt
        self._hasher = hasher
        self._width = hasher.token_width           # bytes per token id in identities (Sequence.token_bytes)
        self._checked = prefix_cache.enabled and hasher.checked
        # per cached block (checked hashes), what it was registered with: (registering sequence,
        # block index), replaced on its first check by (parent identity, token bytes, salt)
        self._identity: list[Optional[tuple]] = [None] * num_blocks
        # a plain hash_lru (kvrl.engine.guards.PooledHashLRU): its maps, which the per-block loops
        # below update in place of the bulk calls (the same operations in the same order)
        self._lru = prefix_cache.maps if isinstance(prefix_cache, PooledHashLRU) else None
        # lazy registration (module doc): families by first-block identity; pending blocks are counted
        # by the pooled hash_lru (PooledHashLRU.num_pending) so that its num_cached includes them
        self._lazy = self._lru is not None and self._checked and self.lazy_registration
        # append_blocks takes one block itself where _reclaim is this class's (a tier's offloads)
        self._one_block = self._lru is not None and type(self)._reclaim is PagedAllocator._reclaim
        self._families: dict = {}
        #: the cached blocks reclaimed, the latest ones: a cached block keeps its identity until it is in here
        self._reclaim_log = ReclaimLog(4 * num_blocks)
        self.ref_counts = [0] * num_blocks
        self._fill = [0] * num_blocks          # tokens with computed KV in each block
        self._cached = [False] * num_blocks    # registered in the prefix cache
        self._free: deque[int] = deque(range(num_blocks))
        self._num_used = 0
        self._tokens_in_use = 0                # sum of fills over used blocks
        self._cpu_free: list[int] = list(range(num_cpu_blocks - 1, -1, -1))
        self.num_cpu_blocks = num_cpu_blocks

    # ----------------------------------------------------------------- counters
    @property
    def num_free_blocks(self) -> int:
        return len(self._free) + self.prefix_cache.num_evictable

    @property
    def num_used_blocks(self) -> int:
        return self._num_used

    @property
    def num_free_cpu_blocks(self) -> int:
        return len(self._cpu_free)

    @property
    def tokens_stored(self) -> int:
        """Tokens whose KV is held in used blocks (shared blocks counted once)."""
        return self._tokens_in_use

    # ----------------------------------------------------------------- block primitives
    def _allocate(self) -> int:
        if self._free:
            block = self._free.popleft()
        else:
            block = self.prefix_cache.evict()
            if block is None:
                raise OutOfBlocks("no free GPU block")
            self._cached[block] = False
            self._identity[block] = None
            self._reclaim_log.append(block)
        self.ref_counts[block] = 1
        self._fill[block] = 0
        self._num_used += 1
        return block

    def _incref(self, block: int) -> None:
        if self.ref_counts[block] == 0:
            self.prefix_cache.on_acquire(block)
            self._num_used += 1
            self._tokens_in_use += self._fill[block]
        self.ref_counts[block] += 1

    def _release(self, blocks, now: float) -> None:
        """:meth:`_decref` of each of ``blocks`` in order (inlined: this runs once per block of
        every finished or swapped-out sequence; a plain hash_lru's release order is updated in the
        loop itself, as its ``on_release_blocks`` would)."""
        ref, fill, cached, free_list = self.ref_counts, self._fill, self._cached, self._free
        used = tokens = 0
        if self._lru is not None:                  # hash_lru's on_release_blocks, block by block
            evictable = self._lru[2]
            for block in blocks:
                rc = ref[block] - 1
                ref[block] = rc
                if rc == 0:
                    used += 1
                    tokens += fill[block]
                    if cached[block]:
                        evictable[block] = None
                    else:
                        free_list.append(block)
            self._num_used -= used
            self._tokens_in_use -= tokens
            return
        released = []                              # cached blocks, handed to the prefix cache in order
        for block in blocks:
            rc = ref[block] - 1
            ref[block] = rc
            if rc == 0:
                used += 1
                tokens += fill[block]
                if cached[block]:
                    released.append(block)
                else:
                    free_list.append(block)
        self._num_used -= used
        self._tokens_in_use -= tokens
        if released:
            self.prefix_cache.on_release_blocks(released, now)

    def _settle_tail(self, seq: Sequence) -> None:
        """Set the :attr:`block_fill` entry of ``seq``'s partial block (if any) to what it holds,
        ``num_computed % block_size`` tokens (see :attr:`exact_tail_fill`), before it is read."""
        tail = seq.num_computed % self.block_size
        if tail and seq.block_table:       # (a swapped sequence holds no GPU block)
            self._fill[seq.block_table[seq.num_computed // self.block_size]] = tail

    def _decref(self, block: int, now: float) -> None:
        rc = self.ref_counts[block] - 1
        self.ref_counts[block] = rc
        if rc == 0:
            self._num_used -= 1
            self._tokens_in_use -= self._fill[block]
            if self._cached[block]:
                self.prefix_cache.on_release(block, now)
            else:
                self._free.append(block)

    # ----------------------------------------------------------------- growth
    def needs_blocks(self, seq: Sequence, upto: int) -> bool:
        """Whether :meth:`extend` to ``upto`` would allocate (a new block or a CoW copy)."""
        table = seq.block_table
        if upto > len(table) * self.block_size:
            return True
        start = seq.num_computed
        return bool(start % self.block_size) and start < upto and self.ref_counts[table[start // self.block_size]] > 1

    def blocks_to_extend(self, seq: Sequence, upto: int) -> int:
        """Free blocks that :meth:`extend` to ``upto`` tokens would consume (new blocks + CoW copy)."""
        need = -(-upto // self.block_size) - len(seq.block_table)
        start = seq.num_computed
        if start % self.block_size and start < upto:
            last = seq.block_table[start // self.block_size]
            if self.ref_counts[last] > 1:
                need += 1
        return max(need, 0)

    def admission_blocks(self, seq: Sequence, match: PrefixMatch) -> int:
        """Free blocks the whole remaining prompt (all of ``seq``'s tokens) will take."""
        return -(-seq.num_tokens // self.block_size) - len(match.block_ids) + match.num_evictable

    def can_admit(self, seq: Sequence, match: PrefixMatch, upto: int) -> bool:
        need = -(-upto // self.block_size) - len(match.block_ids) + match.num_evictable
        return need <= self.num_free_blocks

    def admit(self, seq: Sequence, match: PrefixMatch, upto: int) -> list[tuple[int, int]]:
        """Take the matched blocks and allocate up to ``upto`` tokens; sets ``seq.num_computed``."""
        now = self._clock()
        for block in match.block_ids:
            self._incref(block)
            self.prefix_cache.on_hit(block, now)
        seq.block_table = list(match.block_ids)
        seq.num_computed = match.num_tokens(self.block_size)
        return self.extend(seq, upto)

    def extend(self, seq: Sequence, upto: int) -> list[tuple[int, int]]:
        """Make ``seq.block_table`` cover ``upto`` tokens; returns copy-on-write pairs (src, dst)."""
        copies: list[tuple[int, int]] = []
        start = seq.num_computed
        if start % self.block_size and start < upto:
            idx = start // self.block_size
            old = seq.block_table[idx]
            if self.ref_counts[old] > 1:
                new = self._allocate()
                held = start % self.block_size     # what the shared block holds (its entry may lag)
                self._fill[new] = held
                self._tokens_in_use += held
                copies.append((old, new))
                self._decref(old, self._clock())
                seq.block_table[idx] = new
        need = -(-upto // self.block_size) - len(seq.block_table)
        if need > 0:
            self._take(seq.block_table, need)
        return copies

    def _take(self, table: list[int], n: int) -> None:
        """Append ``n`` new blocks to ``table``: uncached free blocks first, as :meth:`_allocate`
        takes them, then reclaimed ones (:class:`OutOfBlocks` if too few)."""
        free_list = self._free
        take = min(n, len(free_list))
        if take:
            ref, fill = self.ref_counts, self._fill
            for _ in range(take):
                block = free_list.popleft()
                ref[block] = 1
                fill[block] = 0
                table.append(block)
            self._num_used += take
        if n > take:
            self._reclaim(table, n - take)

    def append_blocks(self, table: list[int], n: int) -> bool:
        """Append ``n`` new blocks to a block table that ends at a block boundary (what :meth:`extend`
        allocates there: no copy is due), or return False, changing nothing, if fewer are free.

        One block (a decode's next block, the common call) is taken here, as :meth:`_take` and a
        plain hash_lru's :meth:`_reclaim` take one (a specialised twin of their one-block case)."""
        if n == 1 and self._one_block:
            free_list = self._free
            if free_list:
                block = free_list.popleft()
            else:
                block_of, hash_of, evictable = self._lru
                if not evictable:
                    return False
                block, _ = evictable.popitem(False)
                block_hash = hash_of.pop(block, None)
                if block_hash is None:
                    self.prefix_cache.num_pending -= 1
                else:
                    del block_of[block_hash]
                self._cached[block] = False
                self._identity[block] = None
                self._reclaim_log.append(block)
            self.ref_counts[block] = 1
            self._fill[block] = 0
            self._num_used += 1
            table.append(block)
            return True
        free = len(self._free)
        if n > free and n - free > self.prefix_cache.num_evictable:
            return False
        if free:
            self._take(table, n)
        else:                            # what _take does with no free block left
            self._reclaim(table, n)
        return True

    def _reclaim(self, table: list[int], n: int) -> None:
        """Append to ``table`` ``n`` blocks taken from the prefix cache's evictable ones, as ``n``
        calls of :meth:`_allocate` on an empty free list take them (same blocks, same order, the
        same :class:`OutOfBlocks` after the blocks there were), with one guarded call for the lot.
        A subclass whose :meth:`_allocate` does more per reclaimed block overrides this too."""
        cached, identity, ref, fill = self._cached, self._identity, self.ref_counts, self._fill
        if self._lru is not None:                  # hash_lru's evict_blocks, block by block
            block_of, hash_of, evictable = self._lru
            pop, forget, k = evictable.popitem, hash_of.pop, min(n, len(evictable))
            pending = 0
            for _ in range(k):
                block, _ = pop(False)     # last=False: the oldest (positional: a cheaper call)
                block_hash = forget(block, None)
                if block_hash is None:    # registered lazily, without an identity (module doc)
                    pending += 1
                else:
                    del block_of[block_hash]
                cached[block] = False
                identity[block] = None
                ref[block] = 1
                fill[block] = 0
                table.append(block)
            self._num_used += k
            self._reclaim_log += table[len(table) - k:]
            if pending:
                self.prefix_cache.num_pending -= pending
            if k < n:
                raise OutOfBlocks("no free GPU block")
            return
        blocks = self.prefix_cache.evict_blocks(n)
        for block in blocks:
            cached[block] = False
            identity[block] = None
            ref[block] = 1
            fill[block] = 0
        self._num_used += len(blocks)
        self._reclaim_log += blocks
        table += blocks
        if len(blocks) < n:
            raise OutOfBlocks("no free GPU block")

    @property
    def block_fill(self) -> list[int]:
        """Tokens with computed KV in each block: the pool's own list, where a running sequence's
        partial block may lag behind (see :attr:`exact_tail_fill` and :meth:`on_computed`)."""
        return self._fill

    def add_stored_tokens(self, n: int) -> None:
        """Count ``n`` tokens the caller added to :attr:`block_fill` of used blocks."""
        self._tokens_in_use += n

    def on_computed(self, seq: Sequence, old: int, new: int) -> None:
        """Record that tokens ``[old, new)`` of ``seq`` now have KV; registers newly full blocks
        (:meth:`on_computed_batch` of this one item).

        One decode token inside a block (``new - old == 1``, ``new % block_size != 0``) counts one
        stored token and sets its block's entry to ``new % block_size``; a caller may instead only
        count it (:meth:`add_stored_tokens`) and leave the entry to lag (:attr:`exact_tail_fill`), as
        the engine's ``apply`` does: subclasses must keep that case that way."""
        self.on_computed_batch(((seq, old, new),))

    def on_computed_batch(self, items) -> None:
        """:meth:`on_computed` of each ``(seq, old, new)`` of ``items``, in order, with the newly
        full blocks of all of them registered in one bulk call to the prefix cache, in that
        order. The same as separate calls: the items write to distinct blocks (a block being
        written is private, see copy-on-write in :meth:`extend`), so only the registration order
        could matter, and it is kept. A plain hash_lru's maps are updated in this loop itself
        (what its ``insert_blocks`` does, block by block in the same order).

        Each item stores ``new - old`` tokens: by :attr:`exact_tail_fill` the block where ``old``
        falls held ``old % block_size`` of them and any later block of the table none (it is new),
        so no entry of :attr:`block_fill` is read (one that lagged is only overwritten)."""
        bs, fill = self.block_size, self._fill
        enabled, cached = self.prefix_cache.enabled, self._cached
        lru, checked, identity, lazy = self._lru, self._checked, self._identity, self._lazy
        if lru is not None:
            setdefault, hash_of = lru[0].setdefault, lru[1]
        added = pending = 0
        entries, owners = [], []       # blocks to register, and their (sequence, block index)
        for seq, old, new in items:
            table = seq.block_table
            tail = new % bs
            added += new - old
            if new - old == 1 and tail:    # one decode token inside a block
                fill[table[old // bs]] = tail
                continue
            first_full, last_full = old // bs, new // bs   # blocks [first_full, last_full) are now full
            family = self._family_of(seq, first_full) if lazy and last_full > first_full else None
            if family is not None:         # registered without identities (module doc)
                listed = family.blocks.append
                for block in table[first_full:last_full]:
                    fill[block] = bs
                    listed(block)
                    if not cached[block]:
                        cached[block] = True
                        identity[block] = family
                        pending += 1
            elif lru is not None and last_full > first_full:     # hash_lru's insert_blocks, block by block
                hashes = seq.block_hashes
                if len(hashes) < last_full:        # a prompt's were hashed when it was matched
                    self._ensure_hashes(seq, last_full)
                for i in range(first_full, last_full):
                    block = table[i]
                    fill[block] = bs
                    if not cached[block]:
                        block_hash = hashes[i]
                        if setdefault(block_hash, block) == block:
                            hash_of[block] = block_hash
                            cached[block] = True
                            if checked:
                                identity[block] = (seq, i)
            elif enabled and last_full > first_full:
                self._ensure_hashes(seq, last_full)
                hashes = seq.block_hashes
                parent = hashes[first_full - 1] if first_full else None
                for i in range(first_full, last_full):
                    block = table[i]
                    fill[block] = bs
                    block_hash = hashes[i]
                    if not cached[block]:
                        entries.append((block_hash, parent, block))
                        owners.append((seq, i))
                    parent = block_hash
            else:
                for block in table[first_full:last_full]:
                    fill[block] = bs
            if tail:
                fill[table[last_full]] = tail
        self._tokens_in_use += added
        if pending:
            self.prefix_cache.num_pending += pending
        if not entries:
            return
        registered = self.prefix_cache.insert_blocks(entries, self._clock())
        if len(registered) != len(entries):     # some identity was cached already: keep only the registered
            done = set(registered)
            owners = [owner for (_, _, block), owner in zip(entries, owners) if block in done]
        if self._checked:
            identity = self._identity
            for block, owner in zip(registered, owners):
                cached[block] = True
                identity[block] = owner
        else:
            for block in registered:
                cached[block] = True

    # ----------------------------------------------------------------- sharing and release
    def fork(self, parent: Sequence, child: Sequence) -> list[tuple[int, int]]:
        """``child`` shares all of ``parent``'s blocks (copy-on-write on the next partial write);
        no copies are needed now, so the returned list is empty."""
        for block in parent.block_table:
            self._incref(block)
        child.block_table = list(parent.block_table)
        child.block_hashes = list(parent.block_hashes)
        child.num_computed = parent.num_computed
        return []

    def free(self, seq: Sequence) -> None:
        """Release ``seq``'s GPU and CPU blocks (tail first, so cached tails are reclaimed first)."""
        self._settle_tail(seq)
        self._release(reversed(seq.block_table), self._clock())
        seq.block_table = []
        seq.prefix_family = None        # no sequence <-> family cycle left behind
        self._cpu_free.extend(seq.cpu_block_table)
        seq.cpu_block_table = []

    # ----------------------------------------------------------------- swapping
    def can_swap_out(self, seq: Sequence) -> bool:
        return len(seq.block_table) <= len(self._cpu_free)

    def swap_out(self, seq: Sequence) -> list[tuple[int, int]]:
        """Move ``seq`` to the CPU pool; returns (gpu_block, cpu_block) pairs to copy first."""
        pairs = [(block, self._cpu_free.pop()) for block in seq.block_table]
        self._settle_tail(seq)
        self._release(reversed(seq.block_table), self._clock())
        seq.cpu_block_table = [cpu for _, cpu in pairs]
        seq.block_table = []
        return pairs

    def blocks_to_swap_in(self, seq: Sequence) -> int:
        return len(seq.cpu_block_table)

    def swap_in(self, seq: Sequence) -> list[tuple[int, int]]:
        """Bring ``seq`` back to fresh GPU blocks; returns (cpu_block, gpu_block) pairs."""
        pairs = [(cpu, self._allocate()) for cpu in seq.cpu_block_table]
        self._cpu_free.extend(seq.cpu_block_table)
        seq.cpu_block_table = []
        seq.block_table = [gpu for _, gpu in pairs]
        computed, seq.num_computed = seq.num_computed, 0
        if computed:
            self.on_computed(seq, 0, computed)
        seq.num_computed = computed
        return pairs

    # ----------------------------------------------------------------- checks
    def check_invariants(self, live_seqs: list[Sequence]) -> None:
        """Assert the pool's invariants given every sequence that may hold blocks (tests; see
        :func:`~kvrl.engine.pool_invariants.check_paged_pool`)."""
        check_paged_pool(self, live_seqs)
