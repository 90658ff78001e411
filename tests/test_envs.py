"""The Gymnasium environments and the ``agent`` plugins: API conformance, determinism, truncation,
bad actions, replay, and the same decisions inside and outside the environment."""
from __future__ import annotations

import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import kvrl.envs  # noqa: F401  (registers the ids)
from kvrl.envs.agent_io import AgentNotFound, load_agent, write_meta
from kvrl.envs.config import load_task
from kvrl.workloads import build_workload

# A small, fast scenario with memory pressure: 80 synthetic requests on a 256-block pool.
SMALL = ["workload=synthetic", "workload.num_requests=80", "workload.arrival.rate=30", "workload.output_len.mean=150",
         "workload.rate_scale=1.0", "env.episode.rate_scales=null",
         "engine.num_blocks=256", "env.episode.split=null", "env.episode.window_s=null"]
TASKS = ("watermark", "preemption")


def make(task, *overrides):
    env_id, cfg = load_task(task, [*SMALL, *overrides])
    return gym.make(env_id, config=cfg)


def same(a: dict, b: dict) -> bool:
    """Equal metric dicts, NaN equal to NaN (bit for bit otherwise)."""
    return a.keys() == b.keys() and all(a[k] == b[k] or (a[k] != a[k] and b[k] != b[k]) for k in a)


def rollout(env, seed=None, action=0, options=None):
    """(observations, rewards, last info) of one episode with a constant action."""
    obs, _ = env.reset(seed=seed, options=options)
    observations, rewards = [obs], []
    while True:
        obs, reward, terminated, truncated, info = env.step(action)
        observations.append(obs)
        rewards.append(reward)
        if terminated or truncated:
            return observations, rewards, info


@pytest.mark.parametrize("task", TASKS)
def test_check_env_passes(task):
    env = make(task)
    check_env(env.unwrapped, skip_render_check=True)


@pytest.mark.parametrize("task", TASKS)
def test_seeded_windows_are_reproducible_bit_for_bit(task):
    env = make(task, "env.episode.window_s=0.5")
    a_obs, a_rew, a_info = rollout(env, seed=7)
    b_obs, b_rew, b_info = rollout(env, seed=7)
    assert [o.tobytes() for o in a_obs] == [o.tobytes() for o in b_obs]
    assert a_rew == b_rew and same(a_info["metrics"], b_info["metrics"])
    c_obs, _, _ = rollout(env, seed=8)                       # another seed: another window
    assert [o.tobytes() for o in c_obs] != [o.tobytes() for o in a_obs]


@pytest.mark.parametrize("task", TASKS)
def test_truncated_at_trace_end_with_every_request_served(task):
    env = make(task)
    _, rewards, info = rollout(env, seed=0)
    assert info["trace_end"] and info["metrics"]["finished"] == 80
    assert all(np.isfinite(rewards))


def test_truncated_at_the_window_time_limit():
    env = make("watermark", "env.episode.window_s=0.5", "env.episode.start_s=0.5")
    _, _, info = rollout(env, seed=0)
    assert not info["trace_end"] and info["engine_time_s"] >= 1.0


def test_reward_components_are_in_info_and_sum_to_the_reward():
    env = make("preemption", "env.reward.recompute_penalty=0.5")
    env.reset(seed=0)
    _, reward, _, _, info = env.step(0)
    parts = [v for k, v in info.items() if k.startswith("reward_")]
    assert len(parts) == 3 and reward == pytest.approx(sum(parts))
    assert info["reward_recompute_penalty"] == pytest.approx(-0.5 * info["recomputed_tokens"] / 100.0)


def _engine_run(task, plugin_kind, plugin, *overrides):
    """Metrics of Engine.run on the SMALL scenario with ``plugin`` in the ``plugin_kind`` slot."""
    from omegaconf import OmegaConf

    from kvrl.builder import build_engine, to_dict

    _, cfg = load_task(task, [*SMALL, *overrides])
    run = OmegaConf.create({**cfg.run, plugin_kind: plugin})
    engine = build_engine(run, record_steps=False)
    requests = build_workload(to_dict(run.workload), vocab_size=engine.executor.vocab_size,
                              max_model_len=engine.config.max_model_len)
    return engine.run(requests)


@pytest.mark.parametrize("task,kind,plugin,action", [
    ("watermark", "watermark", {"name": "fixed", "fraction": 0.01}, 0),          # bins[0] = 0.01
    ("preemption", "eviction", {"name": "lifo", "mode": "recompute"}, 0),        # slot 0 = LIFO victim
])
def test_constant_action_episode_equals_engine_run_of_the_heuristic(task, kind, plugin, action):
    _, _, info = rollout(make(task), seed=0, action=action)
    assert same(info["metrics"], _engine_run(task, kind, plugin))


@pytest.mark.parametrize("action", [np.nan, np.array([np.nan]), 99, -1, 1.5, "x"])
def test_bad_discrete_watermark_action_raises(action):
    env = make("watermark")
    env.reset(seed=0)
    with pytest.raises(ValueError, match="watermark"):
        env.step(action)


