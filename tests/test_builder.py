"""One way to build an engine (kvrl.builder.build_engine) and a config that is resolved, not mutated."""
from __future__ import annotations

import copy
import dataclasses
import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from kvrl import plugins
from kvrl.builder import build_engine
from kvrl.engine.config import EngineConfig
from kvrl.engine.engine import Engine
from kvrl.executors.hardware import DEVICES, MODEL_SHAPES
from kvrl.executors.sim import SimExecutor

ROOT = Path(__file__).resolve().parents[1]
POLICIES = {"scheduler": {"name": "fcfs"}, "watermark": {"name": "fixed"}, "eviction": {"name": "lifo"},
            "prefix_cache": {"name": "hash_lru"}}


def _sim():
    return SimExecutor(MODEL_SHAPES["qwen3-0.6b"], DEVICES["h200"])


def test_the_engine_resolves_a_copy_of_its_config():
    cfg = EngineConfig(num_blocks=0, num_cpu_blocks=None, max_model_len=None)
    before = dataclasses.replace(cfg)
    engine = Engine(cfg, _sim(), *(plugins.create_from_config(k, POLICIES[k]) for k in plugins.KINDS))
    assert cfg == before                                   # the caller's config is unchanged
    assert engine.config is not cfg
    assert engine.config.num_blocks > 0 and engine.config.num_cpu_blocks > 0
    assert engine.config.max_model_len == MODEL_SHAPES["qwen3-0.6b"].max_model_len


@pytest.mark.parametrize("as_omegaconf", [False, True])
def test_build_engine_takes_mappings_and_changes_nothing(as_omegaconf):
    node = {"engine": {"num_blocks": 0, "block_size": 16}, **copy.deepcopy(POLICIES), "slo": {"ttft_s": 0.5}}
    cfg = OmegaConf.create(node) if as_omegaconf else node
    snapshot = copy.deepcopy(node)
    engine = build_engine(cfg, executor=_sim())
    assert (OmegaConf.to_container(cfg) if as_omegaconf else cfg) == snapshot
    assert engine.config.num_blocks > 0 and engine.metrics.default_slo_ttft_s == 0.5

    given = EngineConfig(num_blocks=64, block_size=4, num_cpu_blocks=8, max_model_len=1024)   # nothing to resolve
    engine = build_engine({"engine": given, **POLICIES}, executor=_sim())
    assert engine.config == given and engine.config is not given


def test_build_engine_names_what_is_missing_or_unknown():
    with pytest.raises(ValueError, match="eviction"):
        build_engine({"engine": {"num_blocks": 64}, **{k: v for k, v in POLICIES.items() if k != "eviction"}},
                     executor=_sim())
    with pytest.raises(ValueError, match="'engine'"):
        build_engine(dict(POLICIES), executor=_sim())
    with pytest.raises(ValueError, match="engine.num_blockz"):
        build_engine({"engine": {"num_blockz": 64}, **POLICIES}, executor=_sim())


def test_no_engine_is_built_outside_the_builder():
    """Apps, benchmarks and scripts build engines through kvrl.builder.build_engine only."""
    pattern = re.compile(r"(?<![\w.])Engine\(")
    offenders = []
    for folder in ("kvrl", "envs", "benchmarks", "scripts"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == ROOT / "kvrl" / "builder.py":
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                code = line.split("#", 1)[0]
                if pattern.search(code) and not code.lstrip().startswith(("class ", "def ")):
                    offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not offenders, "\n".join(offenders)
