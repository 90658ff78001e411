"""The sim's prediction of a live run, recorded beside it, so drift shows in ordinary use.

After a live run, :func:`predict` serves the same requests through a fresh engine on the sim
executor: the same engine limits as resolved live (pool sizes, ``max_model_len``), fresh policies
from the same config, and a step-time profile that matches the live GPU and model shape (the
live executor's own ``cost_model`` names both). Which profile: with the live run's executed steps
(:class:`StepLog`), the matching one (shipped, host-class or on ``$KVRL_PROFILE_PATH``) that prices
those very steps closest to their live time in total (:func:`select_profile`: lent hosts of one
class differ by several percent, docs/fidelity.md "Runs 44-45"); without them, ``profile=auto``
preferring a profile of this host's CPU count. :func:`compare` gives the sim's relative error per
metric, and :func:`describe` one line for the terminal. ``kvrl-run backend=live`` writes it to
``sim_prediction.json``; ``kvrl-eval backend=live`` adds ``sim_<metric>`` columns per run.
"""
from __future__ import annotations

import copy
import math
import os
from typing import Any, Optional, Sequence

from omegaconf import DictConfig, OmegaConf

from kvrl.engine.callbacks import EngineCallback
from kvrl.fidelity.compare import speed_scale

#: metrics compared (docs/design.md section 5)
METRICS = ("throughput_tok_s", "goodput_tok_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "preemptions")


def sim_config(cfg: Any, engine) -> DictConfig:
    """``cfg`` with the sim backend and the live engine's resolved pool sizes and length limit."""
    sim = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True)) if isinstance(cfg, DictConfig) \
        else OmegaConf.create(copy.deepcopy(dict(cfg)))
    live = engine.executor
    sim.backend = {"name": "sim", "profile": "auto", "cuda_graphs": bool(getattr(live, "use_cuda_graphs", True)),
                   "step_graphs": bool(getattr(live, "use_step_graphs", False))}
    sim.engine.num_blocks = engine.config.num_blocks
    sim.engine.num_cpu_blocks = engine.config.num_cpu_blocks
    sim.engine.max_model_len = engine.config.max_model_len
    return sim


class StepLog(EngineCallback):
    """Engine callback on a live run: keeps every executed batch and its live ``elapsed_s`` (the
    executor's seconds, the engine's gap before the step included), for :func:`select_profile`.
    Between live steps it costs two list appends."""

    def __init__(self) -> None:
        self.batches: list = []
        self.elapsed: list[float] = []

    def on_step(self, event) -> bool:
        self.batches.append(event.batch)
        self.elapsed.append(event.output.elapsed_s)
        return True


def replay_error(sim, steps: StepLog, engine_config) -> float:
    """The total relative error of ``sim`` (a :class:`~kvrl.executors.sim.SimExecutor`) pricing the
    live run's executed batches in order, ``sum(sim) / sum(live) - 1`` (NaN without live time); its
    clock and swap stream restart on a pool of ``engine_config``'s sizes."""
    live_s = float(sum(steps.elapsed))
    if not live_s > 0:
        return float("nan")
    sim.allocate_kv(engine_config.num_blocks, engine_config.num_cpu_blocks, engine_config.block_size)
    return sum(sim.execute(batch).elapsed_s for batch in steps.batches) / live_s - 1.0


def select_profile(reference, steps: StepLog, engine_config, cuda_graphs: bool, step_graphs: bool):
    """Of every profile matching the live run's shape and device
    (:func:`~kvrl.executors.profile.matching_profiles`), the one whose sim prices the run's own
    executed steps (``steps``) closest to their live time in total, and each candidate's error by
    path (:func:`replay_error`). ``(None, {})`` where no profile matches or no step was served."""
    from kvrl.executors.profile import matching_profiles
    from kvrl.executors.sim import SimExecutor

    if not steps.batches:
        return None, {}
    errors, best, best_err = {}, None, float("inf")
    for prof in matching_profiles(reference.model, reference.device, step_graphs):
        sim = SimExecutor(reference.model, reference.device, profile=prof, cuda_graphs=cuda_graphs,
                          step_graphs=step_graphs)
        err = errors[prof.path or "<in memory>"] = replay_error(sim, steps, engine_config)
        if abs(err) < best_err:
            best, best_err = prof, abs(err)
    return best, errors


