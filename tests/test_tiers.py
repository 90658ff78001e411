"""The CPU tier under the prefix cache (issue #20, kvrl.engine.tiers): invariants under random
operations (no identity in two tiers, no leaked block, tenant scoping), the identity check on tier
hits, the default (no tier) unchanged, sim pricing, config errors, and greedy token-exactness
against transformers after an offload and reload on the live executor (CPU, tiny model)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from kvrl import plugins
from kvrl.engine.batch import ScheduledBatch
from kvrl.engine.config import EngineConfig
from kvrl.engine.engine import Engine
from kvrl.engine.paged_allocator import PagedAllocator
from kvrl.engine.request import SeqStatus
from kvrl.engine.tiers import TieredAllocator
from kvrl.executors.hardware import DEVICES, MODEL_SHAPES
from kvrl.executors.sim import SimExecutor
from tests.helpers import make_request


def tier_engine(num_blocks=24, tier_blocks=16, tier="offload_all", prefix_cache="hash_lru", block_size=4,
                scope="tenant", executor=None, mode="recompute", **kw):
    cfg = EngineConfig(num_blocks=num_blocks, block_size=block_size, num_cpu_blocks=kw.pop("num_cpu_blocks", 16),
                       max_model_len=kw.pop("max_model_len", 4096), cpu_tier_blocks=tier_blocks,
                       prefix_cache_scope=scope, **kw)
    ex = executor or SimExecutor(MODEL_SHAPES["qwen3-0.6b"], DEVICES["h200"], profile="none")
    return Engine(cfg, ex, plugins.create("scheduler", "fcfs"), plugins.create("watermark", "fixed"),
                  plugins.create("eviction", "lifo", mode=mode),
                  plugins.create("prefix_cache", prefix_cache), tier=plugins.create("tier", tier))


def _prompt(group, length, rng):
    base = np.random.default_rng(group).integers(0, 50, 64, dtype=np.int32)     # shared prefixes
    return np.concatenate([base[: length - length // 4], rng.integers(0, 50, length // 4, dtype=np.int32)])


ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(4, 40), st.integers(1, 8), st.integers(1, 2), st.integers(0, 3),
                  st.sampled_from(["a", "b"])),
        st.tuples(st.just("step"), st.integers(1, 6)),
        st.tuples(st.just("preempt"), st.sampled_from(["swap", "recompute"])),
        st.tuples(st.just("abort"), st.integers(0, 50)),
    ),
    min_size=1, max_size=40)


@pytest.mark.parametrize("prefix_cache", ["hash_lru", "hash_lfu", "radix_lru"])
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops, seed=st.integers(0, 2**16), tier_blocks=st.sampled_from([1, 3, 12]),
       tier=st.sampled_from(["offload_all", "cost_aware", "prefetch"]), disk_blocks=st.sampled_from([0, 2, 16]),
       read_ahead=st.sampled_from([0, 2]))
def test_tier_invariants_hold_under_random_operations(prefix_cache, ops, seed, tier_blocks, tier, disk_blocks,
                                                      read_ahead):
    """After every operation: pool and tier partitions exact (CPU and disk), every GPU-cached
    identity absent from both tiers and no identity on CPU and disk at once, every cached block a sequence holds registered under its own salt (two tenants send
    the same prompts); at the end every request finished or was aborted and nothing is held."""
    engine = tier_engine(num_blocks=28, tier_blocks=tier_blocks, tier=tier, prefix_cache=prefix_cache,
                         max_num_batched_tokens=32, mode="swap", disk_tier_blocks=disk_blocks,
                         disk_tier_read_ahead_blocks=read_ahead if disk_blocks else 0)
    rng = np.random.default_rng(seed)
    added = []
    for op in ops:
        if op[0] == "add":
            _, plen, olen, n, group, tenant = op
            rid = f"r{len(added)}"
            engine.submit(make_request(rid, tokens=_prompt(group, plen, rng), output_len=olen, n=n,
                                       arrival_s=engine.now, tenant=tenant))
            added.append((rid, olen, n))
        elif op[0] == "step":
            for _ in range(op[1]):
                if engine.has_unfinished:
                    engine.step()
        elif op[0] == "preempt" and engine.running:
            engine.preempt(engine.running[-1].seq_id, op[1])
        elif op[0] == "abort" and added:
            rid = added[op[1] % len(added)][0]
            if engine.is_open(rid):
                engine.abort(rid, "aborted by test")
        engine.check_invariants()
    steps = 0
    while engine.has_unfinished:
        engine.step()
        engine.check_invariants()
        steps += 1
        assert steps < 5000, "engine did not drain"
    alloc = engine.allocator
    assert alloc.num_used_blocks == 0 and alloc.num_free_blocks == alloc.num_blocks
    for rid, olen, n in added:
        rec = engine.metrics.requests[rid]
        if not rec.error:
            assert rec.output_tokens == n * olen
            assert all(s.status is SeqStatus.FINISHED for s in engine.sequences(rid))
    s = engine.metrics.summary()
    assert s["tier_loaded_blocks"] <= s["tier_offloaded_blocks"]
    event(f"tier loads: {'some' if s['tier_loaded_blocks'] else 'none'}")
    if disk_blocks:
        assert s["tier_disk_loaded_blocks"] <= s["tier_demoted_blocks"]
        event(f"disk loads: {'some' if s['tier_disk_loaded_blocks'] else 'none'}")
        if read_ahead:      # every disk load used a staged read or was read at its step; staging bounded
            ra = alloc.read_ahead
            assert ra.stats.used_blocks <= s["tier_disk_loaded_blocks"] and ra.num_staged <= read_ahead
            event(f"read-ahead used: {'some' if ra.stats.used_blocks else 'none'}")


def _fill_then_reuse(engine, prompts, fillers, tenants=("a", "a")):
    """Serve ``prompts`` (tenant ``tenants[0]``), then ``fillers`` (which reclaim the GPU cache),
    then ``prompts`` again (tenant ``tenants[1]``); returns the engine's summary."""
    reqs = [make_request(f"p{i}", tokens=p, output_len=2, arrival_s=0.0, tenant=tenants[0])
            for i, p in enumerate(prompts)]
    reqs += [make_request(f"f{i}", tokens=p, output_len=2, arrival_s=1.0, tenant="filler")
             for i, p in enumerate(fillers)]
    reqs += [make_request(f"q{i}", tokens=p, output_len=2, arrival_s=2.0, tenant=tenants[1])
             for i, p in enumerate(prompts)]
    summary = engine.run(reqs)
    engine.check_invariants()
    assert summary["finished"] == len(reqs)
    return summary


