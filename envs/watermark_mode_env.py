"""``kvrl/WatermarkMode-v0``: the agent sets the admission watermark and the preemption mode (swap
or recompute) together, once per decision epoch.

The engine runs the ``joint_agent`` watermark plugin and the task's ``follow_mode`` eviction
plugin (:mod:`kvrl.plugins.joint`): each ``step(action)`` sets the watermark fraction and the mode
that every preemption until the next decision uses (victim by ``eviction.victim``, LIFO in
``conf/env/joint.yaml``), then serves the workload until the next decision epoch ends or the
episode does, as :class:`~kvrl.envs.watermark_env.WatermarkEnv`. ``reset`` serves the first epoch
with the watermark 0.01 and the eviction plugin's ``mode``. Action: see
:class:`~kvrl.envs.actions.WatermarkModeActions`. Observation: the watermark task's features, then
1.0 when the mode in force is swap (else 0.0).
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

import numpy as np
from gymnasium import spaces

from kvrl.envs.actions import WatermarkModeActions
from kvrl.envs.config import WatermarkModeEnvConfig
from kvrl.envs.features import engine_feature_names
from kvrl.envs.watermark_env import WatermarkEnv


class WatermarkModeEnv(WatermarkEnv):
    role = "watermark"              # the slot the session puts the agent plugin in (then joint_agent, below)
    config_cls = WatermarkModeEnvConfig
    task = "joint"

    def __init__(self, config: WatermarkModeEnvConfig | Mapping[str, Any] | None = None,
                 task_overrides: Sequence[str] = (), render_mode: Optional[str] = None) -> None:
        super(WatermarkEnv, self).__init__(config, task_overrides, render_mode)   # KvrlEnv's: own action space below
        eviction = self.session.run.eviction
        if eviction.name != "follow_mode":
            raise ValueError(f"kvrl/WatermarkMode-v0 sets the preemption mode through eviction=follow_mode; "
                             f"the task's run config has eviction.name={eviction.name!r}")
        self.session.run.watermark = {"name": "joint_agent"}
        self.actions = WatermarkModeActions(self.config.action)
        self.action_space = self.actions.space
        size = len(engine_feature_names(self.features)) + 1
        self.observation_space = spaces.Box(0.0, 1.0, shape=(size,), dtype=np.float32)
        self._ended = True

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None):
        obs, info = super().reset(seed=seed, options=options)
        info["mode"] = self.plugin.mode.value
        return obs, info

    def step(self, action):
        self._check_running()
        if self._ended:
            raise RuntimeError("the episode has ended (truncated); call reset()")
        fraction, mode, clipped = self.actions.decode(action, clip=self.config.clip_actions)
        self.plugin.set_action(fraction, mode)
        self._ended = self._serve_epoch()
        reward, terminated, truncated, info = self._outcome(self._ended, clipped)
        self._ended = self._ended or terminated
        info["watermark"] = fraction
        info["mode"] = mode.value
        return self.plugin.observe(), reward, terminated, truncated, info
