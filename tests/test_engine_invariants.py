"""Property tests of the engine's invariants (docs/design.md §2) over random operation sequences."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvrl.engine.request import SeqStatus
from tests.helpers import make_engine, make_request

PREFIX_CACHES = ["none", "hash_lru", "hash_lfu", "radix_lru"]
EVICTIONS = ["lifo", "fewest_computed", "most_blocks", "priority", "cost_aware"]

ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(1, 40), st.integers(1, 12), st.integers(1, 3), st.integers(0, 3)),
        st.tuples(st.just("step"), st.integers(1, 4)),
        st.tuples(st.just("preempt"), st.sampled_from(["swap", "recompute"])),
        st.tuples(st.just("abort"), st.integers(0, 50)),
    ),
    min_size=1, max_size=40)


def _shared_prompt(rng, group, length):
    base = np.random.default_rng(group).integers(0, 50, 64, dtype=np.int32)   # shared prefixes
    tail = rng.integers(0, 50, 64, dtype=np.int32)
    return np.concatenate([base[: length // 2], tail[: length - length // 2]])


def _preempt_one(engine, mode):
    """Force a preemption from outside the scheduler, through the engine's own path."""
    if engine.running:
        engine.preempt(engine.running[-1].seq_id, mode)   # a swap-out runs on the executor at once


@pytest.mark.parametrize("prefix_cache", PREFIX_CACHES)
@pytest.mark.parametrize("eviction", EVICTIONS)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops, mode=st.sampled_from(["recompute", "swap", "auto"]), seed=st.integers(0, 2**16))
def test_invariants_hold_under_random_operations(prefix_cache, eviction, ops, mode, seed):
    params = {} if eviction == "cost_aware" else {"mode": mode}
    engine = make_engine(num_blocks=48, block_size=4, num_cpu_blocks=24, prefix_cache=prefix_cache,
                         eviction=eviction, eviction_params=params, max_num_batched_tokens=32)
    rng = np.random.default_rng(seed)
    added = []
    for op in ops:
        if op[0] == "add":
            _, plen, olen, n, group = op
            rid = f"r{len(added)}"
            engine.submit(make_request(rid, tokens=_shared_prompt(rng, group, plen), output_len=olen, n=n,
                                       arrival_s=engine.now, priority=int(rng.integers(0, 3))))
            added.append((rid, olen, n))
        elif op[0] == "step":
            for _ in range(op[1]):
                if engine.has_unfinished:
                    engine.step()
        elif op[0] == "preempt":
            _preempt_one(engine, op[1])
        elif op[0] == "abort" and added:
            rid = added[op[1] % len(added)][0]
            if engine.is_open(rid):
                engine.abort(rid, "aborted by test")
        engine.check_invariants()
    steps = 0
    while engine.has_unfinished:
        engine.step()
        steps += 1
        assert steps < 5000, "engine did not drain"
    engine.check_invariants()
    # at idle every non-cached block is free
    alloc = engine.allocator
    assert alloc.num_used_blocks == 0
    assert alloc.num_free_blocks == alloc.num_blocks
    assert alloc.num_free_cpu_blocks == alloc.num_cpu_blocks
    # no request lost or duplicated: each finished one produced n * output_len tokens exactly once
    for rid, olen, n in added:
        rec = engine.metrics.requests[rid]
        if rec.error:
            continue
        seqs = engine.sequences(rid)
        assert rec.finish_s is not None, f"request {rid} never finished"
        assert len(seqs) == n
        assert all(s.status is SeqStatus.FINISHED and s.num_output == olen for s in seqs)
        assert rec.output_tokens == n * olen


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16), n=st.integers(2, 4))
def test_contiguous_allocator_invariants(seed, n):
    engine = make_engine(num_blocks=200, block_size=4, prefix_cache="none", allocator="contiguous",
                         contiguous_reserve="pow2", max_model_len=64)
    rng = np.random.default_rng(seed)
    for i in range(12):
        engine.submit(make_request(f"c{i}", int(rng.integers(1, 30)), int(rng.integers(1, 20)), n=1 + (i % n),
                                   seed=i))
    while engine.has_unfinished:
        engine.step()
        engine.check_invariants()
    assert engine.allocator.num_free_blocks == 200
    assert engine.metrics.summary()["finished"] == 12
