"""Engine behaviour: preemption, prefix reuse and tenant scoping, utilization, bad input."""
from __future__ import annotations

from typing import Literal, Optional   # noqa: F401  (annotations of a test plugin's Params)

import numpy as np
import pytest

from kvrl.engine.request import RequestRejected
from kvrl.workloads import build_workload
from tests.helpers import make_engine, make_request


def _long_output_requests(n=24, seed=0):
    rng = np.random.default_rng(seed)
    return [make_request(f"q{i}", int(rng.integers(8, 40)), int(rng.integers(20, 60)), seed=i) for i in range(n)]


def test_preemption_by_swap_and_recompute_completes_every_request():
    # a CPU pool too small for every victim: 'auto' swaps while it has room, recomputes otherwise
    engine = make_engine(num_blocks=40, block_size=4, num_cpu_blocks=20, watermark_params={"fraction": 0.0},
                         eviction_params={"mode": "auto"})
    reqs = _long_output_requests()
    summary = engine.run(reqs)
    assert summary["finished"] == len(reqs)
    assert summary["swapped_out_blocks"] > 0 and summary["swapped_in_blocks"] == summary["swapped_out_blocks"]
    assert summary["recomputed_tokens"] > 0
    assert summary["preemptions"] > 0
    for r in reqs:
        assert engine.metrics.requests[r.request_id].output_tokens == r.output_len
    engine.check_invariants()


@pytest.mark.parametrize("eviction", ["lifo", "fewest_computed", "most_blocks", "priority"])
@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_every_eviction_policy_drains_under_pressure(eviction, mode):
    engine = make_engine(num_blocks=40, block_size=4, num_cpu_blocks=200, eviction=eviction,
                         watermark_params={"fraction": 0.0}, eviction_params={"mode": mode})
    summary = engine.run(_long_output_requests(seed=1))
    assert summary["finished"] == 24 and summary["preemptions"] > 0
    key = "swapped_out_blocks" if mode == "swap" else "recomputed_tokens"
    assert summary[key] > 0


def test_lifo_evicts_newest_admitted():
    engine = make_engine(num_blocks=40, block_size=4, num_cpu_blocks=0, watermark_params={"fraction": 0.0})
    victims = []
    engine._on_preempt.append(lambda seq, mode: victims.append((seq.admit_order, max(
        [s.admit_order for s in engine.running] + [seq.admit_order]))))
    engine.run(_long_output_requests(seed=2))
    assert victims and all(order >= newest for order, newest in victims)


def _system_prompt_workload(tenant_b=False):
    rng = np.random.default_rng(0)
    system = rng.integers(0, 1000, 512, dtype=np.int32)
    reqs = []
    for i in range(40):
        tokens = np.concatenate([system, rng.integers(0, 1000, 16, dtype=np.int32)])
        tenant = "b" if tenant_b and i % 2 else "a"
        reqs.append(make_request(f"s{i}", tokens=tokens, output_len=8, arrival_s=i * 0.05, tenant=tenant))
    return reqs


@pytest.mark.parametrize("prefix_cache", ["hash_lru", "radix_lru", "hash_lfu"])
def test_shared_system_prompt_hits_the_prefix_cache(prefix_cache):
    engine = make_engine(num_blocks=400, block_size=16, prefix_cache=prefix_cache)
    summary = engine.run(_system_prompt_workload())
    assert summary["prefix_hit_rate"] > 0.9


def test_no_prefix_cache_means_no_hits():
    engine = make_engine(num_blocks=400, block_size=16, prefix_cache="none")
    assert engine.run(_system_prompt_workload())["prefix_hit_rate"] == 0.0


