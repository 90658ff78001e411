"""Rollouts from a copied environment (kvrl.envs.rollout): a deep copy serves exactly as the
original would, and the rollout scores are the finished episode's goodput."""
from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
import pytest

import kvrl.envs  # noqa: F401
from kvrl.envs.config import load_task
from kvrl.envs.rollout import RolloutData, action_scores, collect, finish

OVERRIDES = ["engine.prefix_hash=xxh3", "workload.num_requests=300", "env.episode.window_s=4.0",
             "env.decision.epoch_s=0.5", "env.episode.step_time_sigma=0.0"]


@pytest.fixture(scope="module")
def env():
    env_id, cfg = load_task("pool512", OVERRIDES)
    return gym.make(env_id, config=cfg).unwrapped


def _start(env, seed=0):
    requests, _ = env.session.episode(np.random.default_rng(seed), None)
    env.reset(seed=seed, options={"workload": list(requests)})
    for _ in range(3):
        env.step(2)


def test_copy_serves_like_the_original(env):
    _start(env)
    twin = copy.deepcopy(env)
    a = [env.step(i % 7)[:3] for i in range(6)]
    b = [twin.step(i % 7)[:3] for i in range(6)]
    for (obs_a, r_a, t_a), (obs_b, r_b, t_b) in zip(a, b):
        assert np.array_equal(obs_a, obs_b) and r_a == r_b and t_a == t_b
    assert finish(env, 2) == finish(twin, 2)


def test_copy_with_the_default_block_hash_serves_like_the_original():
    """The default (keyed blake2b) identity hash: the copy serves as the original does."""
    env_id, cfg = load_task("pool512", OVERRIDES[1:])
    original = gym.make(env_id, config=cfg).unwrapped
    _start(original)
    assert original.driver.engine.allocator._hasher.name == "blake2b"
    twin = copy.deepcopy(original)
    assert [original.step(i % 7)[1] for i in range(4)] == [twin.step(i % 7)[1] for i in range(4)]


def test_scores_leave_the_env_untouched_and_match_finishing(env):
    _start(env, seed=1)
    now = env.driver.engine.now
    scores = action_scores(env, base=2)
    assert env.driver.engine.now == now and scores.shape == (7,)
    assert scores[2] == finish(copy.deepcopy(env), 2)     # the base action held = finishing at base
    assert len(set(scores.round(6))) > 1                  # the pool is pressured: actions differ


def test_collect_and_round_trip(env, tmp_path):
    data = collect(env, base=2, episodes=1, rng=np.random.default_rng(0), record=0.15)
    assert data.scores and len(data.observations) == len(data.scores)
    adv = data.advantages_pct()
    assert np.allclose(adv[:, 2], 0.0)
    data.save(str(tmp_path / "d.npz"))
    again = RolloutData.load([str(tmp_path / "d.npz")])
    assert np.array_equal(np.asarray(again.scores), np.asarray(data.scores))


def test_victim_deviations_start_from_the_heuristic_they_deviate_from(tmp_path):
    """scripts/rl_victim_deviation.py: the base episode (slot 0 = slo_slack, swap) is kvrl-eval's
    slo_slack job, and every valid other action is tried at each drawn decision."""
    import json
    import subprocess
    import sys

    from kvrl.apps.eval import Job, Policy, run_job

    rules = "env.features.slot_rules=[{name: slo_slack, mode: swap},lifo]"
    small = [rules, "env.features.slo=true", "env.features.top_k=2", "workload.horizon_s=40", "engine.num_blocks=256"]
    out = tmp_path / "dev.jsonl"
    proc = subprocess.run([sys.executable, "scripts/rl_victim_deviation.py", "--seeds", "0", "--decisions", "2",
                           "--out", str(out), "--", *small], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    _, cfg = load_task("classes_preemption", ["seed=0", *small])
    plugin = {"name": "slo_slack", "mode": "swap"}
    job = run_job(cfg.run, "eviction", Job(Policy("s", "x", plugin), "val", 0), 0.8)
    assert len(rows) == 2 and all(r["base_goodput"] == job["goodput_tok_s"] for r in rows)
    assert all(r["goodput"] and "1" not in r["goodput"] for r in rows)      # the base action is not a deviation
    assert "best deviation per decision" in proc.stdout
