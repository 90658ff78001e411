"""Structured configs of the apps that run the live executor: ``kvrl-fidelity``
(``fidelity_schema``), ``kvrl-profile`` (``profile_schema``) and ``kvrl-bench``
(``bench_schema``), stored in Hydra's ConfigStore like ``run_schema`` (:mod:`kvrl.apps.schema`).

Two layers, as for kvrl-run. When Hydra composes an app's config, the dataclass types reject a
wrong type of a typed key (``num_requests=many``) and an override of a key the app lacks
(``num_request=5``), naming the key. What Hydra lets through, each app's ``validate_*`` checks
first thing in its job, before any model is built, raising
:class:`~kvrl.apps.schema.ConfigError` with the key's full name:

* keys added with ``+`` (Hydra accepts ``+num_request=5`` even on a structured config);
* the entries of ``workloads`` and ``policies`` (``kvrl-fidelity``), which are free-form maps so
  that ``+workloads.NAME={...}`` keeps working (OmegaConf cannot assign a dict to an element of a
  typed ``Dict[str, Dataclass]``): each entry is checked against :class:`FidelityWorkload` or
  :class:`PolicyConfig`, its engine overrides against :class:`~kvrl.engine.config.EngineConfig`,
  its workload by its builder's ``Params`` (:mod:`kvrl.workloads.registry`), its plugins by theirs;
* ranges and choices (``live_repeats >= 1``, ``min_len <= max_len``, a known model family, ...).

The YAML files (``conf/fidelity.yaml``, ``profile.yaml``, ``bench.yaml``) keep the values and
say what each key means; the defaults here are the same values.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from typing import Any, Dict, List, Mapping, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

from kvrl import plugins
from kvrl.apps.schema import ConfigError, SLOConfig, check_node, check_slo, register_schemas
from kvrl.engine.config import EngineConfig
from kvrl.executors.hardware import ModelShape

DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?")
DTYPES = ("auto", "bfloat16", "float16", "float32")
BENCH_SYSTEMS = ("kvrl", "hf_cb", "hf_static")


# ----------------------------------------------------------------------------------- shared nodes
@dataclass
class ModelConfig:
    """``conf/model/<name>.yaml``: the model's shape (:class:`~kvrl.executors.hardware.ModelShape`),
    its family (the random-weight variant) and an optional checkpoint directory."""

    name: str = MISSING
    family: str = "qwen3"
    checkpoint: Optional[str] = None
    num_layers: int = 28
    hidden_size: int = 1024
    num_heads: int = 16
    num_kv_heads: int = 8
    head_dim: int = 128
    intermediate_size: int = 3072
    vocab_size: int = 151936
    tie_word_embeddings: bool = True
    max_model_len: int = 40960
    dtype_bytes: int = 2


@dataclass
class LiveSettings:
    """The live executor's device, dtype, graphs and sampling (``conf/backend/live.yaml``)."""

    device: str = "auto"
    dtype: str = "auto"
    cuda_graphs: bool = True
    step_graphs: bool = True
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0


@dataclass
class LiveBackendConfig(LiveSettings):
    """``backend: live`` (kvrl-profile times the live executor only)."""

    name: str = "live"


# ------------------------------------------------------------------------------------ kvrl-fidelity
@dataclass
class SharedEngineConfig(EngineConfig):
    """The engine keys every workload shares, plus the CPU executor's pool size when
    ``num_blocks`` is 0 (on CUDA the pool is sized from free memory)."""

    cpu_device_num_blocks: int = 2048


@dataclass
class FidelityWorkload:
    """One entry of ``workloads``: a description, engine overrides (EngineConfig keys; a
    ``num_blocks`` of 0 means the shared pool) and a workload config (``conf/workload`` keys)."""

    doc: str = ""
    engine: Dict[str, Any] = field(default_factory=dict)
    workload: Any = MISSING


@dataclass
class PolicyConfig:
    """One entry of ``policies``: a plugin per kind (``{name: ..., params...}``); ``tier`` optional."""

    scheduler: Any = MISSING
    watermark: Any = MISSING
    eviction: Any = MISSING
    prefix_cache: Any = MISSING
    tier: Any = None


