"""What keeps a policy's faults and cost with the engine's books: a wall-clock timer for policy
calls and a checked wrapper around the prefix-cache policy.

:class:`PolicyTimer` sums the wall time of policy calls (``time.perf_counter``). Calls nest (a
scheduler may read ``seq.cached_prefix_tokens``, which asks the prefix cache; a policy may read
``engine.reserved_blocks``, which asks the watermark): only the outermost call is counted, so no
second is counted twice.

:class:`GuardedPrefixCache` sits between the block pool and the prefix-cache policy. It keeps its
own record of which block holds which hash and which cached blocks are evictable (reference count
0), and checks every answer against it:

- ``lookup`` must return a block that was registered under that hash and not evicted since;
- ``evict`` must return an evictable block (one still in use would be handed to a second owner),
  and may return None only when no block is evictable; ``evict_blocks(n)`` must return ``n``
  distinct evictable blocks, or every evictable one if fewer are left;
- ``insert_blocks`` must answer once per block;
- a call that raises counts as failing.

A failing call is reported through ``on_error`` (which raises under
``engine.policy_errors=raise``) and then falls back to no caching for that call: a lookup misses,
an insert leaves the block private, a hit/release/acquire notice is dropped, and an eviction takes
the evictable block released longest ago. No request is aborted and no block is lost; the pool's
counts come from this record, so a policy that miscounts cannot corrupt them. With a well-behaved
policy every answer is the policy's own, so results are unchanged.

:class:`PooledHashLRU` stands in for the guard when the policy is a plain ``hash_lru``
(:class:`~kvrl.plugins.prefix_caches.HashLRU` with none of its methods overridden; see
:func:`guard_prefix_cache`). The engine then runs HashLRU's algorithm itself, in bulk, on the
policy's own three maps: a guard's record would duplicate them, and there is no foreign answer to
check. The block pool's per-block loops (registration, release, reclaim) update those maps
directly, as the bulk calls would. Every answer and count equals what HashLRU's methods would give
(tests/test_prefix_bulk.py and tests/test_prefix_lazy.py compare the two), so results are unchanged;
so do the maps, except that a block the pool registers lazily (kvrl.engine.prefix_identity) is in
the evictable order and counted by ``num_pending`` but enters the identity maps only once its family
is named. Since no plugin code runs, such a run counts no policy time for its prefix cache. This
halves the per-block work of the default prefix cache on a long trace (about a million blocks pass
through registration, release and reclaim).
"""
from __future__ import annotations

from time import perf_counter
from typing import Callable, Optional, Union

from kvrl.plugins.base import PrefixCachePolicy


class PolicyTimer:
    """Wall seconds spent in policy calls (outermost calls only); ``depth`` > 0 inside one."""

    __slots__ = ("total_s", "depth")

    def __init__(self) -> None:
        self.total_s = 0.0
        self.depth = 0


