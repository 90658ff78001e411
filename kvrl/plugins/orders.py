"""Schedulers that change the admission order while the engine serves: ``switch`` (the order of one of
several schedulers, the one chosen last by whatever drives it: a planner, a controller, an agent) and
``order_bandit`` (a discounted-UCB bandit over those orders, :class:`~kvrl.plugins.controllers.EpochBandit`,
that needs no training); and the ``ordered`` watermark, a rule that holds a fixed watermark and, while an
agent has handed it the watermark (``env.action.rules``), the engine's ``switch`` at one order: so an agent
of ``kvrl/Watermark-v0`` chooses the admission order (``env=tenants_order``).

On the multi-tenant task the order is a lever of about 30% (``lpm`` over ``fcfs``, docs/rl.md, "The
admission order"), and the best order per run, chosen with hindsight, is a few percent over ``lpm``: these
are what an adaptive order is measured with (``scripts/rl_order_headroom.py``).
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field

from kvrl.plugins.base import SchedulerPolicy, WatermarkPolicy, check_range
from kvrl.plugins.controllers import EpochBandit, check_bandit_params
from kvrl.plugins.registry import available, create, register


def _check_orders(orders) -> None:
    if isinstance(orders, (str, bytes)) or not hasattr(orders, "__len__") or len(orders) == 0:
        raise ValueError(f"orders must be a non-empty list of scheduler names, got {orders!r}")
    known = [n for n in available("scheduler") if n not in ("switch", "order_bandit")]
    for i, name in enumerate(orders):
        if name not in known:
            raise ValueError(f"orders[{i}] must be one of {known}, got {name!r}")


#: the ``switch`` scheduler of each engine, keyed (weakly) on the engine view its plugins are bound to
_SWITCHES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


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
        _SWITCHES[engine] = self
        for s in self.schedulers:
            s.bind(engine)

    def __setstate__(self, state: dict) -> None:
        """A copy (``copy.deepcopy`` of a serving loop, as a rollout planner makes) is the switch of the copied
        engine: the ``ordered`` rules of that copy find it."""
        self.__dict__.update(state)
        if self.engine is not None:
            _SWITCHES[self.engine] = self

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

    def set_order(self, index: int) -> None:
        raise ValueError("scheduler=order_bandit chooses its own order; an agent or planner that sets the order "
                         "needs scheduler=switch")

    def bind(self, engine) -> None:
        super().bind(engine)
        self._start_epochs(engine.now)

    def on_step_end(self) -> None:
        SwitchScheduler.on_step_end(self)
        EpochBandit.on_step_end(self)

    def on_finish(self, seq) -> None:
        SwitchScheduler.on_finish(self, seq)
        EpochBandit.on_finish(self, seq)


@register("watermark", "ordered")
class OrderedWatermark(WatermarkPolicy):
    """A rule for an agent that chooses the admission order (``env.action.rules``): keep ``fraction`` of the
    GPU blocks free (as ``fixed``) and, each time the agent hands it the watermark, set the engine's
    ``switch`` scheduler to ``order`` (one of that scheduler's ``orders``) until the next decision. Run by
    itself (no agent), it is ``fixed``, and the switch keeps its own order. An engine whose scheduler is not a
    ``switch`` with ``order`` among its orders fails at the hand-over, naming the setting. Parameters:
    ``order`` (a scheduler name, default ``lpm``), ``fraction`` (default 0.0, in [0, 1))."""

    @dataclass
    class Params:
        order: str = "lpm"
        fraction: float = 0.0

        def __post_init__(self):
            _check_orders([self.order])
            check_range("fraction", self.fraction, 0.0, 1.0, hi_inclusive=False)

    def on_take_over(self) -> None:
        switch = _SWITCHES.get(self.engine)
        orders = switch.params.orders if switch is not None else []
        if self.params.order not in orders:
            raise ValueError(f"watermark rule ordered(order={self.params.order}) sets the admission order of a "
                             f"switch scheduler: set scheduler=switch with {self.params.order} among scheduler.orders "
                             f"(now: {'scheduler is not switch' if switch is None else orders})")
        switch.set_order(orders.index(self.params.order))

    def reserved_blocks(self) -> int:
        return int(self.params.fraction * self.engine.num_blocks)
