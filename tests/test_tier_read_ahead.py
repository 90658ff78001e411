"""Disk-tier read-ahead (issue #20, kvrl.engine.tier_read_ahead): reads issued at a prefix lookup
into bounded staging buffers deliver the same bytes as the synchronous read, never a stale or
failed read's bytes; the sim charges only the part of an early read not yet elapsed; greedy tokens
with read-ahead equal transformers' (live, CPU, tiny model: tests/test_tiers.py)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from kvrl.engine.batch import ScheduledBatch, ScheduledSeq
from kvrl.engine.config import EngineConfig
from kvrl.engine.disk_tier import DEFAULT_DISK_BANDWIDTH, DiskStore
from kvrl.engine.request import Sequence
from kvrl.engine.tier_read_ahead import DiskReadAhead
from kvrl.executors.hardware import DEVICES, MODEL_SHAPES
from kvrl.executors.sim import SimExecutor
from tests.helpers import make_request
from tests.test_tiers import _fill_then_reuse, _live_engine, _prompts, tier_engine, tiny_checkpoint  # noqa: F401

BLOCK = 4096


def _store_with_blocks(tmp_path, n):
    store = DiskStore(8, BLOCK, str(tmp_path), threads=2)
    data = np.random.default_rng(0).integers(0, 256, (n, BLOCK), dtype=np.uint8)
    for b in range(n):
        store.write(b, data[b])
    store.drain()
    return store, data


def test_read_ahead_delivers_the_synchronous_reads_bytes(tmp_path):
    store, data = _store_with_blocks(tmp_path, 4)
    ra = DiskReadAhead(4, BLOCK, store=store)
    ra.issue([(b, f"h{b}") for b in range(4)])
    for b in (2, 0, 3, 1):
        sync = np.zeros(BLOCK, np.uint8)
        store.read(b, sync).result()
        staged = np.zeros(BLOCK, np.uint8)
        assert ra.finish_into(ra.take(b, f"h{b}"), staged)
        assert np.array_equal(staged, sync) and np.array_equal(staged, data[b])
    assert ra.stats.issued_blocks == ra.stats.used_blocks == 4 and ra.num_free == 4
    ra.check_invariants()


def test_staging_memory_is_bounded_and_overflow_is_counted(tmp_path):
    store, _ = _store_with_blocks(tmp_path, 5)
    ra = DiskReadAhead(2, BLOCK, store=store)
    assert ra.staging_bytes == 2 * BLOCK
    ra.issue([(b, b) for b in range(5)])
    assert ra.num_staged == 2 and ra.stats.issued_blocks == 2 and ra.stats.full_blocks == 3
    assert ra.take(4, 4) is None                       # not staged: its step reads it synchronously
    ra.issue([(0, 0), (1, 1)])                         # already staged: nothing new
    assert ra.stats.issued_blocks == 2
    assert ra.finish_into(ra.take(0, 0), np.zeros(BLOCK, np.uint8))
    ra.issue([(4, 4)])                                 # a freed buffer is reused
    assert ra.num_staged == 2 and ra.stats.issued_blocks == 3
    ra.check_invariants()
    with pytest.raises(ValueError, match="engine.disk_tier_read_ahead_blocks"):
        DiskReadAhead(0, BLOCK, store=store)


def test_a_read_issued_before_a_rewrite_is_never_used(tmp_path):
    """A disk block written anew after its read was issued (invalidate), or no longer holding the
    identity (sweep), or asked for under another identity, has no staged read to use."""
    store, data = _store_with_blocks(tmp_path, 3)
    ra = DiskReadAhead(3, BLOCK, store=store)
    ra.issue([(0, "a"), (1, "b"), (2, "c")])
    ra.invalidate(0)
    store.write(0, data[2]).result()
    assert ra.take(0, "a") is None
    ra.sweep(lambda slot, h: slot != 1)
    assert ra.take(1, "b") is None
    assert ra.take(2, "other") is None and ra.take(2, "c") is not None
    assert ra.stats.dropped_blocks == 2
    store.drain()
    ra.sweep(lambda slot, h: True)                     # dropped reads' buffers come back once done
    assert ra.num_free == 2                            # the third is the taken entry's, not finished
    ra.close()


def test_a_failed_read_is_reported_not_copied(tmp_path):
    store = DiskStore(4, BLOCK, str(tmp_path), threads=1)
    ra = DiskReadAhead(2, BLOCK, store=store)
    ra.issue([(3, "x"), (2, "y")])                     # no such files
    store.drain()                                      # a failed read is not a drain error
    assert ra.failed(3, "x") and not ra.failed(3, "x")   # reported once, then gone
    dest = np.full(BLOCK, 7, np.uint8)
    assert not ra.finish_into(ra.take(2, "y"), dest)
    assert (dest == 7).all() and ra.stats.errors == 2 and ra.num_free == 2


def test_a_failed_read_does_not_poison_the_blocks_next_write(tmp_path):
    """Each I/O reports its own failure: a write after a failed read of the block succeeds and
    a read after it returns the written bytes."""
    store = DiskStore(2, BLOCK, str(tmp_path), threads=1)
    with pytest.raises(FileNotFoundError):
        store.read(1, np.zeros(BLOCK, np.uint8)).result()
    data = np.arange(BLOCK, dtype=np.uint8)
    store.write(1, data).result()
    back = np.zeros(BLOCK, np.uint8)
    store.read(1, back).result()
    assert np.array_equal(back, data)
    store.drain()


def test_the_sim_charges_only_the_part_of_an_early_read_not_yet_elapsed():
    """Reads issued ahead run on the sim's disk read queue from their issue; a step whose tier
    loads use them waits only for what is left: nothing after a step longer than the reads,
    all of it (as a synchronous read) when used at once."""
    ex = SimExecutor(MODEL_SHAPES["llama-3-8b"], DEVICES["h200"], profile="none")
    long_step = ScheduledSeq(Sequence(0, make_request("long", 4096)), 0, 4096, 1)
    item = ScheduledSeq(Sequence(1, make_request("x", 64)), 32, 32, 1)
    read_s = DEFAULT_DISK_BANDWIDTH.read_s(2 * ex.kv_block_bytes(16))

    def loading_step(ahead: bool, compute_between: bool) -> float:
        ex.allocate_kv(512, 0, 16)
        ex.allocate_tier(8, 16)
        if ahead:
            assert ex.issue_disk_read_ahead(2) == pytest.approx(read_s)
        if compute_between:
            assert ex.execute(ScheduledBatch(seqs=[long_step])).elapsed_s > read_s
        if ahead:
            waited = ex.await_disk_reads(read_s)
            assert waited == pytest.approx(0.0 if compute_between else read_s)
        return ex.execute(ScheduledBatch(seqs=[item], tier_in=[(0, 2), (1, 3)])).elapsed_s

    plain = loading_step(False, False)
    assert loading_step(True, False) - plain == pytest.approx(read_s, rel=1e-6)
    assert loading_step(True, True) == pytest.approx(loading_step(False, True), rel=1e-9)


def test_read_ahead_in_the_sim_keeps_the_hits_and_counts_its_reads():
    """The sim disk workload of tests/test_tiers.py with read-ahead: the same disk hits, every
    one served by a read issued at a lookup, never more staged than the buffers."""
    prompts, fillers = _prompts(2, 33, 1), _prompts(12, 33, 2)
    base = _fill_then_reuse(tier_engine(tier_blocks=16, disk_tier_blocks=128, max_num_batched_tokens=40),
                            prompts, fillers)
    engine = tier_engine(tier_blocks=16, disk_tier_blocks=128, max_num_batched_tokens=40,
                         disk_tier_read_ahead_blocks=4)
    ahead = _fill_then_reuse(engine, prompts, fillers)
    assert ahead["tier_disk_loaded_blocks"] == base["tier_disk_loaded_blocks"] > 0
    assert ahead["tier_disk_read_ahead_used_blocks"] + ahead["tier_disk_read_ahead_full_blocks"] >= \
        ahead["tier_disk_loaded_blocks"] > 0
    assert ahead["tier_disk_read_ahead_used_blocks"] > 0
    assert ahead["tier_disk_read_ahead_issued_blocks"] >= ahead["tier_disk_read_ahead_used_blocks"]
    assert ahead["tier_disk_read_ahead_blocks"] == 4 and ahead["tier_disk_read_ahead_staging_bytes"] == 0
    assert "tier_disk_read_ahead_used_blocks" not in base


def test_read_ahead_config_errors_name_the_key():
    with pytest.raises(ValueError, match="engine.disk_tier_read_ahead_blocks"):
        EngineConfig(cpu_tier_blocks=8, disk_tier_blocks=8, disk_tier_read_ahead_blocks=-1)
    with pytest.raises(ValueError, match="engine.disk_tier_read_ahead_blocks > 0 needs engine.disk_tier_blocks"):
        EngineConfig(cpu_tier_blocks=8, disk_tier_read_ahead_blocks=4)


# ---------------------------------------------------------------------------------------- live (CPU)
def _disk_round(tiny_checkpoint, tmp_path):
    """A live engine with read-ahead whose first prompt's blocks were pushed to disk."""
    rng = np.random.default_rng(4)
    system = rng.integers(0, 512, 20, dtype=np.int32)
    prompt = np.concatenate([system, rng.integers(0, 512, 9, dtype=np.int32)])
    fillers = [rng.integers(0, 512, 30, dtype=np.int32) for _ in range(6)]
    engine = _live_engine(tiny_checkpoint, tier_blocks=12, disk_tier_blocks=64, disk_tier_dir=str(tmp_path),
                          disk_tier_read_ahead_blocks=8)
    engine.run([make_request("p", tokens=prompt, output_len=6)]
               + [make_request(f"f{i}", tokens=f, output_len=6, arrival_s=1.0 + i) for i, f in enumerate(fillers)])
    return engine, prompt


