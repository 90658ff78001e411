"""The engine's speed devices (issue #15) change nothing anyone can see."""
from __future__ import annotations

import gc

from tests.helpers import make_engine, make_request


def _requests(n: int = 6) -> list:
    return [make_request(f"r{i}", prompt_len=8 + i, output_len=12, arrival_s=0.0) for i in range(n)]


def test_decode_items_are_reused_only_when_nobody_holds_them():
    """A decode's ScheduledSeq is updated in place from step to step while no one else references
    it; a batch someone keeps (a callback here) keeps its own items, unchanged by later steps."""
    engine = make_engine()
    for request in _requests():
        engine.add_request(request)
    engine.step()                                   # prefills
    first = engine.step()                           # decodes; the batch is held here
    seen = [(id(item), item.seq.seq_id, item.start, item.num_tokens, item.num_samples) for item in first.seqs]
    second = engine.step()                          # `first` still held: every decode item is new
    assert [(id(i), i.seq.seq_id, i.start, i.num_tokens, i.num_samples) for i in first.seqs] == seen
    assert not {id(i) for i in first.seqs} & {id(i) for i in second.seqs}
    assert all(b.start == a.start + 1 for a, b in zip(first.seqs, second.seqs))
    ids = {id(i) for i in (*first.seqs, *second.seqs)}
    del first, second                               # nobody holds the items: the next step reuses them
    third = engine.step()
    assert all(item.start == item.seq.num_computed - 1 and item.num_tokens == 1 for item in third.seqs)
    # a decode that needs a new block takes the general path (a new item); all others are reused
    reused = [item for item in third.seqs if item.seq.num_computed % engine.config.block_size != 1]
    assert reused and all(id(item) in ids and item.seq.decode_item is item for item in reused)
    while engine.has_unfinished:                    # finished sequences keep no item (no reference cycle)
        engine.step()
    assert all(s.decode_item is None for group in engine._groups.values() for s in group.seqs)


def test_objects_made_during_a_run_join_the_oldest_generation():
    """With pause_gc, what the run made is not left in the young generations at its end (the first
    young collection would walk every object the run kept); on the old code a record made during
    the run was still in generation 0 or 1 right after it."""
    assert gc.get_freeze_count() == 0 and gc.isenabled()
    engine = make_engine()
    engine.run(_requests())
    record = engine.metrics.requests["r0"]
    assert gc.is_tracked(record)
    assert not any(o is record for o in gc.get_objects(generation=0))
    assert not any(o is record for o in gc.get_objects(generation=1))
    assert any(o is record for o in gc.get_objects(generation=2))
    assert gc.get_freeze_count() == 0 and gc.isenabled()


def test_plain_decodes_are_priced_and_sampled_as_their_items_say():
    """The sim prices a planned batch's plain decodes from the planner's summary and leaves their
    tokens to its rule: the same step time and tokens as from the items one by one; callbacks see
    every token as a list, and the summary is dropped once the step has run."""
    import copy
    import dataclasses

    engine = make_engine(num_blocks=256)
    for request in _requests(8) + [make_request("fork", prompt_len=9, output_len=12, n=3)]:
        engine.add_request(request)
    engine.step()                                   # prefills (and the fork)
    engine.step()
    batch = engine.schedule()
    plain = batch.plain
    assert plain.count >= 8 and plain.end == len(batch.seqs) and plain.count + len(plain.others) == plain.end
    summed, itemwise = copy.deepcopy(engine.executor), copy.deepcopy(engine.executor)
    out = summed.execute(batch)
    ref = itemwise.execute(dataclasses.replace(batch, plain=None))
    assert ref.decode_tokens is None and None not in ref.sampled
    assert sum(tokens is None for tokens in out.sampled) == plain.count
    assert out.elapsed_s == ref.elapsed_s
    out.resolve(batch)
    assert out.sampled == ref.sampled
    seen = []

    class Keep:
        def on_step(self, event):
            seen.append(event)
            return True

    engine.add_callback(Keep())
    engine._execute(batch, engine._planned_aborts)
    assert seen[0].output.sampled == ref.sampled and batch.plain is None
    assert [s.output_token_ids[-1] for s in (i.seq for i in batch.seqs)] == [t[0] for t in ref.sampled]


