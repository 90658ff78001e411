"""Gymnasium environments on the kvrl engine (importable as ``kvrl.envs``).

Importing this package registers (cheaply: no engine, SB3 or torch import):

* ``kvrl/Watermark-v0``: set the admission watermark once per decision epoch;
* ``kvrl/Preemption-v0``: pick the preemption victim and mode at each block shortage
  (``action_masks()`` for sb3-contrib's MaskablePPO);
* ``kvrl/WatermarkMode-v0``: set the watermark and the preemption mode (swap or recompute)
  together once per decision epoch;
* ``kvrl/Tier-v0``: pick the KV tiers' mode (drop, offload, offload + prefetch) once per
  decision epoch (issue #20, ``kvrl.envs.tier_env``);
* ``kvrl/WatermarkLive-v0`` and ``kvrl/PreemptionLive-v0``: the same on the live executor (a real
  model, by default the tiny random one on CPU), registered as nondeterministic.

``gymnasium.make(id)`` builds the packaged task (``conf/env/<task>.yaml`` composed through
``conf/train.yaml``); ``gymnasium.make(id, config=...)`` takes a typed config or a mapping merged
over it, ``task_overrides=[...]`` Hydra overrides of the task. See docs/rl.md.
"""
from __future__ import annotations

import gymnasium

LIVE_OVERRIDES = ("backend=live", "model=tiny")

ENV_IDS = {
    "kvrl/Watermark-v0": ("kvrl.envs.watermark_env:WatermarkEnv", False, ()),
    "kvrl/Preemption-v0": ("kvrl.envs.preemption_env:PreemptionEnv", False, ()),
    "kvrl/WatermarkMode-v0": ("kvrl.envs.watermark_mode_env:WatermarkModeEnv", False, ()),
    "kvrl/WatermarkLive-v0": ("kvrl.envs.watermark_env:WatermarkEnv", True, LIVE_OVERRIDES),
    "kvrl/PreemptionLive-v0": ("kvrl.envs.preemption_env:PreemptionEnv", True, LIVE_OVERRIDES),
    "kvrl/Tier-v0": ("kvrl.envs.tier_env:TierEnv", False, ()),
}


def register_envs() -> None:
    """Register :data:`ENV_IDS` with Gymnasium (idempotent)."""
    for env_id, (entry_point, live, overrides) in ENV_IDS.items():
        if env_id not in gymnasium.registry:
            gymnasium.register(env_id, entry_point=entry_point, nondeterministic=live,
                               kwargs={"task_overrides": overrides})


register_envs()
