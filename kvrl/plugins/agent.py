"""The ``agent`` watermark and eviction plugins: decisions from a reinforcement-learning agent.

Each runs in one of two modes:

* **driven**: an environment (``kvrl/Watermark-v0``, ``kvrl/Preemption-v0``) builds the engine,
  calls :meth:`drive` and supplies every decision;
* **policy**: with ``policy_path`` (a ``kvrl-train`` run directory or model zip), the saved agent
  decides by itself, from the same observation features (:mod:`kvrl.envs.features`) at the same
  decision points as in its environment, so ``kvrl-run watermark=agent
  watermark.policy_path=runs/train/...`` runs a trained agent outside the environment.

With neither, the watermark agent holds ``fraction`` (like ``fixed``) and the eviction agent
fails at its first decision, saying what to set.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

import numpy as np

from kvrl.envs.config import DecisionConfig, FeatureConfig, resolve_features
from kvrl.envs.features import CANDIDATE_FEATURES, FeatureTracker
from kvrl.plugins.base import EvictionDecision, EvictionPolicy, PreemptionMode, WatermarkPolicy, check_range
from kvrl.plugins.registry import register

if TYPE_CHECKING:
    from kvrl.envs.actions import PreemptionActions, WatermarkActions
    from kvrl.envs.agent_io import Agent


class EpochClock:
    """Decision epochs: due after the engine step that ends ``epoch_s`` seconds of engine time
    (or ``epoch_steps`` steps) since the last decision; due after the first step."""

    def __init__(self, config: DecisionConfig) -> None:
        self.config = config
        self._last_s = -math.inf
        self._last_step = None

    def due(self, view) -> bool:
        if self.config.epoch_s is not None:
            return view.now - self._last_s >= self.config.epoch_s
        return self._last_step is None or view.step_index - self._last_step >= self.config.epoch_steps

    def mark(self, view) -> None:
        self._last_s, self._last_step = view.now, view.step_index


def _load(path: str, role: str, deterministic: bool) -> tuple["Agent", FeatureConfig]:
    """The saved agent and its feature config (latency references resolved from its scenario)."""
    from kvrl.envs.agent_io import load_agent

    agent = load_agent(path, role=role, deterministic=deterministic)
    return agent, resolve_features(agent.env_config)


@register("watermark", "agent")
class AgentWatermark(WatermarkPolicy):
    """Keep ``fraction`` of the GPU blocks free (``int(fraction * num_blocks)``, as ``fixed``),
    the fraction being set by an agent at each decision epoch; or, for an agent whose actions are
    watermark rules (``env.action.rules``), let the rule it chose decide until its next decision
    (rule 0 before the first): every rule is bound to the engine and sees every step, finish and
    preemption, and the chosen one answers ``reserved_blocks`` and ``admit``. Parameters:
    ``fraction`` (the value before the first decision, default 0.01), ``policy_path`` (a saved
    watermark agent; null = set by an environment), ``deterministic`` (the policy's mode, not a
    sample)."""

    @dataclass
    class Params:
        fraction: float = 0.01
        policy_path: Optional[str] = None
        deterministic: bool = True

        def __post_init__(self):
            check_range("fraction", self.fraction, 0.0, 1.0, hi_inclusive=False)

    def __init__(self, params) -> None:
        super().__init__(params)
        self.fraction = params.fraction
        self.tracker: Optional[FeatureTracker] = None
        self.clock: Optional[EpochClock] = None
        self.decision_due = False
        self._agent: Optional["Agent"] = None
        self._actions: Optional["WatermarkActions"] = None
        self.rules: list[WatermarkPolicy] = []       # the watermark rules an agent chooses among (if any)
        self.rule = 0                                # the chosen one's index

    def bind(self, engine) -> None:
        super().bind(engine)
        if self.params.policy_path:
            from kvrl.envs.actions import WatermarkActions

            agent, features = _load(self.params.policy_path, "watermark", self.params.deterministic)
            self.drive(features, agent.env_config.decision, agent.env_config.action.rules)
            self._agent = agent
            self._actions = WatermarkActions(agent.env_config.action)

    def drive(self, features: FeatureConfig, decision: DecisionConfig, rules: Optional[list] = None) -> None:
        """Start tracking features and decision epochs (resolved ``features``: no null refs), and with
        ``rules`` (watermark plugin configs) build and bind them; rule 0 decides until the first decision."""
        from kvrl import plugins

        self.tracker = FeatureTracker(features)
        self.tracker.bind(self.engine)
        self.clock = EpochClock(decision)
        self.rules = [plugins.create_from_config("watermark", rule) for rule in rules or ()]
        for rule in self.rules:
            rule.bind(self.engine)
        self.rule = 0
        if self.rules:
            self.rules[0].on_take_over()

    def observe(self) -> np.ndarray:
        return self.tracker.engine_features()

    def set_fraction(self, fraction: float) -> None:
        """A decision: hold ``fraction`` until the next epoch."""
        self.fraction = fraction
        self._decided()

    def set_rule(self, index: int) -> None:
        """A decision: rule ``index`` of :attr:`rules` decides until the next epoch."""
        if not 0 <= index < len(self.rules):
            raise ValueError(f"watermark agent: rule {index} of {len(self.rules)} (env.action.rules)")
        self.rule = index
        self.rules[index].on_take_over()
        self._decided()

    def _decided(self) -> None:
        """A decision was taken now: the next is due an epoch from here."""
        self.clock.mark(self.engine)
        self.decision_due = False

    def on_step_end(self) -> None:
        for rule in self.rules:
            rule.on_step_end()
        if self.tracker is None:
            return
        self.tracker.on_step_end()
        if self.clock.due(self.engine):
            self.decision_due = True
            if self._agent is not None:   # policy mode decides here; a driving env decides outside
                self._act()

    def _act(self) -> None:
        """Policy mode: take the saved agent's decision for the current observation."""
        action = self._agent.act(self.observe())
        if self.rules:
            self.set_rule(self._actions.to_rule(action, clip=True)[0])
        else:
            self.set_fraction(self._actions.to_fraction(action, clip=True)[0])

    def on_finish(self, seq) -> None:
        for rule in self.rules:
            rule.on_finish(seq)
        if self.tracker is not None:
            self.tracker.on_finish(seq)

    def on_preempt(self, seq, mode) -> None:
        for rule in self.rules:
            rule.on_preempt(seq, mode)

    @property
    def vetoes(self) -> bool:
        return bool(self.rules) and self.rules[self.rule].vetoes

    def admit(self, seq, blocks_needed: int) -> bool:
        return self.rules[self.rule].admit(seq, blocks_needed) if self.rules else True

    def reserved_blocks(self) -> int:
        if self.rules:
            return self.rules[self.rule].reserved_blocks()
        return int(self.fraction * self.engine.num_blocks)