@pytest.mark.parametrize("action", [np.array([2.0], np.float32), np.array([np.inf], np.float32)])
def test_bad_box_action_raises_or_is_clipped_and_counted(action):
    env = make("watermark", "env.action.type=box")
    env.reset(seed=0)
    with pytest.raises(ValueError, match="outside the Box"):
        env.step(action)
    env = make("watermark", "env.action.type=box", "env.clip_actions=true")
    env.reset(seed=0)
    _, _, _, _, info = env.step(action)
    assert info["clipped_actions"] == 1 and info["watermark"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="NaN"):                  # NaN has no nearest action
        env.step(np.array([np.nan], np.float32))


def test_out_of_range_preemption_action_raises_or_clips_and_masked_action_falls_back():
    env = make("preemption")
    env.reset(seed=0)
    with pytest.raises(ValueError, match="not an integer in"):
        env.step(16)
    env = make("preemption", "env.clip_actions=true")
    env.reset(seed=0)
    _, _, _, _, info = env.step(16)
    assert info["clipped_actions"] == 1
    mask = env.unwrapped.action_masks()
    for _ in range(50):      # the next decision where some slot is empty (which one depends on the cost model)
        if not mask.all():
            break
        _, _, _, _, info = env.step(0)
        mask = env.unwrapped.action_masks()
    assert not mask.all(), "no decision with an empty slot in 50 steps"
    before = info["masked_actions"]
    masked = int(np.flatnonzero(~mask)[0])
    _, _, _, _, info = env.step(masked)
    assert info["masked_actions"] == before + 1 and info["victim_slot"] == 0


@pytest.mark.parametrize("kind", ["discrete", "multidiscrete"])
def test_action_masks_match_the_action_space(kind):
    env = make("preemption", f"env.action.type={kind}")
    env.reset(seed=0)
    mask = env.unwrapped.action_masks()
    space = env.action_space
    size = space.n if kind == "discrete" else int(space.nvec.sum())
    assert mask.shape == (size,) and mask.dtype == bool and mask[0]


def test_replay_of_a_fixed_slice_and_of_a_given_workload():
    env = make("watermark", "env.episode.window_s=1.0")
    a = rollout(env, seed=1, options={"start_s": 0.5})
    b = rollout(env, seed=2, options={"start_s": 0.5})
    assert a[1] == b[1]
    env_id, cfg = load_task("watermark", SMALL)
    requests = build_workload(cfg.run["workload"], vocab_size=env.unwrapped.session.executor.vocab_size)[:20]
    _, _, info = rollout(env, options={"workload": requests})
    assert info["trace_end"] and info["metrics"]["requests"] == 20
    with pytest.raises(ValueError, match="unknown reset option"):
        env.reset(options={"start": 1.0})


def test_rate_scales_draw_each_windowed_episodes_load_and_take_them_in_turn_for_whole_splits():
    env = make("watermark", "env.episode.window_s=null", "env.episode.rate_scales=[1.0,4.0]").unwrapped
    whole = env.session.requests                     # the scenario's rate scale (1.0 in SMALL)
    span = whole[-1].arrival_s - whole[0].arrival_s
    spans = []
    for seed in range(6):
        env.reset(seed=seed)
        served = env.driver.pending
        assert len(served) == len(whole)
        spans.append(served[-1].arrival_s - served[0].arrival_s)
    assert spans == pytest.approx([span, span / 4.0] * 3)      # validation at the training loads: each in turn
    windowed = make("watermark", "env.episode.window_s=0.5", "env.episode.rate_scales=[1.0,4.0]").unwrapped
    drawn, pool = [], windowed.session._pool
    windowed.session._pool = lambda family, rate: (drawn.append(rate), pool(family, rate))[1]
    for seed in range(8):
        windowed.reset(seed=seed)
    assert set(drawn) == {1.0, 4.0} and drawn != [1.0, 4.0] * 4     # drawn with the episode's seed
    with pytest.raises(ValueError, match="rate_scales"):
        make("watermark", "env.episode.rate_scales=[]")


MIX = ["+env.episode.workloads=[{},{num_requests: 40},{name: multi_turn, num_conversations: 12, max_turns: 3}]"]


def test_a_mixture_lays_each_family_over_the_scenario():
    from kvrl.envs.config import variant_workloads

    _, cfg = load_task("watermark", [*SMALL, *MIX, "workload.seed=3", "workload.rate_scale=2.0"])
    scenario = cfg.run["workload"]
    own, fewer, turns = variant_workloads(scenario, cfg.episode.workloads)
    assert own == scenario
    assert fewer == {**scenario, "num_requests": 40}              # same builder: only the keys given change
    assert turns["name"] == "multi_turn" and turns["num_conversations"] == 12 and turns["max_turns"] == 3
    assert turns["seed"] == 3 and turns["rate_scale"] == 2.0      # another builder: the scenario's common keys
    assert turns["split_fractions"] == scenario["split_fractions"] and "prompt_len" not in turns
    assert turns["min_turns"] == 2                                # ... and that builder's own defaults
    assert variant_workloads(scenario, None) == [scenario]
    with pytest.raises(ValueError, match="episode.workloads"):
        load_task("watermark", [*SMALL, "+env.episode.workloads=[]"])
    with pytest.raises(ValueError, match=r"episode.workloads\[1\]"):
        load_task("watermark", [*SMALL, "+env.episode.workloads=[{},3]"])
    with pytest.raises(ValueError, match=r"episode.workloads\[1\].*unknown key 'rate'"):
        make("watermark", "+env.episode.workloads=[{},{rate: 3.0}]")      # checked before any episode


