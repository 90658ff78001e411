"""Prefix matching and block identities of the paged pool (:class:`PrefixIdentityMixin`, a base of
:class:`kvrl.engine.paged_allocator.PagedAllocator`, whose attributes it reads: ``block_size``,
``prefix_cache``, ``ref_counts`` and the private ``_hasher``, ``_width``, ``_salt``, ``_checked``,
``_lazy``, ``_lru``, ``_families``, ``_identity``, ``_reclaim_log`` and ``keeps_peeks``).

Lazy registration (a plain ``hash_lru`` run by the pool with a checked hash, the default): a full block
is registered without computing its identity while its *family* (the blocks of the chains that start
with the same first-block identity) has one owner sequence that registers blocks in order. Such a
block is cached (it is released to the evictable order and reclaimed from there like any other), but
it has no entry in the identity maps yet: only a lookup can tell that it is there, and a lookup of any
identity of a family begins with the family's first block, so :meth:`PrefixIdentityMixin.match_prefix`
names every pending block of that family (in registration order) before it looks up anything, and
from then on the family registers eagerly. So does a family as soon as a second sequence registers in
it, or its owner registers a block index again (after a swap-in). Every lookup, registration, cached
flag and count is what eager registration gives, since identities of different families never equal
one another (as far as the hash is collision resistant) and a pending family holds no identity twice;
what is saved is hashing and the identity maps for the blocks of prompts that no one else shares
(nearly all of them in an offline batch of distinct prompts).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from kvrl.engine.request import Sequence


@dataclass(eq=False, slots=True)
class PrefixFamily:
    """The lazily registered blocks of one family (see the module doc): ``blocks[j]`` is the block
    at index ``first + j`` of ``owner``'s table when ``owner`` registered it, or None once the family
    registers eagerly. Such a block is still pending while its identity record is this family
    object (set at registration, cleared when the block is reclaimed)."""

    owner: Sequence
    first: int
    blocks: Optional[list[int]]


class ReclaimLog(list):
    """The cached blocks the pool reclaimed, oldest first: a list, which the pool appends to (and extends)
    where it reclaims a cached block. At most ``cap`` are kept: past that the older half is dropped and
    counted in ``base``, so a peek kept from before the cut is matched again (:meth:`PrefixIdentityMixin.peek_cached_tokens`)."""

    __slots__ = ("base", "cap")

    def __init__(self, cap: int) -> None:
        super().__init__()
        self.base = 0          # blocks dropped from the front
        self.cap = cap

    @property
    def end(self) -> int:
        """Blocks logged so far, the dropped ones included: where the log stands."""
        return self.base + len(self)

    def since(self, position: int) -> Optional[list]:
        """The blocks logged since ``position`` (an earlier :attr:`end`), or None if some were dropped."""
        return self[position - self.base:] if position >= self.base else None

    def append(self, block: int) -> None:
        super().append(block)
        if len(self) > self.cap:
            self._trim()

    def __iadd__(self, blocks):
        super().__iadd__(blocks)
        if len(self) > self.cap:
            self._trim()
        return self

    def _trim(self) -> None:
        cut = len(self) // 2
        del self[:cut]
        self.base += cut


@dataclass
class PrefixMatch:
    """Cached full blocks found for a sequence that is about to be (re)admitted."""

    block_ids: list[int] = field(default_factory=list)
    num_evictable: int = 0  # of those, blocks with reference count 0 (they leave the free pool)
    check_failed: bool = False  # the next block's identity was cached but its tokens/salt/parent differ

    def num_tokens(self, block_size: int) -> int:
        return len(self.block_ids) * block_size


class PrefixIdentityMixin:
    """Matching a sequence's tokens against cached blocks, and the identities registered blocks
    are checked against (the module doc; :class:`~kvrl.engine.paged_allocator.PagedAllocator`)."""

    def _ensure_hashes(self, seq: Sequence, num_full_blocks: int) -> None:
        hashes = seq.block_hashes
        done = len(hashes)
        if done < num_full_blocks:     # only the new blocks' tokens (a long history is not re-read per block)
            bs = self.block_size
            data = seq.token_bytes(done * bs, num_full_blocks * bs, self._width)
            if done and num_full_blocks - done == 1:    # one more block, as a decode fills them
                hashes.append(self._hasher.chain(hashes[-1], data))
                return
            self._hasher.extend(hashes, data, bs, num_full_blocks, None if done else self._salt(seq), offset=done * bs)

    def match_prefix(self, seq: Sequence) -> PrefixMatch:
        """Longest run of cached full blocks for ``seq``'s tokens, leaving >= 1 token to compute.

        With a checked hash, each block found by identity must also have been registered with
        ``seq``'s parent identity, token ids and salt; the first that was not ends the match
        (``check_failed``), as a miss would."""
        match = PrefixMatch()
        if not self.prefix_cache.enabled:
            return match
        bs = self.block_size
        max_blocks = (seq.num_tokens - 1) // bs
        if self._lazy and max_blocks:      # the family's pending blocks are named first (module doc)
            self._ensure_hashes(seq, 1)
            family = self._families.get(seq.block_hashes[0])
            if family is None:             # nothing of this family is cached: a miss, no more hashing
                return match
            if family.blocks is not None:
                self._name_family(family)
        return self._match_from(seq, 0, max_blocks, match)

    def _match_from(self, seq: Sequence, start: int, max_blocks: int, match: PrefixMatch) -> PrefixMatch:
        """:meth:`match_prefix`'s lookups and checks from block ``start`` on (at most ``max_blocks``
        in all), the blocks found appended to ``match``: the whole match from 0; from a later block,
        its rest where the blocks before ``start`` are known to be cached (:meth:`peek_cached_tokens`)."""
        bs = self.block_size
        self._ensure_hashes(seq, max_blocks)
        lookup = self.prefix_cache.lookup
        hashes = seq.block_hashes
        data = salt = None
        width = bs * self._width
        for i in range(start, max_blocks):
            block = lookup(hashes[i])
            if block is None:
                break
            if self._checked:
                if data is None:
                    data = seq.token_bytes(0, max_blocks * bs, self._width)
                    salt = self._salt(seq)
                parent, tokens, block_salt = self._registered_identity(block)
                if (parent != (hashes[i - 1] if i else None) or block_salt != salt
                        or tokens != data[i * width:(i + 1) * width]):
                    match.check_failed = True
                    break
            match.block_ids.append(block)
            if self.ref_counts[block] == 0:
                match.num_evictable += 1
        return match

    def _family_of(self, seq: Sequence, first: int) -> Optional[PrefixFamily]:
        """The family in which ``seq`` registers its blocks from index ``first`` on lazily, or None
        if they must be registered eagerly (the family turns eager here if ``seq`` is not its owner
        or registers an index again). Kept on ``seq`` (:attr:`Sequence.prefix_family`) until it is
        freed: a sequence's family never changes."""
        family = seq.prefix_family
        if family is None:
            hashes = seq.block_hashes
            if not hashes:
                self._ensure_hashes(seq, 1)
            key = hashes[0]
            family = self._families.get(key)
            if family is None:
                family = self._families[key] = PrefixFamily(seq, first, [])
            seq.prefix_family = family
        if family.blocks is None:
            return None
        if family.owner is seq and first == family.first + len(family.blocks):
            return family
        self._name_family(family)
        return None

    def _name_family(self, family: PrefixFamily) -> None:
        """Register the identities of ``family``'s pending blocks, in their registration order, and
        make the family eager. No identity of a pending family is in the maps (only an eager
        registration in the family could have put one there), and its owner registered each block
        index once, so every one of them is new."""
        owner, first, blocks, identity = family.owner, family.first, family.blocks, self._identity
        family.blocks = None
        pending = [j for j, block in enumerate(blocks) if identity[block] is family]
        if not pending:
            return
        self._ensure_hashes(owner, first + pending[-1] + 1)
        hashes, (block_of, hash_of, _) = owner.block_hashes, self._lru
        for j in pending:
            block, block_hash = blocks[j], hashes[first + j]
            if block_of.setdefault(block_hash, block) != block:
                raise AssertionError(f"block {block}: a pending identity was cached already")
            hash_of[block] = block_hash
            identity[block] = (owner, first + j)
        self.prefix_cache.num_pending -= len(pending)

    def _registered_identity(self, block: int) -> tuple:
        """(parent identity, token bytes, salt) that cached ``block`` was registered with.
        Registration records only a reference to the registering sequence (its tokens up to the
        block never change); the bytes are taken once, at the block's first check."""
        record = self._identity[block]
        if type(record[1]) is int:
            src, i = record
            bs = self.block_size
            record = (src.block_hashes[i - 1] if i else None, src.token_bytes(i * bs, (i + 1) * bs, self._width),
                      self._salt(src))
            self._identity[block] = record
        return record

    def peek_cached_tokens(self, seq: Sequence) -> int:
        """Prompt tokens :meth:`match_prefix` would find cached for ``seq`` now, without the match.

        Asked for every waiting request at every step by a prefix-aware scheduler (``lpm``), so on the
        pool's own hash_lru the answer is kept on the sequence (:attr:`Sequence.prefix_peek`: where the
        reclaim log stood, and the blocks found, in a set) and, while none of those blocks has been
        reclaimed since (:class:`ReclaimLog`), only the blocks after them are looked up: a cached block
        keeps the identity it was found with until it is reclaimed, and registrations only add blocks, so
        the leading blocks found then are found now. The same count as a whole match
        (tests/test_prefix_peek.py), at one lookup per waiting request and step plus one set test per
        block reclaimed since its last peek, instead of a lookup and an identity check per cached block
        (docs/fidelity.md, "Runs 68-69": 1-3 ms a step with 64-128 requests waiting on 1-3k-token system
        prompts, live)."""
        bs = self.block_size
        if self._lru is None or not self.keeps_peeks:    # another prefix cache, or tiers: a whole match
            return self.match_prefix(seq).num_tokens(bs)
        log = self._reclaim_log
        max_blocks = (seq.num_tokens - 1) // bs
        kept = seq.prefix_peek
        reclaimed = log.since(kept[0]) if kept is not None and kept[1] == max_blocks else None
        if reclaimed is not None and kept[2].isdisjoint(reclaimed):
            blocks = kept[2]              # the leading blocks of one chain: distinct, so their count is the match
            blocks.update(self._match_from(seq, len(blocks), max_blocks, PrefixMatch()).block_ids)
        else:
            blocks = set(self.match_prefix(seq).block_ids)
            if not blocks:                # nothing to keep: the next peek matches again (a miss is cheap)
                seq.prefix_peek = None
                return 0
        seq.prefix_peek = (log.end, max_blocks, blocks)
        return len(blocks) * bs