def predict(cfg: Any, live_engine, requests: Sequence, live_host: Optional[dict] = None,
            steps: Optional[StepLog] = None, profile=None, earlier_replay_errors: Sequence[float] = ()) -> dict:
    """The sim's summary of serving ``requests`` as ``live_engine`` (a finished live run) did,
    plus ``cost_source`` and ``profile_staleness`` of the sim's cost model, ``profile_choice`` (how it
    was chosen: ``"given"``, ``"replay"`` with ``profile_replay_errors``, every candidate's
    :func:`replay_error` on this run, or ``"auto"``), ``replay_error``: the chosen cost model's
    :func:`replay_error` on this run's own steps (NaN without ``steps``: a host that much faster or
    slower than the profile's, what ``backend.step_time_scale = 1 / (1 + replay_error)`` corrects; docs/rl.md,
    "Live again, on another VM"), and ``host_probe_ratio``: the live run's host
    measurement (``live_host``: :class:`~kvrl.executors.host_speed.HostProbes`' ``meter.stats()``)
    against the profile's (NaN where either is missing). The profile: ``profile`` where given (a
    :class:`~kvrl.executors.profile.StepProfile`, a profile path, or ``"roofline"``; kvrl-eval keeps
    its first run's choice, so every run of a process is priced alike), else :func:`select_profile` on ``steps`` (the live run's
    :class:`StepLog`), else ``profile=auto`` for this host's CPU count. The sim prices host terms as
    profiled (``host_speed`` 1.0): the ratio is recorded, not applied, until a GPU run shows it helps
    (docs/fidelity.md, "Host speed"). ``at_host_speed``: the same run in the sim at this run's own host speed
    (``step_time_scale = 1 / (1 + replay_error)``, kept as ``host_speed_scale``), its :data:`METRICS`; NaN without
    a replay error. A calibration after the fact, not a prediction: its error is the cost model's shape alone
    (docs/rl.md, "A third VM, and a control"). ``calibrated``: a prediction, the same run in the sim at the host
    speed measured on earlier live runs of the same host (``earlier_replay_errors``, e.g. this process's earlier
    jobs: ``step_time_scale = 1 / (1 + their mean)``, kept as ``calibration_scale``), its :data:`METRICS`; NaN without
    a finite earlier replay error (docs/fidelity.md, "The sim calibrated on earlier runs")."""
    from kvrl.builder import build_engine
    from kvrl.executors.sim import SimExecutor

    live = live_engine.executor
    reference = getattr(live, "cost_model", None)      # the live run's shape and device
    scfg = sim_config(cfg, live_engine)
    graphs, step_graphs = bool(scfg.backend.cuda_graphs), bool(scfg.backend.step_graphs)
    choice, errors = ("given" if profile is not None else "auto"), {}
    if reference is not None and profile is None and steps is not None:
        profile, errors = select_profile(reference, steps, live_engine.config, graphs, step_graphs)
        choice = "replay" if profile is not None else "auto"
    make_sim = lambda scale=1.0: SimExecutor(reference.model, reference.device, seed=int(scfg.seed),
                                             profile=profile if profile is not None else "auto", cuda_graphs=graphs,
                                             step_graphs=step_graphs, host_cpus=os.cpu_count(), step_time_scale=scale)
    sim = make_sim() if reference is not None else None
    engine = build_engine(scfg, executor=sim, record_steps=False)
    summary = engine.run(list(requests))
    replay = float("nan")
    if choice == "replay":
        replay = errors.get(profile.path or "<in memory>", float("nan"))
    elif sim is not None and steps is not None and steps.batches:
        replay = replay_error(sim, steps, live_engine.config)     # after the run: it restarts the sim's clock
    summary["replay_error"] = replay
    summary["host_speed_scale"] = speed_scale([replay])
    summary["calibration_scale"] = speed_scale(earlier_replay_errors)

    def at_scale(scale: float) -> dict:
        out = dict.fromkeys(METRICS, math.nan)
        if reference is not None and math.isfinite(scale):
            out.update({k: v for k, v in build_engine(scfg, executor=make_sim(scale), record_steps=False)
                        .run(list(requests)).items() if k in METRICS})
        return out
    summary["at_host_speed"] = at_scale(summary["host_speed_scale"])
    summary["calibrated"] = at_scale(summary["calibration_scale"])
    summary["cost_source"] = engine.executor.cost_source
    summary["profile_staleness"] = engine.executor.profile_staleness
    summary["profile_choice"] = choice
    summary["profile_replay_errors"] = errors
    summary["host_probe_ratio"] = probe_ratio(live_host, engine.executor.profile)
    return summary


def probe_ratio(live: Optional[dict], profile) -> float:
    """:func:`~kvrl.executors.host_speed.host_speed_factor` of the live run's host measurement
    ``live`` (:func:`~kvrl.executors.host_speed.probe_stats`) and the profile's (NaN without either)."""
    from kvrl.executors.host_speed import host_speed_factor

    return host_speed_factor(live, profile.meta.get("host_probe") if profile is not None else None)


def compare(live: dict, sim: dict, metrics: Sequence[str] = METRICS) -> dict[str, float]:
    """Relative error of the sim per metric, ``(sim - live) / |live|`` (nan when undefined)."""
    out = {}
    for key in metrics:
        a, b = live.get(key), sim.get(key)
        if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)):
            out[key] = float("nan")
        elif a == 0:
            out[key] = 0.0 if b == 0 else float("inf")
        else:
            out[key] = (b - a) / abs(a)
    return out


def describe(errors: dict[str, float]) -> str:
    """One line: ``sim vs live: throughput +2.1%, goodput -0.4%, ...``."""
    parts = [f"{k.removesuffix('_tok_s').removesuffix('_s')} {v:+.1%}" for k, v in errors.items() if math.isfinite(v)]
    return "sim vs live: " + ", ".join(parts)