@pytest.mark.parametrize("prefix_cache", ["hash_lru", "radix_lru"])
def test_other_tenant_gets_no_hits_on_first_tenants_blocks(prefix_cache):
    engine = make_engine(num_blocks=400, block_size=16, prefix_cache=prefix_cache)
    engine.run(_system_prompt_workload(tenant_b=True))
    first_b = min((s for g in engine._groups.values() for s in g.seqs if s.request.tenant == "b"),
                  key=lambda s: s.request.arrival_s)
    assert first_b.num_cached_prompt_tokens == 0      # tenant a's system prompt is not visible to b
    later_b = [s for g in engine._groups.values() for s in g.seqs if s.request.tenant == "b" and s is not first_b]
    assert all(s.num_cached_prompt_tokens >= 512 for s in later_b)   # b hits its own blocks


def test_global_scope_shares_across_tenants():
    engine = make_engine(num_blocks=400, block_size=16, prefix_cache="hash_lru", prefix_cache_scope="global")
    engine.run(_system_prompt_workload(tenant_b=True))
    b_seqs = [s for g in engine._groups.values() for s in g.seqs if s.request.tenant == "b"]
    assert all(s.num_cached_prompt_tokens >= 512 for s in b_seqs)


def test_parallel_sampling_shares_prompt_blocks_copy_on_write():
    engine = make_engine(num_blocks=64, block_size=4, prefix_cache="none")
    engine.submit(make_request("p", 10, 6, n=3))
    engine.step()                          # prefill (10 tokens) and fork into 3 sequences
    seqs = engine._groups["p"].seqs
    assert len(seqs) == 3
    assert all(s.block_table == seqs[0].block_table for s in seqs)       # shared, ref count 3
    assert engine.allocator.ref_counts[seqs[0].block_table[0]] == 3
    batch = engine.step()                  # every fork writes into the shared partial block
    assert len(batch.copies) == 2          # two copies; the last holder writes in place
    last = {s.block_table[2] for s in seqs}
    assert len(last) == 3 and {s.block_table[0] for s in seqs} == {seqs[0].block_table[0]}
    while engine.has_unfinished:
        engine.step()
    assert engine.metrics.requests["p"].output_tokens == 18
    engine.check_invariants()


def test_kv_utilization_paged_vs_contiguous_on_azure_trace():
    reqs = build_workload({"name": "azure_code", "max_requests": 300}, vocab_size=151936)
    paged = make_engine(num_blocks=0, block_size=16, max_model_len=8192).run(reqs)
    contiguous = make_engine(num_blocks=0, block_size=16, prefix_cache="none", allocator="contiguous",
                             max_model_len=8192).run(reqs)
    assert paged["finished"] == contiguous["finished"] == 300
    assert paged["kv_utilization"] >= 0.96
    assert contiguous["kv_utilization"] < 0.5


def test_too_long_prompt_is_rejected_and_the_rest_run():
    engine = make_engine(num_blocks=64, block_size=4, max_model_len=50)
    reqs = [make_request("ok1", 10, 5), make_request("long", 60, 5), make_request("ok2", 10, 5, arrival_s=0.1)]
    summary = engine.run(reqs)
    assert summary["finished"] == 2 and summary["rejected"] == 1
    rid, reason = engine.metrics.rejected[0]
    assert rid == "long" and "max_model_len=50" in reason


def test_request_larger_than_the_pool_is_rejected_with_advice():
    engine = make_engine(num_blocks=8, block_size=4)
    with pytest.raises(RequestRejected, match="engine.num_blocks=8"):
        engine.add_request(make_request("big", 40, 10))
    assert engine.run([make_request("small", 8, 4)])["finished"] == 1


@pytest.mark.parametrize("field,value,msg", [
    ("output_len", -3, "output_len must be an integer >= 1"),
    ("output_len", 2.5, "output_len must be an integer >= 1"),
    ("n", 0, "n must be an integer >= 1"),
])
def test_malformed_requests_are_rejected(field, value, msg):
    engine = make_engine()
    kwargs = {"output_len": 4, field: value}
    req = make_request("bad", 8, **kwargs)
    with pytest.raises(RequestRejected, match=msg):
        engine.add_request(req)


def test_token_outside_vocabulary_is_rejected():
    engine = make_engine()
    with pytest.raises(RequestRejected, match="outside the model's vocabulary"):
        engine.add_request(make_request("v", tokens=[1, 2, 10**7], output_len=2))