_SWAP_FITS = CANDIDATE_FEATURES.index("swap_fits")
Decider = Callable[[np.ndarray, np.ndarray], tuple[int, PreemptionMode]]


@register("eviction", "agent")
class AgentEviction(EvictionPolicy):
    """Victim and mode chosen by an agent among the candidate slots of its features (the
    ``top_k`` newest admissions, slot 0 = the LIFO victim; with ``features.slot_rules`` the
    rules' victims first). Parameters: ``policy_path`` (a saved preemption agent; null = driven by
    ``kvrl/Preemption-v0``), ``deterministic``. A chosen swap for a victim that does not fit the
    CPU pool becomes recompute (the engine's rule)."""

    @dataclass
    class Params:
        policy_path: Optional[str] = None
        deterministic: bool = True

    def __init__(self, params) -> None:
        super().__init__(params)
        self.tracker: Optional[FeatureTracker] = None
        self.actions: Optional["PreemptionActions"] = None
        self._decide: Optional[Decider] = None

    def bind(self, engine) -> None:
        super().bind(engine)
        if self.params.policy_path:
            from kvrl.envs.actions import PreemptionActions

            agent, features = _load(self.params.policy_path, "eviction", self.params.deterministic)
            actions = PreemptionActions(agent.env_config.action, features.top_k)
            self.drive(features, actions,
                       lambda obs, mask: actions.decode(agent.act(obs, mask), mask, clip=True)[:2])

    def drive(self, features: FeatureConfig, actions: "PreemptionActions", decide: Optional[Decider] = None) -> None:
        """Track features; ask ``decide(observation, mask) -> (slot, mode)`` at each shortage, or,
        without ``decide``, leave the decisions to the caller of ``Engine.step_iter`` (the
        environment, which builds each observation with :meth:`observe`)."""
        self.tracker = FeatureTracker(features)
        self.tracker.bind(self.engine)
        self.actions = actions
        self._decide = decide

    def observe(self, candidates) -> tuple[np.ndarray, np.ndarray, list]:
        """``(observation, action mask, slots)`` for a shortage with these candidates."""
        tracker = self.tracker
        slots = tracker.candidate_slots(candidates)
        rows = tracker.candidate_features(candidates, slots)
        swap_ok = rows[:, _SWAP_FITS] > 0
        obs = np.concatenate([tracker.engine_features(), rows.reshape(-1)])
        return obs, self.actions.mask(len(slots), swap_ok), slots

    def on_step_end(self) -> None:
        if self.tracker is not None:
            self.tracker.on_step_end()

    def on_finish(self, seq) -> None:
        if self.tracker is not None:
            self.tracker.on_finish(seq)

    def select(self, candidates):
        if self._decide is None:
            raise RuntimeError("eviction=agent has no policy: set eviction.policy_path to a kvrl-train run "
                               "directory (a preemption agent), or drive it from kvrl/Preemption-v0")
        obs, mask, slots = self.observe(candidates)
        slot, mode = self._decide(obs, mask)
        return EvictionDecision(slots[slot].seq_id, mode)