@dataclass
class FidelitySchema:
    """``kvrl-fidelity``: see ``conf/fidelity.yaml`` for the meaning of each key."""

    model: ModelConfig = field(default_factory=ModelConfig)
    live: LiveSettings = field(default_factory=LiveSettings)
    weights: str = "memory"
    profile: str = "select"
    seed: int = 0
    cpu_threads: int = 1
    flush_denormal: bool = True
    engine: SharedEngineConfig = field(default_factory=SharedEngineConfig)
    slo: SLOConfig = field(default_factory=lambda: SLOConfig(ttft_s=1.0, tpot_s=0.05))
    workloads: Dict[str, Any] = field(default_factory=dict)
    policies: Dict[str, Any] = field(default_factory=dict)
    only_workloads: Optional[List[str]] = None
    only_policies: Optional[List[str]] = None
    max_requests: Optional[int] = None
    warmup_requests: int = 256
    max_live_wall_s: Optional[float] = 60.0
    live_repeats: int = 3
    plots: bool = True
    resim: Optional[str] = None
    refit: bool = False
    host_speed: Any = 1.0
    sim_step_scale: float = 1.0
    sim_ensemble: int = 1
    sim_step_noise: Any = "profile"


# ------------------------------------------------------------------------------------- kvrl-profile
@dataclass
class GridConfig:
    """``grid.*``: overrides of the grid preset's values (null = the preset's); see ``GRIDS`` in
    :mod:`kvrl.profiling.batches` and ``conf/profile.yaml``."""

    decode_batch: Optional[List[int]] = None
    decode_ctx: Optional[List[int]] = None
    eager_decode: Optional[bool] = None
    ragged_batch: Optional[List[int]] = None
    ragged_ctx: Optional[List[int]] = None
    prefill_tokens: Optional[List[int]] = None
    prefill_seqs: Optional[List[int]] = None
    prefix_query: Optional[List[int]] = None
    prefix_cached: Optional[List[int]] = None
    mixed_batch: Optional[List[int]] = None
    mixed_ctx: Optional[List[int]] = None
    mixed_prefill: Optional[List[int]] = None
    mixed_long_batch: Optional[List[int]] = None
    mixed_long_ctx: Optional[List[int]] = None
    mixed_long_prefill: Optional[List[int]] = None
    mixed_long_cached: Optional[List[int]] = None
    scatter_batch: Optional[List[int]] = None
    scatter_ctx: Optional[List[int]] = None
    copies: Optional[List[int]] = None
    swaps: Optional[List[int]] = None
    overlap_batch: Optional[int] = None
    overlap_ctx: Optional[int] = None
    overlap_swap_in: Optional[List[int]] = None
    random: Optional[int] = None
    holdout: Optional[int] = None
    host_requests: Optional[int] = None
    host_prompt: Optional[List[int]] = None
    host_output: Optional[List[int]] = None
    host_rate: Optional[float] = None
    host_shared_prefix: Optional[List[int]] = None
    host_pressure_fraction: Optional[float] = None
    host_lengths: Optional[str] = None
    kv_fill: Optional[str] = None
    warmup: Optional[int] = None
    reps: Optional[int] = None
    point_budget_s: Optional[float] = None
    fit_stat: Optional[str] = None
    interleave: Optional[bool] = None


@dataclass
class DiskConfig:
    """``disk.*``: the disk-tier bandwidth measurement (``mb`` MiB each way, 8 to 512 files)."""

    measure: bool = True
    dir: Optional[str] = None
    mb: float = 256.0


