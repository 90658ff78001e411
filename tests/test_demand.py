"""Class-conditional length prediction and the demand features (issue 17, task ``classes``)."""
from types import SimpleNamespace

import numpy as np
import pytest


def _seq(tenant, num_output):
    return SimpleNamespace(tenant=tenant, num_output=num_output)


def test_remaining_output_is_per_tenant_once_the_tenant_has_enough_history():
    from kvrl.plugins.lengths import RemainingOutput

    pooled, keyed = RemainingOutput("none"), RemainingOutput("tenant", min_class_history=3)
    for n in (1000, 1100, 900):
        for p in (pooled, keyed):
            p.add(_seq("chat", n))
    for p in (pooled, keyed):
        p.add(_seq("extract", 30))
        p.add(_seq("extract", 34))
    # extract has 2 < 3 finished requests: predicted from all five, like the pooled predictor
    assert keyed(0, "extract") == pooled(0, "extract") == pytest.approx((1000 + 1100 + 900 + 30 + 34) / 5)
    assert keyed(0, "chat") == pytest.approx(1000.0)                 # chat's own mean
    assert pooled(0, "chat") == pytest.approx(612.8)
    assert keyed(950, "chat") == pytest.approx((1000 + 1100) / 2 - 950)   # those that outlived 950
    assert keyed(2000, "chat") == 2000.0                             # outlived all: as many again
    keyed.add(_seq("extract", 32))
    assert keyed(0, "extract") == pytest.approx(32.0)
    assert RemainingOutput("tenant")(5, "nobody") == 5.0             # no history at all


def test_past_future_tenant_key_reserves_for_each_class_from_its_own_history():
    from kvrl.plugins.registry import create

    running = [_seq("chat", 10), _seq("extract", 10)]
    generated, cap = np.array([10, 10]), np.array([4000, 4000])
    keyed = create("watermark", "past_future", key="tenant", min_history=2, quantile=0.5)
    pooled = create("watermark", "past_future", min_history=2, quantile=0.5)
    for p in (keyed, pooled):
        for n in (1000, 1200, 1100):
            p.on_finish(_seq("chat", n))
        for n in (20, 40, 30):
            p.on_finish(_seq("extract", n))
    assert list(keyed._predict_running(running, generated, cap)) == [1090, 20]
    assert list(pooled._predict_running(running, generated, cap)) == [30, 30]     # the pooled median
    with pytest.raises(ValueError, match="key"):
        create("watermark", "past_future", key="class")


def test_demand_features_extend_the_observation_and_see_the_classes():
    import gymnasium as gym

    import kvrl.envs  # noqa: F401
    from kvrl.envs.config import load_task
    from kvrl.envs.features import DEMAND_FEATURES, engine_feature_names

    env_id, cfg = load_task("classes", ["workload.horizon_s=40", "env.episode.window_s=8"])
    env = gym.make(env_id, config=cfg)
    names = engine_feature_names(env.unwrapped.features)
    assert names[-len(DEMAND_FEATURES):] == DEMAND_FEATURES
    obs, _ = env.reset(seed=0)
    assert obs.shape == env.observation_space.shape == (len(names),)
    seen = []
    for _ in range(6):
        obs, *_ = env.step(1)
        assert np.all((obs >= 0) & (obs <= 1))
        seen.append(obs[-3:])
    assert max(s[0] for s in seen) > 0.0 and max(s[1] for s in seen) > 0.0   # growth and peak demand
    tracker = env.unwrapped.driver.engine.watermark.tracker
    assert tracker.remaining_output(0, "chat") > 10 * tracker.remaining_output(0, "extract")
    with pytest.raises(ValueError, match="length_key"):
        load_task("classes", ["env.features.length_key=class"])


def _slack_seq(**kw):
    base = dict(slo_ttft_s=1.0, slo_tpot_s=0.01, arrival_s=0.0, first_token_s=0.5, num_output=11)
    return SimpleNamespace(**{**base, **kw})


