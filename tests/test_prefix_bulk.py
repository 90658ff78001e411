"""The prefix-cache policy's bulk calls (issue #14): the block pool registers, releases and
reclaims blocks in batches through ``insert_blocks`` / ``on_release_blocks`` / ``evict_blocks``;
a policy with only the per-block methods gets defaults that loop over them, a subclass's per-block
override is never bypassed, and a bulk answer outside the contract is a contained policy error."""
from __future__ import annotations

import logging

from kvrl import plugins
from kvrl.engine.config import EngineConfig
from kvrl.engine.engine import Engine
from kvrl.executors.hardware import DEVICES, MODEL_SHAPES
from kvrl.executors.sim import SimExecutor
from kvrl.plugins.base import PrefixCachePolicy
from kvrl.plugins.prefix_caches import HashLRU
from tests.helpers import make_request, quiet_kvrl_logs

_quiet = quiet_kvrl_logs(logging.ERROR)


def _engine(prefix_cache, num_blocks=40):
    return Engine(EngineConfig(num_blocks=num_blocks, block_size=4, num_cpu_blocks=0, max_model_len=4096,
                               prefix_cache_scope="global"),
                  SimExecutor(MODEL_SHAPES["qwen3-0.6b"], DEVICES["h200"]), plugins.create("scheduler", "fcfs"),
                  plugins.create("watermark", "fixed", fraction=0.0), plugins.create("eviction", "lifo"),
                  prefix_cache)


def _requests():
    """Shared two-block prefixes and private tails: registrations, hits, releases and (in a small
    pool) reclaims of cached blocks."""
    shared = list(range(1, 9))
    return [make_request(f"r{i}", tokens=shared + [100 + i] * (9 + i % 7), output_len=5 + i % 4,
                         arrival_s=0.2 * i) for i in range(16)]


class PerBlockLRU(PrefixCachePolicy):
    """A third-party LRU with only the per-block methods (no bulk overrides)."""

    def __init__(self, params=None) -> None:
        super().__init__(params)
        self.block_of, self.hash_of, self.free = {}, {}, {}

    def lookup(self, block_hash):
        return self.block_of.get(block_hash)

    def insert(self, block_hash, parent_hash, block_id, now):
        if block_hash in self.block_of:
            return False
        self.block_of[block_hash], self.hash_of[block_id] = block_id, block_hash
        return True

    def on_release(self, block_id, now):
        self.free[block_id] = None

    def on_acquire(self, block_id):
        del self.free[block_id]

    def evict(self):
        if not self.free:
            return None
        block = next(iter(self.free))
        del self.free[block]
        del self.block_of[self.hash_of.pop(block)]
        return block

    num_evictable = property(lambda self: len(self.free))
    num_cached = property(lambda self: len(self.block_of))


def test_the_pool_moves_blocks_in_bulk_calls():
    """Registration is one insert_blocks call per step at most (never insert() per block), and the
    bulk answers are hash_lru's own: the same run as a per-block-only policy of the same order."""
    calls = {"insert_blocks": 0, "evict_blocks": 0, "on_release_blocks": 0, "blocks": 0, "insert": 0}

    class Counting(HashLRU):
        def insert(self, block_hash, parent_hash, block_id, now):
            calls["insert"] += 1
            return super().insert(block_hash, parent_hash, block_id, now)

        def insert_blocks(self, entries, now):
            calls["insert_blocks"] += 1
            calls["blocks"] += len(entries)
            return super().insert_blocks(entries, now)

        def on_release_blocks(self, block_ids, now):
            calls["on_release_blocks"] += 1
            return super().on_release_blocks(block_ids, now)

        def evict_blocks(self, n):
            calls["evict_blocks"] += 1
            return super().evict_blocks(n)

    bulk = _engine(Counting(None))
    summary = bulk.run(_requests())
    bulk.check_invariants()
    assert calls["insert"] == 0 and 0 < calls["insert_blocks"] < calls["blocks"]
    assert calls["insert_blocks"] <= bulk.step_index
    assert calls["evict_blocks"] > 0 and calls["on_release_blocks"] > 0
    per_block = _engine(PerBlockLRU())
    assert per_block.run(_requests()) == summary
    assert summary["prefix_hit_rate"] > 0 and summary["policy_errors"] == 0


