"""``train.init_agent``: start ``kvrl-train`` from a saved agent instead of an untrained policy.

The use it is made for is fine-tuning a sim-trained agent on the live engine for a bounded budget
(``backend=live train.max_wall_s=...``, docs/rl.md "Fine-tuning live"), but any saved agent can be
continued on any task whose observations and actions mean the same: the agent's algorithm must be
``agent=<its algorithm>``, it must drive the same plugin kind, and the task's observation features
and action settings must equal the ones it was trained with (the model zip only checks shapes; the
same shape with another ``features.slot_rules`` would silently mean other victims).

The loaded model keeps its weights and saved hyperparameters; ``agent.kwargs`` given on the command
line override them (e.g. ``agent.kwargs.learning_rate=1e-4 agent.kwargs.n_steps=128``), except
``policy_kwargs`` (the network's shape), which must match. Its timestep counter restarts at 0, so
``train.total_timesteps`` counts the fine-tuning decisions and checkpoints resume as usual.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvrl.apps.schema import ConfigError
from kvrl.envs.agent_io import ROLES, algo_class, model_path, read_meta, saved_env_config
from kvrl.envs.config import to_dict

# The parts of a task config that decide what an observation and an action mean.
MEANING_KEYS = ("features", "action", "decision")
PPO_FAMILY = ("ppo", "maskable_ppo", "recurrent_ppo")


@dataclass
class WarmStart:
    """A saved agent loaded onto the training envs: the SB3 model, the zip it came from and the
    timesteps it had been trained for there."""

    model: Any
    source: Path
    source_timesteps: int


def meaning_differences(saved: Any, here: Any) -> list[str]:
    """``env.<part>.<key>: agent <value>, here <value>`` for every key of :data:`MEANING_KEYS`
    whose value differs between two typed task configs (empty when the agent fits the task)."""
    diffs = []
    for part in MEANING_KEYS:
        a, b = to_dict(saved).get(part), to_dict(here).get(part)
        if a == b:
            continue
        if not isinstance(a, dict) or not isinstance(b, dict):
            diffs.append(f"env.{part}: agent {a!r}, here {b!r}")
            continue
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key):
                diffs.append(f"env.{part}.{key}: agent {a.get(key)!r}, here {b.get(key)!r}")
    return diffs


def load_warm_start(path: str | Path, algo: str, env_id: str, env_config: Any, env: Any,
                    agent_kwargs: dict) -> WarmStart:
    """The agent at ``path`` (a kvrl-train run directory or one of its zips) loaded onto ``env``
    to continue training as ``agent=algo`` on task ``env_id``/``env_config``, with
    ``agent_kwargs`` overriding its saved hyperparameters. :class:`ConfigError` naming
    ``train.init_agent`` when it is missing or does not fit the task."""
    try:
        zip_path = model_path(path)
        meta = read_meta(zip_path)
    except FileNotFoundError as exc:
        raise ConfigError(f"train.init_agent: {exc}") from None
    if meta["algo"] != algo:
        raise ConfigError(f"train.init_agent: {zip_path} is a {meta['algo']} agent; continue it with "
                          f"agent={meta['algo']} (here agent={algo})")
    if ROLES.get(meta["env_id"]) != ROLES.get(env_id):
        raise ConfigError(f"train.init_agent: {zip_path} was trained on {meta['env_id']} "
                          f"({ROLES.get(meta['env_id'])}), not a task like {env_id} ({ROLES.get(env_id)})")
    diffs = meaning_differences(saved_env_config(meta), env_config)
    if diffs:
        raise ConfigError(f"train.init_agent: {zip_path} was trained with other observations or actions "
                          f"than this task's; set them as the agent had them: " + "; ".join(diffs))
    kwargs = dict(agent_kwargs)
    # Training schedules are saved with cloudpickle and may not unpickle under another Python (a GPU
    # machine's); SB3's _setup_model rebuilds lr_schedule (and DQN's exploration schedule) from
    # the plain values, and PPO's clip range from this number.
    custom = {"lr_schedule": lambda _progress: 0.0}
    if algo in PPO_FAMILY:
        custom["clip_range"] = float(kwargs.pop("clip_range", 0.2))
    try:
        model = algo_class(algo).load(str(zip_path), env=env, device="cpu", custom_objects=custom, **kwargs)
    except (ValueError, KeyError) as exc:       # spaces or policy_kwargs that differ (SB3's message)
        raise ConfigError(f"train.init_agent: {zip_path} does not fit this task: {exc}") from None
    source_timesteps = int(model.num_timesteps)
    model.num_timesteps = 0
    return WarmStart(model, zip_path, source_timesteps)
