"""Builds engines, executors and policies from a composed Hydra/OmegaConf config.

Shared by every app (kvrl-run, kvrl-bench, the Gymnasium environments) so that one config means
the same engine everywhere.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from omegaconf import DictConfig, OmegaConf

from kvrl import plugins
from kvrl.engine.config import EngineConfig
from kvrl.engine.engine import Engine
from kvrl.executors.base import Executor
from kvrl.executors.hardware import DeviceSpec, ModelShape
from kvrl.plugins.registry import OPTIONAL_KINDS


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
                           cuda_graphs=bool(backend.get("cuda_graphs", True)))
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
