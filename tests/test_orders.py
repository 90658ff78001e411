"""Schedulers that change the admission order while serving (kvrl/plugins/orders.py): ``switch`` admits in
the order of the scheduler it holds, exactly, and changes it between steps; ``order_bandit`` plays each
order once, then follows the better one by its epochs' goodput."""
from __future__ import annotations

import logging

import pytest

from kvrl import plugins
from kvrl.engine.callbacks import EngineCallback
from tests.helpers import make_engine, quiet_kvrl_logs
from tests.test_prefix_peek import _tenant_requests

_quiet = quiet_kvrl_logs(logging.ERROR)


@pytest.mark.parametrize("name,choice", [("fcfs", 0), ("lpm", 1), ("sjf", 2)])
def test_a_switch_holding_one_order_serves_as_that_scheduler(name, choice):
    """Same requests, same steps: the switch holding ``orders[choice]`` is that scheduler, run for run."""
    alone = make_engine(num_blocks=40, scheduler=name, watermark_params={"fraction": 0.01})
    held = make_engine(num_blocks=40, scheduler="switch", watermark_params={"fraction": 0.01},
                       scheduler_params={"orders": ["fcfs", "lpm", "sjf"], "choice": choice})
    assert held.run(_tenant_requests(7, n=70)) == alone.run(_tenant_requests(7, n=70))
    assert held.metrics.steps == alone.metrics.steps


def test_a_switch_changes_the_order_between_steps_and_keeps_every_order_informed():
    engine = make_engine(num_blocks=40, scheduler="switch", scheduler_params={"orders": ["lpm", "sjf"]})
    switch = engine.scheduler
    for r in _tenant_requests(3, n=50):
        engine.submit(r)
    for step in range(400):
        if not engine.has_unfinished:
            break
        switch.set_order(step // 25 % 2)          # lpm and sjf in turn, 25 steps each
        engine.step()
    assert not engine.has_unfinished and engine.metrics.num_finished == 50
    assert sum(switch.schedulers[1]._count.values()) == 50      # sjf learnt from every finish, in force or not
    with pytest.raises(ValueError, match="choice"):
        switch.set_order(2)


def test_the_order_bandit_plays_each_order_once_then_the_better():
    bandit = plugins.create("scheduler", "order_bandit", orders=["fcfs", "lpm"], discount=0.95, exploration=0.2)
    plays = []
    for _ in range(200):
        arm = bandit.choose()
        bandit.reward(arm, 1000.0 if arm == 1 else 600.0)
        plays.append(arm)
    assert plays[:2] == [0, 1] and plays[-50:].count(1) > 45


class _Choices(EngineCallback):
    def __init__(self, scheduler) -> None:
        self.scheduler, self.seen = scheduler, []

    def on_step(self, event) -> bool:
        self.seen.append(self.scheduler.choice)
        return True


def test_the_order_bandit_switches_orders_by_epoch_while_serving():
    engine = make_engine(num_blocks=40, scheduler="order_bandit",
                         scheduler_params={"orders": ["fcfs", "lpm", "sjf"], "epoch_s": 0.02})
    watch = _Choices(engine.scheduler)
    engine.run(_tenant_requests(5, n=80), callbacks=[watch])
    assert engine.metrics.num_finished == 80
    assert watch.seen[0] == 0 and set(watch.seen) == {0, 1, 2} and engine.scheduler.epochs_played.sum() >= 3


@pytest.mark.parametrize("name,params,key", [
    ("switch", {"orders": []}, "orders"), ("switch", {"orders": ["fcfs", "nope"]}, r"orders\[1\]"),
    ("switch", {"orders": ["order_bandit"]}, r"orders\[0\]"), ("switch", {"choice": 5}, "choice"),
    ("order_bandit", {"epoch_s": 0.0}, "epoch_s"), ("order_bandit", {"discount": 1.5}, "discount"),
])
def test_order_parameters_are_validated(name, params, key):
    with pytest.raises(ValueError, match=key):
        plugins.create("scheduler", name, **params)


def test_an_agent_of_the_order_task_sets_the_admission_order_through_its_rules():
    """env=tenants_order: every action hands the watermark to an ``ordered`` rule, which sets the engine's
    switch to that rule's order for the epoch; the watermark stays the rules' 0.01 (10 of 1,024 blocks)."""
    import gymnasium as gym

    import kvrl.envs  # noqa: F401  (registers the ids)
    from kvrl.envs.config import load_task

    env_id, cfg = load_task("tenants_order", ["env.episode.window_s=4.0", "env.episode.rate_scales=null"])
    env = gym.make(env_id, config=cfg)
    env.reset(seed=0)
    engine = env.unwrapped.driver.engine
    assert engine.scheduler.params.orders == ["lpm", "fcfs", "sjf"] and engine.scheduler.choice == 0
    for action in (2, 1, 0):
        _, _, terminated, truncated, info = env.step(action)
        assert engine.scheduler.choice == action and info["rule"] == action and info["watermark"] == 10 / 1024
        if terminated or truncated:
            break


def test_an_ordered_rule_needs_a_switch_with_its_order():
    import dataclasses

    from kvrl.envs.config import DecisionConfig, FeatureConfig

    features = dataclasses.replace(FeatureConfig(), ttft_ref_s=1.0, tpot_ref_s=0.05)
    engine = make_engine(num_blocks=40, scheduler="lpm", watermark="agent")
    with pytest.raises(ValueError, match="scheduler=switch"):
        engine.watermark.drive(features, DecisionConfig(),
                               [{"name": "ordered", "order": "fcfs"}, {"name": "ordered", "order": "lpm"}])
    alone = make_engine(num_blocks=40, scheduler="switch", watermark="ordered", watermark_params={"fraction": 0.25},
                        scheduler_params={"orders": ["fcfs", "lpm"], "choice": 1})
    assert alone.watermark.reserved_blocks() == 10 and alone.scheduler.choice == 1   # by itself: a fixed watermark
    bandit = make_engine(num_blocks=40, scheduler="order_bandit", watermark="agent")
    with pytest.raises(ValueError, match="order_bandit chooses its own order"):
        bandit.watermark.drive(features, DecisionConfig(),
                               [{"name": "ordered", "order": "fcfs"}, {"name": "ordered", "order": "lpm"}])


def test_a_copied_engine_s_ordered_rules_set_the_copy_s_order():
    """A rollout planner deep-copies the serving state and plays each action on the copy: an ``ordered`` rule of
    the copy sets the copy's switch, and the original keeps its order."""
    import copy
    import dataclasses

    from kvrl.envs.config import DecisionConfig, FeatureConfig

    engine = make_engine(num_blocks=40, scheduler="switch", watermark="agent",
                         scheduler_params={"orders": ["lpm", "fcfs", "sjf"]})
    engine.watermark.drive(dataclasses.replace(FeatureConfig(), ttft_ref_s=1.0, tpot_ref_s=0.05), DecisionConfig(),
                           [{"name": "ordered", "order": o} for o in ("lpm", "fcfs", "sjf")])
    twin = copy.deepcopy(engine)
    twin.watermark.set_rule(2)
    assert twin.scheduler.choice == 2 and engine.scheduler.choice == 0
    engine.watermark.set_rule(1)
    assert engine.scheduler.choice == 1 and twin.scheduler.choice == 2
