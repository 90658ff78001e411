"""The joint watermark-and-mode agent (``kvrl/WatermarkMode-v0``): the ``joint_agent`` watermark
plugin decides the watermark and the preemption mode together, and the ``follow_mode`` eviction
plugin preempts with the mode last decided.

The two plugins of one engine meet on a :class:`ModeChannel`, one per engine, keyed (weakly) on
the engine view both are bound to: ``follow_mode`` opens it with its own ``mode`` parameter (the
mode before the first decision) and ``joint_agent`` writes each decided mode into it. A
``joint_agent`` whose engine has no ``follow_mode`` eviction plugin fails at its first decision
(its modes would be ignored), naming the setting.

Like the ``agent`` plugins (:mod:`kvrl.plugins.agent`), ``joint_agent`` is either driven by the
environment (:meth:`JointAgentWatermark.set_action` at each decision epoch) or, with
``policy_path``, decides by itself from the same observation at the same decision points, so
``kvrl-run watermark=joint_agent watermark.policy_path=... eviction=follow_mode`` (and kvrl-eval)
runs a trained joint agent outside the environment.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Optional

import numpy as np

from kvrl.plugins.agent import AgentWatermark, _load
from kvrl.plugins.base import EvictionDecision, EvictionPolicy, PreemptionMode
from kvrl.plugins.registry import create, register

if TYPE_CHECKING:
    from kvrl.engine.views import EngineView
    from kvrl.envs.actions import WatermarkModeActions


@dataclass
class ModeChannel:
    """The preemption mode in force for one engine. ``followed``: a ``follow_mode`` eviction
    plugin applies it."""

    mode: PreemptionMode = PreemptionMode.RECOMPUTE
    followed: bool = False


_CHANNELS: "weakref.WeakKeyDictionary[EngineView, ModeChannel]" = weakref.WeakKeyDictionary()


def mode_channel(view: "EngineView") -> ModeChannel:
    """The :class:`ModeChannel` of the engine behind ``view`` (made at the first call)."""
    channel = _CHANNELS.get(view)
    if channel is None:
        channel = _CHANNELS[view] = ModeChannel()
    return channel


@register("eviction", "follow_mode")
class FollowMode(EvictionPolicy):
    """Victim by the ``victim`` rule (``lifo``, ``fewest_computed`` or ``most_blocks``, as the
    eviction plugins of those names), mode = the mode the ``joint_agent`` watermark plugin decided
    last (``mode``, default recompute, until its first decision; with another watermark plugin,
    always ``mode``: then it equals the eviction plugin named by ``victim`` with that ``mode``).
    A swap of a victim that does not fit the CPU pool becomes recompute (the engine's rule)."""

    @dataclass
    class Params:
        victim: Literal["lifo", "fewest_computed", "most_blocks"] = "lifo"
        mode: Literal["recompute", "swap"] = "recompute"

    def bind(self, engine) -> None:
        super().bind(engine)
        self.channel = mode_channel(engine)
        self.channel.mode = PreemptionMode(self.params.mode)
        self.channel.followed = True
        self._victim_rule = create("eviction", self.params.victim)     # its victim order (key), not its mode
        self._victim_rule.bind(engine)

    def select(self, candidates):
        return EvictionDecision(max(candidates, key=self._victim_rule.key).seq_id, self.channel.mode)


@register("watermark", "joint_agent")
class JointAgentWatermark(AgentWatermark):
    """The ``agent`` watermark (``fraction`` of the GPU blocks kept free, set at each decision
    epoch) whose decisions also set the preemption mode that the ``follow_mode`` eviction plugin
    applies. Parameters as ``agent``: ``fraction`` (before the first decision), ``policy_path`` (a
    saved ``kvrl/WatermarkMode-v0`` agent; null = driven by that environment), ``deterministic``.
    Observation: the ``agent`` features, then 1.0 when the mode in force is swap (else 0.0)."""

    def __init__(self, params) -> None:
        super().__init__(params)
        self.channel: Optional[ModeChannel] = None
        self._decode = None

    def bind(self, engine) -> None:
        self.channel = mode_channel(engine)
        if not self.params.policy_path:
            super().bind(engine)
            return
        from kvrl.envs.actions import WatermarkModeActions

        self.engine = engine
        agent, features = _load(self.params.policy_path, "joint", self.params.deterministic)
        self.drive(features, agent.env_config.decision)
        actions: WatermarkModeActions = WatermarkModeActions(agent.env_config.action)
        self._agent = agent
        self._decode = lambda obs: actions.decode(agent.act(obs), clip=True)[:2]

    @property
    def mode(self) -> PreemptionMode:
        return self.channel.mode

    def observe(self) -> np.ndarray:
        mode = np.float32(self.channel.mode is PreemptionMode.SWAP)
        return np.append(self.tracker.engine_features(), mode)

    def set_action(self, fraction: float, mode: PreemptionMode) -> None:
        """A decision: hold ``fraction`` and ``mode`` until the next epoch."""
        if not self.channel.followed:
            raise RuntimeError("watermark=joint_agent decides the preemption mode, which only eviction=follow_mode "
                               "applies; set eviction=follow_mode (victim=lifo|fewest_computed|most_blocks)")
        self.set_fraction(fraction)
        self.channel.mode = mode

    def _act(self) -> None:
        self.set_action(*self._decode(self.observe()))
