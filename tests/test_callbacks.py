"""Engine callbacks (kvrl.engine.callbacks), public preemption and request-state queries."""
from __future__ import annotations

import pytest

from kvrl.engine.callbacks import EngineCallback, StepEvent
from kvrl.engine.request import SeqStatus
from kvrl.plugins.base import PreemptionMode
from tests.helpers import make_engine, make_request


def _requests(n=6, output_len=8):
    return [make_request(f"r{i}", 24, output_len, arrival_s=0.001 * i, seed=i) for i in range(n)]


class _Log(EngineCallback):
    def __init__(self, stop_at=None):
        self.events: list[StepEvent] = []
        self.calls: list[str] = []
        self.stop_at = stop_at

    def on_run_start(self, engine):
        self.calls.append("start")

    def on_step(self, event):
        self.events.append(event)
        return self.stop_at is None or event.step_index < self.stop_at

    def on_run_end(self, engine):
        self.calls.append("end")


def test_callback_sees_every_step_and_the_run_is_unchanged():
    reqs = _requests()
    plain = make_engine()
    expected = plain.run(reqs)
    engine = make_engine()
    log = engine.add_callback(_Log())
    assert engine.run(reqs) == expected
    assert log.calls == ["start", "end"] and engine.stopped_by is None
    assert [e.step_index for e in log.events] == list(range(1, engine.step_index + 1))
    assert log.events[-1].now_s == engine.now
    assert sum(e.duration_s for e in log.events) == pytest.approx(engine.now - engine.metrics.start_s)
    assert [e.batch.num_tokens for e in log.events] == [row[6] + row[7] for row in engine.metrics.steps]
    for e in log.events:
        assert len(e.output.sampled) == len(e.batch.seqs) and e.execute_wall_s >= 0.0
        assert e.duration_s == e.output.elapsed_s      # sim: no policy time charged


def test_returning_false_stops_the_run_after_that_step():
    engine = make_engine()
    stopper, other = _Log(stop_at=3), _Log()
    summary = engine.run(_requests(), callbacks=[stopper, other])
    assert engine.step_index == 3 and engine.stopped_by is stopper
    assert len(other.events) == 3 and other.calls == ["start", "end"]      # every callback saw the step
    assert summary["finished"] < 6
    engine.run([make_request("late", 8, 2, arrival_s=engine.now)])      # a new run starts unstopped
    assert engine.stopped_by is None and engine.sequences("late")[0].status is SeqStatus.FINISHED
    assert len(stopper.events) == len(other.events) == 3     # run-scoped callbacks were removed


def test_bad_callbacks_are_refused_with_a_clear_error():
    engine = make_engine()
    with pytest.raises(TypeError, match="no callable on_step"):
        engine.add_callback(object())

    class _NoBool:
        def on_step(self, event):
            return None

    with pytest.raises(TypeError, match="not a bool"):
        engine.run(_requests(1), callbacks=[_NoBool()])


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_public_preempt_and_request_queries(mode):
    engine = make_engine(num_blocks=64, num_cpu_blocks=64)
    engine.submit(make_request("a", 20, 10, seed=1))
    for _ in range(3):
        engine.step()
    (seq,) = engine.sequences("a")
    assert engine.is_open("a") and not engine.is_open("never")
    with pytest.raises(KeyError, match="'never' was not added"):
        engine.sequences("never")
    before = engine.now
    applied = engine.preempt(seq.seq_id, mode)
    assert applied is PreemptionMode(mode) and seq not in engine.running
    assert seq.status is (SeqStatus.SWAPPED if mode == "swap" else SeqStatus.WAITING)
    assert (engine.now > before) == (mode == "swap")      # a swap-out is executed and takes time
    engine.check_invariants()
    with pytest.raises(ValueError, match="not running"):
        engine.preempt(seq.seq_id, mode)
    while engine.has_unfinished:
        engine.step()
        engine.check_invariants()
    assert not engine.is_open("a") and seq.status is SeqStatus.FINISHED and seq.num_preemptions == 1


def test_swap_without_cpu_blocks_falls_back_to_recompute():
    engine = make_engine(num_cpu_blocks=0)
    engine.submit(make_request("a", 20, 10, seed=1))
    engine.step()
    assert engine.preempt(engine.sequences("a")[0].seq_id, "swap") is PreemptionMode.RECOMPUTE


