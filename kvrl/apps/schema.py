"""Structured (typed) configs of the Hydra apps, their validation, and the config resolvers.

Typed nodes make a typo fail before any work starts: an unknown key or a wrong type fails when
Hydra composes the config, naming the key. What types cannot say (ranges, choices, plugin
parameters, the workload builders' ``Params``) :func:`validate_config` checks: each app calls it first thing
in its job, and the :class:`ValidateConfig` callback (``override hydra/callbacks: kvrl`` in an
app's defaults) runs it over every job of a basic-sweeper multirun before the first is launched.
"""
from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, List, Mapping, Optional

from hydra.core.config_store import ConfigStore
from hydra.experimental.callback import Callback
from omegaconf import MISSING, DictConfig, OmegaConf, errors

from kvrl import plugins
from kvrl.apps.tracking import TRACKERS
from kvrl.engine.config import EngineConfig
from kvrl.executors.hardware import DeviceSpec
from kvrl.workloads import resolve_config

WANDB_MODES = ("offline", "online", "disabled")
BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


@dataclass
class SLOConfig:
    """Default latency objectives (seconds) for requests without their own; null = no objective."""

    ttft_s: Optional[float] = 2.0
    tpot_s: Optional[float] = 0.1


@dataclass
class LoggerConfig:
    """Where a job's metrics go besides its ``metrics.json`` (``conf/logger/<name>.yaml``).

    Attributes:
        name: ``none``; ``csv`` (``log.csv`` in the job directory); ``wandb`` (Weights & Biases).
        project, entity: W&B project and entity (null = the W&B default entity).
        mode: W&B mode: ``offline`` (default; upload later with ``wandb sync``), ``online`` or
            ``disabled``. ``conf/logger/wandb.yaml`` takes it from ``WANDB_MODE`` when set.
        group: W&B group; null = the sweep directory in a multirun (every job of one sweep in
            one group), no group for a single run.
        tags: W&B tags.
    """

    name: str = "none"
    project: str = "kvrl"
    entity: Optional[str] = None
    mode: str = "offline"
    group: Optional[str] = None
    tags: List[str] = field(default_factory=list)


@dataclass
class EngineKeys:
    """What every app that builds an engine composes: backend, model, device, workload, the four
    plugin groups, engine limits, SLOs, logger and seed."""

    backend: Any = MISSING
    model: Any = MISSING
    device: DeviceSpec = field(default_factory=DeviceSpec)
    workload: Any = MISSING
    scheduler: Any = MISSING
    watermark: Any = MISSING
    eviction: Any = MISSING
    prefix_cache: Any = MISSING
    tier: Any = None            # optional plugin kind (kvrl.plugins.tiers); null = offload_all, used only with engine.cpu_tier_blocks > 0
    engine: EngineConfig = field(default_factory=EngineConfig)
    slo: SLOConfig = field(default_factory=SLOConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    seed: int = 0


@dataclass
class RunSchema(EngineKeys):
    progress: bool = True      # progress bar over finished requests
    plots: bool = True         # write kv_usage.png
    max_steps: Optional[int] = None


class ConfigError(ValueError):
    """A config value out of range or not among its choices; the message names the key."""


def check_node(schema: type, node: Any, where: str = "") -> None:
    """Raise ``ValueError`` naming the key (prefixed with ``where``) when the plain mapping ``node``
    has a key ``schema`` lacks, a value of the wrong type, or lacks a required key."""
    prefix = f"{where}." if where else ""
    if not isinstance(node, Mapping):
        raise ValueError(f"{where or 'config'} must be a mapping of {[f.name for f in fields(schema)]}, got {node!r}")
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema), node)
    except errors.OmegaConfBaseException as exc:
        raise ValueError(f"{prefix}{exc.full_key}: {str(exc.msg).splitlines()[0]}") from None
    missing = sorted(OmegaConf.missing_keys(merged))
    if missing:
        raise ValueError(f"{', '.join(prefix + k for k in missing)} required")


def check_slo(slo: dict) -> None:
    """``slo.*``: each objective > 0 or null."""
    for key, value in slo.items():
        if value is not None and not value > 0:
            raise ValueError(f"slo.{key} must be > 0 or null, got {value}")


def _check_logger(logger: dict) -> None:
    plugins.check_choice("logger.name", logger["name"], list(TRACKERS))
    plugins.check_choice("logger.mode", logger["mode"], WANDB_MODES)


def _check_plugin(kind: str) -> Callable[[dict], None]:
    def check(node: dict) -> None:
        node = dict(node)
        plugins.make_params(kind, node.pop("name"), **node)
    return check


_SECTION_CHECKS: dict[str, Callable[[dict], Any]] = {
    "engine": lambda node: EngineConfig(**node),
    "device": lambda node: DeviceSpec(**node),
    "slo": check_slo,
    "logger": _check_logger,
    "workload": resolve_config,
    **{kind: _check_plugin(kind) for kind in plugins.KINDS},
}