@dataclass
class ProfileSchema:
    """``kvrl-profile``: see ``conf/profile.yaml`` for the meaning of each key."""

    backend: LiveBackendConfig = field(default_factory=LiveBackendConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    weights: str = "memory"
    grid_preset: str = "auto"
    grid: GridConfig = field(default_factory=GridConfig)
    block_size: int = 16
    num_blocks: int = 0
    gpu_memory_utilization: float = 0.9
    seed: int = 0
    progress: bool = True
    cpu_threads: int = 1
    flush_denormal: bool = True
    install_dir: Optional[str] = None
    disk: DiskConfig = field(default_factory=DiskConfig)


# --------------------------------------------------------------------------------------- kvrl-bench
@dataclass
class BenchSchema:
    """``kvrl-bench``: see ``conf/bench.yaml`` for the meaning of each key."""

    systems: List[str] = field(default_factory=lambda: list(BENCH_SYSTEMS))
    num_requests: int = 256
    min_len: int = 100
    max_len: int = 1024
    seed: int = 0
    preset: str = "qwen3-0.6b"
    checkpoint: Optional[str] = None
    checkpoint_root: str = "runs/.checkpoints"
    torch_device: str = "auto"
    dtype: str = "auto"
    cuda_graphs: bool = True
    step_graphs: bool = True
    num_blocks: int = 0
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 16384
    gpu_memory_utilization: float = 0.9
    trace_steps: int = 0
    profile: bool = False


# ------------------------------------------------------------------------------------- validation
def _check_model(model: dict) -> None:
    from kvrl.model.random_checkpoint import preset_config

    ModelShape(**{f.name: model[f.name] for f in fields(ModelShape)})   # ranges, heads divisible
    try:
        preset_config("tiny", model["family"])
    except (ValueError, KeyError):
        raise ValueError(f"model.family {model['family']!r} is not a known family") from None


def _check_live(live: dict, where: str) -> None:
    if not DEVICE.fullmatch(live["device"]):
        raise ValueError(f"{where}.device must be auto, cpu, cuda or cuda:N, got {live['device']!r}")
    plugins.check_choice(f"{where}.dtype", live["dtype"], DTYPES)
    plugins.check_range(f"{where}.temperature", live["temperature"], 0.0)
    plugins.check_range(f"{where}.top_p", live["top_p"], 0.0, 1.0)
    if live["top_p"] == 0:
        raise ValueError(f"{where}.top_p must be > 0, got 0")
    plugins.check_range(f"{where}.top_k", live["top_k"], 0)


def _check_common(cfg: dict) -> None:
    plugins.check_range("seed", cfg["seed"], 0)
    plugins.check_range("cpu_threads", cfg["cpu_threads"], 1)


def _check_fidelity_workload(name: str, entry: Any, base: dict) -> None:
    from kvrl.workloads import resolve_config

    where = f"workloads.{name}"
    check_node(FidelityWorkload, entry, where)
    known = {f.name for f in fields(EngineConfig)}
    unknown = sorted(set(entry["engine"]) - known)
    if unknown:
        raise ValueError(f"unknown key(s) {[f'{where}.engine.{k}' for k in unknown]}; known: {sorted(known)}")
    merged = {**base, **entry["engine"]}
    try:
        EngineConfig(**merged)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    try:
        resolve_config(entry["workload"])
    except ValueError as exc:
        raise ValueError(f"{where}.workload: {exc}") from None


def _check_policy(name: str, entry: Any) -> None:
    where = f"policies.{name}"
    check_node(PolicyConfig, entry, where)
    for kind in (*plugins.KINDS, "tier"):
        node = entry.get(kind)
        if node is None and kind == "tier":
            continue
        if not isinstance(node, Mapping) or "name" not in node:
            raise ValueError(f"{where}.{kind} must be {{name: ..., params...}}, got {node!r}")
        node = dict(node)
        try:
            plugins.make_params(kind, node.pop("name"), **node)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{where}.{kind}: {exc}") from None


def check_subset(key: str, chosen: Optional[list], known: Mapping, where: str = "") -> None:
    """``chosen`` (e.g. ``only_workloads``; None = all) must name keys of ``known``; ``where`` says whose
    names those are in the error."""
    unknown = sorted(set(chosen or ()) - set(known))
    if unknown:
        raise ValueError(f"{key}: unknown name(s) {unknown}{where}; known: {sorted(known)}")


def _validate(schema: type, checks: Any, cfg: Any) -> dict:
    """``cfg`` resolved to a plain dict, checked against ``schema`` and by ``checks(plain)``."""
    plain = OmegaConf.to_container(cfg, resolve=True) if OmegaConf.is_config(cfg) else dict(cfg)
    try:
        check_node(schema, plain)
        checks(plain)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"invalid config: {exc}") from None
    return plain


