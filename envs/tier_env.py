"""``kvrl/Tier-v0``: an agent drives the KV tiers' decisions (issue #20).

Every decision epoch (``steps_per_decision`` engine steps) the agent picks the tier mode the
engine follows until the next decision:

* ``0`` drop: reclaimed GPU prefix blocks are dropped (the engine without tiers);
* ``1`` offload: reclaimed blocks go to the CPU tier, replaced CPU tier blocks to disk (``offload_all``);
* ``2`` offload + prefetch: as 1, plus the ``prefetch`` policy's loading ahead of need.

Observation (7 floats, unscaled ratios): GPU pool free fraction (free + evictable), CPU tier and
disk tier fill fractions, running and waiting sequences over ``max_num_seqs``, and the prompt
hit rates on the GPU and in the tiers over the last epoch. The episode is truncated at the
trace's end (serving is continuing; nothing terminates it). Reward: minus the summed TTFT
(seconds) of the requests whose first token came in the epoch, divided by ``ttft_scale``, so
the return is minus the total TTFT of the episode (in ``ttft_scale`` units) when it runs to the end.

The episode serves one multi-turn workload (a shared system prompt, conversations whose turns
extend the previous prompt and answer) on the sim with a small GPU pool; ``TierEnvConfig`` sets
its size. Built directly (no Hydra task file): ``gymnasium.make("kvrl/Tier-v0", config={...})``.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Mapping, Optional, Union

import gymnasium
import numpy as np
from gymnasium import spaces

from kvrl.builder import build_engine
from kvrl.engine.engine import Engine
from kvrl.envs.driver import EngineDriver
from kvrl.executors.hardware import DEVICES, MODEL_SHAPES
from kvrl.executors.sim import SimExecutor
from kvrl.workloads import build_workload


@dataclass
class TierEnvConfig:
    """The episode: model/device shape of the sim, pool sizes, workload and decision epoch."""

    model: str = "qwen3-0.6b"
    device: str = "h200"
    profile: str = "auto"
    num_blocks: int = 256
    block_size: int = 16
    cpu_tier_blocks: int = 2048
    disk_tier_blocks: int = 0
    steps_per_decision: int = 16
    ttft_scale: float = 1.0
    workload: dict = field(default_factory=lambda: {
        "name": "multi_turn", "num_conversations": 40, "arrival": {"rate": 4.0}, "system_prompt_len": 512,
        "first_prompt_len": {"dist": "constant", "mean": 256}, "user_turn_len": {"dist": "constant", "mean": 64},
        "output_len": {"dist": "constant", "mean": 64},
        "max_turns": 6, "mean_turn_gap_s": 2.0})
    prefetch: dict = field(default_factory=dict)    # the agent tier plugin's prefetch parameters (mode 2)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.model not in MODEL_SHAPES:
            raise ValueError(f"env.model must be one of {sorted(MODEL_SHAPES)}, got {self.model!r}")
        if self.device not in DEVICES:
            raise ValueError(f"env.device must be one of {sorted(DEVICES)}, got {self.device!r}")
        for name in ("num_blocks", "cpu_tier_blocks", "steps_per_decision"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"env.{name} must be a positive integer, got {getattr(self, name)!r}")
        if not self.ttft_scale > 0:
            raise ValueError(f"env.ttft_scale must be > 0, got {self.ttft_scale!r}")


class TierEnv(gymnasium.Env):
    """See the module doc. ``config``: a :class:`TierEnvConfig` or a mapping of its fields."""

    metadata = {"render_modes": []}
    MODES = ("drop", "offload", "offload+prefetch")

    def __init__(self, config: Union[TierEnvConfig, Mapping[str, Any], None] = None, task_overrides=()) -> None:
        if task_overrides:
            raise ValueError(f"kvrl/Tier-v0 takes config={{...}} (TierEnvConfig fields), not task overrides "
                             f"{list(task_overrides)}")
        if config is None:
            config = TierEnvConfig()
        elif not isinstance(config, TierEnvConfig):
            known = {f.name for f in fields(TierEnvConfig)}
            unknown = sorted(set(config) - known)
            if unknown:
                raise ValueError(f"unknown kvrl/Tier-v0 config key(s) {unknown}; known: {sorted(known)}")
            config = TierEnvConfig(**dict(config))
        self.config = config
        self.action_space = spaces.Discrete(len(self.MODES))
        self.observation_space = spaces.Box(0.0, np.inf, shape=(7,), dtype=np.float32)
        self.engine: Optional[Engine] = None
        self.driver: Optional[EngineDriver] = None

    # ------------------------------------------------------------------ episode
    def _build(self, seed: int) -> None:
        cfg = self.config
        ex = SimExecutor(MODEL_SHAPES[cfg.model], DEVICES[cfg.device], seed=seed, profile=cfg.profile)
        engine = {"num_blocks": cfg.num_blocks, "block_size": cfg.block_size, "cpu_tier_blocks": cfg.cpu_tier_blocks,
                  "disk_tier_blocks": cfg.disk_tier_blocks, "seed": seed, "prefix_hash_key": "seed"}
        self.engine = build_engine({"engine": engine, "scheduler": {"name": "fcfs"}, "watermark": {"name": "fixed"},
                                    "eviction": {"name": "lifo", "mode": "recompute"},
                                    "prefix_cache": {"name": "hash_lru"}, "tier": {"name": "agent", **cfg.prefetch}},
                                   executor=ex)
        self.policy = self.engine.tier                  # kvrl.plugins.tiers.AgentTier: the env sets its mode
        requests = build_workload({**cfg.workload, "seed": seed}, vocab_size=ex.vocab_size,
                                  max_model_len=self.engine.config.max_model_len)
        self.driver = EngineDriver(self.engine, list(requests))
        self._ttft_seen: set[str] = set()
        self._stats_seen = (0, 0, 0)

    def reset(self, *, seed: Optional[int] = None, options=None):
        super().reset(seed=seed)
        self._build(self.config.seed if seed is None else int(seed))
        return self._obs(), {}

    def step(self, action):
        if self.driver is None:
            raise RuntimeError("call reset() before step()")
        if not self.action_space.contains(action):
            raise ValueError(f"action {action!r} is not in {self.action_space}")
        self.policy.mode = int(action)
        for _ in range(self.config.steps_per_decision):
            if self.driver.done:
                break
            self.driver.step()
        ttft = 0.0
        for rid, rec in self.engine.metrics.requests.items():
            if rec.first_token_s is not None and rid not in self._ttft_seen:
                self._ttft_seen.add(rid)
                ttft += rec.first_token_s - rec.arrival_s
        done = self.driver.done
        info = {"mode": self.MODES[int(action)], "ttft_s": ttft, "now_s": self.engine.now}
        if done:
            info["summary"] = self.engine.metrics.summary()
        # serving continues past the trace: its end truncates the episode, nothing terminates it
        return self._obs(), -ttft / self.config.ttft_scale, False, done, info

    def _obs(self) -> np.ndarray:
        e, alloc = self.engine, self.engine.allocator
        st = alloc.stats
        looked, gpu, tiers = (st.prompt_tokens_looked_up, st.prompt_tokens_hit_gpu,
                              st.prompt_tokens_hit_cpu + st.prompt_tokens_hit_disk)
        d_looked = looked - self._stats_seen[0]
        rate = lambda hit, seen: (hit - seen) / d_looked if d_looked else 0.0
        obs = np.array([
            alloc.num_free_blocks / alloc.num_blocks,
            alloc.tier.num_stored / alloc.tier.num_blocks,
            alloc.disk.num_stored / alloc.disk.num_blocks if alloc.disk is not None else 0.0,
            len(e.running) / e.config.max_num_seqs,
            (len(e.waiting) + len(e.preempted)) / e.config.max_num_seqs,
            rate(gpu, self._stats_seen[1]),
            rate(tiers, self._stats_seen[2]),
        ], dtype=np.float32)
        self._stats_seen = (looked, gpu, tiers)
        return obs


__all__ = ["TierEnv", "TierEnvConfig"]
