"""``kvrl-train``: train a stable-baselines3 agent on a kvrl environment (``conf/train.yaml``).

Trains on windows of the workload's ``train`` split in ``train.n_envs`` vectorised environments,
evaluates on the whole ``val`` split every ``train.eval_every`` timesteps (EvalCallback; the best
model is kept; with a mixture of workload families, ``env.episode.workloads``, on each family's val
split, and with ``train.val_loads=training`` at each training load, the return averaged over them),
checkpoints every ``train.checkpoint_every`` timesteps, and writes into the Hydra
run directory (``runs/train/<date>/<time>``): ``model.zip`` (final), ``best_model.zip``,
``checkpoints/``, ``agent.json`` (what :func:`kvrl.envs.agent_io.load_agent` needs),
``progress.csv`` (SB3's log), ``evaluations.npz``, ``config.yaml``, ``summary.json``.

``resume=true hydra.run.dir=<that run directory>`` continues the run with its own config from
its newest readable checkpoint up to ``train.total_timesteps``, appending to its history
(:mod:`kvrl.apps.resume`). ``train.init_agent=<saved agent>`` starts from that agent instead of
a new policy (:mod:`kvrl.apps.warm_start`: fine-tuning, e.g. a sim-trained agent on
``backend=live``) and ``train.max_wall_s`` bounds the training's wall-clock time.
``env.action.bins=auto`` takes the watermark bins from a validation sweep of fixed watermarks on the scenario (:mod:`kvrl.apps.bins`; the sweep is logged and kept in
``bins_sweep.json``). ``logger=csv|wandb`` also sends SB3's log to the tracker (W&B: plus
``WandbCallback``), inside the job, always finished.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Optional

import hydra
import numpy as np
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from kvrl.apps import resume, tracking, warm_start
from kvrl.apps.leaderboard import key_value_table
from kvrl.apps.outputs import atomic_write, write_json
from kvrl.apps.rl_schema import register_rl_schemas, validate_train
from kvrl.apps.schema import ConfigError, validate_config
from kvrl.envs.agent_io import algo_class, write_meta
from kvrl.envs.config import AUTO_BINS, describe_workload, env_config_from_app, episode_rate_scales

log = logging.getLogger("kvrl.train")

register_rl_schemas()

OFF_POLICY = ("sac", "dqn")
CHECKPOINT_PREFIX = resume.CHECKPOINT_PREFIX


def check_compatible(algo: str, env_id: str, env_cfg: Any) -> None:
    """Fail early, saying what to change, when the agent cannot act in the environment."""
    box = getattr(getattr(env_cfg, "action", None), "type", None) == "box"
    if algo == "sac" and not box:
        raise ValueError(f"agent=sac needs continuous actions: {env_id} here has discrete ones "
                         f"(the watermark task takes env.action.type=box)")
    if algo == "dqn" and box:
        raise ValueError("agent=dqn needs discrete actions: set env.action.type=discrete")
    if "Preemption" in env_id and algo != "maskable_ppo" and not env_cfg.clip_actions:
        log.warning("%s has state-dependent action masks; agent=%s ignores them (masked actions fall back "
                    "to the LIFO victim); agent=maskable_ppo uses them", env_id, algo)
    if algo == "maskable_ppo" and "Preemption" not in env_id:
        raise ValueError(f"agent=maskable_ppo needs action masks, which only kvrl/Preemption-v0 has; "
                         f"use agent=ppo for {env_id}")


def make_envs(env_id: str, env_cfg: Any, n_envs: int, seed: int, subproc: bool):
    """A monitored VecEnv of ``n_envs`` copies (seeded ``seed``, ``seed + 1``, ...)."""
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    import kvrl.envs  # noqa: F401  (registers the ids, also in SubprocVecEnv workers)

    return make_vec_env(env_id, n_envs=n_envs, seed=seed, env_kwargs={"config": env_cfg, "render_mode": None},
                        vec_env_cls=SubprocVecEnv if subproc and n_envs > 1 else DummyVecEnv)


def _tracker_writer(tracker):
    """An SB3 log writer that forwards every numeric record to the kvrl tracker."""
    from stable_baselines3.common.logger import KVWriter

    class TrackerWriter(KVWriter):
        def write(self, key_values, key_excluded, step=0):
            row = {k: float(v) for k, v in key_values.items()
                   if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)}
            if row:
                tracker.log(row, step=step)

    return TrackerWriter()


def _episode_metrics_callback():
    """Logs the docs/design.md §5 metrics of every finished training episode (goodput, ...)."""
    from stable_baselines3.common.callbacks import BaseCallback

    class EpisodeMetrics(BaseCallback):
        KEYS = ("goodput_tok_s", "throughput_tok_s", "slo_attainment", "ttft_p99_s", "tpot_p99_s", "preemptions")

        def _on_step(self) -> bool:
            for info in self.locals.get("infos", ()):
                metrics = info.get("metrics")
                if metrics:
                    for key in self.KEYS:
                        value = metrics.get(key)
                        if value is not None and np.isfinite(value):
                            self.logger.record_mean(f"episode/{key}", float(value))
            return True

    return EpisodeMetrics()


def _callbacks(cfg: DictConfig, out_dir: Path, algo: str, env_id: str, eval_cfg: Any,
               evaluations: Optional[dict] = None):
    from stable_baselines3.common.callbacks import CheckpointCallback, EvalCallback

    t = cfg.train
    n = t.n_envs
    callbacks = [_episode_metrics_callback(),
                 CheckpointCallback(save_freq=max(t.checkpoint_every // n, 1), save_path=str(out_dir / "checkpoints"),
                                    name_prefix=CHECKPOINT_PREFIX, save_replay_buffer=algo in OFF_POLICY)]
    if t.eval_every > 0:
        eval_env = make_envs(env_id, eval_cfg, 1, int(cfg.seed) + 10_000, subproc=False)
        cls = EvalCallback
        if algo == "maskable_ppo":
            from sb3_contrib.common.maskable.callbacks import MaskableEvalCallback as cls
        # one whole val split per family of a mixture and per validation load, each once (in turn)
        episodes = len(eval_cfg.episode.workloads or [None]) * len(eval_cfg.episode.rate_scales or [None])
        evaluator = cls(eval_env, n_eval_episodes=episodes, eval_freq=max(t.eval_every // n, 1), deterministic=True,
                        best_model_save_path=str(out_dir), log_path=str(out_dir), verbose=0)
        resume.restore_evaluations(evaluator, evaluations)     # resumed: appends; the best so far stays to beat
        callbacks.append(evaluator)
    if cfg.logger.name == "wandb":
        from wandb.integration.sb3 import WandbCallback
        callbacks.append(WandbCallback(verbose=0))
    return callbacks


def _wall_clock_stop(max_wall_s: float):
    """A callback that ends ``learn`` at the first agent decision after ``max_wall_s`` wall-clock
    seconds from its creation (just before ``learn``, so the first episode's reset counts;
    ``train.max_wall_s``); its ``stopped`` says whether it did."""
    from stable_baselines3.common.callbacks import BaseCallback

    t0 = time.perf_counter()

    class WallClockStop(BaseCallback):
        stopped = False

        def _on_step(self) -> bool:
            if time.perf_counter() - t0 < max_wall_s:
                return True
            self.stopped = True
            log.info("train.max_wall_s=%g reached after %d timesteps: stopping", max_wall_s, self.num_timesteps)
            return False

    return WallClockStop()


def resolve_bins(cfg: DictConfig, out_dir: Path) -> None:
    """``env.action.bins=auto``: replace it in ``cfg`` with the useful range of a validation sweep
    of fixed watermarks on the scenario (:func:`kvrl.apps.bins.sweep_fixed`), logged and written
    to ``bins_sweep.json``."""
    from kvrl.apps.bins import sweep_fixed

    env_id, env_cfg = env_config_from_app(cfg)
    auto = env_cfg.action.auto
    log.info("env.action.bins=auto: serving the whole val split with fixed watermarks %s (%s)",
             auto.sweep, describe_workload(env_cfg.run["workload"]))
    sweep = sweep_fixed(env_cfg.run, auto.sweep, auto.tolerance, workers=int(cfg.train.n_envs))
    log.info("env.action.bins=auto: %s", sweep.describe())
    cfg.env.action.bins = list(sweep.bins)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(out_dir / "bins_sweep.json", sweep.as_dict())


def _new_model(cls: type, cfg: DictConfig, env: Any) -> Any:
    kwargs = OmegaConf.to_container(cfg.agent.kwargs, resolve=True)
    model = cls(cfg.agent.policy, env, seed=int(cfg.seed), device="cpu", verbose=0, **kwargs)
    if cfg.train.init_logits:
        apply_action_prior(model, {int(k): float(v) for k, v in cfg.train.init_logits.items()})
    return model


def apply_action_prior(model: Any, logits: dict[int, float]) -> None:
    """Add ``logits`` (discrete action index -> logit) to the bias of ``model``'s untrained action
    head (``train.init_logits``). ``ConfigError`` naming the key when the policy has no
    categorical action head (e.g. DQN, continuous actions) or an index is outside the action space."""
    import torch

    head = getattr(model.policy, "action_net", None)
    n = getattr(model.action_space, "n", None)
    if head is None or n is None or getattr(head, "bias", None) is None or head.out_features != int(n):
        raise ConfigError(f"train.init_logits: {type(model).__name__} on {model.action_space} has no "
                          "categorical action head to set a prior on (PPO, MaskablePPO or RecurrentPPO "
                          "with a discrete action space)")
    for index, logit in logits.items():
        if index >= n:
            raise ConfigError(f"train.init_logits.{index}: the action space has {n} actions (0..{n - 1})")
        with torch.no_grad():
            head.bias[index] += logit


def train(cfg: DictConfig, out_dir: Path, tracker) -> dict:
    """Train as ``cfg`` says, writing into ``out_dir``; returns the summary. With ``cfg.resume``,
    ``cfg`` must already be the run's own (:func:`kvrl.apps.resume.restore_config`)."""
    import torch
    from stable_baselines3.common.logger import Logger

    torch.set_num_threads(cfg.train.torch_threads)
    if cfg.env.get("action", {}).get("bins") == AUTO_BINS and cfg.env.action.get("type", "discrete") == "discrete":
        resolve_bins(cfg, out_dir)
    env_id, env_cfg = env_config_from_app(cfg)
    # validation: the whole val split at the scenario's rate, or at each training load in turn (val_loads)
    val_rates = None if cfg.train.val_loads == "scenario" else cfg.env.episode.get("rate_scales")
    _, eval_cfg = env_config_from_app(cfg, split="val", window_s=None, start_s=None, rate_scales=val_rates,
                                      step_time_sigma=0.0)
    algo = cfg.agent.name
    check_compatible(algo, env_id, env_cfg)
    cls = algo_class(algo)
    ep = env_cfg.episode
    rate_scale = env_cfg.run["workload"]["rate_scale"]
    if ep.rate_scales is None:
        log.info("training loads: every episode at workload.rate_scale=%g (%s)", rate_scale,
                 describe_workload(env_cfg.run["workload"]))
    else:
        log.info("training loads: env.episode.rate_scales=%s, rate_scales_relative=%s (workload.rate_scale=%g): "
                 "episodes drawn from rate scales %s of %s", ep.rate_scales, str(ep.rate_scales_relative).lower(),
                 rate_scale, [round(r, 6) for r in episode_rate_scales(env_cfg)],
                 describe_workload(env_cfg.run["workload"]))
    if ep.workloads is not None:
        log.info("training workloads: a mixture of %d families (env.episode.workloads), one drawn per episode; "
                 "the rate scales above are relative to each family's own", len(ep.workloads))
    out_dir.mkdir(parents=True, exist_ok=True)
    write_meta(out_dir, algo, env_id, env_cfg)
    atomic_write(out_dir / "config.yaml", lambda f: f.write(OmegaConf.to_yaml(cfg, resolve=True)))

    t = cfg.train
    env = make_envs(env_id, env_cfg, t.n_envs, int(cfg.seed), subproc=t.vec_env == "subproc")
    try:
        found = resume.load_newest(cls, out_dir, env, algo in OFF_POLICY) if cfg.resume else None
        warm = None
        history, evaluations = "", None
        if found is not None:
            log.info("resuming from %s (%d timesteps)", found.path, found.timesteps)
            model = found.model
            history, evaluations = resume.keep_history(out_dir, found.timesteps)
        else:
            if cfg.resume:
                log.warning("resume=true but %s holds no checkpoint: starting from scratch", out_dir / "checkpoints")
            if t.init_agent:
                warm = warm_start.load_warm_start(t.init_agent, algo, env_id, env_cfg, env,
                                                  OmegaConf.to_container(cfg.agent.kwargs, resolve=True))
                log.info("train.init_agent: starting from %s (%d timesteps of its own training)", warm.source,
                         warm.source_timesteps)
                model = warm.model
            else:
                model = _new_model(cls, cfg, env)
        model.set_logger(Logger(str(out_dir), [resume.appending_csv(out_dir / "progress.csv", history),
                                               _tracker_writer(tracker)]))
        remaining = max(t.total_timesteps - model.num_timesteps, 0)
        callbacks = _callbacks(cfg, out_dir, algo, env_id, eval_cfg, evaluations)
        wall_stop = _wall_clock_stop(float(t.max_wall_s)) if t.max_wall_s is not None else None
        if wall_stop is not None:
            callbacks.append(wall_stop)
        wall = time.perf_counter()
        model.learn(total_timesteps=remaining, callback=callbacks, reset_num_timesteps=False, progress_bar=cfg.progress)
        model.save(str(out_dir / "model.zip"))
    finally:
        env.close()
    summary = {"algo": algo, "env_id": env_id, "timesteps": int(model.num_timesteps),
               "wall_s": time.perf_counter() - wall, "workload": describe_workload(env_cfg.run["workload"]),
               "bins": getattr(env_cfg.action, "bins", None) if env_cfg.action.type == "discrete" else None,
               "training_rate_scales": episode_rate_scales(env_cfg),
               "resumed_from": str(found.path) if found else None,
               "init_agent": str(warm.source) if warm else None,
               "init_agent_timesteps": warm.source_timesteps if warm else None,
               "stopped_by_max_wall_s": bool(wall_stop and wall_stop.stopped),
               "unreadable_checkpoints": found.unreadable if found else []}
    evaluations = out_dir / "evaluations.npz"
    if evaluations.is_file():
        data = np.load(evaluations)
        summary["best_val_reward"] = float(data["results"].mean(axis=1).max())
        summary["last_val_reward"] = float(data["results"].mean(axis=1)[-1])
    write_json(out_dir / "summary.json", summary)
    return summary