def _prompts(n, length, seed):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 1000, length, dtype=np.int32) for _ in range(n)]


def test_reclaimed_prefix_blocks_come_back_from_the_cpu_tier():
    prompts, fillers = _prompts(2, 33, 1), _prompts(6, 33, 2)
    gpu_only = _fill_then_reuse(tier_engine(tier_blocks=0), prompts, fillers)
    tiered = _fill_then_reuse(tier_engine(tier_blocks=64), prompts, fillers)
    assert "tier_cpu_hit_rate" not in gpu_only and gpu_only["prefix_hit_rate"] == 0.0
    assert tiered["tier_offloaded_blocks"] > 0
    assert tiered["tier_loaded_blocks"] == 2 * 8          # both prompts' 8 full blocks (32 of 33 tokens)
    assert tiered["tier_cpu_hit_rate"] == pytest.approx(2 * 32 / (10 * 33))
    block_bytes = SimExecutor(MODEL_SHAPES["qwen3-0.6b"], DEVICES["h200"]).kv_block_bytes(4)
    assert tiered["tier_bytes_loaded"] == 16 * block_bytes
    assert tiered["tier_load_s"] > 0 and tiered["tier_store_s"] > 0


@pytest.mark.parametrize("scope,hits", [("tenant", False), ("global", True)])
def test_tier_hits_are_scoped_like_gpu_hits(scope, hits):
    """Tenant b sends tenant a's prompts after a's blocks went to the CPU tier: under the default
    tenant scope b gets nothing from the tier; under global scope it does."""
    prompts, fillers = _prompts(2, 33, 1), _prompts(6, 33, 2)
    summary = _fill_then_reuse(tier_engine(tier_blocks=64, scope=scope), prompts, fillers, tenants=("a", "b"))
    assert summary["tier_offloaded_blocks"] > 0
    assert (summary["tier_loaded_blocks"] > 0) is hits


def test_a_tier_block_whose_record_differs_is_not_a_hit():
    """The tier checks parent, tokens and salt on a hit as the GPU cache does: a tier block
    whose recorded tokens differ from the requester's (what a hash collision would look like) is
    a miss, counted in prefix_check_failures, and the prompt is recomputed."""
    prompts, fillers = _prompts(1, 33, 1), _prompts(6, 33, 2)
    engine = tier_engine(tier_blocks=64)
    reqs = [make_request("p", tokens=prompts[0], output_len=2)]
    reqs += [make_request(f"f{i}", tokens=p, output_len=2, arrival_s=1.0) for i, p in enumerate(fillers)]
    engine.run(reqs)
    tier = engine.allocator.tier
    seq_hashes = engine.sequences("p")[0].block_hashes
    slot = tier.lookup(seq_hashes[0])
    assert slot is not None, "the first block should be in the tier"
    entry = tier.entry(slot)
    tier._entry[slot] = entry._replace(tokens=bytes(len(entry.tokens)))
    before = engine.metrics.prefix_check_failures
    engine.run([make_request("again", tokens=prompts[0], output_len=2, arrival_s=engine.now)])
    assert engine.metrics.prefix_check_failures == before + 1
    assert engine.allocator.stats.loaded_blocks == 0


