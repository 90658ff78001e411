"""Configuration of the kvrl Gymnasium environments: typed, validated dataclasses.

An environment config has two parts:

* ``run``: the engine and workload, in the shape of a kvrl Hydra app config (``backend``,
  ``model``, ``device``, ``workload``, ``scheduler``, ``watermark``, ``eviction``,
  ``prefix_cache``, ``engine``, ``slo``, ``seed``), built by :func:`kvrl.builder.build_engine`;
* the task: decision epochs, action space, reward, episode windows, observation features.

:func:`load_task` composes the packaged task ``conf/env/<name>.yaml`` through ``conf/train.yaml``
(the scenario the apps train and evaluate on); :func:`env_config_from_app` does the same from an
app's already composed config. Mappings become dataclasses through OmegaConf, so an unknown key
or a wrong type fails naming the key, and ``__post_init__`` checks ranges.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence

from kvrl.plugins.base import check_choice, check_range
from kvrl.plugins.lengths import LENGTH_KEYS
from kvrl.envs.rules import rule_spec

DEFAULT_TTFT_REF_S = 1.0     # feature latency references where run.slo has no objective
DEFAULT_TPOT_REF_S = 0.05
RUN_KEYS = ("backend", "model", "device", "workload", "scheduler", "watermark", "eviction", "prefix_cache",
            "engine", "slo", "seed")
SPLITS = ("train", "val", "test")


@dataclass
class DecisionConfig:
    """When the watermark agent acts: after the engine step that ends an epoch of ``epoch_s``
    seconds of engine time (idle gaps included) or of ``epoch_steps`` engine steps. Exactly one
    is set. The first decision follows the first engine step."""

    epoch_s: Optional[float] = 1.0
    epoch_steps: Optional[int] = None

    def __post_init__(self) -> None:
        if (self.epoch_s is None) == (self.epoch_steps is None):
            raise ValueError("decision: set exactly one of epoch_s and epoch_steps")
        if self.epoch_s is not None:
            check_range("decision.epoch_s", self.epoch_s, 1e-6)
        if self.epoch_steps is not None:
            check_range("decision.epoch_steps", self.epoch_steps, 1)


@dataclass
class RewardConfig:
    """Reward of one env step, in tokens / ``token_scale``:

    ``kind`` tokens (``goodput``: output tokens of the requests that finished in the step and
    met their TTFT/TPOT SLOs; ``throughput``: output tokens of every request that finished in the
    step) minus ``recompute_penalty`` x recomputed tokens minus ``swap_penalty`` x swapped tokens
    (blocks moved out or in, times the block size). Summed over an episode, the goodput term is
    the run's goodput (docs/design.md §5) times its duration.

    ``baseline``: null, or a plugin of the kind the agent replaces (``{name: slo_slack, mode:
    swap}``). Each episode's arrivals are then first served with it, and every step's reward also
    subtracts the baseline's ``kind`` tokens that finished in the same interval of engine time
    (the rest at the episode's end), so an episode's return is the agent's tokens minus the
    baseline's on the same arrivals. The baseline does not depend on the agent's actions: the
    optimal policy is unchanged, and the window-to-window variance of the return cancels (a
    control variate). It costs one more serving of each episode.
    """

    kind: str = "goodput"
    token_scale: float = 100.0
    recompute_penalty: float = 0.0
    swap_penalty: float = 0.0
    baseline: Optional[Dict[str, Any]] = None

    def __post_init__(self) -> None:
        if self.baseline is not None:
            self.baseline = {str(k): v for k, v in dict(self.baseline).items()}
            if "name" not in self.baseline or self.baseline["name"] == "agent":
                raise ValueError(f"reward.baseline: give a plugin by name (not 'agent'), got {self.baseline!r}")
        check_choice("reward.kind", self.kind, ("goodput", "throughput"))
        check_range("reward.token_scale", self.token_scale, 1e-9)
        check_range("reward.recompute_penalty", self.recompute_penalty, 0.0)
        check_range("reward.swap_penalty", self.swap_penalty, 0.0)


@dataclass
class EpisodeConfig:
    """Which arrivals an episode serves.

    ``split`` (train | val | test) replaces ``run.workload.split``. ``window_s`` (engine seconds,
    after ``rate_scale``): each episode serves the arrivals of one window of that length and is
    truncated when engine time reaches the window's end (a time limit: requests still in flight
    earn nothing); null: the whole split, served to completion (truncated at trace end), which
    reproduces ``kvrl-run`` on the same config exactly. ``start_s``: null = a window start drawn
    uniformly with the env's seeded RNG at each reset; a number = always the same slice (a
    replayed arrival sequence). ``reset(options={"start_s": ...})`` or
    ``reset(options={"workload": requests or workload config})`` override it for one episode.
    ``rate_scales``: null = every episode at the scenario's ``workload.rate_scale``; a list = each
    episode's rate scale drawn uniformly from it at reset (training over a range of loads; the
    window is cut from the split at the drawn rate), or, for whole-split episodes (``window_s: null``,
    validation at the training loads), each in turn (after every family of a mixture, in turn, at one
    load). ``rate_scales_relative``: true (default) =
    the list holds multipliers of ``workload.rate_scale`` (``[0.5, 1.0]`` at ``rate_scale: 20`` is
    10x and 20x the trace's rate, so the loads follow the scenario it is pointed at); false = the
    list holds absolute rate scales of the trace. :func:`episode_rate_scales` gives the absolute
    values. ``step_time_sigma``: domain randomisation of the sim's cost model; each episode's step
    times are multiplied by ``exp(N(0, step_time_sigma))`` drawn at reset (0 = off; sim only).

    ``workloads``: null = every episode serves the scenario's ``run.workload``; a list = a mixture of
    workload families, each entry a workload config laid over the scenario's (see
    :func:`variant_workloads`). An episode with a window (training) first draws its family
    uniformly, then its rate scale (relative ones multiply the family's own ``rate_scale``), then
    its window; whole-split episodes (``window_s: null``, validation) take the families in turn, so
    ``len(workloads)`` of them serve each family's split once.
    """

    split: Optional[str] = "train"
    window_s: Optional[float] = 120.0
    start_s: Optional[float] = None
    rate_scales: Optional[list] = None
    rate_scales_relative: bool = True
    step_time_sigma: float = 0.0
    workloads: Optional[List[Any]] = None

    def __post_init__(self) -> None:
        if self.split is not None:
            check_choice("episode.split", self.split, SPLITS)
        if self.workloads is not None:
            if len(self.workloads) == 0:
                raise ValueError("episode.workloads: give at least one workload (or null)")
            for i, entry in enumerate(self.workloads):
                if not isinstance(entry, Mapping):
                    raise ValueError(f"episode.workloads[{i}]: a workload config mapping ({{}} = the scenario's "
                                     f"own), got {type(entry).__name__}")
        if self.window_s is not None:
            check_range("episode.window_s", self.window_s, 1e-6)
        if self.start_s is not None:
            check_range("episode.start_s", self.start_s, 0.0)
        check_range("episode.step_time_sigma", self.step_time_sigma, 0.0, 1.0)
        if self.rate_scales is not None:
            if len(self.rate_scales) == 0:
                raise ValueError("episode.rate_scales: give at least one rate scale (or null)")
            self.rate_scales = [float(x) for x in self.rate_scales]
            for x in self.rate_scales:
                check_range("episode.rate_scales[]", x, 1e-9)


@dataclass
class FeatureConfig:
    """Normalisation of the observation features (see :mod:`kvrl.envs.features`).

    ``tau_s``: time constant (engine seconds) of the rate averages (arrivals, preemptions,
    recomputation). ``latency_alpha``: weight of each finished request in the TTFT/TPOT/SLO
    averages. ``count_scale``: a queue of this many sequences maps to 0.5. ``rate_ref``:
    arrivals per second that map to 0.5. ``ttft_ref_s`` / ``tpot_ref_s``: latencies that map to
    0.5 and count as meeting the SLO in the attainment average; null = ``run.slo`` (1 s and 50 ms
    where that is null too). ``top_k``: candidate slots of the preemption
    observation. ``oracle_lengths``: candidates' remaining output from the trace (oracle; a real
    server does not know it) instead of a prediction from finished requests. ``history``: append
    :data:`~kvrl.envs.features.HISTORY_FEATURES` (short-horizon rates over ``short_tau_s``, the
    load trend, the running sequences' predicted KV demand) to the engine features. ``prefix``:
    append :data:`~kvrl.envs.features.PREFIX_FEATURES` (the prefix cache's recent hit rate over
    ``tau_s``, its cached blocks and those of them no sequence holds) after those. ``demand``:
    append :data:`~kvrl.envs.features.DEMAND_FEATURES` (the running batch's predicted growth and
    peak KV demand, the waiting queue's predicted KV demand) after those. ``slo_mix``: append
    :data:`~kvrl.envs.features.SLO_MIX_FEATURES` (the shares of running and waiting sequences whose
    TPOT objective is below ``tpot_ref_s``) after those. ``length_key``: what
    the remaining-output prediction is conditioned on: ``none`` (every finished request) or
    ``tenant`` (the finished requests of the same tenant, once it has ``min_class_history`` of
    them; the request class a server knows at admission) or ``hint`` (each request's
    ``output_len_hint``, calibrated by the finished hinted requests). ``slo``: append
    :data:`~kvrl.envs.features.SLO_CANDIDATE_FEATURES` to each candidate row (TTFT missed; SLO
    slack, :func:`~kvrl.plugins.slack.slo_slack` with future tokens at ``slo_pace`` x the TPOT
    objective, squashed around ``slack_ref_s``). ``slot_rules``: eviction plugins (a name, or a
    mapping with ``name`` and its parameters) whose victims fill the first candidate slots, one
    slot each in this order (slot ``i`` = the candidate plugin ``i`` would preempt, so choosing
    slot ``i`` imitates it; the same candidate may fill several slots); the remaining slots hold
    the newest admissions not shown yet. Empty (default): every slot by newest admission.
    """

    tau_s: float = 10.0
    latency_alpha: float = 0.05
    count_scale: float = 16.0
    rate_ref: float = 1.0
    ttft_ref_s: Optional[float] = None
    tpot_ref_s: Optional[float] = None
    top_k: int = 8
    oracle_lengths: bool = False
    history: bool = False
    short_tau_s: float = 1.0
    prefix: bool = False
    demand: bool = False
    slo_mix: bool = False
    length_key: str = "none"
    min_class_history: int = 8
    slo: bool = False
    slo_pace: float = 0.8
    slack_ref_s: float = 0.25
    slot_rules: List[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.slot_rules = [rule_spec(rule, "eviction", "features.slot_rules") for rule in self.slot_rules]
        if len(self.slot_rules) > self.top_k:
            raise ValueError(f"features.slot_rules: {len(self.slot_rules)} rules but features.top_k is {self.top_k}")
        check_range("features.slo_pace", self.slo_pace, 1e-6, 1.0)
        check_range("features.slack_ref_s", self.slack_ref_s, 1e-9)
        if self.length_key not in LENGTH_KEYS:
            raise ValueError(f"features.length_key must be one of {', '.join(LENGTH_KEYS)}, got {self.length_key!r}")
        check_range("features.min_class_history", self.min_class_history, 1)
        check_range("features.tau_s", self.tau_s, 1e-6)
        check_range("features.short_tau_s", self.short_tau_s, 1e-6)
        check_range("features.latency_alpha", self.latency_alpha, 1e-6, 1.0)
        for name in ("count_scale", "rate_ref", "ttft_ref_s", "tpot_ref_s"):
            if getattr(self, name) is not None:
                check_range(f"features.{name}", getattr(self, name), 1e-9)
        check_range("features.top_k", self.top_k, 1)


AUTO_BINS = "auto"
DEFAULT_SWEEP = [0.0, 0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5]


@dataclass
class AutoBinsConfig:
    """How ``bins: auto`` is resolved (by ``kvrl-train``, :mod:`kvrl.apps.bins`): every fixed
    watermark of ``sweep`` serves the whole ``val`` split once (seed 0, the scenario's
    ``workload.rate_scale``); the bins are the values of ``sweep`` from the lowest to the highest
    whose val goodput is at least ``(1 - tolerance)`` times the best one (the best included)."""

    sweep: List[float] = field(default_factory=lambda: list(DEFAULT_SWEEP))
    tolerance: float = 0.35

    def __post_init__(self) -> None:
        if not self.sweep:
            raise ValueError("action.auto.sweep must not be empty")
        for f in self.sweep:
            check_range("action.auto.sweep[*]", f, 0.0, 1.0, hi_inclusive=False)
        check_range("action.auto.tolerance", self.tolerance, 0.0, 1.0)


@dataclass
class WatermarkActionConfig:
    """The watermark action: ``discrete`` picks one of ``bins`` (fractions of the GPU blocks to
    keep free); ``box`` is one float in [-1, 1] mapped linearly onto [``low``, ``high``].
    ``bins: auto``: ``kvrl-train`` replaces it, before it builds an environment, with the useful
    range of a validation sweep of fixed watermarks (``auto``, :class:`AutoBinsConfig`); an
    environment cannot be built with ``auto`` still in place. ``rules`` (discrete only): watermark
    plugins (a name, or ``{name, **params}``); action ``i`` then hands the watermark to rule ``i``
    until the next decision (every rule sees every engine event all along, so its state is current
    when it takes over), and ``bins`` is not used."""

    type: str = "discrete"
    bins: Any = field(default_factory=lambda: list(DEFAULT_SWEEP))    # a list of fractions, or "auto"
    low: float = 0.0
    high: float = 0.5
    auto: AutoBinsConfig = field(default_factory=AutoBinsConfig)
    rules: Optional[List[Any]] = None

    def __post_init__(self) -> None:
        check_choice("action.type", self.type, ("discrete", "box"))
        if self.rules is not None:
            if self.type != "discrete":
                raise ValueError(f"action.rules needs action.type=discrete (one action per rule), got {self.type!r}")
            if isinstance(self.rules, (str, bytes)) or len(self.rules) < 2:
                raise ValueError(f"action.rules must be a list of at least two watermark plugins, got {self.rules!r}")
            self.rules = [rule_spec(rule, "watermark", "action.rules") for rule in self.rules]
        if isinstance(self.bins, str):
            if self.bins != AUTO_BINS:
                raise ValueError(f"action.bins must be a list of fractions or {AUTO_BINS!r}, got {self.bins!r}")
        else:
            if isinstance(self.bins, (int, float)) or not self.bins:
                raise ValueError(f"action.bins must be a non-empty list of fractions or {AUTO_BINS!r}, "
                                 f"got {self.bins!r}")
            self.bins = [float(b) for b in self.bins]
            for b in self.bins:
                check_range("action.bins[*]", b, 0.0, 1.0, hi_inclusive=False)
        check_range("action.low", self.low, 0.0, 1.0, hi_inclusive=False)
        check_range("action.high", self.high, self.low, 1.0, hi_inclusive=False)


@dataclass
class PreemptionActionConfig:
    """The preemption action over ``features.top_k`` candidate slots: ``discrete`` = one of
    ``2 * top_k`` (slot, mode) pairs, index ``2 * slot + mode``; ``multidiscrete`` = ``[slot,
    mode]``. Mode 0 = recompute, 1 = swap."""

    type: str = "discrete"

    def __post_init__(self) -> None:
        check_choice("action.type", self.type, ("discrete", "multidiscrete"))


MODE_NAMES = ("recompute", "swap")     # mode index 0, 1 of the joint action


@dataclass
class WatermarkModeActionConfig:
    """The joint action of ``kvrl/WatermarkMode-v0``: a watermark of ``bins`` (fractions of the GPU
    blocks to keep free) and a preemption mode (0 = recompute, 1 = swap). ``discrete``:
    ``Discrete(2 * len(bins))``, index ``2 * bin + mode``; ``multidiscrete``: ``[bin, mode]``."""

    type: str = "discrete"
    bins: List[float] = field(default_factory=lambda: [0.0, 0.01, 0.03, 0.05, 0.1, 0.2])

    def __post_init__(self) -> None:
        check_choice("action.type", self.type, ("discrete", "multidiscrete"))
        if isinstance(self.bins, (str, int, float)) or not self.bins:
            raise ValueError(f"action.bins must be a non-empty list of fractions, got {self.bins!r}")
        self.bins = [float(b) for b in self.bins]
        for b in self.bins:
            check_range("action.bins[*]", b, 0.0, 1.0, hi_inclusive=False)


@dataclass
class EnvConfig:
    """What both environments share. ``clip_actions``: out-of-range or masked actions are mapped
    to the nearest valid one (counted in ``info["clipped_actions"]``) instead of raising
    ``ValueError``; NaN always raises (it has no nearest valid action)."""

    run: Dict[str, Any] = field(default_factory=dict)
    reward: RewardConfig = field(default_factory=RewardConfig)
    episode: EpisodeConfig = field(default_factory=EpisodeConfig)
    features: FeatureConfig = field(default_factory=FeatureConfig)
    clip_actions: bool = False

    def __post_init__(self) -> None:
        missing = [k for k in RUN_KEYS if k not in self.run]
        if self.run and missing:
            raise ValueError(f"env run config lacks {missing} (expected keys: {list(RUN_KEYS)})")


@dataclass
class WatermarkEnvConfig(EnvConfig):
    """``kvrl/Watermark-v0``: the agent sets the watermark once per decision epoch."""

    action: WatermarkActionConfig = field(default_factory=WatermarkActionConfig)
    decision: DecisionConfig = field(default_factory=DecisionConfig)


@dataclass
class PreemptionEnvConfig(EnvConfig):
    """``kvrl/Preemption-v0``: the agent picks the victim and mode at each block shortage."""

    action: PreemptionActionConfig = field(default_factory=PreemptionActionConfig)


@dataclass
class WatermarkModeEnvConfig(EnvConfig):
    """``kvrl/WatermarkMode-v0``: the agent sets the watermark and the preemption mode together,
    once per decision epoch."""

    action: WatermarkModeActionConfig = field(default_factory=WatermarkModeActionConfig)
    decision: DecisionConfig = field(default_factory=DecisionConfig)


TASKS = {"kvrl/Watermark-v0": WatermarkEnvConfig, "kvrl/Preemption-v0": PreemptionEnvConfig,
         "kvrl/WatermarkLive-v0": WatermarkEnvConfig, "kvrl/PreemptionLive-v0": PreemptionEnvConfig,
         "kvrl/WatermarkMode-v0": WatermarkModeEnvConfig}


def resolve_features(config: EnvConfig) -> FeatureConfig:
    """``config.features`` with null latency references taken from ``run.slo``."""
    slo = config.run.get("slo") or {}
    f = config.features
    return dataclasses.replace(
        f, ttft_ref_s=f.ttft_ref_s or slo.get("ttft_s") or DEFAULT_TTFT_REF_S,
        tpot_ref_s=f.tpot_ref_s or slo.get("tpot_s") or DEFAULT_TPOT_REF_S)


def make_config(cls: type, values: Mapping[str, Any] | None = None) -> Any:
    """A validated ``cls`` (an env config dataclass) from a mapping; unknown keys fail by name."""
    from omegaconf import OmegaConf

    if values is None:
        return cls()
    if isinstance(values, cls):
        return values
    merged = OmegaConf.merge(OmegaConf.structured(cls), OmegaConf.create(_plain(values)))
    return OmegaConf.to_object(merged)


def _plain(values: Any) -> Any:
    from omegaconf import DictConfig, OmegaConf

    if isinstance(values, DictConfig):
        return OmegaConf.to_container(values, resolve=True)
    if dataclasses.is_dataclass(values):
        return dataclasses.asdict(values)
    return dict(values)


def to_dict(config: Any) -> dict:
    """Plain nested dict of an env config (for JSON sidecars and W&B)."""
    return dataclasses.asdict(config)


def env_config_from_app(cfg: Any, split: Optional[str] = None, **episode: Any) -> tuple[str, Any]:
    """``(env id, typed env config)`` from a composed kvrl-train / kvrl-eval config: its ``env``
    node (``id`` + task keys) and its run keys. ``split`` and ``episode`` override the episode."""
    from omegaconf import OmegaConf

    node = OmegaConf.to_container(cfg.env, resolve=True)
    env_id = node.pop("id")
    if env_id not in TASKS:
        raise ValueError(f"env.id must be one of {sorted(TASKS)}, got {env_id!r}")
    node["run"] = {k: OmegaConf.to_container(cfg[k], resolve=True) if OmegaConf.is_config(cfg[k]) else cfg[k]
                   for k in RUN_KEYS}
    if split is not None:
        episode["split"] = split
    node.setdefault("episode", {}).update(episode)
    return env_id, make_config(TASKS[env_id], node)


def episode_rate_scales(config: EnvConfig, workload: Optional[Mapping[str, Any]] = None) -> Optional[list[float]]:
    """The absolute rate scales training episodes of ``workload`` (default ``run.workload``; a family of
    ``episode.workloads``) draw from (null: the workload's own rate): ``episode.rate_scales`` times the
    workload's ``rate_scale`` when ``rate_scales_relative``."""
    ep = config.episode
    if ep.rate_scales is None:
        return None
    if not ep.rate_scales_relative:
        return list(ep.rate_scales)
    if workload is None:
        workload = config.run.get("workload") or {}
    base = float(workload.get("rate_scale", 1.0))
    return [r * base for r in ep.rate_scales]


def variant_workloads(workload: Mapping[str, Any], variants: Optional[Sequence[Mapping[str, Any]]]) -> list[dict]:
    """The workload configs of ``episode.workloads`` (``[workload]`` when null), each laid over the
    scenario's ``workload``: an entry with the same builder ``name`` (or none) changes only the keys
    it gives (deep merge); an entry naming another builder starts from that builder's defaults with
    the scenario's common keys (seed, split, split fractions, rate scale, overlong, SLO defaults...)
    and then takes its own keys."""
    from omegaconf import OmegaConf

    from kvrl.workloads import CommonParams, WorkloadConfigError, default_config, resolve_config

    base = OmegaConf.to_container(OmegaConf.create(dict(workload)), resolve=True)
    if variants is None:
        return [base]
    out = []
    for i, entry in enumerate(variants):
        entry = OmegaConf.to_container(OmegaConf.create(dict(entry)), resolve=True)
        name = entry.get("name", base.get("name"))
        if name == base.get("name"):
            start = base
        else:
            start = default_config(name)
            start.update({f.name: base[f.name] for f in dataclasses.fields(CommonParams) if f.name in base})
        family = OmegaConf.to_container(OmegaConf.merge(OmegaConf.create(start), OmegaConf.create(entry)), resolve=True)
        try:
            resolve_config(family)
        except WorkloadConfigError as e:
            raise ValueError(f"episode.workloads[{i}]: {e}") from None
        out.append(family)
    return out


def describe_workload(workload: Mapping[str, Any]) -> str:
    """What a workload config loads, for outputs: the builder and, where it reads one, the file
    (``azure_code (file /data/x.csv)``; ``azure_code (packaged trace)`` for the packaged copy)."""
    name = workload.get("name")
    path = workload.get("path")
    if path:
        return f"{name} (file {path})"
    if name == "azure_code":
        return f"{name} (packaged trace)"
    return str(name)


def load_task(name: str = "watermark", overrides: Sequence[str] = ()) -> tuple[str, Any]:
    """Compose ``conf/train.yaml`` with ``env=<name>`` and Hydra ``overrides``; returns ``(env id,
    typed env config)``. Inside a running Hydra app this composes with the app's Hydra instance."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    from kvrl.apps.rl_schema import register_rl_schemas

    register_rl_schemas()
    args = [f"env={name}", *overrides]
    if GlobalHydra.instance().is_initialized():
        cfg = compose("train", overrides=args)
    else:
        with initialize_config_module("kvrl.conf", version_base="1.3"):
            cfg = compose("train", overrides=args)
    return env_config_from_app(cfg)
