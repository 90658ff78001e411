"""What the experiments share: plain copies of configs, serving one engine, and writing results.
"""
from __future__ import annotations

import copy
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np


def plain(cfg: Any) -> Any:
    from omegaconf import DictConfig, ListConfig, OmegaConf
    if isinstance(cfg, (DictConfig, ListConfig)):
        return OmegaConf.to_container(cfg, resolve=True)
    return copy.deepcopy(cfg)


def deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def serve(cfg: Any, requests: list, executor: Any) -> tuple[Any, float]:
    from kvrl.builder import build_engine
    engine = build_engine(cfg, executor=executor, record_steps=False)
    wall = time.perf_counter()
    engine.run(requests)
    return engine, time.perf_counter() - wall


def fmt(x: Any, digits: int = 3) -> str:
    if isinstance(x, float):
        if not math.isfinite(x):
            return "n/a"
        return f"{x:.{digits}g}"
    return str(x)


def cost_note(result: dict) -> str:
    cost = result.get("cost_model")
    return f"\n\nStep times: {cost}.\n" if cost and result.get("backend") == "sim" else "\n"


def write_result(out_dir: Path, stem: str, result: dict, markdown: str) -> None:
    from kvrl.files import atomic_write

    def clean(x):
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {str(k): clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        if isinstance(x, np.generic):
            return clean(x.item())
        return x

    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(out_dir / f"{stem}.json", lambda f: json.dump(clean(result), f, indent=2))
    atomic_write(out_dir / f"{stem}.md", lambda f: f.write(markdown))
