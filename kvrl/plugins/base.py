"""Contracts of the four policy kinds.

Every policy gets a validated ``params`` dataclass at construction and, once the engine is built,
a read-only :class:`~kvrl.engine.views.EngineView` through :meth:`Policy.bind`. Policies never
mutate engine state: they return decisions, and the engine carries them out.

The methods each kind must implement are abstract (:mod:`abc`): a plugin that lacks one, or
misspells it, cannot be instantiated, so ``kvrl.plugins.create`` fails naming it before any run.
"""
from __future__ import annotations

import abc
import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Sequence

if TYPE_CHECKING:
    from kvrl.engine.views import EngineView, SeqView


def check_range(name: str, value: float, lo: Optional[float] = None, hi: Optional[float] = None,
                hi_inclusive: bool = True) -> None:
    """Raise ``ValueError`` naming ``name`` unless ``lo <= value <= hi`` (or ``< hi``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise ValueError(f"{name} must be a number, got {value!r}")
    if lo is not None and value < lo:
        raise ValueError(f"{name} must be >= {lo}, got {value}")
    if hi is not None and (value > hi or (not hi_inclusive and value >= hi)):
        raise ValueError(f"{name} must be {'<=' if hi_inclusive else '<'} {hi}, got {value}")


def check_choice(name: str, value: Any, choices: Sequence[Any]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")


class Policy(abc.ABC):
    """Base of all plugins: parameters, the engine view, and optional event hooks.

    The engine calls the hooks a plugin overrides, of every kind (scheduler, watermark, eviction,
    prefix cache, tier); a hook that raises is a policy error and its event is dropped."""

    plugin_kind: str = ""
    plugin_name: str = ""

    def __init__(self, params: Any) -> None:
        self.params = params
        self.engine: Optional["EngineView"] = None

    def bind(self, engine: "EngineView") -> None:
        """Called once when the engine is built; ``engine`` stays valid and live for the run."""
        self.engine = engine

    def on_step_end(self) -> None:
        """Called after every engine step."""

    def on_finish(self, seq: "SeqView") -> None:
        """Called when a sequence finishes (not when it is aborted)."""

    def on_preempt(self, seq: "SeqView", mode: "PreemptionMode") -> None:
        """Called after a sequence was preempted."""


class SchedulerPolicy(Policy):
    """Orders the waiting queue; the engine admits in that order while budget and watermark allow.

    Requests preempted by recompute always go ahead of new arrivals, in the order they were
    preempted; the policy orders the rest by ascending :meth:`key`. With ``static_key = True``
    (a waiting sequence's key never changes while it waits) the engine keeps the queue sorted
    incrementally instead of sorting it every step; dynamic policies set it to False.
    """

    static_key: bool = True

    @abc.abstractmethod
    def key(self, seq: "SeqView") -> Any:
        """Sort key of a waiting sequence (ascending = admitted first); keys must be comparable."""

    def order(self, waiting: list["SeqView"]) -> list["SeqView"]:
        return sorted(waiting, key=self.key)


class WatermarkPolicy(Policy):
    """Decides how many free blocks must remain after an admission (or a swap-in).

    The engine admits a request needing ``b`` blocks only if ``num_free_blocks - b >=
    reserved_blocks()``; with nothing running, admission ignores the watermark so the engine
    cannot stall.
    """

    @abc.abstractmethod
    def reserved_blocks(self) -> int:
        """Free blocks to keep: an integer in ``[0, num_blocks]`` (anything else is a policy error)."""

    def on_take_over(self) -> None:
        """Called when an agent hands the watermark to this policy as one of its rules (``env.action.rules``,
        :class:`~kvrl.plugins.agent.AgentWatermark`), before it answers for the engine: a rule that acts
        beyond the watermark while it is in force (the ``ordered`` rule sets the admission order) acts
        here. Default: nothing."""

    @property
    def vetoes(self) -> bool:
        """Whether :meth:`admit` may refuse a request now; the engine asks :meth:`admit` only when it
        may (no view built, no call timed). Default: whether the class overrides :meth:`admit`. A
        policy that delegates :meth:`admit` to another answers for the one it delegates to."""
        return type(self).admit is not WatermarkPolicy.admit

    def admit(self, seq: "SeqView", blocks_needed: int) -> bool:
        """Per-request admission veto, asked before the reservation rule (default: admit).

        Returning False skips this request for the current step and lets the engine consider the
        next one (unlike the reservation rule, which stops admission for the step), so a policy
        can hold back one tenant (quotas, fair shares) without blocking the others.
        """
        return True


class PreemptionMode(str, enum.Enum):
    SWAP = "swap"            # copy the victim's blocks to the CPU pool, copy back later
    RECOMPUTE = "recompute"  # drop the victim's blocks and redo its prefill later


@dataclass(frozen=True)
class EvictionDecision:
    seq_id: int
    mode: PreemptionMode


class EvictionPolicy(Policy):
    """Picks a victim and a mode when a running sequence needs a block and none is free.

    ``candidates`` are the running sequences not yet scheduled in this step, always including
    the sequence that needs the block. If ``mode`` is swap and the CPU pool lacks room, the engine
    falls back to recompute.
    """

    @abc.abstractmethod
    def select(self, candidates: list["SeqView"]) -> EvictionDecision:
        """The victim (one of ``candidates``, by ``seq_id``) and the preemption mode."""


class PrefixCachePolicy(Policy):
    """Matches full blocks by chained hash and decides which freed cached blocks to reclaim first.

    The block pool owns reference counts and the free list; this policy owns the map from block
    hash to block id and the reclaim order of evictable blocks (cached, reference count 0).
    Contract: a block id returned by :meth:`evict` must be evictable, and is forgotten by the
    policy (its hash no longer matches).

    Isolation contract (issue #14): ``block_hash`` is an opaque block identity (bytes or int,
    :mod:`kvrl.engine.hashing`): a keyed, collision-resistant chain over (parent identity, the
    block's token ids, a salt of tenant and ``cache_salt``) by default. A policy only maps
    identities to blocks; it must not decide a hit by anything else, and must not order anything
    by identity values (they are random per engine). Every block it returns from :meth:`lookup`
    is checked by the allocator against the request's parent, tokens and salt before it is
    shared, and this lookup-and-check is the only way KV is shared by identity: hash and radix
    caches, copy-on-write forks (which share a parent's own blocks) and the swap pool (whose
    blocks re-enter the cache only by :meth:`insert` from their own sequence) all go through it,
    and so must any tier added later.

    Bulk calls: the block pool registers a sequence's new full blocks, releases a finished
    sequence's blocks and reclaims blocks for an allocation through :meth:`insert_blocks`,
    :meth:`on_release_blocks` and :meth:`evict_blocks`, one call per batch of blocks (a long trace
    moves about a million blocks through each). Their defaults call the per-block methods in
    order, so a policy that implements only those behaves as it would block by block. A policy
    may override a bulk method for speed and must then give the same answers and leave the same
    state as the per-block calls would. A bulk call that raises (or answers outside its contract)
    is one policy error, and none of its answers is used: no block of it is registered, and an
    eviction's blocks come from the fallback order (see :mod:`kvrl.engine.guards`). A bulk method
    stands for the per-block method of its own class: a subclass that overrides ``insert``,
    ``on_release`` or ``evict`` but not the matching bulk method gets the default bulk method
    (the loop over its own per-block one), so subclassing a built-in never bypasses an override.
    """

    enabled: bool = True
    _BULK_OF = {"insert": "insert_blocks", "on_release": "on_release_blocks", "evict": "evict_blocks"}

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        for single, bulk in PrefixCachePolicy._BULK_OF.items():
            if single in vars(cls) and bulk not in vars(cls):
                setattr(cls, bulk, getattr(PrefixCachePolicy, bulk))

    @abc.abstractmethod
    def lookup(self, block_hash: int) -> Optional[int]:
        """Block id holding ``block_hash``, or None."""

    @abc.abstractmethod
    def insert(self, block_hash: int, parent_hash: Optional[int], block_id: int, now: float) -> bool:
        """Register a newly filled block; False if the hash is already cached (the block stays private)."""

    def on_hit(self, block_id: int, now: float) -> None:
        """A lookup result is being reused by a sequence."""

    @abc.abstractmethod
    def on_release(self, block_id: int, now: float) -> None:
        """A cached block's reference count dropped to zero: it becomes evictable."""

    @abc.abstractmethod
    def on_acquire(self, block_id: int) -> None:
        """An evictable cached block is referenced again: it stops being evictable."""

    @abc.abstractmethod
    def evict(self) -> Optional[int]:
        """Forget and return one evictable block chosen by the policy, or None if there is none."""

    def insert_blocks(self, entries: list[tuple], now: float) -> list[bool]:
        """:meth:`insert` of each ``(block_hash, parent_hash, block_id)`` of ``entries`` in order;
        returns its answer per entry (True: registered)."""
        insert = self.insert
        return [insert(block_hash, parent_hash, block_id, now) for block_hash, parent_hash, block_id in entries]

    def on_release_blocks(self, block_ids: list[int], now: float) -> None:
        """:meth:`on_release` of each of ``block_ids`` in order."""
        for block_id in block_ids:
            self.on_release(block_id, now)

    def evict_blocks(self, n: int) -> list[int]:
        """Up to ``n`` calls of :meth:`evict`, stopping at the first None: the blocks reclaimed, in
        order (fewer than ``n`` only when no evictable block is left)."""
        blocks = []
        for _ in range(n):
            block = self.evict()
            if block is None:
                break
            blocks.append(block)
        return blocks

    @property
    @abc.abstractmethod
    def num_evictable(self) -> int:
        """Cached blocks with reference count 0."""

    @property
    @abc.abstractmethod
    def num_cached(self) -> int:
        """Blocks registered in the cache."""
