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
