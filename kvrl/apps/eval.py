"""``kvrl-eval``: saved agents against heuristic baselines on the ``test`` split (``conf/eval.yaml``).

For the task's plugin kind (``env=watermark``: watermark; ``env=preemption``: eviction) it runs,
for every seed, each baseline of ``baselines.<kind>``, the fixed watermark of ``sweep`` that has
the best mean goodput on the ``val`` split (watermark task), and each agent of ``agents`` (run
through the ``agent`` plugin with ``policy_path``, exactly as ``kvrl-run`` would). Every run
serves the whole split with ``Engine.run``; with ``resample`` each seed serves a seeded random
share of the split's requests at the same request rate (``subsample = resample``, ``rate_scale``
divided by it), which is what makes the confidence intervals.

Baselines tuned on ``val`` (:mod:`kvrl.apps.baselines`): each baseline named in ``tune.<kind>``
runs every point of its grid on ``val`` (seeds ``tune_seeds``), and its val-best point runs on
test as ``name(params) [val-tuned]``. With ``tune_loads=training`` the val sweep and the tuning
runs serve the val split once at each of the task's training loads (``env.episode.rate_scales``)
and rank by the mean over loads and seeds, as an agent trained with ``train.val_loads=training``
was selected; their rows in ``results.csv`` carry the load as ``val_rate_scale``. With ``oracle`` (watermark task), the ``sweep`` also runs
on test and its best mean is a reference line (kind ``oracle``: hindsight, not a competitor).
Besides the first baseline and the val-picked watermark, every row gets a paired difference to
the strongest competitor (the heuristic, val-best or val-tuned policy with the best mean test
goodput) and to the oracle. Live, a seed's policies run one after another on one host whose speed drifts
between jobs: ``job_order=auto`` (the default) rotates their order by seed; ``seed_position`` records it.

Writes into the Hydra run directory (``runs/eval/<date>/<time>``): ``leaderboard.csv`` and
``leaderboard.md`` (mean and 95% CI per policy), ``results.csv`` (every run, val sweep
included; while the test runs go one by one, as on the live backend, ``results.partial.csv``
holds the runs finished so far, so a run stopped by a time limit keeps them), ``goodput.png``
(bars with CIs), ``traces.png`` (watermark and KV usage over time, first seed), ``config.yaml``;
with ``step_traces=all``, ``step_traces.npz``: every test job's per-step record (:func:`~kvrl.apps.eval_files.write_step_traces`;
a policy's behaviour step by step, live or sim, e.g. one against the other); prints the leaderboard.
``logger=wandb`` also logs the table and the plots.
"""
from __future__ import annotations

import copy
import json
import logging
import os
import queue
import shlex
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import hydra
import numpy as np
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from kvrl.apps import sim_beside, tracking
from kvrl.executors.host_speed import HostProbes
from kvrl.apps.cost_note import sim_cost_note
from kvrl.apps.eval_files import write_results, write_step_traces
from kvrl.apps.job_order import JOB_ORDERS, job_order
from kvrl.apps.baselines import (VAL_TUNED, best_of, label_of, mean_goodput, oracle_on_test, strongest_competitor,
                                 tune_on_val)
from kvrl.apps.leaderboard import (build_rows, dedupe_policies, markdown, plot_bars, plot_traces, text_table,
                                   write_csv)
from kvrl.apps.outputs import atomic_write
from kvrl.apps.rl_schema import register_rl_schemas
from kvrl.apps.scenario import agent_differences, describe_differences, newest_agent
from kvrl.apps.schema import validate_config
from kvrl.envs.agent_io import JOINT_SLOTS, ROLES, model_path, read_meta
from kvrl.envs.config import describe_workload, env_config_from_app, episode_rate_scales

log = logging.getLogger("kvrl.eval")
JOURNAL = "results.partial.csv"    # the test runs finished so far (live: after each job); gone once results.csv is written

register_rl_schemas()