def test_full_azure_trace_simulates():
    reqs = build_workload({"name": "azure_code"}, vocab_size=151936)
    assert len(reqs) == 8819
    summary = make_engine(num_blocks=0, block_size=16, prefix_cache="none", max_model_len=16384).run(reqs)
    assert summary["finished"] + summary["rejected"] == 8819 and summary["finished"] > 8700


class _Flaky:
    """Wraps a policy method to raise on selected calls."""

    def __init__(self, fn, fail_on):
        self.fn, self.fail_on, self.calls = fn, fail_on, 0

    def __call__(self, *args):
        self.calls += 1
        if self.calls in self.fail_on:
            raise RuntimeError("injected plugin crash")
        return self.fn(*args)


def test_eviction_plugin_crash_aborts_only_the_affected_request():
    engine = make_engine(num_blocks=40, block_size=4, num_cpu_blocks=0, watermark_params={"fraction": 0.0})
    engine.eviction.select = _Flaky(engine.eviction.select, fail_on={2})
    reqs = _long_output_requests(seed=3)
    summary = engine.run(reqs)
    assert summary["policy_errors"] == 1 and summary["aborted"] == 1
    assert summary["finished"] == len(reqs) - 1
    aborted = [r for r in engine.metrics.requests.values() if r.error]
    assert "eviction policy failed: RuntimeError: injected plugin crash" in aborted[0].error
    engine.check_invariants()
    assert engine.allocator.num_used_blocks == 0


def test_watermark_and_scheduler_crashes_fall_back_and_lose_nothing():
    engine = make_engine(num_blocks=60, block_size=4, scheduler="lpm", prefix_cache="hash_lru")
    engine.watermark.reserved_blocks = _Flaky(engine.watermark.reserved_blocks, fail_on={1, 5, 9})
    engine.scheduler.order = _Flaky(engine.scheduler.order, fail_on={2, 3})
    reqs = _long_output_requests(seed=4)
    summary = engine.run(reqs)
    assert summary["finished"] == len(reqs) and summary["policy_errors"] == 5
    engine.check_invariants()


def test_policy_errors_raise_mode_stops_the_run():
    from kvrl.engine.engine import PolicyError
    engine = make_engine(num_blocks=40, block_size=4, watermark_params={"fraction": 0.0}, policy_errors="raise")
    engine.eviction.select = _Flaky(engine.eviction.select, fail_on={1})
    with pytest.raises(PolicyError, match="injected plugin crash"):
        engine.run(_long_output_requests(seed=3))


def test_run_pauses_the_garbage_collector_for_its_duration_only():
    """Engine.run freezes the objects alive at its start and turns automatic collections off (so no
    full collection walks a live executor's model and graphs mid-run), and undoes both at the end;
    with pause_gc=false it leaves gc alone; when something else froze objects, it keeps their freeze."""
    import gc

    def run(**kw) -> list[tuple[int, bool]]:
        eng = make_engine(**kw)
        seen, execute = [], eng.executor.execute
        eng.executor.execute = lambda batch: (seen.append((gc.get_freeze_count(), gc.isenabled())), execute(batch))[1]
        eng.run([make_request(f"r{i}", prompt_len=8 + i, output_len=3, arrival_s=0.01 * i) for i in range(4)])
        return seen

    assert gc.get_freeze_count() == 0 and gc.isenabled()
    seen = run()
    assert seen and all(n > 0 and not on for n, on in seen)
    assert gc.get_freeze_count() == 0 and gc.isenabled()
    assert all(n == 0 and on for n, on in run(pause_gc=False))
    gc.freeze()
    try:
        assert all(n > 0 and not on for n, on in run())    # someone else's freeze: only collections paused
        assert gc.get_freeze_count() > 0 and gc.isenabled()  # and their freeze kept
    finally:
        gc.unfreeze()
    with pytest.raises(ValueError, match="engine.pause_gc must be true or false"):
        make_engine(pause_gc="yes")