def test_slo_slack_counts_the_stall_a_sequence_can_absorb():
    from kvrl.plugins.slack import slo_slack

    # 10 tokens in 0.1 s since the first (on pace): 20 to come at 0.5 x 10 ms leave 0.1 s of slack
    assert slo_slack(_slack_seq(), now=0.6, remaining=20, pace=0.5) == pytest.approx(0.01 * 30 - 0.1 - 0.1)
    assert slo_slack(_slack_seq(), now=0.95, remaining=20, pace=0.5) < 0          # behind its TPOT course
    assert slo_slack(_slack_seq(first_token_s=1.5), now=2.0, remaining=5, pace=0.5) == -np.inf   # TTFT missed
    assert slo_slack(_slack_seq(slo_tpot_s=None), now=0.6, remaining=20, pace=0.5) == np.inf
    # before the first token: the TTFT's time left, unless the TPOT allowance is shorter
    assert slo_slack(_slack_seq(first_token_s=None), now=0.2, remaining=1000, pace=0.5) == pytest.approx(0.8)
    assert slo_slack(_slack_seq(first_token_s=None), now=0.2, remaining=11, pace=0.5) == pytest.approx(0.05)
    assert slo_slack(_slack_seq(first_token_s=None), now=1.2, remaining=11, pace=0.5) == -np.inf


def test_slo_slack_eviction_takes_a_failed_sequence_first_then_the_most_slack():
    from kvrl.plugins.registry import create

    policy = create("eviction", "slo_slack", pace=0.5)
    policy.bind(SimpleNamespace(now=0.6))
    mk = lambda i, **kw: _slack_seq(seq_id=i, admit_order=i, num_blocks=kw.pop("blocks", 4), tenant=None, **kw)
    tight, loose = mk(0, num_output=2, first_token_s=0.55), mk(1, first_token_s=0.59, num_output=2)
    for n in (30, 30, 30):
        policy.on_finish(SimpleNamespace(tenant=None, num_output=n))
    assert policy.select([tight, loose]).seq_id == 1            # the one with more slack
    failed_small, failed_big = mk(2, first_token_s=1.5, blocks=2), mk(3, first_token_s=1.2, blocks=9)
    assert policy.select([tight, loose, failed_small, failed_big]).seq_id == 3
    with pytest.raises(ValueError, match="pace"):
        create("eviction", "slo_slack", pace=1.5)


SLOT_SMALL = ["workload=synthetic", "workload.num_requests=80", "workload.arrival.rate=30", "workload.output_len.mean=150",
              "workload.rate_scale=1.0", "env.episode.rate_scales=null", "engine.num_blocks=256",
              "env.episode.split=null", "env.episode.window_s=null", "slo.ttft_s=1.0", "slo.tpot_s=0.02"]


def _episode_metrics(overrides, action):
    import gymnasium as gym

    import kvrl.envs  # noqa: F401
    from kvrl.envs.config import load_task

    env_id, cfg = load_task("preemption", [*SLOT_SMALL, *overrides])
    env = gym.make(env_id, config=cfg).unwrapped
    obs, _ = env.reset(seed=0)
    lo, hi, decisions = 1.0, 0.0, 0
    while True:
        lo, hi = min(lo, float(obs.min())), max(hi, float(obs.max()))
        obs, _, terminated, truncated, info = env.step(action)
        decisions += 1
        if terminated or truncated:
            return info["metrics"], (lo, hi), decisions, env


def _run_metrics(eviction):
    from omegaconf import OmegaConf

    from kvrl.builder import build_engine, to_dict
    from kvrl.envs.config import load_task
    from kvrl.workloads import build_workload

    _, cfg = load_task("preemption", SLOT_SMALL)
    run = OmegaConf.create({**cfg.run, "eviction": eviction})
    engine = build_engine(run, record_steps=False)
    return engine.run(build_workload(to_dict(run.workload), vocab_size=engine.executor.vocab_size,
                                     max_model_len=engine.config.max_model_len))


@pytest.mark.parametrize("rules,action,eviction", [
    ("[lifo,most_blocks]", 3, {"name": "most_blocks", "mode": "swap"}),               # slot 1, swap
    ("[most_blocks,{name: slo_slack, pace: 0.5}]", 2, {"name": "slo_slack", "pace": 0.5}),   # slot 1, recompute
])
def test_a_slot_rule_is_imitated_exactly_by_one_fixed_action(rules, action, eviction):
    metrics, _, decisions, _ = _episode_metrics([f"env.features.slot_rules={rules}"], action)
    assert decisions > 10
    run = _run_metrics(eviction)
    same = lambda a, b: a.keys() == b.keys() and all(a[k] == b[k] or (a[k] != a[k] and b[k] != b[k]) for k in a)
    assert same(metrics, run)
    other, *_ = _episode_metrics([f"env.features.slot_rules={rules}"], action - 2)        # slot 0: another rule
    assert not same(other, run)


