"""Saved agents: an SB3 model zip plus ``agent.json``, the environment it was trained on.

Layout written by ``kvrl-train`` in its run directory::

    agent.json              algorithm, env id, env config (task + scenario), kvrl version
    model.zip               the final model
    best_model.zip          the best model on the validation split (EvalCallback)
    checkpoints/*.zip       periodic checkpoints (resume)

:func:`load_agent` accepts the run directory (``best_model.zip``, else ``model.zip``) or any of
its zips; ``agent.json`` is looked up beside the zip, then in the folder above it. SB3 is imported
only when an agent is loaded.
"""
from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

from kvrl import __version__
from kvrl.envs.config import TASKS, make_config, to_dict

META_NAME = "agent.json"
ALGOS = {                      # agent name -> (module, class)
    "ppo": ("stable_baselines3", "PPO"),
    "sac": ("stable_baselines3", "SAC"),
    "dqn": ("stable_baselines3", "DQN"),
    "maskable_ppo": ("sb3_contrib", "MaskablePPO"),
    "recurrent_ppo": ("sb3_contrib", "RecurrentPPO"),
}
ROLES = {"kvrl/Watermark-v0": "watermark", "kvrl/WatermarkLive-v0": "watermark",
         "kvrl/Preemption-v0": "eviction", "kvrl/PreemptionLive-v0": "eviction",
         "kvrl/WatermarkMode-v0": "joint"}     # joint: the watermark and eviction slots together
JOINT_SLOTS = ("watermark", "eviction")       # the plugin slots a joint policy fills


class AgentNotFound(FileNotFoundError):
    """A policy path that holds no saved agent; the message names the path."""


def algo_class(name: str) -> type:
    """The SB3 class of agent ``name`` (``ppo``, ``sac``, ``dqn``, ``maskable_ppo``, ``recurrent_ppo``)."""
    if name not in ALGOS:
        raise ValueError(f"unknown agent {name!r}; known agents: {sorted(ALGOS)}")
    module, cls = ALGOS[name]
    try:
        return getattr(importlib.import_module(module), cls)
    except ImportError as exc:
        raise ImportError(f"agent {name!r} needs the package {module!r} (pip install sb3-contrib)") from exc


def write_meta(run_dir: Path, algo: str, env_id: str, env_config: Any) -> None:
    """Write ``agent.json`` into ``run_dir``."""
    from kvrl.files import atomic_write

    meta = {"algo": algo, "env_id": env_id, "env": to_dict(env_config), "kvrl_version": __version__}
    atomic_write(Path(run_dir) / META_NAME, lambda f: json.dump(meta, f, indent=2, sort_keys=True))


def model_path(path: str | Path) -> Path:
    """The model zip that ``path`` names (see the module docs); :class:`AgentNotFound` otherwise."""
    p = Path(path).expanduser()
    if p.is_dir():
        for name in ("best_model.zip", "model.zip"):
            if (p / name).is_file():
                return p / name
        raise AgentNotFound(f"no saved agent in {p}: expected best_model.zip or model.zip (kvrl-train's run directory)")
    if p.is_file():
        return p
    if p.suffix != ".zip" and p.with_suffix(".zip").is_file():
        return p.with_suffix(".zip")
    raise AgentNotFound(f"agent checkpoint {p} does not exist")


def _meta_path(model: Path) -> Path:
    for folder in (model.parent, model.parent.parent):
        if (folder / META_NAME).is_file():
            return folder / META_NAME
    raise AgentNotFound(f"no {META_NAME} beside {model} or in {model.parent.parent} (written by kvrl-train)")


def read_meta(path: str | Path) -> dict:
    """The ``agent.json`` of the agent at ``path`` (see :func:`model_path`), without loading it."""
    return json.loads(_meta_path(model_path(path)).read_text())


@dataclass
class Agent:
    """A loaded agent: the SB3 model, its algorithm, env id and typed env config.

    A ``recurrent_ppo`` agent carries its LSTM state from one :meth:`act` to the next: one episode (one
    engine run) per agent, or :meth:`reset` between episodes."""

    model: Any
    algo: str
    env_id: str
    env_config: Any
    path: Path
    deterministic: bool = True
    lstm_state: Any = None        # recurrent_ppo: the hidden and cell states after the last act (None: a new episode)

    @property
    def role(self) -> str:
        """The plugin kind it drives: ``watermark``, ``eviction`` or ``joint`` (both)."""
        return ROLES[self.env_id]

    def act(self, obs: np.ndarray, mask: Optional[np.ndarray] = None) -> np.ndarray:
        """The model's action for one observation (masked for ``maskable_ppo``; for ``recurrent_ppo``,
        given the observations since the episode started, through its state)."""
        if self.algo == "maskable_ppo":
            action, _ = self.model.predict(obs, deterministic=self.deterministic, action_masks=mask)
        elif self.algo == "recurrent_ppo":
            action, self.lstm_state = self.model.predict(obs, state=self.lstm_state, deterministic=self.deterministic,
                                                         episode_start=np.array([self.lstm_state is None]))
        else:
            action, _ = self.model.predict(obs, deterministic=self.deterministic)
        return action

    def reset(self) -> None:
        """Start a new episode: a recurrent agent forgets what it saw (others hold no state)."""
        self.lstm_state = None


def _zero(_progress: float) -> float:
    return 0.0


# Training schedules, saved with cloudpickle, are not needed to act and may not unpickle under
# another Python version (a GPU machine's): replace them on load.
INFERENCE_ONLY = {"learning_rate": 0.0, "lr_schedule": _zero, "clip_range": _zero, "exploration_schedule": _zero}


def load_agent(path: str | Path, role: Optional[str] = None, deterministic: bool = True) -> Agent:
    """Load the agent at ``path``; with ``role``, check it drives that plugin kind."""
    model_file = model_path(path)
    meta = json.loads(_meta_path(model_file).read_text())
    env_id = meta["env_id"]
    if role is not None and ROLES[env_id] != role:
        raise ValueError(f"{model_file} is a {ROLES[env_id]} agent ({env_id}), not a {role} agent")
    model = algo_class(meta["algo"]).load(str(model_file), device="cpu", custom_objects=INFERENCE_ONLY)
    return Agent(model, meta["algo"], env_id, saved_env_config(meta), model_file, deterministic)


def saved_env_config(meta: dict) -> Any:
    """The typed env config of an ``agent.json``. One saved before ``episode.rate_scales_relative``
    existed held absolute rate scales: it reads as ``rate_scales_relative: false``."""
    env = json.loads(json.dumps(meta["env"]))
    env.setdefault("episode", {}).setdefault("rate_scales_relative", False)
    return make_config(TASKS[meta["env_id"]], env)