def test_tier_policy_none_changes_nothing():
    """cpu_tier_blocks > 0 with tier=none: the same requests, times and tokens as no tier."""
    prompts, fillers = _prompts(3, 33, 1), _prompts(6, 41, 2)
    results = []
    for blocks, tier in ((0, "offload_all"), (32, "none")):
        engine = tier_engine(tier_blocks=blocks, tier=tier)
        _fill_then_reuse(engine, prompts, fillers)
        results.append([(r.request_id, r.first_token_s, r.finish_s, tuple(map(tuple, engine.outputs(r.request_id))))
                        for r in engine.metrics.requests.values()])
    assert isinstance(tier_engine(tier_blocks=0).allocator, PagedAllocator)
    assert not isinstance(tier_engine(tier_blocks=0).allocator, TieredAllocator)
    assert results[0] == results[1]


def test_cost_aware_offloads_blocks_whose_reload_beats_recompute():
    from kvrl.plugins.tiers import ReclaimedBlock
    engine = tier_engine(tier_blocks=8, tier="cost_aware", block_size=16)
    policy, view = engine.tier, engine.view
    transfer = 2 * view.estimate_swap_s(16) / 16
    for index in (0, 5, 200):
        before = 16 * index
        recompute = 16 * (view.estimate_recompute_s(before + 2048) - view.estimate_recompute_s(before)) / 2048
        assert policy.offload(ReclaimedBlock(index, 16, 8, 8)) is (transfer < recompute)
    # a slow enough host link makes it drop shallow blocks and keep deep ones (longer attention context)
    slow = tier_engine(tier_blocks=8, tier="cost_aware", block_size=16)
    margin = 1.01 * transfer / policy.recompute_s(ReclaimedBlock(300, 16, 8, 8))
    slow.tier = plugins.create("tier", "cost_aware", margin=margin)
    slow.tier.bind(slow.view)
    assert [slow.tier.offload(ReclaimedBlock(i, 16, 8, 8)) for i in (0, 600)] == [False, True]


def test_the_sim_prices_tier_transfers_before_the_forward_pass():
    """Tier transfers run on the swap stream at the step's start and the forward pass waits for
    them (the loads are its inputs), so a step with a forward pass lasts at least transfers + forward."""
    from kvrl.engine.batch import ScheduledSeq
    from kvrl.engine.request import Sequence
    ex = SimExecutor(MODEL_SHAPES["qwen3-0.6b"], DEVICES["h200"], profile="auto")
    item = ScheduledSeq(Sequence(0, make_request("x", 64)), 32, 32, 1)
    ex.allocate_kv(64, 0, 16)
    ex.allocate_tier(8, 16)
    plain = ex.execute(ScheduledBatch(seqs=[item])).elapsed_s
    assert ex.tier_transfer_s() == (0.0, 0.0)
    ex.allocate_kv(64, 0, 16)
    ex.allocate_tier(8, 16)
    tiered = ex.execute(ScheduledBatch(seqs=[item], tier_in=[(0, 2), (1, 3)], tier_out=[(4, 2)])).elapsed_s
    load_s, store_s = ex.tier_transfer_s()
    assert load_s > 0 and store_s > 0
    assert tiered > plain and tiered >= load_s + store_s


@pytest.mark.parametrize("change,message", [
    (dict(prefix_cache="none"), "engine.cpu_tier_blocks"),
    (dict(allocator="contiguous", prefix_cache="none"), "engine.cpu_tier_blocks"),
])
def test_a_tier_without_a_prefix_cache_is_an_error_naming_the_key(change, message):
    with pytest.raises(ValueError, match=message):
        tier_engine(tier_blocks=8, **change)


def test_negative_tier_size_is_rejected():
    with pytest.raises(ValueError, match="engine.cpu_tier_blocks"):
        EngineConfig(cpu_tier_blocks=-1)
    with pytest.raises(ValueError, match="engine.cpu_tier_blocks"):
        EngineConfig(cpu_tier_blocks=2.5)