@dataclass(frozen=True)
class Policy:
    """A leaderboard entry: ``label``, ``kind`` (heuristic | val-best | agent) and the plugin
    config (``name`` + parameters) put in the task's plugin slot."""

    label: str
    kind: str
    plugin: dict


@dataclass(frozen=True)
class Job:
    """One engine run: a policy on a split with a seed; ``trace`` keeps the per-step record the
    plots show, ``steps`` the whole record (every :data:`~kvrl.engine.metrics.STEP_COLUMNS` column);
    ``position``: its place among its seed's test jobs in the order they run (0 first; :func:`job_order`);
    ``rate_scale``: the workload's absolute rate scale for this job (before ``resample``; None: the
    run's), so that one :func:`run_jobs` call serves several loads (:func:`at_loads`)."""

    policy: Policy
    split: str
    seed: int
    trace: bool = False
    steps: bool = False
    position: Optional[int] = None
    rate_scale: Optional[float] = None


def job_config(run: dict, role: str, job: Job, resample: Optional[float]) -> dict:
    """The run config of ``job``: the scenario with the policy in the ``role`` slot, the job's
    split, seed and rate scale, and the seeded resample."""
    cfg = copy.deepcopy(run)
    if role == "joint":             # kvrl/WatermarkMode-v0: a plugin per slot
        cfg.update({slot: dict(job.policy.plugin[slot]) for slot in JOINT_SLOTS})
    else:
        cfg[role] = dict(job.policy.plugin)
    cfg["seed"] = job.seed
    if job.rate_scale is not None:
        cfg["workload"]["rate_scale"] = job.rate_scale
    cfg["workload"] = job_workload(cfg["workload"], job.split, job.seed, resample)
    return cfg


def job_workload(workload: dict, split: str, seed: int, resample: Optional[float]) -> dict:
    """``workload`` (a plain dict, not changed) on ``split`` with ``seed``, and with ``resample``
    the seeded share of its requests over the same share of the time: the same request rate."""
    wl = {**workload, "split": split, "seed": seed}
    if resample is not None:
        wl.update(subsample=resample, rate_scale=wl["rate_scale"] / resample)
    return wl


_LIVE: dict[str, Any] = {}      # this process's live executor: key, executor, pool's num_blocks, sim profile, replay errors


def live_executor(cfg: dict, warmup_requests: int):
    """The live executor of ``cfg`` (backend + model), built once per process and reused by
    every job (the engine reuses its KV pool and captured CUDA graphs when the pool's shape is
    unchanged); at its first use it is warmed up with ``warmup_requests`` synthetic requests
    (:func:`kvrl.builder.warm_up`) so that graph capture and kernel compilation are not charged
    to the first measured run."""
    from kvrl.builder import build_executor, warm_up

    key = json.dumps([cfg["backend"], cfg["model"], cfg["engine"]], sort_keys=True, default=str)
    if _LIVE.get("key") == key:
        return _LIVE["executor"]
    _LIVE.clear()
    executor = build_executor(OmegaConf.create(cfg))
    num_blocks = None
    if warmup_requests > 0:
        num_blocks = warm_up(executor, cfg["engine"], warmup_requests, seed=12345).num_blocks
    _LIVE.update(key=key, executor=executor, num_blocks=num_blocks)
    return executor