@hydra.main(config_path="pkg://kvrl.conf", config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> Optional[float]:
    validate_config(cfg)
    validate_train(cfg)
    hydra_cfg = HydraConfig.get()
    out_dir = Path(hydra_cfg.runtime.output_dir)
    if cfg.resume:
        restored = resume.restore_config(cfg, out_dir, list(hydra_cfg.overrides.task))
        if restored is not None:
            log.info("resume=true: continuing %s with its own config.yaml (agent=%s, env=%s)", out_dir,
                     restored.agent.name, restored.env.id)
            cfg = restored
            validate_config(cfg)
            validate_train(cfg)
        done = resume.finished_timesteps(out_dir, int(cfg.train.total_timesteps))
        if done is not None:
            print(f"kvrl-train: {out_dir} is finished ({done} timesteps, train.total_timesteps="
                  f"{cfg.train.total_timesteps}); nothing to resume. Raise train.total_timesteps to continue it.")
            return resume.read_summary(out_dir).get("best_val_reward")
    with tracking.start_run(cfg, out_dir, app="train") as tracker:
        summary = train(cfg, out_dir, tracker)
    print(key_value_table(f"kvrl-train ({summary['algo']} on {summary['env_id']}) -> {out_dir}", summary))
    return summary.get("best_val_reward")


if __name__ == "__main__":
    main()
