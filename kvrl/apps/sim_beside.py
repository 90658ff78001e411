"""The sim's prediction of a live run, recorded beside it, so drift shows in ordinary use.

After a live run, :func:`predict` serves the same requests through a fresh engine on the sim
executor: the same engine limits as resolved live (pool sizes, ``max_model_len``), fresh policies
from the same config, and the step-time profile that matches the live GPU and model shape (the
live executor's own ``cost_model`` names both), preferring one measured on a host of this one's
class (its CPU count: the shipped ``h200x4/`` profiles on a host of four H200s). :func:`compare` gives the sim's relative error
per metric, and :func:`describe` one line for the terminal. ``kvrl-run backend=live`` writes it
to ``sim_prediction.json``; ``kvrl-eval backend=live`` adds ``sim_<metric>`` columns per run.
"""
from __future__ import annotations

import copy
import math
import os
from typing import Any, Optional, Sequence

from omegaconf import DictConfig, OmegaConf

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


def predict(cfg: Any, live_engine, requests: Sequence, live_host: Optional[dict] = None) -> dict:
    """The sim's summary of serving ``requests`` as ``live_engine`` (a finished live run) did,
    plus ``cost_source`` and ``profile_staleness`` of the sim's cost model, and ``host_probe_ratio``:
    the live run's host measurement (``live_host``: :class:`~kvrl.executors.host_speed.HostProbes`'
    ``meter.stats()``) against the profile's (NaN where either is missing). The sim prices host terms as profiled
    (``host_speed`` 1.0): the ratio is recorded, not applied, until a GPU run shows it helps
    (docs/fidelity.md, "Host speed")."""
    from kvrl.builder import build_engine
    from kvrl.executors.sim import SimExecutor

    live = live_engine.executor
    reference = getattr(live, "cost_model", None)      # the live run's shape and device
    scfg = sim_config(cfg, live_engine)
    if reference is not None:
        sim = SimExecutor(reference.model, reference.device, seed=int(scfg.seed), profile="auto",
                          cuda_graphs=bool(scfg.backend.cuda_graphs), step_graphs=bool(scfg.backend.step_graphs),
                          host_cpus=os.cpu_count())
    else:
        sim = None
    engine = build_engine(scfg, executor=sim, record_steps=False)
    summary = engine.run(list(requests))
    summary["cost_source"] = engine.executor.cost_source
    summary["profile_staleness"] = engine.executor.profile_staleness
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