def run_job(run: dict, role: str, job: Job, resample: Optional[float], live_warmup: int = 0) -> dict:
    """Serve the job's workload; its §5 metrics (and, with ``job.trace``, the per-step trace).
    On the live backend, every job of a process shares one executor (:func:`live_executor`)."""
    from kvrl.builder import build_engine
    from kvrl.engine.metrics import STEP_COLUMNS
    from kvrl.envs.session import cached_workload

    cfg = job_config(run, role, job, resample)
    executor = live_executor(cfg, live_warmup) if cfg["backend"]["name"] == "live" else None
    if executor is not None and not cfg["engine"].get("num_blocks") and _LIVE.get("num_blocks"):
        # engine.num_blocks=0 sizes the pool from free memory, which the warm-up's captured graphs
        # have reduced: every job keeps the first pool's size, so its pool and graphs are reused
        cfg["engine"]["num_blocks"] = _LIVE["num_blocks"]
    engine = build_engine(OmegaConf.create(cfg), executor=executor, record_steps=job.trace or job.steps)
    if executor is not None and not _LIVE.get("num_blocks"):
        _LIVE["num_blocks"] = engine.config.num_blocks
    requests = cached_workload(cfg["workload"], engine.executor.vocab_size, engine.config.max_model_len)
    live = cfg["backend"]["name"] == "live"
    probes = HostProbes() if live else None   # the live host's speed (#16)
    # the first live job's steps choose the sim's profile, kept for every later job of the process, and
    # each job's steps give its replay error, the host's speed against that profile's (#16)
    step_log = sim_beside.StepLog() if live else None
    metrics = engine.run(requests, callbacks=[c for c in (probes, step_log) if c is not None])
    out = {"policy": job.policy.label, "kind": job.policy.kind, "split": job.split, "seed": job.seed,
           "seed_position": job.position, "backend": cfg["backend"]["name"],
           "workload": describe_workload(cfg["workload"]), **metrics}
    if live:      # the sim's prediction of the same run, beside it (#16)
        earlier = _LIVE.setdefault("replay_errors", [])     # this process's earlier jobs: the calibrated sim
        predicted = sim_beside.predict(cfg, engine, requests, probes.meter.stats(), steps=step_log,
                                       profile=_LIVE.get("sim_profile"), earlier_replay_errors=tuple(earlier))
        _LIVE.setdefault("sim_profile", predicted["cost_source"].removeprefix("profile:"))   # "roofline": none
        earlier.append(predicted["replay_error"])
        out.update({f"sim_{k}": predicted[k] for k in sim_beside.METRICS}, sim_cost_source=predicted["cost_source"],
                   host_probe_ratio=predicted["host_probe_ratio"], sim_replay_error=predicted["replay_error"])
        for prefix, key in (("sim_host_", "at_host_speed"), ("sim_cal_", "calibrated")):   # own / earlier host speed
            out.update({prefix + k: v for k, v in predicted[key].items()})
    if job.trace and engine.metrics.steps:
        steps = np.asarray(engine.metrics.steps, dtype=np.float64)
        col = {name: i for i, name in enumerate(STEP_COLUMNS)}
        out["trace"] = {"time_s": steps[:, col["time_s"]], "kv_occupancy": steps[:, col["kv_occupancy"]],
                        "watermark": steps[:, col["reserved_blocks"]] / engine.config.num_blocks,
                        "preemptions": steps[:, col["preemptions"]]}
    if job.steps:
        out["steps"] = np.asarray(engine.metrics.steps, dtype=np.float64).reshape(-1, len(STEP_COLUMNS))
    return out


_DONE: Any = None         # in a worker process: the queue that reports each finished job


def _init_worker(done: Any = None) -> None:
    global _DONE
    os.environ["OMP_NUM_THREADS"] = "1"        # before torch is imported by an agent plugin
    os.environ["MKL_NUM_THREADS"] = "1"
    _DONE = done


def _run_chunk(run: dict, role: str, jobs: Sequence[tuple[int, Job]], resample: Optional[float],
               live_warmup: int) -> list[dict]:
    """A worker's share: the jobs one after another, each reported on ``_DONE`` as
    ``(index, goodput, wall seconds)`` when it finishes."""
    out = []
    for index, job in jobs:
        wall = time.perf_counter()
        out.append(run_job(run, role, job, resample, live_warmup))
        _DONE.put((index, out[-1]["goodput_tok_s"], time.perf_counter() - wall))
    return out


