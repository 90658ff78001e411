"""``kvrl/Watermark-v0``: the agent sets the admission watermark once per decision epoch.

Each ``step(action)`` sets the ``agent`` watermark plugin's fraction (or, with ``env.action.rules``,
hands the watermark to the chosen rule), then serves the workload
(arrivals and engine steps, as ``Engine.run``) until the next decision epoch ends (see
:class:`~kvrl.envs.config.DecisionConfig`) or the episode does. ``reset`` serves the first epoch
with the plugin's initial fraction (``run.watermark.fraction``, default 0.01) and returns the
first observation. Observation: :data:`~kvrl.envs.features.ENGINE_FEATURES` (float32 in [0, 1]), then
:data:`~kvrl.envs.features.HISTORY_FEATURES` with ``features.history``.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

import numpy as np
from gymnasium import spaces

from kvrl.envs.actions import WatermarkActions
from kvrl.envs.common import KvrlEnv
from kvrl.envs.config import WatermarkEnvConfig
from kvrl.envs.features import engine_feature_names


class WatermarkEnv(KvrlEnv):
    role = "watermark"
    config_cls = WatermarkEnvConfig
    task = "watermark"

    def __init__(self, config: WatermarkEnvConfig | Mapping[str, Any] | None = None,
                 task_overrides: Sequence[str] = (), render_mode: Optional[str] = None) -> None:
        super().__init__(config, task_overrides, render_mode)
        self.actions = WatermarkActions(self.config.action)
        self.action_space = self.actions.space
        self.observation_space = spaces.Box(0.0, 1.0, shape=(len(engine_feature_names(self.features)),), dtype=np.float32)
        self._ended = True

    @property
    def plugin(self):
        """The engine's ``agent`` watermark plugin."""
        return self.driver.engine.watermark

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None):
        driver = self._new_episode(seed, options)
        self.plugin.drive(self.features, self.config.decision, self.actions.rules)
        self._ended = self._serve_epoch()
        driver.collect()                 # what finished before the first decision is no action's doing
        info = {"engine_time_s": driver.engine.now, "watermark": self._reserved_fraction()}
        return self.plugin.observe(), info

    def _reserved_fraction(self) -> float:
        """The fraction of the GPU blocks the plugin holds back now (the chosen rule's, with rules)."""
        plugin = self.plugin
        return plugin.reserved_blocks() / plugin.engine.num_blocks if plugin.rules else plugin.fraction

    def _serve_epoch(self) -> bool:
        """Serve until the next decision is due; True when the episode ended instead."""
        driver, plugin = self.driver, self.plugin
        while not driver.done:
            driver.step()
            if plugin.decision_due:
                return driver.done
        return True

    def step(self, action):
        self._check_running()
        if self._ended:
            raise RuntimeError("the episode has ended (truncated); call reset()")
        if self.actions.rules is not None:
            rule, clipped = self.actions.to_rule(action, clip=self.config.clip_actions)
            self.plugin.set_rule(rule)
        else:
            fraction, clipped = self.actions.to_fraction(action, clip=self.config.clip_actions)
            self.plugin.set_fraction(fraction)
        self._ended = self._serve_epoch()
        reward, terminated, truncated, info = self._outcome(self._ended, clipped)
        self._ended = self._ended or terminated
        info["watermark"] = self._reserved_fraction()
        if self.actions.rules is not None:
            info["rule"] = rule
        return self.plugin.observe(), reward, terminated, truncated, info