def test_builder_takes_the_tier_section_or_its_default():
    from kvrl.builder import build_policies
    base = {"scheduler": {"name": "fcfs"}, "watermark": {"name": "fixed"}, "eviction": {"name": "lifo"},
            "prefix_cache": {"name": "hash_lru"}}
    assert build_policies(OmegaConf.create(base))["tier"].plugin_name == "offload_all"
    assert build_policies(OmegaConf.create({**base, "tier": None}))["tier"].plugin_name == "offload_all"
    policy = build_policies(OmegaConf.create({**base, "tier": {"name": "cost_aware", "margin": 2.0}}))["tier"]
    assert policy.plugin_name == "cost_aware" and policy.params.margin == 2.0
    with pytest.raises(ValueError, match="margin"):
        build_policies(OmegaConf.create({**base, "tier": {"name": "cost_aware", "margin": -1.0}}))


def test_a_failing_tier_policy_drops_the_block_and_is_counted():
    from kvrl.plugins.tiers import TierPolicy

    class Broken(TierPolicy):
        def offload(self, block):
            return "yes"

    engine = tier_engine(tier_blocks=16)
    engine.allocator.tier_policy = Broken(None)
    prompts, fillers = _prompts(1, 33, 1), _prompts(6, 33, 2)
    summary = _fill_then_reuse(engine, prompts, fillers)
    assert summary["policy_errors"] > 0 and summary["tier_offloaded_blocks"] == 0
    assert summary["tier_dropped_blocks"] == summary["policy_errors"]


# ---------------------------------------------------------------------------------------- disk tier (sim)
def test_replaced_cpu_tier_blocks_come_back_from_disk():
    """A 16-block CPU tier under 12 fillers' worth of reclaims keeps nothing of the first prompts;
    with a disk tier below it the replaced blocks are demoted and the prompts hit on disk (staged
    through the CPU tier), priced by the default disk bandwidth, with every identity in one place."""
    from kvrl.engine.disk_tier import DEFAULT_DISK_BANDWIDTH
    prompts, fillers = _prompts(2, 33, 1), _prompts(12, 33, 2)
    cpu_only = _fill_then_reuse(tier_engine(tier_blocks=16, max_num_batched_tokens=40), prompts, fillers)
    engine = tier_engine(tier_blocks=16, disk_tier_blocks=128, max_num_batched_tokens=40)
    tiered = _fill_then_reuse(engine, prompts, fillers)
    assert cpu_only["prefix_hit_rate"] == 0.0 and "tier_disk_hit_rate" not in cpu_only
    assert tiered["tier_demoted_blocks"] == tiered["tier_replaced_blocks"] > 0
    assert tiered["tier_disk_loaded_blocks"] > 0
    assert tiered["tier_disk_hit_rate"] == pytest.approx(tiered["tier_disk_loaded_blocks"] * 4 / (16 * 33))
    assert tiered["prefix_hit_rate"] == pytest.approx(tiered["tier_gpu_hit_rate"] + tiered["tier_cpu_hit_rate"]
                                                      + tiered["tier_disk_hit_rate"])
    nbytes = tiered["tier_bytes_disk_loaded"]
    assert tiered["tier_disk_load_s"] == pytest.approx(DEFAULT_DISK_BANDWIDTH.read_s(nbytes))
    assert tiered["tier_disk_store_s"] == pytest.approx(DEFAULT_DISK_BANDWIDTH.write_s(tiered["tier_bytes_demoted"]))
    assert tiered["tier_disk_ttft_saved_s"] != 0.0


@pytest.mark.parametrize("scope,hits", [("tenant", False), ("global", True)])
def test_disk_hits_are_scoped_like_gpu_hits(scope, hits):
    prompts, fillers = _prompts(2, 33, 1), _prompts(12, 33, 2)
    summary = _fill_then_reuse(tier_engine(tier_blocks=16, disk_tier_blocks=128, scope=scope,
                                           max_num_batched_tokens=40), prompts, fillers, tenants=("a", "b"))
    assert summary["tier_demoted_blocks"] > 0
    assert (summary["tier_disk_loaded_blocks"] > 0) is hits


def test_a_disk_block_whose_record_differs_is_not_a_hit():
    prompts, fillers = _prompts(1, 33, 1), _prompts(12, 33, 2)
    engine = tier_engine(tier_blocks=16, disk_tier_blocks=128, max_num_batched_tokens=40)
    engine.run([make_request("p", tokens=prompts[0], output_len=2)]
               + [make_request(f"f{i}", tokens=p, output_len=2, arrival_s=1.0) for i, p in enumerate(fillers)])
    disk = engine.allocator.disk
    slot = disk.lookup(engine.sequences("p")[0].block_hashes[0])
    assert slot is not None, "the first block should be on disk"
    entry = disk.entry(slot)
    disk._entry[slot] = entry._replace(salt=b"another tenant")
    before = engine.metrics.prefix_check_failures
    engine.run([make_request("again", tokens=prompts[0], output_len=2, arrival_s=engine.now)])
    assert engine.metrics.prefix_check_failures == before + 1
    assert engine.allocator.stats.disk_loaded_blocks == 0