class JobProgress:
    """Reports each finished job as it completes: a log line (``[done/total] policy on split, seed:
    goodput, wall time``) and, on a terminal, a tqdm bar of jobs done / total."""

    def __init__(self, jobs: Sequence[Job]) -> None:
        from tqdm.auto import tqdm

        self.jobs = jobs
        self.done = 0
        self.bar = tqdm(total=len(jobs), unit="job", desc="jobs", disable=None, leave=False)

    def report(self, index: int, goodput: float, wall_s: float) -> None:
        from tqdm.contrib.logging import logging_redirect_tqdm

        self.done += 1
        job = self.jobs[index]
        with logging_redirect_tqdm():
            log.info("[%d/%d] %s on %s, seed %d: goodput %.1f tok/s (%.1f s)", self.done, len(self.jobs),
                     job.policy.label, job.split, job.seed, goodput, wall_s)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


def run_jobs(run: dict, role: str, jobs: Sequence[Job], resample: Optional[float], workers: int,
             chunk: int = 1, live_warmup: int = 0,
             on_result: Optional[Callable[[list[dict]], None]] = None) -> list[dict]:
    """Every job's result, in the order of ``jobs``; each job is reported as it finishes
    (:class:`JobProgress`). ``workers`` > 1 spreads them over fresh (spawned) processes in chunks
    of ``chunk`` consecutive jobs (jobs of one split and seed share their workload in a chunk).
    The live backend runs every job in this process, one after another (one accelerator); there
    ``on_result`` is called with the results so far after each job (kvrl-eval's journal, so a live
    stage stopped by a time limit keeps what it served)."""
    if run["backend"]["name"] == "live":
        workers = 1
    progress = JobProgress(jobs)
    try:
        if workers <= 1 or len(jobs) <= 1:
            results = []
            for index, job in enumerate(jobs):
                wall = time.perf_counter()
                results.append(run_job(run, role, job, resample, live_warmup))
                progress.report(index, results[-1]["goodput_tok_s"], time.perf_counter() - wall)
                if on_result is not None:
                    on_result(results)
            return results
        context = get_context("spawn")
        done = context.Queue()
        indexed = list(enumerate(jobs))
        with ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=_init_worker,
                                 initargs=(done,)) as pool:
            futures = [pool.submit(_run_chunk, run, role, indexed[i:i + chunk], resample, live_warmup)
                       for i in range(0, len(jobs), max(chunk, 1))]
            while progress.done < len(jobs):
                try:
                    progress.report(*done.get(timeout=0.5))
                except queue.Empty:
                    failed = next((f for f in futures if f.done() and f.exception() is not None), None)
                    if failed is not None:
                        raise failed.exception()
            return [r for f in futures for r in f.result()]
    finally:
        progress.close()


def find_agents(specs: Sequence[str], env_id: str, train_dir: Path, run: dict) -> list[Path]:
    """Model zips for ``specs`` (paths, or ``latest``: the newest run under ``train_dir`` trained
    on ``env_id`` in the scenario ``run``, :func:`kvrl.apps.scenario.newest_agent`). A missing
    path raises naming it."""
    return [newest_agent(env_id, run, train_dir, ROLES[env_id]) if spec == "latest" else model_path(spec)
            for spec in specs]


def agent_plugin(role: str, path: Path, run: dict) -> dict:
    """The plugin config that runs the saved agent at ``path`` in the ``role`` slot; for the joint
    task, its ``joint_agent`` watermark beside the scenario's ``follow_mode`` eviction plugin (which
    applies the modes the agent decides)."""
    if role == "joint":
        return {"watermark": {"name": "joint_agent", "policy_path": str(path)}, "eviction": dict(run["eviction"])}
    return {"name": "agent", "policy_path": str(path)}


def agent_policies(paths: Sequence[Path], env_id: str, run: dict) -> tuple[list[Policy], list[str]]:
    """A policy per agent, and notes on agents trained on another scenario than ``run``."""
    role = ROLES[env_id]
    policies, notes = [], []
    for path in paths:
        meta = read_meta(path)
        if ROLES[meta["env_id"]] != role:
            raise ValueError(f"{path} is a {ROLES[meta['env_id']]} agent ({meta['env_id']}); this evaluation "
                             f"(env={role}) needs a {role} agent")
        label = f"agent {meta['algo']} ({path.parent.parent.name}/{path.parent.name}/{path.name})"
        diff = agent_differences(meta, run, role)
        if diff:
            notes.append(f"{label} was trained on another scenario (differs in: {describe_differences(diff)})")
            log.warning(notes[-1])
        trained_on = meta["env"]["run"].get("backend", {}).get("name")
        if trained_on != run["backend"]["name"]:     # the executor, not the scenario: said, not flagged
            notes.append(f"{label} was trained on the {trained_on} backend and runs here on the "
                         f"{run['backend']['name']} backend")
        policies.append(Policy(label, "agent", agent_plugin(role, path, run)))
    return policies, notes


