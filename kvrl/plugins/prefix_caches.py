"""Built-in prefix-cache policies: ``none``, ``hash_lru``, ``hash_lfu``, ``radix_lru``.

All match full blocks by their chained identity (see :mod:`kvrl.engine.hashing`); they differ in
which evictable block (cached, no longer referenced) is reclaimed first when the pool runs dry.
None of them decides what a hit is: the allocator checks every block they return against the
request's tokens, salt and parent (:meth:`kvrl.engine.prefix_identity.PrefixIdentityMixin.match_prefix`),
and their iteration orders never depend on identity values (which are keyed and random).
"""
from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from typing import TYPE_CHECKING, Optional

from kvrl.plugins.base import PrefixCachePolicy
from kvrl.plugins.registry import register

if TYPE_CHECKING:   # plugins sit below the engine (import-linter layers in pyproject.toml)
    from kvrl.engine.hashing import BlockHash


@register("prefix_cache", "none")
class NoPrefixCache(PrefixCachePolicy):
    """No prefix caching: every prompt is prefilled in full and freed blocks are reusable at once.
    Blocks are never hashed, which also makes it the cheapest option for long simulations."""

    enabled = False

    def lookup(self, block_hash):
        return None

    def insert(self, block_hash, parent_hash, block_id, now):
        return False

    def on_release(self, block_id, now):
        raise AssertionError("no block is cached without a prefix cache")

    def on_acquire(self, block_id):
        raise AssertionError("no block is cached without a prefix cache")

    def evict(self):
        return None

    num_evictable = property(lambda self: 0)
    num_cached = property(lambda self: 0)


class _HashTable(PrefixCachePolicy):
    """Identity <-> block maps shared by the hash-based policies (identities are opaque keys:
    bytes or ints, see :data:`kvrl.engine.hashing.BlockHash`)."""

    def __init__(self, params) -> None:
        super().__init__(params)
        self._block_of: dict[BlockHash, int] = {}
        self._hash_of: dict[int, BlockHash] = {}

    def lookup(self, block_hash: BlockHash) -> Optional[int]:
        return self._block_of.get(block_hash)

    def insert(self, block_hash, parent_hash, block_id, now) -> bool:
        if self._block_of.setdefault(block_hash, block_id) != block_id:
            return False
        self._hash_of[block_id] = block_hash
        return True

    def _forget(self, block_id: int) -> BlockHash:
        block_hash = self._hash_of.pop(block_id)
        del self._block_of[block_hash]
        return block_hash

    num_cached = property(lambda self: len(self._block_of))


@register("prefix_cache", "hash_lru")
class HashLRU(_HashTable):
    """vLLM's automatic prefix caching: blocks are found by hash; the evictable block released
    longest ago is reclaimed first (a sequence releases its blocks tail first, so among blocks
    freed together the deepest go first). No parameters. Source: vLLM APC."""

    # Its whole state is three maps: _block_of, _hash_of and _evictable (release order). The engine
    # runs a plain HashLRU (no method overridden) itself on those maps, in bulk and with the same
    # answers (kvrl.engine.guards.PooledHashLRU); these methods serve everyone else. Run so, the
    # pool may register a block lazily: it is cached and evictable but has no identity in the maps
    # yet, and _num_pending counts such blocks (always 0 when these methods run).

    def __init__(self, params) -> None:
        super().__init__(params)
        self._evictable: OrderedDict[int, None] = OrderedDict()
        self._num_pending = 0

    def on_release(self, block_id, now):
        self._evictable[block_id] = None

    def on_acquire(self, block_id):
        del self._evictable[block_id]

    def evict(self):
        if not self._evictable:
            return None
        block_id, _ = self._evictable.popitem(last=False)
        del self._block_of[self._hash_of.pop(block_id)]
        return block_id

    # the bulk calls, as the per-block ones above would answer them (one call per sequence's blocks)
    def insert_blocks(self, entries, now):
        setdefault, hash_of = self._block_of.setdefault, self._hash_of
        out = []
        for block_hash, _, block_id in entries:
            ok = setdefault(block_hash, block_id) == block_id
            if ok:
                hash_of[block_id] = block_hash
            out.append(ok)
        return out

    def on_release_blocks(self, block_ids, now):
        evictable = self._evictable
        for block_id in block_ids:
            evictable[block_id] = None

    def evict_blocks(self, n):
        evictable, block_of, hash_of = self._evictable, self._block_of, self._hash_of
        blocks = []
        for _ in range(min(n, len(evictable))):
            block_id = next(iter(evictable))      # the oldest, as popitem(last=False), but cheaper
            del evictable[block_id]
            del block_of[hash_of.pop(block_id)]
            blocks.append(block_id)
        return blocks

    num_evictable = property(lambda self: len(self._evictable))
    num_cached = property(lambda self: len(self._block_of) + self._num_pending)