def test_append_blocks_takes_what_extend_takes_or_nothing():
    """A decode's new block at a block boundary (PagedAllocator.append_blocks): the same blocks, in
    the same order, as extend would take (uncached free ones, then reclaimed cached ones), or
    nothing at all when too few are free; also one block at a time (append_blocks' own one-block
    path, from the free list and from the cached blocks)."""
    from kvrl.engine.request import Sequence

    engines = [make_engine(num_blocks=8, block_size=4) for _ in range(2)]
    for engine in engines:   # 3 full prompt blocks stay cached (evictable) after the run
        engine.run([make_request("a", prompt_len=12, output_len=1, seed=1)])
    alloc, twin = engines[0].allocator, engines[1].allocator
    assert alloc.num_free_blocks == 8 and alloc.prefix_cache.num_evictable == 3
    table: list[int] = []
    assert not alloc.append_blocks(table, 9) and table == [] and alloc.num_free_blocks == 8
    assert alloc.append_blocks(table, 1) and alloc.num_free_blocks == 7 and alloc.prefix_cache.num_evictable == 3
    assert alloc.append_blocks(table, 6) and alloc.num_free_blocks == 1 and alloc.prefix_cache.num_evictable == 1
    assert alloc.append_blocks(table, 1) and alloc.num_free_blocks == 0
    assert not alloc.append_blocks(table, 1) and len(table) == 8
    seq = Sequence(99, make_request("b", prompt_len=32, seed=2))
    twin.extend(seq, 32)
    assert seq.block_table == table and twin.ref_counts == alloc.ref_counts
    assert alloc.prefix_cache.num_cached == twin.prefix_cache.num_cached == 0


def test_a_running_sequences_partial_block_entry_lags_and_is_settled():
    """apply counts a decode token inside a block without writing the block's fill entry
    (PagedAllocator.exact_tail_fill): the entry of a running sequence's partial block lags behind
    its computed tokens, yet the stored-token counter stays exact step after step (with forks and
    finishes, which settle the entry before releasing the block); check_invariants catches a
    drifted counter and an entry that runs ahead."""
    import pytest

    engine = make_engine(num_blocks=256)
    longer = [make_request(f"long{i}", prompt_len=10 + i, output_len=40) for i in range(3)]
    for request in _requests(8) + longer + [make_request("fork", prompt_len=9, output_len=12, n=3)]:
        engine.add_request(request)
    lagged = False
    while engine.has_unfinished:
        engine.step()
        engine.check_invariants()
        fill = engine.allocator.block_fill
        lagged |= any(fill[s.block_table[s.num_computed // 4]] < s.num_computed % 4 for s in engine.running
                      if s.num_computed % 4)
        if engine.metrics.num_finished and lagged and any(s.num_computed % 4 > 1 for s in engine.running):
            break
    assert lagged and engine.metrics.num_finished
    seq = next(s for s in engine.running if s.num_computed % 4 > 1)
    block = seq.block_table[seq.num_computed // 4]
    engine.allocator.add_stored_tokens(-1)
    with pytest.raises(AssertionError, match="stored-token counter"):
        engine.check_invariants()
    engine.allocator.add_stored_tokens(1)
    engine.allocator.block_fill[block] = seq.num_computed % 4 + 1
    with pytest.raises(AssertionError, match="exceeds its computed tokens"):
        engine.check_invariants()


def test_decode_token_offsets_give_the_rules_tokens():
    """apply computes a plain decode's token from the rule's per-sequence offsets, ``(offsets[seq_id]
    + start * b) % m``: the same token as the rule itself, also for sequence ids whose products
    need more than one CPython digit, and the offsets are kept (extended, not rebuilt) between calls."""
    from kvrl.engine.batch import DecodeTokens, ScheduledSeq
    from kvrl.engine.request import Sequence

    rule = DecodeTokens(2654435761 % 151936, 40503, 7 + 40503, 151936)
    request = make_request("r", prompt_len=4)
    first = rule.seq_offsets(10)
    assert len(first) >= 10
    ids = [0, 1, 9, 9_431, 9_432, 123_456, 199_999]    # seq_id * a needs two digits from 9,432 on
    offsets = rule.seq_offsets(max(ids) + 1)
    assert offsets is first and len(offsets) == max(ids) + 1
    for seq_id in ids:
        for start in (0, 15, 4_095, 131_071):
            item = ScheduledSeq(Sequence(seq_id, request), start, 1, 1)
            assert (offsets[seq_id] + start * rule.b) % rule.m == rule.token(item)