def test_a_subclass_override_of_a_per_block_method_is_not_bypassed():
    """HashLRU answers in bulk; a subclass that overrides evict() alone gets the default
    evict_blocks, which calls that override."""
    seen = []

    class Traced(HashLRU):
        def evict(self):
            block = super().evict()
            seen.append(block)
            return block

    assert Traced.evict_blocks is PrefixCachePolicy.evict_blocks
    assert Traced.insert_blocks is HashLRU.insert_blocks
    engine = _engine(Traced(None))
    engine.run(_requests())
    engine.check_invariants()
    assert seen and None not in seen


def test_a_bulk_eviction_outside_the_contract_is_a_contained_policy_error():
    """evict_blocks naming a block twice (one block for two owners) or too few blocks is a policy
    error: the reclaimed blocks come from the fallback order, nothing leaks, nothing is aborted."""
    for answer in ("twice", "short"):
        class Bad(HashLRU):
            def evict_blocks(self, n):
                blocks = super().evict_blocks(n)
                if answer == "twice" and len(blocks) > 1:
                    return [blocks[0]] * len(blocks)
                return blocks[:-1] if answer == "short" else blocks

        engine = _engine(Bad(None), num_blocks=24)
        summary = engine.run(_requests())
        engine.check_invariants()
        assert summary["finished"] == 16 and summary["aborted"] == 0, answer
        assert any(k.startswith("prefix_cache evict_blocks") for k in engine.metrics.policy_error_counts), answer
        assert engine.allocator.num_used_blocks == 0


def test_a_plain_hash_lru_is_run_by_the_pool_with_the_same_answers():
    """The engine runs a plain hash_lru itself on the policy's own maps (PooledHashLRU, no guard
    record beside them); a subclass that overrides any of its methods goes through the guard. Both
    give the same run, leave the same maps, and the policy's own counts stay right. The workload
    has requests that register the same prefix in one step (an identity met twice in one bulk
    insert) and a pool small enough to reclaim cached blocks."""
    from kvrl.engine.guards import GuardedPrefixCache, PooledHashLRU

    class Traced(HashLRU):
        def on_hit(self, block_id, now):
            return super().on_hit(block_id, now)

    shared = list(range(1, 13))
    reqs = lambda: [*_requests(), *[make_request(f"same{i}", tokens=shared + [50 + i] * 3, output_len=4, arrival_s=0.0)
                                    for i in range(3)]]
    plain, traced = HashLRU(None), Traced(None)
    pooled, guarded = _engine(plain, num_blocks=24), _engine(traced, num_blocks=24)
    assert type(pooled.allocator.prefix_cache) is PooledHashLRU
    assert type(guarded.allocator.prefix_cache) is GuardedPrefixCache
    summary = pooled.run(reqs())
    assert guarded.run(reqs()) == summary
    for engine in (pooled, guarded):
        engine.check_invariants()
    assert summary["prefix_hit_rate"] > 0 and summary["policy_errors"] == 0
    assert sorted(plain._block_of.values()) == sorted(traced._block_of.values())     # identities are keyed per engine
    assert sorted(plain._hash_of) == sorted(traced._hash_of)
    assert list(plain._evictable) == list(traced._evictable) and plain.num_evictable > 0
    assert (plain.num_cached, plain.num_evictable) == (pooled.view.num_cached_blocks, pooled.view.num_cached_free_blocks)


def test_a_copied_pooled_hash_lru_looks_up_in_its_own_maps():
    """copy.deepcopy of the pooled hash_lru (the rollout planner copies whole engines) rebinds the
    cached lookup to the copy's map, not the original's."""
    import copy

    from kvrl.engine.guards import PooledHashLRU

    pool = PooledHashLRU(HashLRU(None))
    pool.insert(b"a", None, 7, 0.0)
    twin = copy.deepcopy(pool)
    twin.evict_blocks(0)
    twin.on_release(7, 0.0)
    assert twin.evict_blocks(1) == [7] and twin.lookup(b"a") is None
    assert pool.lookup(b"a") == 7