def test_tier_none_and_cost_aware_decide_demotions():
    """tier=none never demotes (the base class default), offload_all always does, cost_aware when
    a disk read plus a PCIe load beats recomputing the block."""
    from kvrl.plugins.tiers import DemotedBlock
    block = DemotedBlock(index=10, block_size=16, disk_free_blocks=4, disk_blocks=8, disk_read_s=1e-5)
    assert plugins.create("tier", "none").demote(block) is False
    assert plugins.create("tier", "offload_all").demote(block) is True
    engine = tier_engine(tier_blocks=8, tier="cost_aware", block_size=16, disk_tier_blocks=8)
    policy = engine.tier
    pcie = engine.view.estimate_swap_s(16) / 16
    recompute = policy.recompute_s(block)
    assert policy.demote(block) is (1e-5 + pcie < recompute)
    assert policy.demote(DemotedBlock(10, 16, 4, 8, disk_read_s=2 * recompute)) is False


def test_the_sim_prices_disk_reads_before_the_tier_loads():
    """Disk hits are read (profile or default disk bandwidth) before their PCIe loads, and the
    forward pass waits for both: a step with disk reads lasts longer by about the read time."""
    from kvrl.engine.batch import ScheduledSeq
    from kvrl.engine.disk_tier import DEFAULT_DISK_BANDWIDTH
    from kvrl.engine.request import Sequence
    ex = SimExecutor(MODEL_SHAPES["qwen3-0.6b"], DEVICES["h200"], profile="none")
    item = ScheduledSeq(Sequence(0, make_request("x", 64)), 32, 32, 1)
    times = []
    for disk_in in ([], [(0, 0), (1, 1)]):
        ex.allocate_kv(64, 0, 16)
        ex.allocate_tier(8, 16)
        times.append(ex.execute(ScheduledBatch(seqs=[item], tier_in=[(0, 2), (1, 3)], disk_in=disk_in)).elapsed_s)
    read_s = DEFAULT_DISK_BANDWIDTH.read_s(2 * ex.kv_block_bytes(16))
    assert times[1] - times[0] == pytest.approx(read_s, rel=1e-6)


def test_disk_bandwidth_comes_from_the_profile_or_the_documented_default():
    from kvrl.engine.disk_tier import DEFAULT_DISK_BANDWIDTH, DiskBandwidth
    assert DiskBandwidth.from_meta({}) is DEFAULT_DISK_BANDWIDTH
    assert DiskBandwidth.from_meta(None) is DEFAULT_DISK_BANDWIDTH
    measured = DiskBandwidth.from_meta({"disk": {"read_bytes_per_s": 1e9, "write_bytes_per_s": 5e8}})
    assert measured.read_s(2e9) == 2.0 and measured.write_s(1e9) == 2.0
    with pytest.raises(ValueError, match="read_bytes_per_s"):
        DiskBandwidth(0.0, 1.0)


def test_disk_bandwidth_measurement_round_trips_block_files(tmp_path):
    from kvrl.engine.disk_tier import measure_disk_bandwidth
    result = measure_disk_bandwidth(str(tmp_path), block_bytes=64 << 10, num_blocks=8, threads=2)
    assert result["read_bytes_per_s"] > 0 and result["write_bytes_per_s"] > 0
    assert result["file_bytes"] == 64 << 10 and result["dir"] == str(tmp_path)
    assert list(tmp_path.iterdir()) == []          # its files are removed


def test_disk_store_orders_io_per_block(tmp_path):
    """A read queued after a write of the same block sees the write; a rewrite after a read does
    not overtake it; a short buffer is refused naming the sizes."""
    from kvrl.engine.disk_tier import DiskStore
    store = DiskStore(4, 1024, str(tmp_path), threads=3)
    a, b = np.full(1024, 7, np.uint8), np.full(1024, 9, np.uint8)
    got = np.zeros(1024, np.uint8)
    store.write(2, a)
    store.read(2, got)
    store.write(2, b)
    store.drain()
    assert (got == 7).all()
    again = np.zeros(1024, np.uint8)
    store.read(2, again).result()
    assert (again == 9).all()
    with pytest.raises(ValueError, match="1024-byte"):
        store.read(1, np.zeros(10, np.uint8))
    store.close()