def test_the_garbage_of_earlier_runs_is_collected_in_a_process_serving_many():
    """Each run freezes what is alive at its start, garbage of the runs before it included: without the full
    collection a run makes when the heap has grown by a quarter (loop._freeze_heap), dropped engines (cyclic
    garbage) piled up run after run, a few MB per run in kvrl-fidelity's sim ensembles."""
    import gc
    import weakref

    from kvrl.engine import loop

    class Marker:          # one per engine, tied into a reference cycle with it: freed only by the cyclic collector
        def __init__(self):
            self.ballast = [[] for _ in range(30000)]     # what a real run leaves: tens of thousands of objects

    gc.collect()
    loop._FullCollections.heap_objects = 0
    markers = []
    for i in range(40):
        eng = make_engine()
        eng.marker = Marker()
        eng.marker.engine = eng
        markers.append(weakref.ref(eng.marker))
        eng.run([make_request(f"r{j}", prompt_len=8 + j, output_len=3, arrival_s=0.01 * j) for j in range(4)])
        del eng
    alive = sum(ref() is not None for ref in markers)
    assert alive <= 20, f"{alive} of 40 dropped engines still held"   # bounded by the heap-growth rule, not the run count
    assert gc.get_freeze_count() == 0 and gc.isenabled()
    # collect_garbage() before a run timed from outside (kvrl-bench): that run makes no collection of its own
    eng = make_engine()
    loop.collect_garbage()
    calls = []
    collect = gc.collect
    try:
        gc.collect = lambda *a: calls.append(a) or collect(*a)
        eng.run([make_request(f"r{j}", prompt_len=8 + j, output_len=3, arrival_s=0.01 * j) for j in range(4)])
    finally:
        gc.collect = collect
    assert calls == []


# ============================================================================ faults and accounting (#15)
def _sibling_case(engine):
    """Request A (n=2, prompt 8 = 2 blocks) then B (prompt 2): after A's prefill and fork, A takes
    the pool's last free block and its fork A' finds none, so the eviction policy is asked."""
    return [make_request("A", tokens=list(range(1, 9)), output_len=4, n=2),
            make_request("B", tokens=[11, 12], output_len=3, arrival_s=0.0)]


def test_eviction_failure_on_a_fork_removes_its_scheduled_sibling_from_the_batch():
    """A failing eviction aborts request A; A's first sample, already in this step's batch, must
    leave it (its blocks are freed), so the executor never gets a sequence without blocks."""
    engine = make_engine(num_blocks=4, block_size=4, num_cpu_blocks=0, prefix_cache="none",
                         watermark_params={"fraction": 0.0})
    engine.eviction.select = _Flaky(engine.eviction.select, fail_on={1})
    execute, seen = engine.executor.execute, []

    def checked(batch):
        for item in batch.seqs:
            seen.append(len(item.seq.block_table) * 4 >= item.start + item.num_tokens)
        return execute(batch)

    engine.executor.execute = checked
    summary = engine.run(_sibling_case(engine))
    assert engine.eviction.select.calls == 1
    assert seen and all(seen), "a scheduled sequence had no blocks for its tokens"
    assert summary["aborted"] == 1 and summary["finished"] == 1 and summary["policy_errors"] == 1
    assert engine.outputs("B") and len(engine.outputs("B")[0]) == 3
    engine.check_invariants()
    assert engine.allocator.num_used_blocks == 0


def test_abort_of_a_finished_request_changes_nothing():
    engine = make_engine()
    summary = engine.run([make_request("a", 10, 3), make_request("b", 12, 3)])
    assert engine.abort("a", "too late") is False
    assert engine.metrics.summary() == summary and summary["finished"] == 2 and summary["aborted"] == 0
    with pytest.raises(KeyError):
        engine.abort("nope", "unknown")


