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