def test_disk_tier_config_errors_name_the_key():
    with pytest.raises(ValueError, match="engine.disk_tier_blocks > 0 needs engine.cpu_tier_blocks"):
        EngineConfig(disk_tier_blocks=8)
    with pytest.raises(ValueError, match="engine.disk_tier_blocks"):
        EngineConfig(cpu_tier_blocks=8, disk_tier_blocks=-1)
    with pytest.raises(ValueError, match="engine.disk_tier_threads"):
        EngineConfig(cpu_tier_blocks=8, disk_tier_blocks=8, disk_tier_threads=0)
    with pytest.raises(ValueError, match="engine.disk_tier_dir"):
        EngineConfig(cpu_tier_blocks=8, disk_tier_blocks=8, disk_tier_dir=12)


# ---------------------------------------------------------------------------------------- live (CPU)
torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    from kvrl.model import make_random_checkpoint
    path = tmp_path_factory.mktemp("qwen3")
    make_random_checkpoint(path, family="qwen3", preset="tiny", seed=1)
    return path


def _live_engine(path, tier_blocks, **kw):
    from kvrl.executors.live import LiveExecutor
    from kvrl.model import load_model
    model, config = load_model(path, dtype=torch.float32, device="cpu")
    ex = LiveExecutor(model, config, torch.device("cpu"), torch.float32, piecewise=False)
    return tier_engine(num_blocks=20, tier_blocks=tier_blocks, executor=ex, max_model_len=512,
                       max_num_batched_tokens=64, **kw)


def test_live_greedy_output_is_exact_after_offload_and_reload(tiny_checkpoint):
    """Two conversations' prompts, then fillers that push their prefix blocks out of a 20-block GPU
    pool into the CPU tier, then the prompts again: the reloaded blocks serve the second round and
    the greedy tokens equal transformers' for every request."""
    from tests.test_live_exactness import hf_greedy
    rng = np.random.default_rng(4)
    system = rng.integers(0, 512, 20, dtype=np.int32)
    prompts = [np.concatenate([system, rng.integers(0, 512, k, dtype=np.int32)]) for k in (9, 14)]
    fillers = [rng.integers(0, 512, 30, dtype=np.int32) for _ in range(3)]
    engine = _live_engine(tiny_checkpoint, tier_blocks=32)
    reqs = [make_request(f"p{i}", tokens=p, output_len=6, arrival_s=0.0) for i, p in enumerate(prompts)]
    reqs += [make_request(f"f{i}", tokens=p, output_len=6, arrival_s=1.0 + i) for i, p in enumerate(fillers)]
    reqs += [make_request(f"q{i}", tokens=p, output_len=6, arrival_s=10.0) for i, p in enumerate(prompts)]
    summary = engine.run(reqs)
    assert summary["finished"] == len(reqs)
    assert summary["tier_loaded_blocks"] >= 8, summary
    expected = hf_greedy(tiny_checkpoint, [*prompts, *fillers, *prompts], 6)
    assert [engine.outputs(r.request_id)[0] for r in reqs] == expected


def test_live_offload_then_reload_restores_identical_kv(tiny_checkpoint):
    engine = _live_engine(tiny_checkpoint, tier_blocks=4)
    ex = engine.executor
    ex.kv.normal_()
    before = ex.kv_by_block[[3, 5]].clone()
    ex.execute(ScheduledBatch(tier_out=[(3, 2), (5, 0)]))
    ex.kv.zero_()
    ex.execute(ScheduledBatch(tier_in=[(0, 7), (2, 1)]))
    assert torch.equal(ex.kv_by_block[1], before[0]) and torch.equal(ex.kv_by_block[7], before[1])


def test_run_config_composes_the_tier_group_and_reports_tier_metrics():
    """``conf/run.yaml`` with ``tier=cost_aware engine.cpu_tier_blocks=...`` (what kvrl-run takes)
    builds the tiered engine with that policy; without the override the default config has no tier."""
    import kvrl.apps  # noqa: F401  (config resolvers)
    from hydra import compose, initialize_config_module
    from kvrl.apps.schema import register_schemas
    from kvrl.builder import build_engine, to_dict
    from kvrl.workloads import build_workload
    register_schemas()
    plugins.available("tier")
    small = ["workload=multi_turn", "workload.num_conversations=4", "workload.system_prompt_len=64",
             "engine.num_blocks=24", "backend.profile=none"]
    with initialize_config_module("kvrl.conf", version_base="1.3"):
        tiered = compose("run", overrides=[*small, "tier=cost_aware", "tier.margin=1000.0",
                                           "engine.cpu_tier_blocks=64"])
        plain = compose("run", overrides=small)
    assert not isinstance(build_engine(plain).allocator, TieredAllocator)
    engine = build_engine(tiered)
    assert isinstance(engine.allocator, TieredAllocator) and engine.tier.plugin_name == "cost_aware"
    requests = build_workload(to_dict(tiered.workload), vocab_size=engine.executor.vocab_size,
                              max_model_len=engine.config.max_model_len)
    summary = engine.run(list(requests))
    assert summary["tier_cpu_blocks"] == 64 and summary["tier_offloaded_blocks"] > 0


