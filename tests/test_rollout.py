"""Rollouts from a copied environment (kvrl.envs.rollout): a deep copy serves exactly as the
original would, and the rollout scores are the finished episode's goodput. A base may be a policy:
a constant policy scores exactly as the constant does, a state-dependent one differs from the
constants and is recorded per decision, and the per-decision base action survives save/load (old
files without it load too)."""
from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

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


def _script(name: str):
    """The module of scripts/<name>.py, loaded from its file (scripts/ is not a package)."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).parents[1] / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _start(env, seed=0):
    """``env`` reset to ``seed``'s episode and stepped three decisions at action 2; the observation."""
    requests, _ = env.session.episode(np.random.default_rng(seed), None)
    obs, _ = env.reset(seed=seed, options={"workload": list(requests)})
    for _ in range(3):
        obs, *_ = env.step(2)
    return obs


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


def test_collect_scores_only_the_seconds_between_skip_and_until(env, monkeypatch):
    """``skip_s``/``until_s`` bound the engine seconds (from the window's first arrival) at which
    decisions are scored; with ``until_s`` the window stops there (nothing more to score)."""
    import kvrl.envs.rollout as rollout

    scored_at, starts = [], []
    real_reset = type(env).reset

    def reset(self, *args, **kwargs):
        starts.append(kwargs["options"]["workload"][0].arrival_s)
        return real_reset(self, *args, **kwargs)

    monkeypatch.setattr(type(env), "reset", reset)
    monkeypatch.setattr(rollout, "action_scores",
                        lambda env, *a, **k: scored_at.append(env.driver.engine.now) or np.zeros(env.action_space.n))
    collect(env, base=2, episodes=1, rng=np.random.default_rng(0), skip_s=1.0, until_s=2.5)
    elapsed = np.asarray(scored_at) - starts[0]
    assert len(elapsed) >= 2 and elapsed.min() >= 1.0 and elapsed.max() < 2.5
    scored_at.clear()
    collect(env, base=2, episodes=1, rng=np.random.default_rng(0), skip_s=0.0, until_s=None)
    assert np.asarray(scored_at).max() - starts[1] >= 2.5      # without until_s the whole window is scored


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


# --- a policy as the base -------------------------------------------------------------------

def _switching(obs) -> int:
    """A state-dependent base: the top watermark (action 6) while under a fifth of the pool is free
    (the first feature), none (action 0) otherwise; it switches back and forth in an episode."""
    return 6 if float(obs[0]) < 0.2 else 0


def test_a_constant_policy_scores_exactly_as_the_constant(env):
    _start(env, seed=1)
    assert np.array_equal(action_scores(env, base=lambda obs: 2), action_scores(env, base=2))
    assert np.array_equal(action_scores(env, base=lambda obs: 5, hold=2), action_scores(env, base=5, hold=2))
    a = collect(env, base=3, episodes=1, rng=np.random.default_rng(4), record=0.2)
    b = collect(env, base=lambda obs: 3, episodes=1, rng=np.random.default_rng(4), record=0.2)
    assert a.scores and np.array_equal(np.asarray(a.scores), np.asarray(b.scores))
    assert np.array_equal(np.asarray(a.observations), np.asarray(b.observations))
    assert a.base_actions == b.base_actions == [3] * len(a.scores)
    assert a.base_scores == b.base_scores


def test_a_state_dependent_policy_is_followed_and_recorded(env):
    obs = _start(env, seed=0)
    scores = action_scores(env, base=_switching)
    for action in (0, 3):                     # the reference: the action once, then the policy's
        trial = copy.deepcopy(env)
        after, *_ = trial.step(action)
        assert scores[action] == finish(trial, _switching, after)
    constants = [finish(copy.deepcopy(env), k) for k in (0, 6)]
    assert finish(copy.deepcopy(env), _switching, obs) not in constants
    assert scores[_switching(obs)] == finish(copy.deepcopy(env), _switching, obs)
    with pytest.raises(ValueError):
        finish(copy.deepcopy(env), _switching)    # a policy needs the current observation

    data = collect(env, base=_switching, episodes=1, rng=np.random.default_rng(0), explore=0.0, record=0.25)
    assert data.base_actions == [_switching(o) for o in data.observations]
    assert set(data.base_actions) == {0, 6}   # the base switched within the episode
    rows = np.arange(len(data.scores))
    assert np.array_equal(np.asarray(data.base_scores), np.asarray(data.scores)[rows, data.base_actions])
    assert np.allclose(data.advantages_pct()[rows, data.base_actions], 0.0)


