"""The serving loop (kvrl.engine.loop) and the engine's step generator (Engine.step_iter)."""
from __future__ import annotations

import threading

import pytest

from kvrl.engine.decisions import Shortage
from kvrl.engine.engine import PolicyError
from kvrl.engine.loop import ServingLoop
from kvrl.engine.request import SeqStatus
from kvrl.plugins.base import EvictionDecision, PreemptionMode
from tests.helpers import make_engine, make_request


def _requests(n=8, output_len=24):
    return [make_request(f"r{i}", 24, output_len, arrival_s=0.002 * i, seed=i) for i in range(n)]


def _tight(**kw):
    """An engine whose pool is too small for the requests above: shortages every few steps."""
    return make_engine(num_blocks=24, **kw)


def test_step_iter_answered_by_the_plugin_is_engine_run():
    expected = _tight().run(_requests())
    engine = _tight()
    loop = ServingLoop(engine, _requests())
    steps, shortages = loop.serve_iter(), 0
    try:
        point = next(steps)
        while True:
            assert isinstance(point, Shortage) and point.seq.seq_id in [c.seq_id for c in point.candidates]
            assert point.blocks_needed > point.free_blocks
            shortages += 1
            point = steps.send(engine.eviction.select(point.candidates))
    except StopIteration:
        pass
    assert shortages > 0 and engine.metrics.summary() == expected


def test_the_caller_decides_the_victim_and_mode():
    """Answering every shortage with the oldest candidate, swapped, differs from the LIFO plugin."""
    engine = _tight()
    loop = ServingLoop(engine, _requests())
    steps, victims = loop.serve_iter(), []
    try:
        point = next(steps)
        while True:
            victim = min(point.candidates, key=lambda v: v.seq_id)
            victims.append(victim.seq_id)
            point = steps.send(EvictionDecision(victim.seq_id, PreemptionMode.SWAP))
    except StopIteration:
        pass
    summary = engine.metrics.summary()
    assert victims and summary["finished"] == 8 and engine.metrics.swapped_out_blocks > 0
    assert summary != _tight().run(_requests())


@pytest.mark.parametrize("answer", [EvictionDecision(10_000, PreemptionMode.RECOMPUTE), RuntimeError("agent died")])
def test_a_decision_naming_no_candidate_is_a_policy_error(answer):
    engine = _tight()
    gen = engine.step_iter()
    for r in _requests(4):
        engine.add_request(r)
    point = None
    while point is None:                      # steps until the first shortage
        try:
            point = next(gen)
        except StopIteration:
            gen = engine.step_iter()
    needy = point.seq.request_id
    with pytest.raises(StopIteration):
        gen.send(answer)
    assert engine.metrics.policy_errors == 1 and not engine.is_open(needy)
    assert all(s.status is SeqStatus.ABORTED for s in engine.sequences(needy))
    engine.check_invariants()

    strict = _tight(policy_errors="raise")
    for r in _requests(4):
        strict.add_request(r)
    gen = strict.step_iter()
    while True:
        try:
            next(gen)
            break
        except StopIteration:
            gen = strict.step_iter()
    with pytest.raises(PolicyError, match="eviction policy failed"):
        gen.send(answer)


def test_limits_stop_the_loop_between_iterations():
    engine = make_engine()
    loop = ServingLoop(engine, _requests(), max_steps=3)
    loop.run()
    assert engine.step_index == 3 and loop.stop_reason == "max_steps" and not loop.finished

    engine = make_engine()
    loop = ServingLoop(engine, _requests(), end_s=0.005)
    summary = loop.run()
    assert loop.stop_reason == "end_s" and engine.now >= 0.005 and summary["finished"] < 8

    engine = make_engine()
    loop = ServingLoop(engine, _requests(), max_wall_s=1e-9)
    loop.run()
    assert loop.stop_reason == "max_wall_s" and engine.step_index <= 1

    with pytest.raises(ValueError, match="max_wall_s"):
        ServingLoop(make_engine(), _requests(), max_wall_s=0)
    with pytest.raises(ValueError, match="max_steps"):
        ServingLoop(make_engine(), _requests(), max_steps=-1)


def test_the_loop_idles_until_arrivals_and_reports_submissions():
    engine = make_engine()
    late = [make_request("a", 16, 4, arrival_s=1.0, seed=1), make_request("b", 16, 4, arrival_s=5.0, seed=2),
            make_request("too_long", 5000, 4, arrival_s=5.0, seed=3)]
    seen = []
    loop = ServingLoop(engine, late, on_submit=lambda r: seen.append(r.request_id))
    assert engine.now == 1.0 and engine.metrics.start_s == 1.0
    summary = loop.run()
    assert loop.finished and loop.stop_reason is None and seen == ["a", "b"]
    assert summary["finished"] == 2 and [rid for rid, _ in engine.metrics.rejected] == ["too_long"]
    assert engine.metrics.requests["b"].first_token_s > 5.0


def test_the_preemption_env_runs_no_thread():
    import gymnasium as gym

    import kvrl.envs  # noqa: F401
    from kvrl.envs.config import load_task

    before = threading.active_count()
    env_id, cfg = load_task("preemption", ["workload=synthetic", "workload.num_requests=40", "workload.rate_scale=1.0",
                                           "workload.arrival.rate=30", "workload.output_len.mean=150",
                                           "env.episode.rate_scales=null", "engine.num_blocks=256",
                                           "env.episode.split=null", "env.episode.window_s=null"])
    env = gym.make(env_id, config=cfg)
    env.reset(seed=0)
    assert threading.active_count() == before
    env.step(0)
    env.reset(seed=1)                        # abandons the suspended episode
    assert threading.active_count() == before
    env.close()