def _fidelity_checks(cfg: dict) -> None:
    _check_model(cfg["model"])
    _check_live(cfg["live"], "live")
    _check_common(cfg)
    engine = dict(cfg["engine"])
    plugins.check_range("engine.cpu_device_num_blocks", engine.pop("cpu_device_num_blocks"), 1)
    EngineConfig(**engine)
    check_slo(cfg["slo"])
    for name, entry in cfg["workloads"].items():
        _check_fidelity_workload(name, entry, engine)
    for name, entry in cfg["policies"].items():
        _check_policy(name, entry)
    if not cfg["resim"]:      # with resim the names are the earlier run's: kvrl.apps.resim checks them there
        check_subset("only_workloads", cfg["only_workloads"], cfg["workloads"])
        check_subset("only_policies", cfg["only_policies"], cfg["policies"])
    if not cfg["workloads"] or not cfg["policies"] or cfg["only_workloads"] == [] or cfg["only_policies"] == []:
        raise ValueError("need at least one workload and one policy (workloads, policies, only_workloads, only_policies)")
    if cfg["max_requests"] is not None:
        plugins.check_range("max_requests", cfg["max_requests"], 1)
    plugins.check_range("warmup_requests", cfg["warmup_requests"], 0)
    if cfg["max_live_wall_s"] is not None:
        plugins.check_range("max_live_wall_s", cfg["max_live_wall_s"], 0)
    plugins.check_range("live_repeats", cfg["live_repeats"], 1)
    if cfg["refit"] and not cfg["resim"]:
        raise ValueError("refit=true applies only with resim=<run dir> (nothing would be refitted)")
    hs = cfg["host_speed"]
    if hs != "probe" and not (isinstance(hs, (int, float)) and not isinstance(hs, bool) and 0 < hs < float("inf")):
        raise ValueError(f"host_speed={hs!r}: give 'probe' (the live run's host probe over the profile's) or a "
                         "positive factor on the profile's host terms (1 = as profiled)")
    scale = cfg["sim_step_scale"]
    if not 0 < scale < float("inf"):
        raise ValueError(f"sim_step_scale={scale!r}: give a positive factor on the sim's step compute times")
    if scale != 1.0 and not cfg["resim"]:
        raise ValueError("sim_step_scale applies only with resim=<run dir> (a sensitivity check of recorded live runs)")
    plugins.check_range("sim_ensemble", cfg["sim_ensemble"], 1)
    noise = cfg["sim_step_noise"]
    if noise != "profile" and not (isinstance(noise, (int, float)) and not isinstance(noise, bool) and 0 <= noise < 1):
        raise ValueError(f"sim_step_noise={noise!r}: give 'profile' (the profile's measured step-time scatter) or the "
                         "log-standard deviation of the sim's per-step jitter, in [0, 1)")
    if cfg["resim"] and cfg["profile"] in ("select", "auto", "none"):
        raise ValueError(f"resim=<run dir> re-prices recorded live runs with one given cost model: add "
                         f"profile=<profile.json> (got profile={cfg['profile']}; the run's own choice is in its "
                         "fidelity.json, profile_select.profile)")


def _profile_checks(cfg: dict) -> None:
    from kvrl.profiling.batches import GRIDS

    _check_model(cfg["model"])
    _check_live(cfg["backend"], "backend")
    plugins.check_choice("backend.name", cfg["backend"]["name"], ("live",))
    _check_common(cfg)
    plugins.check_choice("grid_preset", cfg["grid_preset"], ("auto", *GRIDS))
    grid = cfg["grid"]
    for key, value in grid.items():
        if isinstance(value, list):
            if not value:
                raise ValueError(f"grid.{key} must not be empty (null = the preset's value)")
            for v in value:
                plugins.check_range(f"grid.{key}", v, 1)
    for key, size in (("host_prompt", 2), ("host_output", 2), ("host_shared_prefix", 3)):
        value = grid[key]
        if value is not None and (len(value) != size or value[-2] > value[-1]):
            raise ValueError(f"grid.{key} must be [{'count, ' if size == 3 else ''}min, max] with min <= max, got {value}")
    for key, lo in (("overlap_batch", 1), ("overlap_ctx", 1), ("random", 0), ("holdout", 0), ("host_requests", 1),
                    ("warmup", 0), ("reps", 1)):
        if grid[key] is not None:
            plugins.check_range(f"grid.{key}", grid[key], lo)
    for key in ("host_rate", "point_budget_s"):
        if grid[key] is not None and not grid[key] > 0:
            raise ValueError(f"grid.{key} must be > 0 or null, got {grid[key]}")
    fraction = grid["host_pressure_fraction"]
    if fraction is not None and not 0 < fraction <= 1:
        raise ValueError(f"grid.host_pressure_fraction must be in (0, 1] or null, got {fraction}")
    if grid["host_lengths"] is not None:
        plugins.check_choice("grid.host_lengths", grid["host_lengths"], ("uniform", "lognormal"))
    if grid["kv_fill"] is not None:
        from kvrl.profiling.timing import KV_FILLS
        plugins.check_choice("grid.kv_fill", grid["kv_fill"], KV_FILLS)
    if grid["fit_stat"] is not None:
        plugins.check_choice("grid.fit_stat", grid["fit_stat"], ("median", "min"))
    plugins.check_range("block_size", cfg["block_size"], 1)
    plugins.check_range("num_blocks", cfg["num_blocks"], 0)
    plugins.check_range("gpu_memory_utilization", cfg["gpu_memory_utilization"], 0.0, 1.0)
    if not cfg["disk"]["mb"] > 0:
        raise ValueError(f"disk.mb must be > 0, got {cfg['disk']['mb']}")