def test_slo_attainment_counts_aborted_and_rejected_requests_as_failures():
    engine = make_engine(num_blocks=64, max_model_len=64)
    for r in [make_request(rid, plen, olen, slo_ttft_s=100.0)
              for rid, plen, olen in (("ok1", 8, 4), ("ok2", 8, 4), ("doomed", 8, 30), ("too_long", 60, 10))]:
        engine.submit(r)
    engine.step()
    assert engine.abort("doomed", "cancelled by the client")
    while engine.has_unfinished:
        engine.step()
    s = engine.metrics.summary()
    assert (s["finished"], s["aborted"], s["rejected"], s["requests"]) == (2, 1, 1, 4)
    assert s["slo_attainment"] == 0.5
    assert s["goodput_tok_s"] == pytest.approx(8 / s["duration_s"])


def _bad_prefix_cache(kind):
    """A hash_lru whose evict() hands back a block still in use, or whose lookup() raises."""
    from kvrl.plugins.prefix_caches import HashLRU

    class Bad(HashLRU):
        def evict(self):
            if kind == "evict_in_use" and self._hash_of:
                used = [b for b in self._hash_of if b not in self._evictable]
                if used:
                    return used[0]
            return super().evict()

        def lookup(self, block_hash):
            if kind == "lookup_raises":
                raise RuntimeError("injected lookup crash")
            return super().lookup(block_hash)

    return Bad(None)


@pytest.mark.parametrize("kind", ["evict_in_use", "lookup_raises"])
def test_a_faulty_prefix_cache_is_contained(kind):
    """An evict() returning a block in use would give one block two owners (silent corruption on
    87fbe4f) and a raising lookup() killed the run; both are policy errors now, nothing is aborted."""
    from kvrl.engine.config import EngineConfig
    from kvrl.engine.engine import Engine
    from kvrl.executors.hardware import DEVICES, MODEL_SHAPES
    from kvrl.executors.sim import SimExecutor
    from kvrl import plugins
    engine = Engine(EngineConfig(num_blocks=24, block_size=4, num_cpu_blocks=0, max_model_len=4096,
                                 prefix_cache_scope="global"),
                    SimExecutor(MODEL_SHAPES["qwen3-0.6b"], DEVICES["h200"]), plugins.create("scheduler", "fcfs"),
                    plugins.create("watermark", "fixed", fraction=0.0), plugins.create("eviction", "lifo"),
                    _bad_prefix_cache(kind))
    shared = list(range(1, 9))     # two shared blocks, then private ones: the pool fills with cached blocks
    reqs = [make_request(f"p{i}", tokens=shared + [100 + i] * (8 + i % 5), output_len=6, arrival_s=0.5 * i)
            for i in range(12)]
    summary = engine.run(reqs)
    engine.check_invariants()
    assert summary["finished"] == 12 and summary["aborted"] == 0
    assert summary["policy_errors"] > 0
    assert any(k.startswith("prefix_cache") for k in engine.metrics.policy_error_counts)
    assert engine.allocator.num_used_blocks == 0


def test_a_scheduler_whose_key_raises_falls_back_to_fcfs():
    engine = make_engine(num_blocks=64)
    engine.scheduler.key = _Flaky(engine.scheduler.key, fail_on=set(range(1, 100)))
    reqs = [make_request(f"k{i}", 8 + i, 3, arrival_s=0.001 * i) for i in range(6)]
    summary = engine.run(reqs)
    assert summary["finished"] == 6 and summary["rejected"] == 0 and summary["policy_errors"] == 6
    firsts = [engine.metrics.requests[r.request_id].first_token_s for r in reqs]
    assert firsts == sorted(firsts)


def test_out_of_range_watermark_is_a_policy_error_logged_once(caplog):
    """A reservation above the pool was taken silently (and blocked admission); now it is a policy
    error with vLLM's fallback, and a policy failing every step warns once, then counts."""
    import logging
    engine = make_engine(num_blocks=64)
    engine.watermark.reserved_blocks = lambda: 65
    with caplog.at_level(logging.WARNING, logger="kvrl.engine.engine"):
        summary = engine.run(_long_output_requests(n=8, seed=5))
    assert summary["finished"] == 8 and summary["policy_errors"] > 20
    first = [r for r in caplog.records if "not a block count in [0, num_blocks=64]" in r.getMessage()]
    assert len(first) == 1
    totals = [r for r in caplog.records if r.getMessage().startswith("policy errors: watermark")]
    assert len(totals) == 1 and str(summary["policy_errors"]) in totals[0].getMessage()


