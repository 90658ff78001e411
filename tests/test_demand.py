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