def test_a_read_ahead_that_failed_makes_its_block_a_miss(tiny_checkpoint, tmp_path):
    """The prompt's block files vanish after its lookup issued their reads: the next lookup finds
    the failed reads, ends the match there (the blocks leave the disk tier), the prompt is
    recomputed, and its greedy tokens still equal transformers'."""
    from tests.test_live_exactness import hf_greedy
    engine, prompt = _disk_round(tiny_checkpoint, tmp_path)
    alloc = engine.allocator
    engine.add_request(make_request("q", tokens=prompt, output_len=6, arrival_s=engine.now))
    seq = engine.sequences("q")[0]
    for path in tmp_path.glob("block-*.kv"):
        path.unlink()
    assert any(level == 2 for level, _ in alloc.match_prefix(seq).tier_blocks)
    alloc.disk_store.drain()
    assert not any(level == 2 for level, _ in alloc.match_prefix(seq).tier_blocks)
    summary = engine.run([])
    engine.check_invariants()
    assert summary["tier_disk_read_ahead_errors"] > 0 and summary["tier_disk_loaded_blocks"] == 0
    assert engine.outputs("q")[0] == hf_greedy(tiny_checkpoint, [prompt], 6)[0]


def test_a_staged_read_that_failed_is_read_again_or_raises_naming_the_file(tiny_checkpoint, tmp_path):
    """At the step that loads it, a failed staged read is read again synchronously: the right
    bytes if the file is back, else an IOError naming the block file (never the buffer's bytes)."""
    engine = _live_engine(tiny_checkpoint, tier_blocks=4, disk_tier_blocks=4, disk_tier_dir=str(tmp_path),
                          disk_tier_read_ahead_blocks=2)
    alloc, pool = engine.allocator, engine.executor.tier_pool
    pool.normal_()
    want = pool[0].clone()
    alloc.read_ahead.issue([(3, "h")])                 # block-3.kv does not exist yet
    alloc.disk_store.drain()
    alloc._move_disk([(0, 3)], [])                     # now it does (a demotion writes it)
    alloc.disk_store.drain()
    pool[1].zero_()
    alloc._move_disk([], [(3, 1, "h")])
    assert torch.equal(pool[1], want) and alloc.read_ahead.stats.errors == 1
    alloc.read_ahead.issue([(2, "g")])                 # never written
    with pytest.raises(IOError, match=r"disk tier: block 2 \(.*block-2\.kv\)"):
        alloc._move_disk([], [(2, 2, "g")])
