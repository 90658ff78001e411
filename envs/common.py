"""What the two environments share: config resolution, the session, episode bookkeeping, and the
``(reward, terminated, truncated, info)`` of a step."""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional, Sequence

import gymnasium as gym
from omegaconf import OmegaConf

from kvrl.envs.config import EnvConfig, load_task, make_config, to_dict
from kvrl.envs.driver import EngineDriver
from kvrl.envs.session import EngineSession


def resolve_env_config(cls: type, config: Any, task: str, task_overrides: Sequence[str]) -> EnvConfig:
    """A complete ``cls``: ``config`` as given when it carries a run config, else merged over the
    packaged task ``conf/env/<task>.yaml`` (a mapping deep-merges; a dataclass takes its run)."""
    if isinstance(config, cls) and config.run:
        return config
    _, default = load_task(task, task_overrides)
    if config is None:
        return default
    if isinstance(config, cls):
        return dataclasses.replace(config, run=default.run)
    merged = OmegaConf.merge(OmegaConf.create(to_dict(default)), OmegaConf.create(dict(config)))
    return make_config(cls, merged)


class KvrlEnv(gym.Env):
    """Base of the kvrl environments. Subclasses set ``role`` (the plugin kind the agent
    replaces), ``config_cls`` and ``task``, and implement ``reset`` / ``step``."""

    metadata = {"render_modes": []}
    role = ""
    config_cls: type = EnvConfig
    task = ""

    def __init__(self, config: EnvConfig | Mapping[str, Any] | None = None, task_overrides: Sequence[str] = (),
                 render_mode: Optional[str] = None) -> None:
        if render_mode is not None:
            raise ValueError(f"kvrl environments do not render (render_mode={render_mode!r}); use render_mode=None")
        self.render_mode = None
        self.config = resolve_env_config(self.config_cls, config, self.task, task_overrides)
        self.session = EngineSession(self.config, self.role)
        self.features = self.session.features
        self.driver: Optional[EngineDriver] = None
        self.clipped_actions = 0
        self.decisions = 0

    def _new_episode(self, seed: Optional[int], options: Optional[Mapping[str, Any]]) -> EngineDriver:
        super().reset(seed=seed)
        requests, end_s = self.session.episode(self.np_random, options)
        self.step_time_scale = self.session.perturb_cost(self.np_random)
        self.driver = self.session.start(requests, end_s)
        self.clipped_actions = 0
        self.decisions = 0
        return self.driver

    def _outcome(self, ended: bool, clipped: bool) -> tuple[float, bool, bool, dict]:
        """Reward, terminated, truncated and info after one decision's worth of serving.

        Serving never reaches a terminal state: the episode is truncated at trace end or at the
        window's time limit; ``terminated`` means failure (a plugin failed, see
        ``engine.policy_errors``)."""
        driver = self.driver
        engine = driver.engine
        self.clipped_actions += int(clipped)
        self.decisions += 1
        parts = driver.collect(final=ended)
        reward, components = parts.reward(self.config.reward)
        failures = engine.metrics.policy_errors
        info = {**components, **dataclasses.asdict(parts), "engine_time_s": engine.now,
                "clipped_actions": self.clipped_actions, "decisions": self.decisions, "policy_errors": failures}
        terminated = failures > 0
        truncated = ended and not terminated
        if terminated or truncated:
            info["metrics"] = engine.metrics.summary()
            info["trace_end"] = driver.finished
        return float(reward), terminated, truncated, info

    def _check_running(self) -> None:
        if self.driver is None:
            raise RuntimeError("call reset() before step()")
