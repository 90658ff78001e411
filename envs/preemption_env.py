"""``kvrl/Preemption-v0``: the agent picks the preemption victim and mode at each block shortage.

The episode is one generator, the serving loop's :meth:`~kvrl.engine.loop.ServingLoop.serve_iter`:
it yields each block shortage of an engine step (:class:`~kvrl.engine.decisions.Shortage`) and
receives the decision; no thread. Each ``step(action)`` sends the decision for the pending
shortage and serves until the next one or the episode's end; ``reset`` serves until the first
shortage (drawing another window when one has none, unless the window is fixed). The ``agent``
eviction plugin tracks the features and builds the observation; it is not asked to decide.

Observation: the engine features (:func:`~kvrl.envs.features.engine_feature_names`) followed by ``top_k`` rows of
:func:`~kvrl.envs.features.candidate_feature_names` (slot 0 = newest admission, the LIFO victim, or with
``features.slot_rules`` the first rule's victim).
:meth:`action_masks` gives the valid actions (sb3-contrib's MaskablePPO calls it); a masked
action is served by the fallback of :meth:`~kvrl.envs.actions.PreemptionActions.decode` and
counted in ``info["masked_actions"]``.
"""
from __future__ import annotations

from typing import Any, Generator, Mapping, Optional, Sequence

import numpy as np
from gymnasium import spaces

from kvrl.envs.actions import PreemptionActions
from kvrl.envs.common import KvrlEnv
from kvrl.envs.config import PreemptionEnvConfig
from kvrl.envs.features import candidate_feature_names, engine_feature_names
from kvrl.plugins.base import EvictionDecision

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
        size = len(engine_feature_names(self.features)) + k * len(candidate_feature_names(self.features))
        self.observation_space = spaces.Box(0.0, 1.0, shape=(size,), dtype=np.float32)
        self._steps: Optional[Generator] = None   # the episode's serving loop, suspended at a shortage
        self._slots: list = []                    # the pending shortage's candidates by slot
        self._obs = np.zeros(size, dtype=np.float32)
        self._mask = self.actions.mask(1, np.zeros(k, dtype=bool))
        self._ended = True
        self.masked_actions = 0

    def action_masks(self) -> np.ndarray:
        """Valid actions at the pending shortage (one flag per action; see PreemptionActions)."""
        return self._mask.copy()

    def _next_shortage(self, decision=None) -> bool:
        """Serve until the next block shortage (sending ``decision`` for the pending one) and
        observe it; False when the episode's serving ended instead."""
        try:
            point = next(self._steps) if decision is None else self._steps.send(decision)
        except StopIteration:
            self._steps = None
            return False
        self._obs, self._mask, self._slots = self.driver.engine.eviction.observe(point.candidates)
        return True

    def _abandon(self) -> None:
        """Drop a suspended episode (the engine is left in the middle of a step)."""
        if self._steps is not None:
            self._steps.close()
            self._steps = None

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None):
        fixed = bool(options) or self.config.episode.start_s is not None or self.config.episode.window_s is None
        for _ in range(MAX_EPISODE_DRAWS):
            self._abandon()
            driver = self._new_episode(seed, options)
            self.masked_actions = 0
            seed = None                      # later draws continue the seeded RNG
            driver.engine.eviction.drive(self.features, self.actions)
            self._steps = driver.loop.serve_iter()
            shortage = self._next_shortage()
            if shortage or fixed:
                break
        if not shortage:
            raise RuntimeError("no block shortage in the episode's arrivals: the scenario puts no pressure on the "
                               "KV cache (lower engine.num_blocks or the watermark, or raise workload.rate_scale)")
        driver.collect()                 # what finished before the first decision is no action's doing
        self._ended = False
        return self._obs, {"engine_time_s": driver.engine.now}

    def step(self, action):
        self._check_running()
        if self._ended:
            raise RuntimeError("the episode has ended (truncated); call reset()")
        slot, mode, clipped, masked = self.actions.decode(action, self._mask, clip=self.config.clip_actions)
        self.masked_actions += int(masked)
        ended = not self._next_shortage(EvictionDecision(self._slots[slot].seq_id, mode))
        reward, terminated, truncated, info = self._outcome(ended, clipped)
        info.update(victim_slot=slot, mode=mode.value, masked_actions=self.masked_actions)
        if ended:
            obs = np.zeros(self.observation_space.shape, dtype=np.float32)
            obs[:len(engine_feature_names(self.features))] = self.driver.engine.eviction.tracker.engine_features()
            self._mask = self.actions.mask(1, np.zeros(self.features.top_k, dtype=bool))
        else:
            obs = self._obs
        self._ended = ended or terminated
        if terminated and not ended:
            self._abandon()
        return obs, reward, terminated, truncated, info

    def close(self) -> None:
        self._abandon()
        super().close()