def test_fidelity_recorder_is_a_callback_and_the_loop_stops_past_the_wall_limit():
    from kvrl.fidelity.pairs import serve_live
    from kvrl.fidelity.replay import StepRecorder

    full, rec = make_engine(), StepRecorder()
    assert serve_live(full, _requests(), rec, max_wall_s=None) is None
    assert len(rec.batches) == len(rec.inside) == full.step_index and full.metrics.num_finished == 6
    assert rec.elapsed == [row[2] for row in full.metrics.steps]
    cut, limited = make_engine(), StepRecorder()
    error = serve_live(cut, _requests(), limited, max_wall_s=1e-9)
    assert "exceeded max_live_wall_s" in error and cut.step_index <= 1 and len(limited.batches) == cut.step_index
    assert cut.metrics.num_finished == 0


def test_fidelity_recorder_counts_what_a_steps_decodes_read_of_the_prefix_cache_together():
    """Six decodes over two prefixes of 64 tokens (four blocks): decodes 0, 2, 4 read prefix A, 1 and 3 read
    prefix B, and decode 5 (16 tokens of context) reads none. Per prefix, every reader but one reads blocks
    another reads, and so does that one: 3 x 64 + 2 x 64 co-read tokens, 2 prefixes, 128 prefix tokens counted
    once. The step model's ``dec_coread`` counts the readers admitted after a prefix's first (3 x 64), whether
    or not another decode of this step reads the same blocks (two readers of two prefixes: none does)."""
    from kvrl.executors.profile import batch_features
    from kvrl.fidelity.replay import batch_co_reads, prefix_reads
    from kvrl.profiling.batches import BatchFactory

    batch = BatchFactory(256, 16, 1000, 4096).batch(decode_lens=[200, 300, 150, 90, 70, 16], shared_prefix=64,
                                                     prefix_groups=2)
    reads = prefix_reads(batch, {})
    assert len(reads) == 5 and len({first for first, _ in reads}) == 2
    assert batch_co_reads(reads) == {"dec_prefixes": 2, "dec_coread_batch": 5 * 64, "dec_prefix_unique": 128}
    assert batch_features(batch)["dec_coread"] == 3 * 64
    alone = BatchFactory(256, 16, 1000, 4096).batch(decode_lens=[200, 300], shared_prefix=64, prefix_groups=2)
    assert batch_co_reads(prefix_reads(alone, {})) == {"dec_prefixes": 2, "dec_coread_batch": 0, "dec_prefix_unique": 128}
    assert batch_co_reads(()) == {"dec_prefixes": 0, "dec_coread_batch": 0, "dec_prefix_unique": 0}


def test_prefix_cache_event_hooks_are_called():
    """Policy's hooks are part of every kind's contract: a prefix cache that overrides them hears
    of every step, finish and preemption."""
    from kvrl import plugins
    from kvrl.engine.config import EngineConfig
    from kvrl.engine.engine import Engine
    from kvrl.executors.hardware import DEVICES, MODEL_SHAPES
    from kvrl.executors.sim import SimExecutor
    from kvrl.plugins.prefix_caches import HashLRU

    class _Counting(HashLRU):
        def __init__(self, params):
            super().__init__(params)
            self.calls = {"step": 0, "finish": 0, "preempt": 0}

        def on_step_end(self):
            self.calls["step"] += 1

        def on_finish(self, seq):
            self.calls["finish"] += 1

        def on_preempt(self, seq, mode):
            self.calls["preempt"] += 1

    cache = _Counting(plugins.create("prefix_cache", "hash_lru").params)
    engine = Engine(EngineConfig(num_blocks=40, block_size=4, num_cpu_blocks=0, max_model_len=4096),
                    SimExecutor(MODEL_SHAPES["qwen3-0.6b"], DEVICES["h200"]), plugins.create("scheduler", "fcfs"),
                    plugins.create("watermark", "fixed", fraction=0.0), plugins.create("eviction", "lifo"), cache)
    summary = engine.run([make_request(f"r{i}", 24, 40, seed=i) for i in range(8)])
    assert summary["finished"] == 8 and summary["preemptions"] > 0
    assert cache.calls == {"step": engine.step_index, "finish": 8, "preempt": summary["preemptions"]}


def test_a_refused_run_callback_leaves_none_registered():
    engine, log = make_engine(), _Log()
    with pytest.raises(TypeError, match="no callable on_step"):
        engine.run(_requests(1), callbacks=[log, object()])
    engine.run(_requests(1))
    assert engine.step_index > 0 and log.events == []