class GuardedPrefixCache:
    """The allocator's view of a :class:`PrefixCachePolicy` (see module doc). Implements the same
    interface; ``num_evictable`` and ``num_cached`` come from the guard's own record."""

    def __init__(self, policy: PrefixCachePolicy, timer: PolicyTimer,
                 on_error: Callable[[str, Exception], object]) -> None:
        self.policy = policy
        self.enabled = bool(policy.enabled)
        self._timer = timer
        self._on_error = on_error
        self._hash_of: dict[int, int] = {}       # cached block -> its hash
        self._evictable: dict[int, None] = {}    # cached blocks with reference count 0, release order

    @property
    def num_evictable(self) -> int:
        return len(self._evictable)

    @property
    def num_cached(self) -> int:
        return len(self._hash_of)

    def _fail(self, what: str, error: Exception) -> None:
        self._on_error(what, error)

    # Each call below times the policy inline (no helper call: these run once per block).
    def lookup(self, block_hash: int) -> Optional[int]:
        timer = self._timer
        t0 = perf_counter()
        try:
            block = self.policy.lookup(block_hash)
            if block is not None and self._hash_of.get(block) != block_hash:
                raise ValueError(f"lookup returned block {block!r}, which does not hold that hash")
        except Exception as exc:
            block, error = None, exc
        else:
            error = None
        if not timer.depth:
            timer.total_s += perf_counter() - t0
        if error is not None:
            self._fail("lookup", error)
        return block

    def insert(self, block_hash: int, parent_hash: Optional[int], block_id: int, now: float) -> bool:
        timer = self._timer
        t0 = perf_counter()
        try:
            ok = self.policy.insert(block_hash, parent_hash, block_id, now)
        except Exception as exc:
            ok, error = False, exc
        else:
            error = None
        if not timer.depth:
            timer.total_s += perf_counter() - t0
        if error is not None:
            self._fail("insert", error)
        elif ok:
            self._hash_of[block_id] = block_hash
        return bool(ok)

    def insert_blocks(self, entries: list[tuple], now: float) -> list[int]:
        """The policy's :meth:`~PrefixCachePolicy.insert_blocks` of ``(hash, parent hash, block)``
        entries, one timed call (a sequence's new full blocks register together); returns the
        blocks that were registered, in order. An answer that is not one truth value per entry
        is a policy error, and then no block is registered."""
        timer = self._timer
        t0 = perf_counter()
        try:
            answers = self.policy.insert_blocks(entries, now)
            if len(answers) != len(entries):
                raise ValueError(f"insert_blocks answered {len(answers)} times for {len(entries)} blocks")
        except Exception as exc:
            answers, error = (), exc
        else:
            error = None
        if not timer.depth:
            timer.total_s += perf_counter() - t0
        if error is not None:
            self._fail("insert_blocks", error)
            return []
        hash_of = self._hash_of
        done = []
        for (block_hash, _, block_id), ok in zip(entries, answers):
            if ok:
                hash_of[block_id] = block_hash
                done.append(block_id)
        return done

    def on_release_blocks(self, blocks: list[int], now: float) -> None:
        """Make ``blocks`` evictable, in order, and tell the policy in one timed
        :meth:`~PrefixCachePolicy.on_release_blocks` call."""
        evictable = self._evictable
        for block in blocks:
            evictable[block] = None
        timer = self._timer
        t0 = perf_counter()
        try:
            self.policy.on_release_blocks(blocks, now)
        except Exception as exc:
            error = exc
        else:
            error = None
        if not timer.depth:
            timer.total_s += perf_counter() - t0
        if error is not None:
            self._fail("on_release_blocks", error)

    def on_hit(self, block_id: int, now: float) -> None:
        timer = self._timer
        t0 = perf_counter()
        try:
            self.policy.on_hit(block_id, now)
        except Exception as exc:
            self._fail("on_hit", exc)
        if not timer.depth:
            timer.total_s += perf_counter() - t0

    def on_release(self, block_id: int, now: float) -> None:
        self._evictable[block_id] = None
        timer = self._timer
        t0 = perf_counter()
        try:
            self.policy.on_release(block_id, now)
        except Exception as exc:
            self._fail("on_release", exc)
        if not timer.depth:
            timer.total_s += perf_counter() - t0

    def on_acquire(self, block_id: int) -> None:
        self._evictable.pop(block_id, None)
        timer = self._timer
        t0 = perf_counter()
        try:
            self.policy.on_acquire(block_id)
        except Exception as exc:
            self._fail("on_acquire", exc)
        if not timer.depth:
            timer.total_s += perf_counter() - t0

    def evict(self) -> Optional[int]:
        """One checked :meth:`evict_blocks` call: the block the policy reclaims, or None."""
        blocks = self.evict_blocks(1)
        return blocks[0] if blocks else None

    def evict_blocks(self, n: int) -> list[int]:
        """Up to ``n`` blocks reclaimed by one timed :meth:`~PrefixCachePolicy.evict_blocks` call:
        its answer must be distinct evictable blocks, ``n`` of them or every evictable one. If not
        (or it raises), that is a policy error and the blocks are the evictable ones released
        longest ago instead. Fewer than ``n`` blocks means none was left."""
        timer, evictable, hash_of = self._timer, self._evictable, self._hash_of
        t0 = perf_counter()
        try:
            blocks = self.policy.evict_blocks(n)
            if type(blocks) is not list:
                blocks = list(blocks)
            want = n if n < len(evictable) else len(evictable)
            valid = len(blocks) == want and (want < 2 or len(set(blocks)) == want)
            for block in blocks:
                valid = valid and block in evictable
            if not valid:
                raise ValueError(f"evict_blocks({n}) returned {blocks[:8]!r}{'...' if len(blocks) > 8 else ''}, "
                                 f"not {want} distinct evictable blocks (a block in use or not cached, or too few)")
        except Exception as exc:
            blocks, error = [], exc
        else:
            error = None
            for block in blocks:
                del evictable[block]
                del hash_of[block]
        if not timer.depth:
            timer.total_s += perf_counter() - t0
        if error is not None:
            self._fail("evict_blocks", error)
            for _ in range(min(n, len(evictable))):
                blocks.append(self._fallback_evict())
        return blocks

    def _fallback_evict(self) -> Optional[int]:
        if not self._evictable:
            return None
        block = next(iter(self._evictable))
        del self._evictable[block]
        del self._hash_of[block]
        return block