def test_views_are_read_only_and_hide_the_engine():
    engine = make_engine()
    engine.submit(make_request("v", 8, 2))
    view = engine.view.waiting[0]
    for obj, names in ((view, ("_seq", "_engine")), (engine.view, ("_engine",))):
        for name in names:
            assert not hasattr(obj, name)
            with pytest.raises(AttributeError):
                setattr(obj, name, None)
    with pytest.raises(AttributeError):
        view.num_output = 5
    with pytest.raises(AttributeError):
        engine.view.num_free_blocks = 0


def test_policy_time_is_measured_and_charged_to_the_sim_clock_on_request():
    import time

    def run(charge):
        engine = make_engine(num_blocks=64, charge_policy_time=charge)
        inner = engine.watermark.reserved_blocks
        engine.watermark.reserved_blocks = lambda: (time.sleep(0.002), inner())[1]
        summary = engine.run([make_request(f"t{i}", 8, 4, arrival_s=0.0) for i in range(3)])
        return summary, engine.metrics.wall_clock()["policy_time_s"]

    plain, plain_t = run(False)
    charged, charged_t = run(True)
    assert plain_t > 0.002 and charged_t > 0.002
    assert charged["duration_s"] >= plain["duration_s"] + 0.9 * charged_t
    with pytest.raises(ValueError, match="engine.charge_policy_time"):
        make_engine(charge_policy_time="yes")


def test_seq_queue_keeps_sorted_list_order_under_pushes_and_removals():
    import bisect
    import random
    from kvrl.engine.queues import SeqQueue
    from kvrl.engine.request import Sequence
    rng = random.Random(0)
    q, ref, keys, live = SeqQueue(keyed=True), [], [], {}
    req = make_request("q", 4, 1)
    for i in range(3000):
        if live and rng.random() < 0.45:
            victim = rng.choice(list(live.values())) if rng.random() < 0.3 else next(iter(q))
            assert q.remove(victim) and not q.remove(victim)
            j = ref.index(victim)
            del ref[j], keys[j]
            del live[victim.seq_id]
        else:
            seq, key = Sequence(i, req), rng.randint(0, 50)
            q.push(seq, key)
            j = bisect.bisect_right(keys, key)
            ref.insert(j, seq)
            keys.insert(j, key)
            live[i] = seq
        assert len(q) == len(ref)
        if i % 97 == 0:
            assert list(q) == ref
    assert list(q) == ref


# ============================================================================ plugin contracts (#15)
def test_a_plugin_missing_a_required_method_fails_at_create():
    import kvrl.plugins as kp

    @kp.register("eviction", "test_misspelt")
    class Misspelt(kp.EvictionPolicy):
        def selct(self, candidates):          # typo: select is never defined
            return kp.EvictionDecision(candidates[0].seq_id, kp.PreemptionMode.RECOMPUTE)

    with pytest.raises(TypeError, match="does not implement select"):
        kp.create("eviction", "test_misspelt")


