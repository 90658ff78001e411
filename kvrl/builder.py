"""Builds engines, executors and policies from a composed Hydra/OmegaConf config.

Shared by every app (kvrl-run, kvrl-bench, the Gymnasium environments) so that one config means
the same engine everywhere.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from typing import TYPE_CHECKING, Any, Mapping, Optional

import numpy as np
from omegaconf import DictConfig, OmegaConf

from kvrl import plugins
from kvrl.engine.config import EngineConfig
from kvrl.engine.engine import Engine
from kvrl.executors.base import Executor
from kvrl.executors.hardware import DeviceSpec, ModelShape
from kvrl.plugins.registry import OPTIONAL_KINDS

if TYPE_CHECKING:
    from kvrl.executors.live import LiveExecutor

log = logging.getLogger(__name__)


def to_dict(cfg: Any) -> dict:
    """Plain dict from a DictConfig or mapping (resolved)."""
    if isinstance(cfg, DictConfig):
        return OmegaConf.to_container(cfg, resolve=True)
    return dict(cfg)


def _dataclass_from(cls: type, cfg: Mapping, prefix: str):
    """Instantiate ``cls`` from the keys of ``cfg`` that are its fields; unknown keys are errors."""
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(cfg) - names)
    if unknown:
        raise ValueError(f"unknown key(s) {[f'{prefix}.{k}' for k in unknown]}; known: {sorted(names)}")
    return cls(**cfg)


def build_executor(cfg: Any) -> Executor:
    """The executor named by ``cfg.backend.name``: ``sim``, or ``live``
    (:func:`~kvrl.executors.live_build.build_live`, ``backend.weights`` default ``disk``)."""
    backend = to_dict(cfg.backend)
    name = backend.pop("name")
    if name == "sim":
        model = to_dict(cfg.model)
        model.pop("checkpoint", None)
        model.pop("family", None)
        shape = _dataclass_from(ModelShape, model, "model")
        device = _dataclass_from(DeviceSpec, to_dict(cfg.device), "device")
        from kvrl.executors.sim import SimExecutor
        return SimExecutor(shape, device, seed=int(cfg.seed), profile=backend.get("profile", "auto"),
                           cuda_graphs=bool(backend.get("cuda_graphs", True)),
                           step_graphs=bool(backend.get("step_graphs", True)),
                           step_time_scale=float(backend.get("step_time_scale", 1.0)))
    if name == "live":
        from kvrl.executors.live_build import build_live
        return build_live(to_dict(cfg.model), backend, seed=int(cfg.seed), weights=backend.get("weights", "disk"))
    raise ValueError(f"unknown backend {name!r}; known backends: sim, live")


def build_policies(cfg: Any) -> dict[str, Any]:
    """One instance per plugin kind from ``cfg.<kind>`` (``{name: ..., params...}``); an optional kind
    (``tier``) that ``cfg`` leaves out or sets to null gets its default plugin. A missing required
    kind is a ``ValueError`` naming it."""
    missing = [kind for kind in plugins.KINDS if kind not in cfg or cfg[kind] is None]
    if missing:
        raise ValueError(f"the config has no {missing} (each plugin kind needs {{name: ..., params...}}; "
                         f"kinds: {list(plugins.KINDS)})")
    policies = {kind: plugins.create_from_config(kind, cfg[kind]) for kind in plugins.KINDS}
    for kind, default in OPTIONAL_KINDS.items():
        node = cfg.get(kind) if kind in cfg else None
        policies[kind] = plugins.create_from_config(kind, node) if node is not None else plugins.create(kind, default)
    return policies


def engine_config(node: Any) -> EngineConfig:
    """An :class:`EngineConfig` from a mapping of its fields (unknown keys are errors naming them),
    or a copy of one."""
    if isinstance(node, EngineConfig):
        return dataclasses.replace(node)
    return _dataclass_from(EngineConfig, to_dict(node), "engine")


def build_engine(cfg: Any, executor: Executor | None = None, record_steps: bool = True) -> Engine:
    """A ready engine for ``cfg``, the one way every app, environment and benchmark builds one.

    ``cfg`` (a composed Hydra config, a DictConfig or a plain mapping) holds ``engine`` (the
    fields of :class:`EngineConfig`, or one), one ``{name: ..., params...}`` per plugin kind
    (``scheduler``, ``watermark``, ``eviction``, ``prefix_cache``; ``tier`` optional) and
    optionally ``slo`` (``ttft_s``, ``tpot_s``). Without ``executor``, ``backend``, ``model``,
    ``device`` and ``seed`` build one (:func:`build_executor`). The engine resolves its own copy
    of the engine config (:meth:`Engine.resolve_config`); ``cfg`` is never changed.
    """
    if "engine" not in cfg:
        raise ValueError("the config has no 'engine' (the fields of kvrl.engine.config.EngineConfig)")
    engine_cfg = engine_config(cfg["engine"])
    policies = build_policies(cfg)
    executor = executor if executor is not None else build_executor(cfg)
    slo = to_dict(cfg["slo"]) if "slo" in cfg and cfg["slo"] is not None else {}
    return Engine(engine_cfg, executor, policies["scheduler"], policies["watermark"], policies["eviction"],
                  policies["prefix_cache"], slo_ttft_s=slo.get("ttft_s"), slo_tpot_s=slo.get("tpot_s"),
                  record_steps=record_steps, tier=policies["tier"])


#: the warm-up engine's policies: first come first served, no prefix cache (no identity outlives it)
WARM_UP_POLICIES = {"scheduler": {"name": "fcfs"}, "watermark": {"name": "fixed"}, "eviction": {"name": "lifo"},
                    "prefix_cache": {"name": "none"}}


def warm_up(executor: "LiveExecutor", engine: Any, num_requests: int, *, seed: int = 0,
            max_prompt_len: Optional[int] = None) -> EngineConfig:
    """Warm ``executor`` up for engines of config ``engine`` (as :func:`build_engine` takes it), so
    that graph capture and kernel compilation are not charged to the first measured run: the one
    warm-up of kvrl-eval, kvrl-fidelity, kvrl-bench and the benchmarks.

    It serves ``num_requests`` (> 0) synthetic requests, all arriving at 0, on a throwaway engine
    of config ``engine`` with :data:`WARM_UP_POLICIES`. Request ``i`` asks ``i + 1`` output tokens,
    so once the prompts are in, requests finish one a step and the decode batch shrinks one by one
    from at most ``min(num_requests, max_num_seqs)`` to 1 (a CUDA graph captured for each graph
    size on the way; sizes above what the pool and the token budget admit at once do not occur); the
    prompts (random tokens drawn with ``seed``) take 12 lengths spaced geometrically from 8 to
    ``max_prompt_len`` (default ``max(16, min(2048, max_model_len // 4, num_blocks * block_size //
    max(num_requests // 4, 4)))``), so prefill steps of many token counts compile their kernels
    and piecewise graphs. A request the engine cannot serve is rejected and counted in the log line.

    What stays on ``executor``: its KV pool of ``engine``'s shape, reused (with the graphs) by every
    engine built later with the same ``num_blocks``, ``num_cpu_blocks`` and ``block_size`` (the
    returned config is the warm-up engine's, resolved: build the measured engines with its
    ``num_blocks`` where ``engine`` says 0), the captured graphs and the compiled kernels. Nothing
    else: the engine, with its prefix cache, block tables, clock and metrics, is dropped, and the
    executor's step timing and sampling restart as in a new executor
    (:meth:`~kvrl.executors.live.LiveExecutor.reset_step_state`: the next step counts no host gap
    before it; sampling restarts from the executor's seed).
    """
    from kvrl.engine.request import Request

    if not num_requests > 0:
        raise ValueError(f"warm-up num_requests={num_requests!r}: must be positive (skip the warm-up for none)")
    t0 = time.perf_counter()
    eng = build_engine({"engine": engine, **WARM_UP_POLICIES}, executor=executor, record_steps=False)
    c = eng.config
    if max_prompt_len is None:
        max_prompt_len = max(16, min(2048, c.max_model_len // 4, c.num_blocks * c.block_size // max(num_requests // 4, 4)))
    rng = np.random.default_rng(seed)
    lens = np.unique(np.geomspace(8, max_prompt_len, 12).astype(int))
    requests = [Request(f"warm{i}", 0.0, rng.integers(0, executor.vocab_size, int(lens[i % len(lens)]), dtype=np.int32),
                        i + 1) for i in range(num_requests)]
    summary = eng.run(requests)
    executor.reset_step_state()
    log.info("warm-up: %d requests (%d rejected), prompts of 8-%d tokens, %d steps in %.1f s", num_requests,
             summary["rejected"], max_prompt_len, eng.step_index, time.perf_counter() - t0)
    return eng.config