def sim_backend() -> dict:
    """The sim backend's config (``conf/backend/sim.yaml``)."""
    from kvrl import conf
    return OmegaConf.to_container(OmegaConf.load(Path(conf.__file__).parent / "backend" / "sim.yaml"))


def sweep_plugins(role: str, sweep: Sequence[float]) -> list[dict]:
    """The constants of ``sweep``: fixed watermarks, or for the joint task (watermark, mode) pairs
    (fixed watermark, LIFO victim with that mode)."""
    fixed = [{"name": "fixed", "fraction": float(f)} for f in sweep]
    if role != "joint":
        return fixed
    return [{"watermark": w, "eviction": {"name": "lifo", "mode": mode}} for w in fixed for mode in ("recompute", "swap")]


def at_loads(run: dict, role: str, jobs: Sequence[Job], loads: Optional[Sequence[float]],
             resample: Optional[float], workers: int, chunk: int) -> list[dict]:
    """:func:`run_jobs` of ``jobs`` with ``loads`` None; else of ``jobs`` at each absolute rate scale
    of ``loads`` in turn (:attr:`Job.rate_scale`), all in one call (one worker pool), every result
    tagged with its ``val_rate_scale``. A chunk stays within one load when ``chunk`` divides ``len(jobs)``."""
    if loads is None:
        return run_jobs(run, role, jobs, resample, workers, chunk=chunk)
    at = [replace(job, rate_scale=float(scale)) for scale in loads for job in jobs]
    results = run_jobs(run, role, at, resample, workers, chunk=chunk)
    return [{**r, "val_rate_scale": job.rate_scale} for job, r in zip(at, results)]


def pick_on_val(run: dict, sweep: Sequence[float], seeds: Sequence[int], resample: Optional[float],
                workers: int, val_pick: str = "same", role: str = "watermark",
                loads: Optional[Sequence[float]] = None) -> tuple[Policy, list[dict]]:
    """The constant of ``sweep`` (:func:`sweep_plugins`) with the best mean goodput on ``val``, and the sweep's runs.
    ``val_pick=sim`` runs the sweep on the sim backend (same model, device and scenario; its
    step-time profile when one matches) whatever the evaluation's backend, so that a live
    evaluation spends no accelerator time on it. ``loads`` (absolute rate scales): the sweep
    serves val at each and the mean is over loads and seeds (:func:`at_loads`)."""
    if val_pick not in ("same", "sim"):
        raise ValueError(f"val_pick={val_pick!r}: expected same or sim")
    tag = "val-best"
    if val_pick == "sim" and run["backend"]["name"] != "sim":
        run = {**run, "backend": sim_backend()}
        tag = "val-best in sim"
    plugins = sweep_plugins(role, sweep)
    jobs = [Job(Policy(label_of(p), "sweep", p), "val", seed) for seed in seeds for p in plugins]
    results = at_loads(run, role, jobs, loads, resample, workers, chunk=len(plugins))
    best = best_of(plugins, results)                             # the first of equals
    log.info("val sweep (%s backend): %s -> %s", run["backend"]["name"],
             ", ".join(f"{k} {v:.2f}" for k, v in mean_goodput(results).items()), label_of(best))
    return Policy(f"{label_of(best)} [{tag}]", "val-best", best), results