def test_whole_split_episodes_take_the_families_in_turn():
    env = make("watermark", *MIX).unwrapped
    sizes = {}
    for seed in range(6):
        env.reset(seed=seed)
        sizes.setdefault(env.session.family, set()).add(len(env.driver.pending))
        assert env.session.family == seed % 3
    assert sizes[0] == {80} and sizes[1] == {40} and len(sizes[2]) == 1 and sizes[2] != {80}


def test_whole_split_episodes_take_every_family_at_each_load_in_turn():
    env = make("watermark", "env.episode.rate_scales=[1.0,2.0]", "+env.episode.workloads=[{},{num_requests: 40}]").unwrapped
    seen = []
    for seed in range(8):
        env.reset(seed=seed)
        served = env.driver.pending
        seen.append((env.session.family, round(served[-1].arrival_s - served[0].arrival_s, 6)))
    assert [f for f, _ in seen] == [0, 1] * 4 and seen[:4] == seen[4:]
    assert seen[2][1] == pytest.approx(seen[0][1] / 2) and seen[3][1] == pytest.approx(seen[1][1] / 2)


def test_windowed_episodes_draw_their_family_with_the_env_seed():
    def families(seed):
        env = make("watermark", *MIX, "env.episode.window_s=1.0").unwrapped
        out = []
        for k in range(12):
            env.reset(seed=seed if k == 0 else None)
            out.append(env.session.family)
        return out

    first = families(0)
    assert families(0) == first and set(first) == {0, 1, 2}
    assert families(1) != first


def test_relative_rate_scales_multiply_each_familys_own_rate():
    env = make("watermark", "env.episode.window_s=null", "env.episode.rate_scales=[2.0]",
               "+env.episode.workloads=[{},{rate_scale: 3.0}]").unwrapped
    spans = []
    for seed in range(2):
        env.reset(seed=seed)
        served = env.driver.pending
        spans.append(served[-1].arrival_s - served[0].arrival_s)
    whole = env.session.requests
    span = whole[-1].arrival_s - whole[0].arrival_s
    assert spans == pytest.approx([span / 2.0, span / 6.0])


def test_step_before_reset_and_after_the_end_raise():
    env = make("watermark").unwrapped
    with pytest.raises(RuntimeError, match="reset"):
        env.step(0)
    rollout(env, seed=0)
    with pytest.raises(RuntimeError, match="reset"):
        env.step(0)


def _save_untrained(tmp_path, task, algo):
    """An untrained SB3 agent saved as kvrl-train would (model.zip + agent.json)."""
    from kvrl.envs.agent_io import algo_class

    env = make(task)
    policy = "MlpLstmPolicy" if algo == "recurrent_ppo" else "MlpPolicy"
    model = algo_class(algo)(policy, env, seed=0, device="cpu", n_steps=32, batch_size=32)
    if algo == "recurrent_ppo":      # a state that weighs as much as the observation, so that it shows in the actions
        import torch

        with torch.no_grad():
            model.policy.lstm_actor.weight_hh_l0.mul_(20.0)
            model.policy.action_net.weight.mul_(20.0)
    model.save(str(tmp_path / "model.zip"))
    write_meta(tmp_path, algo, env.spec.id, env.unwrapped.config)
    return env, load_agent(tmp_path)


@pytest.mark.parametrize("task,kind,algo", [("watermark", "watermark", "ppo"),
                                            ("watermark", "watermark", "recurrent_ppo"),
                                            ("preemption", "eviction", "maskable_ppo")])
def test_saved_agent_decides_the_same_inside_and_outside_the_env(tmp_path, task, kind, algo):
    """The plugin serving a saved agent by itself takes the decisions the env takes with it; a recurrent
    agent's state runs through the episode there too."""
    env, agent = _save_untrained(tmp_path, task, algo)
    obs, _ = env.reset(seed=0)
    seen, actions = [], []
    while True:
        mask = env.unwrapped.action_masks() if kind == "eviction" else None
        seen.append(obs)
        actions.append(int(agent.act(obs, mask)))
        obs, _, terminated, truncated, info = env.step(actions[-1])
        if terminated or truncated:
            break
    outside = _engine_run(task, kind, {"name": "agent", "policy_path": str(tmp_path)})
    assert same(outside, info["metrics"])
    if algo == "recurrent_ppo":      # its actions depend on what it saw before: not on the observation alone
        agent.reset()
        assert [int(agent.act(o)) for o in seen] == actions
        forgetful = []
        for o in seen:
            agent.reset()
            forgetful.append(int(agent.act(o)))
        assert forgetful != actions


def test_missing_checkpoint_path_is_named(tmp_path):
    missing = tmp_path / "nope" / "model.zip"
    with pytest.raises(AgentNotFound, match=str(missing)):
        load_agent(missing)
    with pytest.raises(AgentNotFound, match="best_model.zip or model.zip"):
        load_agent(tmp_path)


