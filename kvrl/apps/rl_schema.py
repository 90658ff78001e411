"""Structured configs of ``kvrl-train``, ``kvrl-eval`` and ``kvrl-select`` (Hydra ConfigStore
``train_schema``, ``eval_schema``, ``select_schema``): the run keys of ``kvrl-run`` plus the task
(``env``), the agent and the app's own settings. The ``env`` and ``agent`` nodes are checked
when the apps build them (:func:`kvrl.envs.config.env_config_from_app`, :func:`kvrl.envs.agent_io.algo_class`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from kvrl import plugins
from kvrl.apps.schema import ConfigError, EngineKeys, register_schemas


@dataclass
class TrainSettings:
    """``train.*``: how long and how ``kvrl-train`` trains.

    Attributes:
        total_timesteps: agent decisions over all vectorised envs.
        n_envs: parallel environments (episodes from different windows of the train split).
        vec_env: ``subproc`` (one process per env) or ``dummy`` (all in this process).
        eval_every: timesteps between evaluations on the whole ``val`` split (EvalCallback; the
            best model is kept as ``best_model.zip``); 0 = no evaluation.
        val_loads: the loads of each evaluation: ``scenario`` = the val split once at the scenario's
            ``workload.rate_scale``; ``training`` = once at each of the training loads
            (``env.episode.rate_scales``), the return averaged over them, so that a split too light at
            the scenario's rate to tell agents apart is also served where they differ (docs/rl.md,
            "Validation at the training loads").
        checkpoint_every: timesteps between checkpoints in ``checkpoints/`` (for ``resume``).
        torch_threads: intra-op threads of torch in each process (1 = no oversubscription).
        init_logits: a prior over a discrete action space, ``{action index: logit}``, added to the
            bias of the untrained policy's action head (PPO and MaskablePPO; SB3 initialises that
            head near zero, so the prior is the starting policy). With ``env.features.slot_rules``
            it starts the agent at a heuristic: on Preemption-v0 ``{1: 6, 0: 3}`` follows the
            plugin in slot 0 with swap (index ``2 * slot + mode``) about 92% of the time and falls
            back to recompute where swap is masked. ``null``: no prior.
        init_agent: a saved agent (a kvrl-train run directory or one of its zips) to start from
            instead of an untrained policy (:mod:`kvrl.apps.warm_start`): fine-tuning, e.g. a
            sim-trained agent on ``backend=live``. ``null``: a new policy.
        max_wall_s: stop training after this many wall-clock seconds (checked at every agent
            decision; the model so far is saved as usual): a bounded budget for live training.
            ``null``: no limit.
    """

    total_timesteps: int = 8192
    n_envs: int = 2
    vec_env: str = "subproc"
    eval_every: int = 4096
    val_loads: str = "scenario"
    checkpoint_every: int = 4096
    torch_threads: int = 1
    init_logits: Any = None    # {action index: logit}; a typed Dict would refuse new keys on the command line
    init_agent: Optional[str] = None
    max_wall_s: Optional[float] = None


@dataclass
class AgentConfig:
    """``conf/agent/<name>.yaml``: the SB3 algorithm, its policy class and keyword arguments."""

    name: str = MISSING
    policy: str = "MlpPolicy"
    kwargs: Any = field(default_factory=dict)


@dataclass
class _RunKeys(EngineKeys):
    env: Any = MISSING


@dataclass
class TrainSchema(_RunKeys):
    agent: AgentConfig = field(default_factory=AgentConfig)
    train: TrainSettings = field(default_factory=TrainSettings)
    resume: bool = False       # continue from the latest checkpoint in the run directory
    progress: bool = True      # progress bar over timesteps


@dataclass
class EvalSchema(_RunKeys):
    """``kvrl-eval``: see ``conf/eval.yaml`` for the meaning of each key."""

    agents: List[str] = field(default_factory=lambda: ["latest"])
    train_dir: str = "runs/train"
    seeds: List[int] = field(default_factory=lambda: [0, 1, 2, 3, 4])
    resample: Optional[float] = 0.8
    sweep: List[float] = field(default_factory=list)
    val_pick: str = "same"
    fixed_best: Optional[float] = None
    live_warmup: int = 32
    baselines: Any = field(default_factory=dict)
    tune: Any = field(default_factory=dict)
    tune_seeds: Optional[List[int]] = None
    tune_loads: str = "scenario"
    oracle: bool = True
    workers: int = 2
    plots: bool = True
    step_traces: str = "first"
    job_order: str = "auto"


@dataclass
class SelectSchema(_RunKeys):
    """``kvrl-select``: see ``conf/select.yaml`` for the meaning of each key."""

    agents: List[str] = MISSING
    split: str = "val"
    seeds: Optional[List[int]] = None    # null: one job per agent at ``seed``; a list: one per seed, scores averaged
    resample: Optional[float] = None     # with seeds: each job serves this seeded share of the split (as kvrl-eval)
    workers: int = 1
    top: int = 5


def validate_train(cfg: Any) -> None:
    """Check ``train.*`` beyond its types; :class:`~kvrl.apps.schema.ConfigError` names the key
    (e.g. ``train.total_timesteps=0`` would save an untrained model)."""
    t = cfg.train
    try:
        plugins.check_range("train.total_timesteps", t.total_timesteps, 1)
        plugins.check_range("train.n_envs", t.n_envs, 1)
        plugins.check_choice("train.vec_env", t.vec_env, ("subproc", "dummy"))
        plugins.check_range("train.eval_every", t.eval_every, 0)
        plugins.check_choice("train.val_loads", t.val_loads, ("scenario", "training"))
        plugins.check_range("train.checkpoint_every", t.checkpoint_every, 1)
        plugins.check_range("train.torch_threads", t.torch_threads, 1)
        if t.max_wall_s is not None:
            plugins.check_range("train.max_wall_s", t.max_wall_s, 1e-3)
        if t.init_agent is not None and t.init_logits is not None:
            raise ValueError("train.init_agent and train.init_logits both set the starting policy: give one")
        if t.init_logits is not None:
            if not hasattr(t.init_logits, "items"):
                raise ValueError(f"train.init_logits must be a map {{action index: logit}}, got {t.init_logits!r}")
            for index, logit in t.init_logits.items():
                plugins.check_range(f"train.init_logits.{index} (an action index)", index, 0)
                plugins.check_range(f"train.init_logits.{index}", logit, -30.0, 30.0)
    except ValueError as exc:
        raise ConfigError(f"invalid config: {exc}") from None


def register_rl_schemas() -> None:
    """Store ``train_schema``, ``eval_schema`` and ``select_schema``, the kvrl-run schemas they
    build on, and every plugin's config option (built-ins and entry points), so Hydra can compose
    the apps."""
    plugins.load_entry_points()
    plugins.available("scheduler")
    register_schemas()
    store = ConfigStore.instance()
    store.store(name="train_schema", node=TrainSchema)
    store.store(name="eval_schema", node=EvalSchema)
    store.store(name="select_schema", node=SelectSchema)