def evaluate(cfg: DictConfig, out_dir: Path, tracker) -> list:
    """Run the evaluation ``cfg`` describes into ``out_dir``; returns the leaderboard rows."""
    if cfg.step_traces not in ("first", "all"):
        raise ValueError(f"step_traces={cfg.step_traces!r}: expected first (the first seed's, for the plots) or all")
    if cfg.job_order not in JOB_ORDERS:
        raise ValueError(f"job_order={cfg.job_order!r}: expected one of {', '.join(JOB_ORDERS)}")
    env_id, env_cfg = env_config_from_app(cfg, split="test")
    role = ROLES[env_id]
    run = env_cfg.run
    seeds = list(cfg.seeds)
    resample = cfg.resample
    baselines = OmegaConf.to_container(cfg.baselines, resolve=True).get(role, [])
    policies = [Policy(label_of(p), "heuristic", p) for p in baselines]
    agent_paths = find_agents(list(cfg.agents), env_id, Path(cfg.train_dir), run)
    agents, notes = agent_policies(agent_paths, env_id, run)
    results: list[dict] = []
    if cfg.tune_loads not in ("scenario", "training"):
        raise ValueError(f"tune_loads={cfg.tune_loads!r}: expected scenario or training")
    loads = episode_rate_scales(env_cfg) if cfg.tune_loads == "training" else None
    if cfg.tune_loads == "training" and loads is None:
        raise ValueError("tune_loads=training: the task has no training loads (env.episode.rate_scales is null)")
    if role == "watermark" and cfg.fixed_best is not None:
        best = {"name": "fixed", "fraction": float(cfg.fixed_best)}
        policies.append(Policy(f"{label_of(best)} [val-best, given]", "val-best", best))
    elif role in ("watermark", "joint") and cfg.sweep:
        best, sweep_results = pick_on_val(run, list(cfg.sweep), seeds, resample, cfg.workers, cfg.val_pick, role,
                                           loads)
        results += sweep_results
        policies.append(best)

    def runner(entries, split, kind, seed_list=seeds, on=run, scales=None):   # (label, plugin) pairs, per seed (and load)
        jobs = [Job(Policy(label, kind, plugin), split, seed) for seed in seed_list for label, plugin in entries]
        return at_loads(on, role, jobs, scales, resample, cfg.workers, chunk=len(entries))
    tune_seeds = list(cfg.tune_seeds) if cfg.tune_seeds is not None else seeds
    tune_run, tag = run, VAL_TUNED
    if cfg.val_pick == "sim" and run["backend"]["name"] != "sim":     # as the val sweep: no accelerator time
        tune_run, tag = {**run, "backend": sim_backend()}, f"{VAL_TUNED} in sim"
    grids = OmegaConf.to_container(cfg.tune, resolve=True) if cfg.tune is not None else {}    # null: no tuning
    tuned, tune_results = tune_on_val(role, baselines, (grids or {}).get(role),
                                      lambda entries, split, kind: runner(entries, split, kind, tune_seeds,
                                                                          tune_run, loads),
                                      tag)
    results += tune_results
    policies += [Policy(label, VAL_TUNED, plugin) for label, plugin in tuned]
    policies = dedupe_policies(policies + agents, role)     # one row per distinct plugin config
    jobs = [Job(p, "test", seed, trace=cfg.plots and seed == seeds[0], steps=cfg.step_traces == "all", position=k)
            for i, seed in enumerate(seeds) for k, p in enumerate(job_order(policies, i, cfg.job_order, run["backend"]["name"]))]
    journal = out_dir / JOURNAL
    out_dir.mkdir(parents=True, exist_ok=True)
    test_results = run_jobs(run, role, jobs, resample, cfg.workers, chunk=len(policies), live_warmup=cfg.live_warmup,
                            on_result=lambda done: write_results(results + done, journal))
    results += test_results
    oracle = None
    if role in ("watermark", "joint") and cfg.oracle and cfg.sweep:     # a reference line, not a competitor
        oracle, oracle_runs, sweep_test = oracle_on_test(list(cfg.sweep), runner, sweep_plugins(role, cfg.sweep))
        results += sweep_test
        test_results += oracle_runs
    competitor = strongest_competitor(test_results)
    if competitor:
        notes.append(f"Strongest competitor (best mean test goodput of the heuristics, val-best and val-tuned "
                     f"policies; the agents' paired Δ reference): {competitor}")
    write_results(results, out_dir / "results.csv")
    if cfg.step_traces == "all":
        write_step_traces(test_results, out_dir / "step_traces.npz")
    journal.unlink(missing_ok=True)
    references = [policies[0].label] if baselines else []
    references += [p.label for p in policies if p.kind == "val-best"]
    references += [r for r in (competitor, oracle) if r and r not in references]
    rows = build_rows(test_results, references)
    write_csv(rows, out_dir / "leaderboard.csv")
    command = "kvrl-eval " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    notes = [f"Command: `{command}`",
             f"Task {env_id} on split=test; {len(seeds)} seeds {seeds}; resample={resample}; "
             f"backend={run['backend']['name']}, model={run['model']['name']}, device={run['device']['name']}, "
             f"engine.num_blocks={run['engine']['num_blocks']}, workload={describe_workload(run['workload'])} "
             f"rate_scale={run['workload']['rate_scale']}, slo={run['slo']}",
             *([sim_cost_note(run)] if run["backend"]["name"] == "sim" else []),
             *([f"Val sweep and tuning at the training loads (tune_loads=training): the val split at rate scales "
                f"{[round(x, 6) for x in loads]}, goodput averaged over loads and seeds"] if loads else []),
             "Cells: mean ± 95% CI half-width (Student t) over seeds; Δ columns: paired per-seed goodput "
             "difference to the reference policy (same requests), mean ± 95% CI.", *notes]
    atomic_write(out_dir / "leaderboard.md", lambda f: f.write(markdown(rows, f"Leaderboard: {env_id}", notes)))
    atomic_write(out_dir / "config.yaml", lambda f: f.write(OmegaConf.to_yaml(cfg, resolve=True)))
    images = {}
    if cfg.plots:
        plot_bars(rows, out_dir / "goodput.png", caption=notes[1])
        traces = {r["policy"]: r["trace"] for r in test_results if "trace" in r}
        shown = {p: t for p, t in traces.items()
                 if role == "eviction" or p.startswith(("fixed(fraction=0.01)", "agent")) or "[val-best]" in p}
        plot_traces(shown, out_dir / "traces.png", caption=notes[1])
        images = {"goodput": out_dir / "goodput.png", "traces": out_dir / "traces.png"}
    best = rows[0]
    tracker.log({"best_goodput_tok_s": best.stats["goodput_tok_s"][0]}, images=images)
    if cfg.logger.name == "wandb":
        _log_wandb_table(tracker, rows)
    print(text_table(rows, f"kvrl-eval: {env_id} on split=test ({len(seeds)} seeds)",
                     files=[out_dir / "leaderboard.md", out_dir / "leaderboard.csv"]))
    return rows


def _log_wandb_table(tracker, rows) -> None:
    import wandb

    from kvrl.apps.leaderboard import METRICS

    columns = ["policy", "kind", "runs"] + [f"{m}_{s}" for m in METRICS for s in ("mean", "ci95")]
    columns += [f"delta_goodput_vs_{ref}_{s}" for ref in rows[0].deltas for s in ("mean", "ci95")]
    data = [[r.policy, r.kind, r.runs] + [v for m in METRICS for v in r.stats[m]]
            + [v for d in r.deltas.values() for v in d] for r in rows]
    tracker.run.log({"leaderboard": wandb.Table(columns=columns, data=data)})


@hydra.main(config_path="pkg://kvrl.conf", config_name="eval", version_base="1.3")
def main(cfg: DictConfig) -> float:
    validate_config(cfg)
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    with tracking.start_run(cfg, out_dir, app="eval") as tracker:
        rows = evaluate(cfg, out_dir, tracker)
    return rows[0].stats["goodput_tok_s"][0]


if __name__ == "__main__":
    main()