def test_kvrl_run_with_a_missing_policy_path_fails_naming_it(tmp_path):
    missing = tmp_path / "gone.zip"
    proc = subprocess.run([sys.executable, "-m", "kvrl.apps.run", f"hydra.run.dir={tmp_path / 'r'}", "progress=false",
                           "workload=synthetic", "workload.num_requests=5", "watermark=agent",
                           f"watermark.policy_path={missing}"], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and str(missing) in proc.stderr + proc.stdout


def test_eviction_agent_without_policy_says_what_to_set():
    from kvrl.engine.engine import PolicyError

    with pytest.raises(PolicyError, match="eviction.policy_path"):
        _engine_run("preemption", "eviction", {"name": "agent"}, "engine.policy_errors=raise")


def test_importing_the_envs_is_cheap():
    code = ("import sys, kvrl.envs, gymnasium; assert 'kvrl/Watermark-v0' in gymnasium.registry; "
            "heavy = [m for m in ('torch', 'stable_baselines3', 'kvrl.engine.engine') if m in sys.modules]; "
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_live_backend_episode_runs_on_cpu():
    env_id, cfg = load_task("watermark", ["backend=live", "model=tiny", "workload=synthetic", "workload.num_requests=6",
                                          "workload.prompt_len.dist=constant", "workload.prompt_len.mean=24",
                                          "workload.prompt_len.low=null",   # else synthetic's uniform low clamps 24 to 32
                                          "workload.output_len.dist=constant", "workload.output_len.mean=6",
                                          "engine.num_blocks=64", "engine.block_size=4", "env.episode.split=null",
                                          "env.episode.window_s=null", "env.decision.epoch_steps=2",
                                          "env.decision.epoch_s=null"])
    env = gym.make("kvrl/WatermarkLive-v0", config=cfg)
    assert env.spec.nondeterministic
    _, _, info = rollout(env, seed=0)
    assert info["trace_end"] and info["metrics"]["finished"] == 6


# ---------------------------------------------------------------- the task suite (issue 17)
SUITE = ("watermark", "preemption", "pressure", "phased", "joint", "tenants", "slo_shift", "throttle", "throttle_rules",
         "throttle_planner", "throttle_planner_mix")


def _few_requests(task: str) -> list[str]:
    """The override that makes ``task``'s workload a few requests (tenant workloads are sized by horizon)."""
    return ["workload.horizon_s=5" if task.startswith(("tenants", "slo_shift")) else "workload.max_requests=5"]


@pytest.mark.parametrize("task", SUITE)
def test_every_task_uses_the_shipped_profile(task):
    _, cfg = load_task(task)
    assert cfg.run["backend"]["profile"] == "auto"
    env_id, small = load_task(task, _few_requests(task))
    env = gym.make(env_id, config=small)
    assert "archive" not in env.unwrapped.session.executor.cost_source


HELD_OUT = (("pressure", "pressure_heldout"), ("phased", "phased_heldout"), ("classes_preemption", "classes_heldout"),
            ("joint", "joint_heldout"), ("tenants", "tenants_heldout"),
            ("slo_shift", "slo_shift_heldout"), ("throttle", "throttle_heldout"),
            ("throttle_rules", "throttle_rules_heldout"), ("throttle_planner", "throttle_planner_heldout"),
            ("throttle_planner", "throttle_planner_heldout_conv"), ("throttle_planner_mix", "throttle_planner_heldout"))


@pytest.mark.parametrize("task,heldout", HELD_OUT)
def test_a_held_out_family_keeps_its_tasks_interface_and_changes_its_traffic(task, heldout):
    """An agent trained on ``task`` must run unchanged on ``heldout``: same env id, spaces and
    decision config; only the traffic (the workload) differs."""
    (id_a, cfg_a), (id_b, cfg_b) = load_task(task, _few_requests(task)), load_task(heldout, _few_requests(heldout))
    assert id_a == id_b
    assert cfg_a.action == cfg_b.action and getattr(cfg_a, "decision", None) == getattr(cfg_b, "decision", None)
    assert cfg_a.features == cfg_b.features
    assert cfg_a.run["workload"] != cfg_b.run["workload"]
    env_a, env_b = gym.make(id_a, config=cfg_a), gym.make(id_b, config=cfg_b)
    assert env_a.observation_space == env_b.observation_space and env_a.action_space == env_b.action_space


def test_history_features_extend_the_observation_and_the_saved_agent_sees_them(tmp_path):
    from kvrl.envs.features import ENGINE_FEATURES, HISTORY_FEATURES

    plain, hist = make("watermark"), make("watermark", "env.features.history=true")
    assert plain.observation_space.shape == (len(ENGINE_FEATURES),)
    assert hist.observation_space.shape == (len(ENGINE_FEATURES) + len(HISTORY_FEATURES),)
    observations, _, _ = rollout(hist, seed=0, action=0)
    stacked = np.stack(observations)
    assert np.all((stacked >= 0) & (stacked <= 1))
    names = ENGINE_FEATURES + HISTORY_FEATURES
    demand = stacked[:, names.index("kv_demand")]
    assert demand.max() > 0.3                       # the running batch's predicted KV demand shows
    np.testing.assert_array_equal(stacked[:, :len(ENGINE_FEATURES)],
                                  np.stack(rollout(plain, seed=0, action=0)[0]))   # the old features unchanged
    from kvrl.envs.agent_io import algo_class

    model = algo_class("ppo")("MlpPolicy", hist, seed=0, device="cpu", n_steps=32, batch_size=32)
    model.save(str(tmp_path / "model.zip"))
    write_meta(tmp_path, "ppo", hist.spec.id, hist.unwrapped.config)
    outside = _engine_run("watermark", "watermark", {"name": "agent", "policy_path": str(tmp_path)},
                          "env.features.history=true")
    assert outside["finished"] == 80


def test_step_time_sigma_perturbs_each_training_episodes_cost_model():
    env = make("watermark", "env.episode.step_time_sigma=0.3").unwrapped
    scales, durations = [], []
    for seed in range(3):
        _, _, info = rollout(env, seed=seed)
        scales.append(env.step_time_scale)
        durations.append(info["metrics"]["duration_s"])
    assert len(set(scales)) == 3 and all(0.3 < s < 3.0 for s in scales)
    assert len(set(durations)) == 3
    rollout(env, seed=0)
    assert env.step_time_scale == scales[0]                              # seeded
    off = make("watermark").unwrapped
    _, _, info = rollout(off, seed=0)
    assert off.step_time_scale == 1.0 and off.session.executor.step_time_scale == 1.0
    with pytest.raises(ValueError, match="step_time_sigma"):
        make("watermark", "env.episode.step_time_sigma=-0.1")


def test_backend_step_time_scale_multiplies_every_step_and_the_episodes_draw():
    """``backend.step_time_scale`` (a host that much slower than the profile's): the same episode's
    engine time scales with it exactly where no step waits on another's time (here 1.1 gives more
    than 1.05x: a slower engine also queues more), the per-episode draw of step_time_sigma multiplies
    it, and a factor that is not positive is refused naming the key."""
    _, _, base = rollout(make("watermark").unwrapped, seed=0)
    slow_env = make("watermark", "backend.step_time_scale=1.1").unwrapped
    _, _, slow = rollout(slow_env, seed=0)
    assert slow_env.session.executor.step_time_scale == 1.1
    assert slow["metrics"]["duration_s"] > 1.05 * base["metrics"]["duration_s"]
    both = make("watermark", "backend.step_time_scale=1.1", "env.episode.step_time_sigma=0.3").unwrapped
    rollout(both, seed=0)
    assert both.session.executor.step_time_scale == pytest.approx(1.1 * both.step_time_scale, rel=1e-12)
    with pytest.raises(ValueError, match="backend.step_time_scale"):
        make("watermark", "backend.step_time_scale=0")


def test_phased_load_alternates_the_arrival_rate():
    from kvrl.workloads.generators import phased_times

    np.testing.assert_allclose(phased_times(np.array([0.0, 5.0, 10.0, 20.0, 30.0, 35.0]), [1.0, 2.0], 10.0),
                               [0.0, 5.0, 10.0, 15.0, 20.0, 25.0])
    reqs = build_workload({"name": "synthetic", "num_requests": 4000, "arrival": {"process": "poisson", "rate": 20.0},
                           "rate_phases": [0.5, 2.0], "phase_s": 5.0}, vocab_size=1000)
    t = np.array([r.arrival_s for r in reqs])
    counts = np.histogram(t, bins=np.arange(0.0, 60.0 + 1e-9, 5.0))[0]
    np.testing.assert_allclose(counts[0::2] / 5.0, 10.0, rtol=0.3)      # 0.5 x 20 requests/s
    np.testing.assert_allclose(counts[1::2] / 5.0, 40.0, rtol=0.3)      # 2 x 20 requests/s
    with pytest.raises(ValueError, match="rate_phases"):
        build_workload({"name": "synthetic", "rate_phases": [1.0, 0.0]}, vocab_size=1000)


# ---------------------------------------------------------------- joint watermark + mode task (issue 17)
# SMALL with prompts that fit its 256-block pool (joint.yaml's own prompts are 2k tokens long), no step-time noise
JOINT = ["workload.prompt_len.mean=256", "workload.prompt_len.high=1024", "env.episode.step_time_sigma=0.0"]


def _joint_run(slots: dict, *overrides):
    """Metrics of Engine.run on the SMALL joint scenario with ``slots`` (plugin kind -> config)."""
    from omegaconf import OmegaConf

    from kvrl.builder import build_engine, to_dict

    _, cfg = load_task("joint", [*SMALL, *JOINT, *overrides])
    run = OmegaConf.create({**cfg.run, **slots})
    engine = build_engine(run, record_steps=False)
    requests = build_workload(to_dict(run.workload), vocab_size=engine.executor.vocab_size,
                              max_model_len=engine.config.max_model_len)
    return engine.run(requests)


def test_joint_env_passes_check_env_in_both_action_types():
    for kind in ("discrete", "multidiscrete"):
        env = make("joint", *JOINT, f"env.action.type={kind}")
        assert env.spec.id == "kvrl/WatermarkMode-v0"
        check_env(env.unwrapped, skip_render_check=True)
    bins = env.unwrapped.config.action.bins
    assert list(env.action_space.nvec) == [len(bins), 2]
    assert make("joint", *JOINT).action_space.n == 2 * len(bins)


@pytest.mark.parametrize("mode,action", [("recompute", 2), ("swap", 3)])    # bins[1] = 0.01; index 2*bin+mode
def test_constant_joint_action_equals_kvrl_run_with_the_same_constants(mode, action):
    _, _, info = rollout(make("joint", *JOINT, f"eviction.mode={mode}"), seed=0, action=action)
    assert info["mode"] == mode and info["watermark"] == 0.01
    plain = _joint_run({"watermark": {"name": "fixed", "fraction": 0.01}, "eviction": {"name": "lifo", "mode": mode}})
    assert same(info["metrics"], plain)
    assert plain["preemptions"] > 0 and (plain["swapped_out_blocks"] > 0) == (mode == "swap")


def test_the_joint_agents_mode_reaches_the_preemptions():
    """Decisions that switch the mode take effect: swap-only, recompute-only and alternating
    episodes differ, and the alternating one both swaps and recomputes."""
    runs = {}
    for name, actions in {"recompute": [2], "swap": [3], "alternate": [2, 3]}.items():
        env = make("joint", *JOINT)
        env.reset(seed=0)
        i = 0
        while True:
            _, _, terminated, truncated, info = env.step(actions[i % len(actions)])
            i += 1
            if terminated or truncated:
                break
        runs[name] = info["metrics"]
    assert runs["recompute"]["swapped_out_blocks"] == 0 and runs["swap"]["swapped_out_blocks"] > 0
    alt = runs["alternate"]
    assert alt["swapped_out_blocks"] > 0 and 0 < alt["recomputed_tokens"] != runs["recompute"]["recomputed_tokens"]


def test_saved_joint_agent_decides_the_same_inside_and_outside_the_env(tmp_path):
    from kvrl.envs.agent_io import algo_class

    env = make("joint", *JOINT)
    model = algo_class("ppo")("MlpPolicy", env, seed=3, device="cpu", n_steps=32, batch_size=32)
    model.save(str(tmp_path / "model.zip"))
    write_meta(tmp_path, "ppo", env.spec.id, env.unwrapped.config)
    agent = load_agent(tmp_path, role="joint")
    obs, _ = env.reset(seed=0)
    modes = set()
    while True:
        obs, _, terminated, truncated, info = env.step(agent.act(obs))
        modes.add(info["mode"])
        if terminated or truncated:
            break
    outside = _joint_run({"watermark": {"name": "joint_agent", "policy_path": str(tmp_path)},
                          "eviction": {"name": "follow_mode"}})
    assert same(outside, info["metrics"]) and outside["policy_errors"] == 0
    assert modes == {"recompute", "swap"}             # the untrained agent tries both: the mode is carried too
    ignored = _joint_run({"watermark": {"name": "joint_agent", "policy_path": str(tmp_path)},
                          "eviction": {"name": "lifo"}})   # no follow_mode: every decision is a counted policy error
    assert ignored["policy_errors"] > 0


def test_joint_agent_without_follow_mode_fails_naming_the_setting():
    from omegaconf import OmegaConf

    from kvrl.builder import build_engine
    from kvrl.plugins.base import PreemptionMode
    from kvrl.plugins.joint import JointAgentWatermark, mode_channel

    env_id, cfg = load_task("joint", [*SMALL, *JOINT])
    cfg.run["eviction"] = {"name": "lifo", "mode": "swap"}
    with pytest.raises(ValueError, match="follow_mode"):
        gym.make(env_id, config=cfg)
    env = make("joint", *JOINT).unwrapped
    env.reset(seed=0)
    with pytest.raises(ValueError, match="watermark-mode"):
        env.step(12)                                  # 2 x 6 bins: 0..11
    assert isinstance(env.plugin, JointAgentWatermark) and mode_channel(env.driver.engine.view).followed
    engine = build_engine(OmegaConf.create({**cfg.run, "watermark": {"name": "joint_agent"},
                                            "eviction": {"name": "lifo"}}), record_steps=False)
    with pytest.raises(RuntimeError, match="eviction=follow_mode"):     # its modes would be ignored
        engine.watermark.set_action(0.01, PreemptionMode.SWAP)


def test_kvrl_eval_puts_a_joint_policy_in_both_slots(tmp_path):
    from kvrl.apps.eval import Job, Policy, agent_plugin, job_config, label_of, sweep_plugins

    _, cfg = load_task("joint")
    points = sweep_plugins("joint", [0.0, 0.1])
    labels = [label_of(p) for p in points]
    assert labels == ["fixed(fraction=0.0) + lifo(mode=recompute)", "fixed(fraction=0.0) + lifo(mode=swap)",
                      "fixed(fraction=0.1) + lifo(mode=recompute)", "fixed(fraction=0.1) + lifo(mode=swap)"]
    run = job_config(cfg.run, "joint", Job(Policy(labels[3], "sweep", points[3]), "val", 1), None)
    assert run["watermark"] == {"name": "fixed", "fraction": 0.1} and run["eviction"] == {"name": "lifo", "mode": "swap"}
    agent = job_config(cfg.run, "joint", Job(Policy("a", "agent", agent_plugin("joint", tmp_path, cfg.run)), "test", 0),
                       None)
    assert agent["watermark"] == {"name": "joint_agent", "policy_path": str(tmp_path)}
    assert agent["eviction"]["name"] == "follow_mode"
    assert sweep_plugins("watermark", [0.1]) == [{"name": "fixed", "fraction": 0.1}]


# ---------------------------------------------------------------- multi-tenant shared prefixes, task (c)
def test_prefix_features_extend_the_observation_behind_their_flag():
    """features.prefix appends the prefix cache's hit rate, cached and reclaimable cached blocks
    after the existing features, which stay as they were (committed agents keep their inputs)."""
    from kvrl.envs.features import ENGINE_FEATURES, HISTORY_FEATURES, PREFIX_FEATURES

    small = ["workload.horizon_s=3", "env.episode.split=null", "env.episode.window_s=null",
             "env.episode.rate_scales=null", "env.episode.step_time_sigma=0.0"]
    _, cfg = load_task("tenants")
    assert cfg.features.prefix and cfg.run["engine"]["prefix_cache_scope"] == "tenant"
    on, off = (gym.make("kvrl/Watermark-v0", config=load_task("tenants", [*small, *extra])[1])
               for extra in ([], ["env.features.prefix=false"]))
    n = len(ENGINE_FEATURES) + len(HISTORY_FEATURES)
    assert on.observation_space.shape == (n + len(PREFIX_FEATURES),) and off.observation_space.shape == (n,)
    with_prefix, _, info = rollout(on, seed=0, action=1)
    stacked = np.stack(with_prefix)
    np.testing.assert_array_equal(stacked[:, :n], np.stack(rollout(off, seed=0, action=1)[0]))
    hit, cached, free = (stacked[:, n + i] for i in range(3))
    assert np.all((stacked >= 0) & (stacked <= 1))
    assert hit.max() > 0.3 and info["metrics"]["prefix_hit_rate"] > 0.3     # the tenants' system prompts hit
    assert cached.max() > 0 and np.all(free <= cached) and free.max() > 0


def test_slo_mix_features_show_the_share_of_tight_tpot_traffic():
    """features.slo_mix appends the shares of running and waiting sequences whose TPOT objective is
    below tpot_ref_s; in the slo_shift task they follow the busy tenant (chat: 2.5 ms < 4 ms)."""
    from types import SimpleNamespace

    from kvrl.envs.features import SLO_MIX_FEATURES, engine_feature_names
    from kvrl.plugins.slack import tight_tpot_share
    seqs = [SimpleNamespace(slo_tpot_s=v) for v in (0.0025, 0.01, None, 0.004)]
    assert tight_tpot_share(seqs, 0.004, inclusive=False) == 0.25 and tight_tpot_share([], 0.004, inclusive=False) == 0.0
    assert tight_tpot_share(seqs, 0.004, inclusive=True) == 0.5
    env_id, cfg = load_task("slo_shift", _few_requests("slo_shift"))
    assert engine_feature_names(cfg.features)[-2:] == SLO_MIX_FEATURES
    _, off = load_task("slo_shift", [*_few_requests("slo_shift"), "env.features.slo_mix=false"])
    on_env, off_env = gym.make(env_id, config=cfg), gym.make(env_id, config=off)
    assert on_env.observation_space.shape[0] == off_env.observation_space.shape[0] + 2
    _, run = load_task("slo_shift", ["workload.horizon_s=60"])
    env = gym.make(env_id, config=run)
    env.reset(seed=0)
    shares, done = [], False
    while not done:
        obs, _, terminated, truncated, _ = env.step(0)
        shares.append(obs[-2:])
        done = terminated or truncated
    shares = np.array(shares)
    assert ((shares >= 0) & (shares <= 1)).all() and shares[:, 0].max() > 0.5 and shares[:, 0].min() < 0.5


def test_phased_long_is_phased_with_longer_splits_at_a_lower_rate():
    _, phased = load_task("phased", [])
    _, long = load_task("phased_long", [])
    changed = {"num_requests": 6000, "split_fractions": [0.6, 0.2, 0.2], "rate_scale": 0.7}
    assert {k: long.run["workload"][k] for k in changed} == changed
    assert {k: v for k, v in long.run["workload"].items() if k not in changed} == \
        {k: v for k, v in phased.run["workload"].items() if k not in changed}
    assert long.episode == phased.episode and long.action == phased.action and long.run["engine"] == phased.run["engine"]


RULES_TR = "+env.action.rules=[{name: token_ratio, min_ratio: 0.05},{name: fixed, fraction: 0.0}]"
RULES_SLACK = "+env.action.rules=[{name: ttft_slack, urgency: 0.2, high: 0.2},{name: fixed, fraction: 0.3}]"


@pytest.mark.parametrize("rules,plugin", [(RULES_TR, {"name": "token_ratio", "min_ratio": 0.05}),
                                          (RULES_SLACK, {"name": "ttft_slack", "urgency": 0.2, "high": 0.2})])
def test_always_choosing_one_rule_serves_what_that_rule_serves(rules, plugin):
    """env.action.rules: action i hands the watermark to rule i, and every rule sees every engine event all
    along, so holding one stateful rule (token_ratio decays each step and resets on preemption;
    ttft_slack reads the queue after each step) is bit for bit kvrl-run with that rule."""
    env = make("watermark", rules)
    assert env.action_space == gym.spaces.Discrete(2)
    _, _, info = rollout(env, seed=0, action=0)
    assert same(info["metrics"], _engine_run("watermark", "watermark", plugin))


def test_switching_rules_hands_the_reserve_to_the_chosen_one():
    env = make("watermark", "+env.action.rules=[{name: fixed, fraction: 0.0},{name: fixed, fraction: 0.3}]")
    env.reset(seed=0)
    num_blocks = env.unwrapped.plugin.engine.num_blocks
    for action in (1, 0, 1, 1, 0):
        _, _, terminated, truncated, info = env.step(action)
        assert info["rule"] == action
        assert info["watermark"] == (int(0.3 * num_blocks) / num_blocks if action else 0.0)
        if terminated or truncated:
            break


def test_the_engine_asks_admit_only_of_a_chosen_rule_that_vetoes():
    """WatermarkPolicy.vetoes: a policy that delegates admit answers for the one it delegates to, so the
    engine builds no view for a rule-choosing agent whose chosen rule admits everything."""
    from kvrl import plugins

    assert not plugins.create("watermark", "fixed").vetoes and plugins.create("watermark", "tenant_quota").vetoes
    assert not plugins.create("watermark", "thrash_guard").vetoes
    assert plugins.create("watermark", "thrash_guard", inner="tenant_quota").vetoes
    env = make("watermark", "+env.action.rules=[{name: tenant_quota},{name: fixed, fraction: 0.3}]")
    env.reset(seed=0)
    plugin = env.unwrapped.plugin
    assert plugin.vetoes                       # rule 0 until the first decision
    env.step(1)
    assert not plugin.vetoes
    env.step(0)
    assert plugin.vetoes


@pytest.mark.parametrize("overrides,named", [
    (["+env.action.rules=[{name: fixed}]"], "at least two"),
    (["+env.action.rules=[{name: fixed},{name: agent}]"], "'agent' is a rule only with a policy_path"),
    (["+env.action.rules=[{name: fixed},{name: nope}]"], "nope"),
    (["+env.action.rules=[{name: fixed},{name: pi, kp: -1}]"], "kp"),
    (["+env.action.rules=[{name: fixed},{name: pi}]", "env.action.type=box"], "action.type=discrete"),
])
def test_bad_rules_are_refused_naming_the_problem(overrides, named):
    with pytest.raises(ValueError, match=named):
        load_task("watermark", overrides)


def test_a_saved_agent_is_a_rule_that_a_gating_agent_can_hand_the_watermark_to(tmp_path):
    """env.action.rules may name a saved agent (``agent`` with a policy_path): it decides by itself, so a
    gate that always chooses it serves bit for bit what the saved agent serves alone, and one that always
    chooses the constant serves the constant."""
    from kvrl.envs.agent_io import algo_class

    inner_env = make("watermark", RULES_SLACK)
    model = algo_class("dqn")("MlpPolicy", inner_env, seed=0, device="cpu", learning_starts=0)
    model.save(str(tmp_path / "model.zip"))
    write_meta(tmp_path, "dqn", inner_env.spec.id, inner_env.unwrapped.config)
    gate = f"+env.action.rules=[{{name: fixed, fraction: 0.0}},{{name: agent, policy_path: '{tmp_path}'}}]"
    alone = _engine_run("watermark", "watermark", {"name": "agent", "policy_path": str(tmp_path)}, RULES_SLACK)
    _, _, info = rollout(make("watermark", gate), seed=0, action=1)
    assert same(info["metrics"], alone)
    _, _, info = rollout(make("watermark", gate), seed=0, action=0)
    assert same(info["metrics"], _engine_run("watermark", "watermark", {"name": "fixed", "fraction": 0.0}))


def test_ttft_slack_around_an_inner_policy_is_the_rule_with_that_policy_for_high(tmp_path):
    """ttft_slack(inner=...): the inner policy decides in place of ``high`` while nothing waiting is urgent, so
    around fixed(h) it serves bit for bit what ttft_slack(high=h) serves;
    around a saved agent it serves what the agent serves alone while no first token is ever at risk (urgency 1:
    no wait on this scenario reaches its TTFT objective) and otherwise differs (urgency 0: any wait is urgent)."""
    from kvrl.envs.agent_io import algo_class

    rule = {"name": "ttft_slack", "urgency": 0.2, "high": 0.2, "low": 0.0}
    around = {"name": "ttft_slack", "urgency": 0.2, "low": 0.0, "inner": "fixed", "inner_params": {"fraction": 0.2}}
    assert same(_engine_run("watermark", "watermark", around), _engine_run("watermark", "watermark", rule))
    env = make("watermark", RULES_SLACK)
    model = algo_class("dqn")("MlpPolicy", env, seed=0, device="cpu", learning_starts=0)
    model.save(str(tmp_path / "model.zip"))
    write_meta(tmp_path, "dqn", env.spec.id, env.unwrapped.config)
    alone = _engine_run("watermark", "watermark", {"name": "agent", "policy_path": str(tmp_path)}, RULES_SLACK)
    guarded = {"name": "ttft_slack", "low": 0.0, "inner": "agent", "inner_params": {"policy_path": str(tmp_path)}}
    assert same(_engine_run("watermark", "watermark", {**guarded, "urgency": 1.0}, RULES_SLACK), alone)
    assert not same(_engine_run("watermark", "watermark", {**guarded, "urgency": 0.0}, RULES_SLACK), alone)


def test_a_saved_rule_choosing_agent_decides_the_same_inside_and_outside_the_env(tmp_path):
    from kvrl.envs.agent_io import algo_class

    env = make("watermark", RULES_SLACK)
    model = algo_class("dqn")("MlpPolicy", env, seed=0, device="cpu", learning_starts=0)
    model.save(str(tmp_path / "model.zip"))
    write_meta(tmp_path, "dqn", env.spec.id, env.unwrapped.config)
    agent = load_agent(tmp_path)
    obs, _ = env.reset(seed=0)
    while True:
        obs, _, terminated, truncated, info = env.step(agent.act(obs))
        if terminated or truncated:
            break
    outside = _engine_run("watermark", "watermark", {"name": "agent", "policy_path": str(tmp_path)}, RULES_SLACK)
    assert same(outside, info["metrics"])
