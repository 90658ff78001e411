"""The paged block pool's invariants, asserted by the tests (fuzzing, property tests) through
:meth:`PagedAllocator.check_invariants <kvrl.engine.paged_allocator.PagedAllocator.check_invariants>`:
kept apart from the pool's hot paths so that its module stays small."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:    # the pool imports this module
    from kvrl.engine.paged_allocator import PagedAllocator
    from kvrl.engine.request import Sequence


def check_paged_pool(pool: "PagedAllocator", live_seqs: "list[Sequence]") -> None:
    """Assert ``pool``'s invariants given every sequence that may hold blocks: reference counts
    equal block-table references, free and evictable blocks are exactly the unused ones (none
    lost, none twice), identity records exist for exactly the cached blocks (checked hashes), a
    cached block without an identity in the maps is a listed pending block (lazy registration), the
    used-block and stored-token counters match (a partial block counted as its sequence's computed
    tokens, its entry may lag), and CPU blocks are held once or free."""
    refs = [0] * pool.num_blocks
    for seq in live_seqs:
        for block in seq.block_table:
            refs[block] += 1
    assert refs == pool.ref_counts, "reference counts differ from block-table references"
    free = set(pool._free)
    assert len(free) == len(pool._free), "a block is on the free list twice"
    for block in free:
        assert pool.ref_counts[block] == 0 and not pool._cached[block], f"free block {block} is in use or cached"
    evictable = sum(1 for b in range(pool.num_blocks) if pool._cached[b] and pool.ref_counts[b] == 0)
    assert evictable == pool.prefix_cache.num_evictable, "evictable count mismatch"
    if pool._checked:
        for b in range(pool.num_blocks):
            assert (pool._identity[b] is not None) == pool._cached[b], f"block {b}: identity record drift"
    if pool._lazy:    # a cached block without an identity is listed in its owner's pending family
        hash_of = pool._lru[1]
        pending = [b for b in range(pool.num_blocks) if pool._cached[b] and b not in hash_of]
        assert len(pending) == pool.prefix_cache.num_pending, "pending-block count drifted"
        for b in pending:
            family = pool._identity[b]
            assert pool._families.get(family.owner.block_hashes[0]) is family and family.blocks is not None, \
                f"block {b}: no pending family"
            j = family.blocks.index(b)
            owner = family.owner
            assert not owner.block_table or owner.block_table[family.first + j] == b, \
                f"block {b}: not where its family lists it"
    used = sum(1 for r in pool.ref_counts if r > 0)
    assert used == pool._num_used, "used-block counter drifted"
    assert used + len(free) + evictable == pool.num_blocks, "blocks leaked"
    fill = list(pool._fill)       # with each sequence's partial block settled (its entry may lag)
    if pool.exact_tail_fill:
        for seq in live_seqs:
            tail = seq.num_computed % pool.block_size
            if tail and seq.block_table:
                fill[seq.block_table[seq.num_computed // pool.block_size]] = tail
    assert pool._tokens_in_use == sum(fill[b] for b in range(pool.num_blocks) if pool.ref_counts[b] > 0), \
        "stored-token counter drifted"
    cpu_held = [b for seq in live_seqs for b in seq.cpu_block_table]
    assert len(set(cpu_held)) == len(cpu_held) and not set(cpu_held) & set(pool._cpu_free)
    assert len(cpu_held) + len(pool._cpu_free) == pool.num_cpu_blocks, "CPU blocks leaked"