def test_slo_candidate_features_extend_each_row_within_bounds():
    from kvrl.envs.features import CANDIDATE_FEATURES, SLO_CANDIDATE_FEATURES, engine_feature_names

    _, (lo, hi), _, env = _episode_metrics(["env.features.slo=true"], 0)
    k = env.features.top_k
    per_row = len(CANDIDATE_FEATURES) + len(SLO_CANDIDATE_FEATURES)
    assert env.observation_space.shape == (len(engine_feature_names(env.features)) + k * per_row,)
    assert 0.0 <= lo and hi <= 1.0


@pytest.mark.parametrize("rules,match", [("[nope]", "nope"), ("[agent]", "agent"),
                                         ("[lifo,lifo,lifo,lifo,lifo,lifo,lifo,lifo,lifo]", "top_k"),
                                         ("[{mode: swap}]", "name")])
def test_bad_slot_rules_fail_naming_the_key(rules, match):
    from kvrl.envs.config import load_task

    with pytest.raises(ValueError, match=match):
        load_task("preemption", [f"env.features.slot_rules={rules}"])


def test_reward_baseline_is_a_control_variate_of_the_same_arrivals():
    rules = ["env.features.slot_rules=[lifo,most_blocks]", "slo.tpot_s=0.006"]   # an SLO that binds
    lifo = "env.reward.baseline={name: lifo}"
    # the agent imitates the baseline exactly (slot 0, recompute): every step's reward is zero
    rewards, info = _episode_rewards([*rules, lifo], action=0)
    assert len(rewards) > 10 and all(r == 0.0 for r in rewards)
    # another policy (most_blocks, swap): the return is its goodput tokens minus LIFO's on the same
    # arrivals, both counted from the first decision (before it the two runs are the same)
    with_baseline, _ = _episode_rewards([*rules, lifo], action=3)
    agent, _ = _episode_rewards(rules, action=3)
    reference, _ = _episode_rewards(rules, action=0)
    assert sum(agent) != pytest.approx(sum(reference))
    assert sum(with_baseline) == pytest.approx(sum(agent) - sum(reference), abs=1e-9)
    assert sum(with_baseline) != pytest.approx(sum(agent))
    with pytest.raises(ValueError, match="baseline"):
        _episode_rewards(["env.reward.baseline={mode: swap}"], action=0)


def _episode_rewards(overrides, action):
    import gymnasium as gym

    import kvrl.envs  # noqa: F401
    from kvrl.envs.config import load_task

    env_id, cfg = load_task("preemption", [*SLOT_SMALL, *overrides])
    env = gym.make(env_id, config=cfg).unwrapped
    env.reset(seed=0)
    rewards = []
    while True:
        _, reward, terminated, truncated, info = env.step(action)
        rewards.append(reward)
        if terminated or truncated:
            return rewards, info


def test_a_sequence_without_a_first_token_shows_none_to_policies():
    """The engine keeps -1.0 for "no first token yet"; through the view a policy sees None (what
    slo_slack, ttft_slack and the SLO features test for), and the engine time once the token is out.
    Seen as -1.0, a waiting request's slack was a TPOT course started before time began."""
    from tests.helpers import make_engine, make_request
    from kvrl.plugins.slack import slo_slack

    engine = make_engine(num_blocks=64)
    engine.metrics.default_slo_ttft_s, engine.metrics.default_slo_tpot_s = 2.0, 0.01
    engine.add_request(make_request("a", prompt_len=16, output_len=8))
    view = engine.view
    (waiting,) = view.waiting
    assert waiting.first_token_s is None
    assert slo_slack(waiting, now=view.now, remaining=8, pace=0.5) == pytest.approx(min(2.0, 0.5 * 0.01 * 7))
    engine.step()
    (running,) = view.running
    assert running.first_token_s is not None and running.first_token_s >= 0.0