@pytest.mark.parametrize("read_ahead", [0, 8])
def test_live_greedy_output_is_exact_after_a_disk_reload(tiny_checkpoint, tmp_path, read_ahead):
    """As above with a 12-block CPU tier over a disk tier in ``tmp_path``: the prompts' blocks are
    pushed through the CPU tier to disk by the fillers, read back from their files on the second
    round (with ``read_ahead``: issued at the lookup into staging buffers,
    kvrl.engine.tier_read_ahead), and the greedy tokens equal transformers' for every request."""
    from tests.test_live_exactness import hf_greedy
    rng = np.random.default_rng(4)
    system = rng.integers(0, 512, 20, dtype=np.int32)
    prompts = [np.concatenate([system, rng.integers(0, 512, k, dtype=np.int32)]) for k in (9, 14)]
    fillers = [rng.integers(0, 512, 30, dtype=np.int32) for _ in range(6)]
    engine = _live_engine(tiny_checkpoint, tier_blocks=12, disk_tier_blocks=64, disk_tier_dir=str(tmp_path),
                          disk_tier_read_ahead_blocks=read_ahead)
    reqs = [make_request(f"p{i}", tokens=p, output_len=6, arrival_s=0.0) for i, p in enumerate(prompts)]
    reqs += [make_request(f"f{i}", tokens=p, output_len=6, arrival_s=1.0 + i) for i, p in enumerate(fillers)]
    reqs += [make_request(f"q{i}", tokens=p, output_len=6, arrival_s=10.0) for i, p in enumerate(prompts)]
    summary = engine.run(reqs)
    engine.check_invariants()
    assert summary["finished"] == len(reqs)
    assert summary["tier_disk_loaded_blocks"] >= 4, summary
    assert summary["tier_disk_load_s"] > 0 and summary["tier_disk_store_s"] > 0
    assert 0 < len(list(tmp_path.glob("block-*.kv"))) <= 64     # one file per disk block written
    if read_ahead:
        assert summary["tier_disk_read_ahead_used_blocks"] == summary["tier_disk_loaded_blocks"], summary
    expected = hf_greedy(tiny_checkpoint, [*prompts, *fillers, *prompts], 6)
    assert [engine.outputs(r.request_id)[0] for r in reqs] == expected


@pytest.mark.parametrize("read_ahead", [False, True])
def test_live_kv_round_trips_through_the_disk_files(tiny_checkpoint, tmp_path, read_ahead):
    """Host tier blocks written to block files and read back into other host blocks are identical,
    read at the step or (``read_ahead``) through staging buffers filled ahead of it."""
    engine = _live_engine(tiny_checkpoint, tier_blocks=4, disk_tier_blocks=4, disk_tier_dir=str(tmp_path),
                          disk_tier_read_ahead_blocks=2 if read_ahead else 0)
    alloc, pool = engine.allocator, engine.executor.tier_pool
    pool.normal_()
    before = pool[[0, 1]].clone()
    alloc._move_disk([(0, 3), (1, 0)], [])
    if read_ahead:
        alloc.read_ahead.issue([(3, "a"), (0, "b")])
    pool.zero_()
    assert alloc._move_disk([], [(3, 2, "a"), (0, 1, "b")]) == ([] if read_ahead else [(3, 2), (0, 1)])
    assert torch.equal(pool[2], before[0]) and torch.equal(pool[1], before[1])
    if read_ahead:
        assert alloc.read_ahead.stats.used_blocks == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["block-0.kv", "block-3.kv"]


# ---------------------------------------------------------------------------------------- prefetch and the env
def _next_turn_requests():
    """A prompt, fillers that push it to the CPU tier, a long runner that keeps the engine
    stepping with room in the pool, and the prompt again while the runner runs."""
    prompt, fillers, runner = _prompts(1, 33, 1)[0], _prompts(3, 33, 2), _prompts(1, 5, 3)[0]
    reqs = [make_request("p", tokens=prompt, output_len=2, arrival_s=0.0)]
    reqs += [make_request(f"f{i}", tokens=p, output_len=2, arrival_s=0.1, tenant="filler") for i, p in enumerate(fillers)]
    reqs += [make_request("run", tokens=runner, output_len=40, arrival_s=0.2, tenant="filler")]
    return reqs + [make_request("q", tokens=prompt, output_len=2, arrival_s=0.215)]


