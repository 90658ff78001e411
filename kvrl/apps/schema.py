"""Structured (typed) configs of the Hydra apps, stored in Hydra's ConfigStore.

Typed nodes make a typo fail before any work starts: an unknown key, a wrong type, or (through
the dataclasses' ``__post_init__`` checks when the engine is built) an out-of-range value, each
with the key named.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from kvrl.engine.config import EngineConfig
from kvrl.executors.hardware import DeviceSpec


@dataclass
class SLOConfig:
    """Default latency objectives (seconds) for requests without their own; null = no objective."""

    ttft_s: Optional[float] = 2.0
    tpot_s: Optional[float] = 0.1


@dataclass
class RunSchema:
    backend: Any = MISSING
    model: Any = MISSING
    device: DeviceSpec = field(default_factory=DeviceSpec)
    workload: Any = MISSING
    scheduler: Any = MISSING
    watermark: Any = MISSING
    eviction: Any = MISSING
    prefix_cache: Any = MISSING
    engine: EngineConfig = field(default_factory=EngineConfig)
    slo: SLOConfig = field(default_factory=SLOConfig)
    seed: int = 0
    progress: bool = True      # progress bar over finished requests
    plots: bool = True         # write kv_usage.png
    max_steps: Optional[int] = None


def register_schemas() -> None:
    ConfigStore.instance().store(name="run_schema", node=RunSchema)