def test_third_party_params_are_validated_from_their_declarations():
    """The README's example plugin took eviction.mode=swapp silently and then failed every call;
    Literal, typed and ranged fields of a third-party Params are now checked at create."""
    import dataclasses

    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    import kvrl.plugins as kp

    @kp.register("eviction", "test_declared")
    class Declared(kp.EvictionPolicy):
        @dataclasses.dataclass
        class Params:
            mode: Literal["recompute", "swap"] = "recompute"
            factor: float = dataclasses.field(default=1.0, metadata={"range": (0.0, 2.0)})
            limit: Optional[int] = None

        def select(self, candidates):
            return kp.EvictionDecision(candidates[0].seq_id, kp.PreemptionMode(self.params.mode))

    assert kp.create("eviction", "test_declared", mode="swap", factor=2, limit=3).params.mode == "swap"
    for bad, key in (({"mode": "swapp"}, "eviction.mode must be one of"), ({"factor": 2.5}, "eviction.factor must be <="),
                     ({"factor": "x"}, "eviction.factor must be of type float"),
                     ({"limit": 1.5}, "eviction.limit must be of type int")):
        with pytest.raises(ValueError, match=key):
            kp.create("eviction", "test_declared", **bad)
    node = ConfigStore.instance().repo["eviction"]["test_declared.yaml"].node   # Hydra can hold the Literal field
    assert OmegaConf.to_container(node) == {"mode": "recompute", "factor": 1.0, "limit": None, "name": "test_declared"}
    with pytest.raises(ValueError, match="eviction.mode"):
        kp.create_from_config("eviction", OmegaConf.merge(node, {"mode": "swapp"}))


def test_offline_batches_cost_linear_time_in_the_queue_length():
    """87fbe4f rebuilt the waiting list every step (quadratic: 40k offline requests took 128 s).
    With 2 admissions per step, 4x the requests must cost about 4x the CPU time, not 16x."""
    import time

    def cpu_seconds(n):
        engine = make_engine(num_blocks=256, block_size=16, prefix_cache="none", max_num_seqs=2,
                             max_num_batched_tokens=64)
        reqs = [make_request(f"o{i}", tokens=[1 + i % 7, 2], output_len=1) for i in range(n)]
        t = time.process_time()
        summary = engine.run(reqs)
        assert summary["finished"] == n
        return time.process_time() - t

    small = min(cpu_seconds(2000) for _ in range(2))
    large = min(cpu_seconds(8000) for _ in range(2))
    assert large < 8 * small, f"2,000 requests: {small:.2f} s, 8,000: {large:.2f} s"


def test_token_bytes_are_the_hashed_ids_across_the_prompt_and_the_outputs():
    """Block identities are hashed from Sequence.token_bytes (no array per block); they must be the
    bytes block_bytes gives for the same ids, in the prompt, the outputs and across the boundary,
    and BlockHasher.extend must give one chain whether it gets ids or their bytes (and
    BlockHasher.chain, block by block, the same chain), at each hash's token width."""
    from kvrl.engine.hashing import BlockHasher, block_bytes
    from kvrl.engine.request import Sequence
    seq = Sequence(0, make_request("b", 20, 1))
    seq.output_token_ids.extend([7, 2**31 - 1, 0, 151_935])
    for width in (4, 8):
        for start, end in ((0, 20), (3, 17), (20, 24), (21, 23), (16, 24), (0, 24)):
            assert seq.token_bytes(start, end, width) == block_bytes(seq.token_slice(start, end), width), (start, end)
    assert len(seq.token_bytes(0, 24)) == 4 * 24 and len(seq.token_bytes(0, 24, 8)) == 8 * 24
    for name in ("blake2b", "sha256", "xxh3"):
        hasher = BlockHasher(name, bytes(32) if name == "blake2b" else None)
        w = hasher.token_width
        from_ids, from_bytes = [], []
        hasher.extend(from_ids, seq.token_slice(0, 24), 4, 6, b"salt")
        hasher.extend(from_bytes, seq.token_bytes(0, 8, w), 4, 2, b"salt")
        hasher.extend(from_bytes, seq.token_bytes(8, 24, w), 4, 6, None, offset=8)
        assert from_ids == from_bytes and len(from_ids) == 6, name
        chained = [hasher.chain(hasher.root(b"salt"), seq.token_bytes(0, 4, w))]
        for i in range(1, 6):                   # block by block, as decodes fill them
            chained.append(hasher.chain(chained[-1], seq.token_bytes(4 * i, 4 * i + 4, w)))
        assert chained == from_ids, name
        with pytest.raises(ValueError, match="reach position"):
            hasher.extend([], seq.token_bytes(0, 20, w), 4, 6, b"salt")