def test_base_actions_round_trip_and_old_files(tmp_path):
    data = RolloutData()
    rng = np.random.default_rng(0)
    for base in (0, 6, 2):
        data.add(rng.normal(size=4), rng.uniform(100, 200, size=7), base)
    data.save(str(tmp_path / "new.npz"))
    again = RolloutData.load([str(tmp_path / "new.npz")])
    assert again.base_actions == [0, 6, 2] and again.base_scores == data.base_scores
    assert np.array_equal(np.asarray(again.scores), np.asarray(data.scores))

    # a file written before base_actions existed (a constant base, action 2)
    scores = rng.uniform(100, 200, size=(3, 7))
    np.savez_compressed(tmp_path / "old.npz", observations=rng.normal(size=(3, 4)).astype(np.float32),
                        scores=scores, base_scores=scores[:, 2])
    assert RolloutData.load([str(tmp_path / "old.npz")], base=2).base_actions == [2, 2, 2]
    assert RolloutData.load([str(tmp_path / "old.npz")]).base_actions == [2, 2, 2]   # inferred from the scores
    both = RolloutData.load([str(tmp_path / "new.npz"), str(tmp_path / "old.npz")], base=2)
    assert both.base_actions == [0, 6, 2, 2, 2, 2] and len(both.scores) == 6


def test_rcpi_script_takes_an_agent_as_its_base(env, tmp_path, capsys):
    """scripts/rl_rcpi.py: ``--base`` an agent directory acts as the agent's greedy policy, and
    crossval's margin favours each decision's recorded base action."""
    import argparse
    import json

    from stable_baselines3 import DQN

    from kvrl.envs.agent_io import write_meta

    rcpi = _script("rl_rcpi")
    agent = tmp_path / "agent"
    agent.mkdir()
    model = DQN("MlpPolicy", env, seed=0, device="cpu", policy_kwargs={"net_arch": []})
    model.save(str(agent / "best_model.zip"))
    write_meta(agent, "dqn", "kvrl/Watermark-v0", env.config)
    policy = rcpi._base(env, str(agent))
    rng = np.random.default_rng(0)
    observations = rng.uniform(0, 1, size=(40, env.observation_space.shape[0])).astype(np.float32)
    assert [policy(o) for o in observations] == [int(model.predict(o, deterministic=True)[0]) for o in observations]
    assert rcpi._base(env, "0.03") == rcpi._constant(env, "0.03") == 2 and rcpi._constant(env, str(agent)) is None

    files = []
    for k in range(2):
        data = RolloutData()
        for obs in observations[20 * k:20 * (k + 1)]:
            data.add(obs, rng.uniform(100, 110, size=7), int(rng.integers(7)))
        files.append(str(tmp_path / f"d{k}.npz"))
        data.save(files[-1])
    common = dict(task="pool512", overrides=OVERRIDES[1:], base=str(agent), seed=0, data=files, epochs=2, batch=16,
                  lr=1e-3, clip_pct=20.0)
    rcpi.crossval(argparse.Namespace(**common, margins=[0.0, 1e6], weight_decay=1e-3, fold_margin=False))
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["folds"] == 2 and out["decisions"] == 40
    assert out["deviation_pct_margin_1000000.0"] == 0.0 and out["realised_gain_pct_margin_1000000.0"] == [0.0, 0.0]
    assert "recommended_margin" in out
    per_file = [RolloutData.load([f], base=None).advantages_pct().mean(axis=0) for f in files]
    assert np.allclose([m for m, _ in out["action_gain_pct"]], np.mean(per_file, axis=0), atol=1e-3)
    rcpi.fit(argparse.Namespace(**common, out=str(tmp_path / "fitted"), weight_decay=1e-4, val_fraction=0.2,
                                margin_pct=0.5))
    summary = json.loads((tmp_path / "fitted" / "rcpi.json").read_text())
    assert summary["margin"] == "targets" and (tmp_path / "fitted" / "best_model.zip").is_file()


