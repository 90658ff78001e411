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