#: the methods a policy must take from :class:`~kvrl.plugins.prefix_caches.HashLRU` unchanged for
#: :class:`PooledHashLRU` to serve it
_HASH_LRU_API = ("lookup", "insert", "on_hit", "on_release", "on_acquire", "evict", "insert_blocks",
                 "on_release_blocks", "evict_blocks", "num_evictable", "num_cached")


class PooledHashLRU:
    """HashLRU's algorithm run by the block pool on the policy's own maps (see module doc): the
    same interface as :class:`GuardedPrefixCache`, answering as the policy's methods would.

    The maps are HashLRU's ``_block_of`` (identity -> block), ``_hash_of`` (block -> identity) and
    ``_evictable`` (an OrderedDict of the evictable blocks in release order, the reclaim order)."""

    enabled = True

    def __init__(self, policy) -> None:
        self.policy = policy
        self._block_of, self._hash_of, self._evictable = policy._block_of, policy._hash_of, policy._evictable
        #: the three maps, for the block pool, whose per-block loops update them directly in place
        #: of the bulk calls below (kvrl.engine.paged_allocator: the same operations, same order)
        self.maps = (self._block_of, self._hash_of, self._evictable)
        self.lookup = self._block_of.get          # HashLRU.lookup, without a call of our own

    @property
    def num_pending(self) -> int:
        """Cached blocks that the pool registered lazily, without an identity yet (see
        :mod:`kvrl.engine.prefix_identity`): in the evictable order like any cached block, absent
        from the identity maps. Kept on the policy (``HashLRU._num_pending``) so that its own
        ``num_cached`` counts them; the pool updates it."""
        return self.policy._num_pending

    @num_pending.setter
    def num_pending(self, value: int) -> None:
        self.policy._num_pending = value

    def __setstate__(self, state: dict) -> None:
        """Copies (``copy.deepcopy``, pickling) rebind :attr:`lookup` to the copy's own map: a bound
        builtin method is copied as is and would still read the original's."""
        self.__dict__.update(state)
        self.lookup = self._block_of.get

    @property
    def num_evictable(self) -> int:
        return len(self._evictable)

    @property
    def num_cached(self) -> int:
        return len(self._block_of) + self.policy._num_pending

    def insert(self, block_hash, parent_hash, block_id: int, now: float) -> bool:
        if self._block_of.setdefault(block_hash, block_id) != block_id:
            return False
        self._hash_of[block_id] = block_hash
        return True

    def insert_blocks(self, entries: list[tuple], now: float) -> list[int]:
        """Register ``(hash, parent hash, block)`` entries in order; returns the registered blocks
        (an identity cached already, or met earlier in ``entries``, leaves its block private)."""
        setdefault, hash_of = self._block_of.setdefault, self._hash_of
        done = []
        for block_hash, _, block_id in entries:
            if setdefault(block_hash, block_id) == block_id:
                hash_of[block_id] = block_hash
                done.append(block_id)
        return done

    def on_hit(self, block_id: int, now: float) -> None:
        """HashLRU ignores hits (its order is release order)."""

    def on_release(self, block_id: int, now: float) -> None:
        self._evictable[block_id] = None

    def on_release_blocks(self, blocks: list[int], now: float) -> None:
        evictable = self._evictable
        for block in blocks:
            evictable[block] = None

    def on_acquire(self, block_id: int) -> None:
        del self._evictable[block_id]

    def evict(self) -> Optional[int]:
        blocks = self.evict_blocks(1)
        return blocks[0] if blocks else None

    def evict_blocks(self, n: int) -> list[int]:
        """The ``n`` blocks released longest ago (all of them if fewer are evictable), forgotten
        (a pending block, registered without an identity, leaves only the pending count)."""
        evictable, hash_of, block_of = self._evictable, self._hash_of, self._block_of
        blocks = []
        pop = evictable.popitem
        for _ in range(min(n, len(evictable))):
            block, _ = pop(False)   # the oldest
            block_hash = hash_of.pop(block, None)
            if block_hash is None:
                self.policy._num_pending -= 1
            else:
                del block_of[block_hash]
            blocks.append(block)
        return blocks


def guard_prefix_cache(policy, timer: PolicyTimer,
                       on_error: Callable[[str, Exception], object]) -> Union[GuardedPrefixCache, PooledHashLRU]:
    """What the block pool talks to for ``policy``: :class:`PooledHashLRU` for a plain ``hash_lru``
    (HashLRU itself, or a subclass that overrides none of its methods), else a
    :class:`GuardedPrefixCache` checking every answer."""
    from kvrl.plugins.prefix_caches import HashLRU
    cls = type(policy)
    if isinstance(policy, HashLRU) and all(getattr(cls, name) is getattr(HashLRU, name) for name in _HASH_LRU_API):
        return PooledHashLRU(policy)
    return GuardedPrefixCache(policy, timer, on_error)