def validate_config(cfg: DictConfig) -> None:
    """Check every section of ``cfg`` that an app config may have (engine, device, slo, logger,
    workload, the four plugin kinds, ``seed``, ``max_steps``) beyond what its types enforce, and
    (when ``cfg`` was composed onto a schema) every key against the schema: Hydra's ``+key=...``
    goes past the types, so a misspelt ``+max_step=5`` would otherwise be ignored.

    Raises :class:`ConfigError` naming the key. Cheap: builds no executor, engine or workload,
    so it may run before every job of a sweep.
    """
    try:
        schema = OmegaConf.get_type(cfg) if OmegaConf.is_config(cfg) else None
        if schema is not None and is_dataclass(schema):     # keys added with + (Hydra lets them through)
            node = OmegaConf.to_container(cfg, resolve=False)      # interpolations stay as written
            node.pop("hydra", None)
            check_node(schema, node)
        for key, check in _SECTION_CHECKS.items():
            if key in cfg:
                check(OmegaConf.to_container(cfg[key], resolve=True))
        if "seed" in cfg:
            plugins.check_range("seed", cfg.seed, 0)
        if cfg.get("max_steps") is not None:
            plugins.check_range("max_steps", cfg.max_steps, 1)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"invalid config: {exc}") from None


def sweep_job_overrides(config: DictConfig, parser: Any) -> list[list[str]]:
    """The override lists of every job of a basic-sweeper multirun (``hydra.sweeper.params`` and
    the command line, expanded by Hydra's BasicSweeper; ``parser`` is an ``OverridesParser``);
    empty for other sweepers, whose trials exist only once they are asked for."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    sweeper = config.hydra.sweeper
    if sweeper.get("_target_") != BASIC_SWEEPER:
        return []
    arguments = [f"{k}={v}" for k, v in (sweeper.get("params") or {}).items()]
    arguments += list(config.hydra.overrides.task)
    batches = BasicSweeper.split_arguments(parser.parse_overrides(arguments), None)
    return [list(job) for batch in batches for job in batch]


def sweep_job_configs(config: DictConfig, loader: Any) -> Iterator[tuple[list[str], DictConfig]]:
    """``(overrides, composed config)`` of every job of a basic-sweeper multirun.

    Composing a config costs Hydra about half a second, so jobs are composed once per distinct
    set of structural overrides (config group choices, ``+``/``~`` edits); each job's plain
    ``key=value`` overrides are then applied to a copy the way Hydra applies them, with the
    same type checks.
    """
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create(loader)
    groups = set(config.hydra.runtime.choices)
    composed: dict[tuple[str, ...], DictConfig] = {}
    for overrides in sweep_job_overrides(config, parser):
        parsed = parser.parse_overrides(overrides)
        plain = [o for o in parsed if not (o.key_or_group in groups or o.is_add() or o.is_delete()
                                           or o.is_force_add() or o.package is not None)]
        structural = tuple(o.input_line for o in parsed if o not in plain)
        if structural not in composed:
            composed[structural] = loader.load_sweep_config(config, list(structural))
        job_config = copy.deepcopy(composed[structural])
        ConfigLoaderImpl._apply_overrides_to_config(plain, job_config)
        yield overrides, job_config


class ValidateConfig(Callback):
    """Hydra callback: before a basic-sweeper multirun launches its first job, check every job's
    config, so one bad value fails the whole sweep at once, naming the job's overrides and the
    key. (Each job still checks its own config, with any sweeper.)

    Hydra 1.3 turns a callback's exceptions into warnings, so the failure is a ``SystemExit``
    carrying the message (exit status 1).
    """

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from hydra.core.global_hydra import GlobalHydra

        loader = GlobalHydra.instance().config_loader()
        for num, (overrides, job_config) in enumerate(sweep_job_configs(config, loader)):
            try:
                validate_config(job_config)
            except ConfigError as exc:
                raise SystemExit(f"sweep job #{num} ({' '.join(overrides)}): {exc}") from None


def optuna_storage(sqlite_path: str) -> str:
    """Resolver ``${kvrl_optuna_storage:PATH}``: the Optuna storage URL shared by every process
    (and machine) that tunes one study: ``$KVRL_OPTUNA_STORAGE`` if set (e.g. a PostgreSQL URL),
    else a SQLite file at ``PATH`` (relative to the working directory), whose folder it creates."""
    url = os.environ.get("KVRL_OPTUNA_STORAGE")
    if url:
        return url
    path = Path(sqlite_path).absolute()
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path}"


def register_schemas() -> None:
    """Store the app schemas in Hydra's ConfigStore and register the kvrl config resolvers."""
    ConfigStore.instance().store(name="run_schema", node=RunSchema)
    if not OmegaConf.has_resolver("kvrl_optuna_storage"):
        OmegaConf.register_new_resolver("kvrl_optuna_storage", optuna_storage)
