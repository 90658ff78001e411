"""``kvrl/Preemption-v0``: the agent picks the preemption victim and mode at each block shortage.

The engine asks its eviction policy in the middle of a step; the ``agent`` eviction plugin hands
the question to this environment through :class:`~kvrl.envs.handoff.Handoff` (the serving loop
runs in a worker thread that waits for the answer). Each ``step(action)`` answers the pending
shortage and serves until the next one or the episode's end; ``reset`` serves until the first
shortage (drawing another window when one has none, unless the window is fixed).

Observation: the engine features (:func:`~kvrl.envs.features.engine_feature_names`) followed by ``top_k`` rows of
:data:`~kvrl.envs.features.CANDIDATE_FEATURES` (slot 0 = newest admission, the LIFO victim).
:meth:`action_masks` gives the valid actions (sb3-contrib's MaskablePPO calls it); a masked
action is served by the fallback of :meth:`~kvrl.envs.actions.PreemptionActions.decode` and
counted in ``info["masked_actions"]``.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

import numpy as np
from gymnasium import spaces

from kvrl.envs.actions import PreemptionActions
from kvrl.envs.common import KvrlEnv
from kvrl.envs.config import PreemptionEnvConfig
from kvrl.envs.features import CANDIDATE_FEATURES, engine_feature_names
from kvrl.envs.handoff import Handoff

MAX_EPISODE_DRAWS = 20


class PreemptionEnv(KvrlEnv):
    role = "eviction"
    config_cls = PreemptionEnvConfig
    task = "preemption"

    def __init__(self, config: PreemptionEnvConfig | Mapping[str, Any] | None = None,
                 task_overrides: Sequence[str] = (), render_mode: Optional[str] = None) -> None:
        super().__init__(config, task_overrides, render_mode)
        k = self.features.top_k
        self.actions = PreemptionActions(self.config.action, k)
        self.action_space = self.actions.space
        size = len(engine_feature_names(self.features)) + k * len(CANDIDATE_FEATURES)
        self.observation_space = spaces.Box(0.0, 1.0, shape=(size,), dtype=np.float32)
        self._handoff = Handoff()
        self._mask = self.actions.mask(1, np.zeros(k, dtype=bool))
        self._ended = True
        self.masked_actions = 0

    def action_masks(self) -> np.ndarray:
        """Valid actions at the pending shortage (one flag per action; see PreemptionActions)."""
        return self._mask.copy()

    def _ask(self, obs: np.ndarray, mask: np.ndarray):
        """The plugin's decider (serving thread): wait for the agent's (slot, mode)."""
        return self._handoff.ask((obs, mask))

    def _serve(self) -> None:
        driver = self.driver
        while not driver.done:
            driver.step()

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None):
        fixed = bool(options) or self.config.episode.start_s is not None or self.config.episode.window_s is None
        for _ in range(MAX_EPISODE_DRAWS):
            driver = self._new_episode(seed, options)
            self.masked_actions = 0
            seed = None                      # later draws continue the seeded RNG
            driver.engine.eviction.drive(self.features, self.actions, self._ask)
            kind, payload = self._handoff.start(self._serve)
            if kind == "decide" or fixed:
                break
        if kind != "decide":
            raise RuntimeError("no block shortage in the episode's arrivals: the scenario puts no pressure on the "
                               "KV cache (lower engine.num_blocks or the watermark, or raise workload.rate_scale)")
        obs, self._mask = payload
        driver.collect()                 # what finished before the first decision is no action's doing
        self._ended = False
        return obs, {"engine_time_s": driver.engine.now}

    def step(self, action):
        self._check_running()
        if self._ended:
            raise RuntimeError("the episode has ended (truncated); call reset()")
        slot, mode, clipped, masked = self.actions.decode(action, self._mask, clip=self.config.clip_actions)
        self.masked_actions += int(masked)
        kind, payload = self._handoff.reply((slot, mode))
        ended = kind == "end"
        reward, terminated, truncated, info = self._outcome(ended, clipped)
        info.update(victim_slot=slot, mode=mode.value, masked_actions=self.masked_actions)
        if ended:
            obs = np.zeros(self.observation_space.shape, dtype=np.float32)
            obs[:len(engine_feature_names(self.features))] = self.driver.engine.eviction.tracker.engine_features()
            self._mask = self.actions.mask(1, np.zeros(self.features.top_k, dtype=bool))
        else:
            obs, self._mask = payload
        self._ended = ended or terminated
        if terminated and not ended:
            self._handoff.abandon()
        return obs, reward, terminated, truncated, info

    def close(self) -> None:
        self._handoff.abandon()
        super().close()