def test_prefetch_brings_a_finished_chain_back_to_the_gpu_before_its_next_turn():
    results = {}
    for tier in ("offload_all", "prefetch"):
        engine = tier_engine(tier_blocks=64, tier=tier)
        summary = engine.run(_next_turn_requests())
        engine.check_invariants()
        q = engine.metrics.requests["q"]
        results[tier] = (summary, q.first_token_s - q.arrival_s)
    (plain, plain_ttft), (pre, pre_ttft) = results["offload_all"], results["prefetch"]
    assert plain["tier_cpu_hit_rate"] > 0 and plain["tier_prefetched_blocks"] == 0
    assert pre["tier_prefetch_used_blocks"] == 8             # q's 8 full blocks were on the GPU already
    assert pre["tier_cpu_hit_rate"] == 0.0 and pre["tier_gpu_hit_rate"] == plain["tier_cpu_hit_rate"]
    assert pre_ttft < plain_ttft                              # no load in q's first step


def test_prefetch_policy_picks_the_newest_chain_per_conversation_within_its_window():
    from kvrl.plugins.tiers import PrefetchChain, PrefetchState
    policy = plugins.create("tier", "prefetch", max_blocks=10, reserve=0.5, window_s=5.0, max_chains=8)
    chains = (PrefetchChain(0, "a", "c1", 0.0, 4), PrefetchChain(1, "a", "c1", 7.0, 6),
              PrefetchChain(2, "a", "c2", 8.0, 6), PrefetchChain(3, "b", None, 9.0, 2))
    assert policy.prefetch(PrefetchState(chains, 80, 100, 10.0)) == ([3, 2, 1], 10)
    assert policy.prefetch(PrefetchState(chains, 55, 100, 10.0)) == ([3, 2, 1], 5)
    assert policy.prefetch(PrefetchState(chains, 50, 100, 10.0)) == ((), 0)
    with pytest.raises(ValueError, match="reserve"):
        plugins.create("tier", "prefetch", reserve=1.5)


def test_prefetch_keeps_the_invariants_with_a_disk_tier():
    engine = tier_engine(tier_blocks=12, tier="prefetch", disk_tier_blocks=32)
    engine.run(_next_turn_requests() + [make_request(f"x{i}", tokens=p, output_len=3, arrival_s=0.3 + 0.01 * i)
                                        for i, p in enumerate(_prompts(6, 29, 5))])
    engine.check_invariants()
    assert engine.allocator.num_used_blocks == 0


def test_tier_env_smoke():
    """kvrl/Tier-v0 is registered lazily, steps through a small episode to its end with every
    mode, and rewards minus the epoch's summed TTFT."""
    import gymnasium
    import kvrl.envs  # noqa: F401  (registers the ids)
    env = gymnasium.make("kvrl/Tier-v0", config={
        "workload": {"name": "multi_turn", "num_conversations": 6, "system_prompt_len": 64, "max_turns": 3,
                     "mean_turn_gap_s": 0.5, "arrival": {"rate": 8.0}, "first_prompt_len": {"dist": "constant", "mean": 64},
                     "user_turn_len": {"dist": "constant", "mean": 16}, "output_len": {"dist": "constant", "mean": 16}},
        "num_blocks": 48, "cpu_tier_blocks": 64, "disk_tier_blocks": 64, "profile": "none"})
    from gymnasium.utils.env_checker import check_env
    check_env(env.unwrapped, skip_render_check=True)
    obs, _ = env.reset(seed=1)
    assert env.observation_space.contains(obs)
    total, steps, info = 0.0, 0, {}
    while True:
        obs, reward, terminated, truncated, info = env.step(steps % 3)
        assert reward <= 0 and env.observation_space.contains(obs)
        total += reward
        steps += 1
        assert not terminated
        if truncated:
            break
    summary = info["summary"]
    assert summary["finished"] > 0 and env.unwrapped.driver.finished
    assert total == pytest.approx(-sum(r.first_token_s - r.arrival_s
                                       for r in env.unwrapped.engine.metrics.requests.values()
                                       if r.first_token_s is not None))
    with pytest.raises(ValueError, match="unknown kvrl/Tier-v0 config key"):
        gymnasium.make("kvrl/Tier-v0", config={"num_block": 4})