def _bench_checks(cfg: dict) -> None:
    from kvrl.model.random_checkpoint import preset_config

    systems = cfg["systems"]
    if not systems or len(set(systems)) != len(systems):
        raise ValueError(f"systems must name each system at most once and at least one, got {systems}")
    for system in systems:
        plugins.check_choice("systems", system, BENCH_SYSTEMS)
    plugins.check_range("num_requests", cfg["num_requests"], 1)
    plugins.check_range("min_len", cfg["min_len"], 1)
    plugins.check_range("max_len", cfg["max_len"], cfg["min_len"])
    plugins.check_range("seed", cfg["seed"], 0)
    if cfg["checkpoint"] is None:
        try:
            preset_config(cfg["preset"])
        except ValueError as exc:
            raise ValueError(f"preset: {exc}") from None
    if not DEVICE.fullmatch(cfg["torch_device"]):
        raise ValueError(f"torch_device must be auto, cpu, cuda or cuda:N, got {cfg['torch_device']!r}")
    plugins.check_choice("dtype", cfg["dtype"], DTYPES)
    plugins.check_range("trace_steps", cfg["trace_steps"], 0)
    EngineConfig(num_blocks=cfg["num_blocks"], block_size=cfg["block_size"], max_num_seqs=cfg["max_num_seqs"],
                 max_num_batched_tokens=cfg["max_num_batched_tokens"],
                 gpu_memory_utilization=cfg["gpu_memory_utilization"])


def validate_fidelity(cfg: Any) -> dict:
    """Check a composed ``kvrl-fidelity`` config; returns it as a plain resolved dict.
    :class:`~kvrl.apps.schema.ConfigError` names the first bad key."""
    return _validate(FidelitySchema, _fidelity_checks, cfg)


def validate_profile(cfg: Any) -> dict:
    """Check a composed ``kvrl-profile`` config (as :func:`validate_fidelity`)."""
    return _validate(ProfileSchema, _profile_checks, cfg)


def validate_bench(cfg: Any) -> dict:
    """Check a composed ``kvrl-bench`` config (as :func:`validate_fidelity`)."""
    return _validate(BenchSchema, _bench_checks, cfg)


def register_live_schemas() -> None:
    """Store ``fidelity_schema``, ``profile_schema`` and ``bench_schema`` (and the kvrl resolvers)."""
    register_schemas()
    store = ConfigStore.instance()
    store.store(name="fidelity_schema", node=FidelitySchema)
    store.store(name="profile_schema", node=ProfileSchema)
    store.store(name="bench_schema", node=BenchSchema)


def compose_fidelity(overrides: list[str] = ()) -> dict:
    """``conf/fidelity.yaml`` composed by Hydra with ``overrides`` (e.g. ``["model=llama-3-8b"]``),
    validated, as a plain dict without Hydra's own section: kvrl-fidelity's configuration, for
    scripts (benchmarks/diag_steps.py, gc_stalls.py)."""
    from hydra import compose, initialize_config_module

    register_live_schemas()
    with initialize_config_module("kvrl.conf", version_base="1.3"):
        return validate_fidelity(compose("fidelity", overrides=list(overrides)))