def test_guessed_scores_do_not_see_the_future_and_average_their_draws(env):
    """With a Guess, the arrivals to come and every output length are the guess's: a copy whose real
    future differs scores the same (the clairvoyant scores differ); K draws are the mean of the K
    one-draw scores taken in turn from the same generator, every action served on the same draws."""
    import dataclasses

    from kvrl.envs.guess import Guess

    _start(env, seed=1)
    loop = env.driver.loop
    assert loop.next_index < len(loop.pending) and env.driver.engine.metrics.finished_output_lens
    other = copy.deepcopy(env)
    o_loop = other.driver.loop
    o_loop.pending = o_loop.pending[:o_loop.next_index] + [
        dataclasses.replace(r, output_len=r.output_len + 7) for r in o_loop.pending[o_loop.next_index + 3:]]
    for seq in other.driver.engine.live_sequences():
        other.driver.engine.set_output_len(seq, seq.request.output_len + 5)
    assert not np.array_equal(action_scores(env, 2), action_scores(other, 2))
    guess = Guess(window_s=1.0, horizon_s=2.0, samples=1)
    mine, theirs = action_scores(env, 2, 1, guess, np.random.default_rng(3)), \
        action_scores(other, 2, 1, guess, np.random.default_rng(3))
    assert np.array_equal(mine, theirs) and len(set(mine.round(6))) > 1
    rng = np.random.default_rng(4)
    one = [action_scores(env, 2, 1, guess, rng) for _ in range(2)]
    two = action_scores(env, 2, 1, dataclasses.replace(guess, samples=2), np.random.default_rng(4))
    assert np.allclose(two, (one[0] + one[1]) / 2, rtol=1e-12)
    with pytest.raises(ValueError, match="rng"):
        action_scores(env, 2, 1, guess)


def test_set_output_len_refuses_a_length_already_reached(env):
    _start(env, seed=2)
    engine = env.driver.engine
    seq = next(s for s in engine.live_sequences() if s.output_token_ids)
    with pytest.raises(ValueError, match="not above"):
        engine.set_output_len(seq, len(seq.output_token_ids))


def test_rcpi_base_is_a_rules_index_on_a_task_with_rules():
    rcpi = _script("rl_rcpi")
    _, _, planner = rcpi._env("throttle_planner", ["workload.max_requests=5"], copyable=True)
    assert planner.action_space.n == 7 and rcpi._constant(planner, "3") == 3
    for bad in ("7", "0.01"):
        with pytest.raises(SystemExit, match="rule's index"):
            rcpi._constant(planner, bad)
    _, _, plain = rcpi._env("pool512", ["workload.max_requests=5"], copyable=True)
    with pytest.raises(SystemExit, match="neither a saved agent"):
        rcpi._constant(plain, "no-such-agent")


def test_action_mix_labels_name_the_rules_or_the_bins():
    mix = _script("rl_action_mix")
    for task, first, n in (("throttle_planner", "token_ratio(clip_max_new_tokens=4096, min_ratio=0.05)", 7),
                           ("throttle", "0", 6)):
        env_id, cfg = load_task(task, ["workload.max_requests=5"])
        labels = mix.action_labels(gym.make(env_id, config=cfg).unwrapped)
        assert labels[0] == first and len(labels) == n


def test_action_mix_first_decisions_replaced_by_a_constant(tmp_path, monkeypatch, capsys):
    """``--first N --first_action A``: the agent served with its first N decisions at A; with N past the
    episode's end that is A throughout, with N = 0 the agent itself."""
    import re
    import sys

    from stable_baselines3 import DQN

    from kvrl.envs.agent_io import write_meta

    mix = _script("rl_action_mix")
    env_id, cfg = load_task("throttle_planner")
    env = gym.make(env_id, config=cfg).unwrapped
    agent = tmp_path / "agent"
    agent.mkdir()
    DQN("MlpPolicy", env, seed=0, device="cpu", policy_kwargs={"net_arch": []}).save(str(agent / "best_model.zip"))
    write_meta(agent, "dqn", env_id, env.config)
    goodputs = {}
    for first in (0, 10_000):
        monkeypatch.setattr(sys, "argv", ["rl_action_mix.py", "--task", "throttle_planner", "--first", str(first),
                                          "--first_action", "1", str(agent)])
        mix.main()
        goodputs[first] = [float(x) for x in re.findall(r"goodput ([0-9.]+) tok/s", capsys.readouterr().out)]
    throughout, agent_alone, replaced_none = goodputs[0]
    assert agent_alone != throughout                        # (seed 0's agent does not act as fixed 0.0)
    assert replaced_none == agent_alone and goodputs[10_000][2] == throughout == goodputs[10_000][0]


def test_rcpi_recommends_a_margin_only_where_the_crossval_gain_excludes_zero():
    """crossval's recommended margin: the best mean among margins whose interval lies above zero; none
    (keep the base) when every interval reaches zero, as in session 45's second round."""
    rcpi = _script("rl_rcpi")
    assert rcpi.recommended_margin({0.0: (0.224, 0.089), 0.05: (0.219, 0.084), 0.25: (0.006, 0.016)}) == 0.0
    assert rcpi.recommended_margin({0.0: (0.30, 0.35), 0.1: (0.20, 0.05)}) == 0.1
    assert rcpi.recommended_margin({0.0: (0.012, 0.058), 0.05: (0.008, 0.058), 0.1: (0.005, 0.014)}) is None