@register("prefix_cache", "hash_lfu")
class HashLFU(_HashTable):
    """Least-frequently-used reclaim: each cached block counts its hits; the evictable block with
    the fewest hits goes first, ties broken by older release. Keeps hot shared prompts (system
    prompts hit by every request) through bursts of one-off prompts. No parameters."""

    def __init__(self, params) -> None:
        super().__init__(params)
        self._hits: dict[int, int] = {}
        self._heap: list[tuple[int, float, int, int]] = []
        self._evictable: dict[int, int] = {}   # block -> version of its live heap entry
        self._counter = itertools.count()

    def insert(self, block_hash, parent_hash, block_id, now) -> bool:
        ok = super().insert(block_hash, parent_hash, block_id, now)
        if ok:
            self._hits[block_id] = 0
        return ok

    def on_hit(self, block_id, now):
        self._hits[block_id] += 1

    def on_release(self, block_id, now):
        version = next(self._counter)
        self._evictable[block_id] = version
        heapq.heappush(self._heap, (self._hits[block_id], now, version, block_id))

    def on_acquire(self, block_id):
        del self._evictable[block_id]

    def evict(self):
        while self._heap:
            _, _, version, block_id = heapq.heappop(self._heap)
            if self._evictable.get(block_id) == version:
                del self._evictable[block_id]
                del self._hits[block_id]
                self._forget(block_id)
                return block_id
        return None

    num_evictable = property(lambda self: len(self._evictable))


@register("prefix_cache", "radix_lru")
class RadixLRU(_HashTable):
    """SGLang RadixAttention's policy at block granularity: cached blocks form a tree (a block's
    parent is the block holding the preceding tokens) and only evictable *leaves* are reclaimed,
    least recently used first, so a shared prefix outlives every branch hanging off it. Should no
    evictable leaf exist (an evictable inner block whose child is still in use), the least
    recently released evictable block is taken. No parameters. Source: SGLang (Zheng et al. 2024)."""

    def __init__(self, params) -> None:
        super().__init__(params)
        self._parent: dict[BlockHash, Optional[BlockHash]] = {}   # block identity -> parent identity
        self._children: dict[BlockHash, int] = {}                 # block identity -> cached children
        self._last_use: dict[int, float] = {}           # block -> last release/hit time
        self._evictable: OrderedDict[int, None] = OrderedDict()
        self._leaf_heap: list[tuple[float, int, int]] = []
        self._counter = itertools.count()

    def insert(self, block_hash, parent_hash, block_id, now) -> bool:
        ok = super().insert(block_hash, parent_hash, block_id, now)
        if ok:
            self._parent[block_hash] = parent_hash
            self._children[block_hash] = 0
            if parent_hash in self._children:
                self._children[parent_hash] += 1
            self._last_use[block_id] = now
        return ok

    def on_hit(self, block_id, now):
        self._last_use[block_id] = now

    def _push_if_leaf(self, block_id: int) -> None:
        if block_id in self._evictable and self._children[self._hash_of[block_id]] == 0:
            heapq.heappush(self._leaf_heap, (self._last_use[block_id], next(self._counter), block_id))

    def on_release(self, block_id, now):
        self._last_use[block_id] = now
        self._evictable[block_id] = None
        self._push_if_leaf(block_id)

    def on_acquire(self, block_id):
        del self._evictable[block_id]

    def _take(self, block_id: int) -> int:
        del self._evictable[block_id]
        del self._last_use[block_id]
        block_hash = self._forget(block_id)
        parent_hash = self._parent.pop(block_hash)
        del self._children[block_hash]
        if self._children.get(parent_hash, 0) > 0:
            self._children[parent_hash] -= 1
            parent_block = self._block_of[parent_hash]
            self._push_if_leaf(parent_block)
        return block_id

    def evict(self):
        while self._leaf_heap:
            last_use, _, block_id = heapq.heappop(self._leaf_heap)
            if (block_id in self._evictable and self._last_use[block_id] == last_use
                    and self._children[self._hash_of[block_id]] == 0):
                return self._take(block_id)
        if self._evictable:
            return self._take(next(iter(self._evictable)))
        return None

    num_evictable = property(lambda self: len(self._evictable))
