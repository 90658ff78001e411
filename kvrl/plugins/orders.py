"""Schedulers that change the admission order while the engine serves: ``switch`` (the order of one of
several schedulers, the one chosen last by whatever drives it: a planner, a controller, an agent) and
``order_bandit`` (a discounted-UCB bandit over those orders, :class:`~kvrl.plugins.controllers.EpochBandit`,
that needs no training).

On the multi-tenant task the order is a lever of about 30% (``lpm`` over ``fcfs``, docs/rl.md, "The
admission order"), and the best order per run, chosen with hindsight, is a few percent over ``lpm``: these
are what an adaptive order is measured with (``scripts/rl_order_headroom.py``).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from kvrl.plugins.base import SchedulerPolicy, check_range
from kvrl.plugins.controllers import EpochBandit, check_bandit_params
from kvrl.plugins.registry import available, create, register


def _check_orders(orders) -> None:
    if isinstance(orders, (str, bytes)) or not hasattr(orders, "__len__") or len(orders) == 0:
        raise ValueError(f"orders must be a non-empty list of scheduler names, got {orders!r}")
    known = [n for n in available("scheduler") if n not in ("switch", "order_bandit")]
    for i, name in enumerate(orders):
        if name not in known:
            raise ValueError(f"orders[{i}] must be one of {known}, got {name!r}")


@register("scheduler", "switch")
class SwitchScheduler(SchedulerPolicy):
    """The admission order of one of ``orders`` (scheduler names, each at its defaults), the one at index
    :attr:`choice` (``choice`` at the start; :meth:`set_order` changes it between steps). Every one of them is
    bound to the engine and hears every finish, preemption and step, so a predictor among them (``sjf``'s)
    keeps learning while another order is in force. The waiting queue is sorted every step (no static key).
    Parameters: ``orders`` (default ``[fcfs, lpm]``), ``choice`` (default 0)."""

    static_key = False

    @dataclass
    class Params:
        orders: list[str] = field(default_factory=lambda: ["fcfs", "lpm"])
        choice: int = 0

        def __post_init__(self):
            _check_orders(self.orders)
            check_range("choice", self.choice, 0, len(self.orders) - 1)

    def __init__(self, params) -> None:
        super().__init__(params)
        self.schedulers = [create("scheduler", name) for name in params.orders]
        self.choice = int(params.choice)

    @property
    def current(self) -> SchedulerPolicy:
        """The scheduler whose order is in force."""
        return self.schedulers[self.choice]

    def set_order(self, index: int) -> None:
        """Admit in the order of ``orders[index]`` from the next step on."""
        check_range("choice", index, 0, len(self.schedulers) - 1)
        self.choice = int(index)

    def bind(self, engine) -> None:
        super().bind(engine)
        for s in self.schedulers:
            s.bind(engine)

    def key(self, seq):
        return self.current.key(seq)

    def order(self, waiting):
        return self.current.order(waiting)

    def on_step_end(self) -> None:
        for s in self.schedulers:
            s.on_step_end()

    def on_finish(self, seq) -> None:
        for s in self.schedulers:
            s.on_finish(seq)

    def on_preempt(self, seq, mode) -> None:
        for s in self.schedulers:
            s.on_preempt(seq, mode)


@register("scheduler", "order_bandit")
class OrderBandit(EpochBandit, SwitchScheduler):
    """A bandit over admission orders that needs no training: each epoch of ``epoch_s`` engine seconds
    admits in the order of one of ``orders`` (as ``switch``) and earns the epoch's goodput; discounted UCB
    (:class:`~kvrl.plugins.controllers.EpochBandit`, as the ``bandit`` watermark) picks the next epoch's
    order, each order once first, in the listed order. Parameters: ``orders`` (default ``[fcfs, lpm]``),
    ``epoch_s`` (2.0), ``discount`` (0.9, in (0, 1]), ``exploration`` (0.5)."""

    @dataclass
    class Params:
        orders: list[str] = field(default_factory=lambda: ["fcfs", "lpm"])
        epoch_s: float = 2.0
        discount: float = 0.9
        exploration: float = 0.5

        def __post_init__(self):
            _check_orders(self.orders)
            check_bandit_params(self.epoch_s, self.discount, self.exploration)

    def __init__(self, params) -> None:
        SchedulerPolicy.__init__(self, params)
        self.schedulers = [create("scheduler", name) for name in params.orders]
        self._start_bandit(len(params.orders))

    @property
    def choice(self) -> int:
        return self.arm

    def bind(self, engine) -> None:
        super().bind(engine)
        self._start_epochs(engine.now)

    def on_step_end(self) -> None:
        SwitchScheduler.on_step_end(self)
        EpochBandit.on_step_end(self)

    def on_finish(self, seq) -> None:
        SwitchScheduler.on_finish(self, seq)
        EpochBandit.on_finish(self, seq)
