"""One (workload, policy) pair served live and in the sim on the same engine configuration, and the
configuration it runs with (the shared pool, each workload's engine, its requests); the warm-up
is :func:`kvrl.builder.warm_up`.
"""
from __future__ import annotations

import csv
import logging
import math
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np

from kvrl.fidelity.compare import mean_summary, speed_scale, summarize
from kvrl.fidelity.replay import GcPauses, StepRecorder, replay_summary
from kvrl.fidelity.report import plot_pair


log = logging.getLogger("kvrl.fidelity")


def pair_engine(ecfg: dict, executor, pcfg: dict, slo: dict, record_steps: bool = True):
    """The engine of one (workload, policy) pair: engine config ``ecfg``, the plugin kinds of
    ``pcfg`` (every kind needed; ``tier`` absent or null: the default tier policy), ``slo``."""
    from kvrl import plugins
    from kvrl.builder import build_engine

    kinds = {kind: dict(pcfg[kind]) for kind in (*plugins.KINDS, "tier") if pcfg.get(kind) is not None}
    return build_engine({"engine": ecfg, **kinds, "slo": slo}, executor=executor, record_steps=record_steps)


def serve_live(engine, requests, recorder: StepRecorder, max_wall_s: Optional[float]) -> Optional[str]:
    """Serve ``requests`` on ``engine`` (a :class:`~kvrl.engine.loop.ServingLoop` run with
    ``recorder`` registered), stopping between steps once ``max_wall_s`` wall seconds have passed
    (None or 0: no limit); returns the error that says so, or None."""
    from kvrl.engine.loop import ServingLoop

    loop = ServingLoop(engine, requests, max_wall_s=max_wall_s or None)
    loop.run([recorder])
    return f"live run exceeded max_live_wall_s={max_wall_s}" if loop.stop_reason == "max_wall_s" else None


def pair_host_speed(setting, live_probe: Optional[dict], profile) -> dict:
    """The sim's ``host_speed`` for one pair and what it stands on: ``setting`` ``"probe"`` (the
    live run's host probes against the profile's, :func:`~kvrl.executors.host_speed.host_speed_ratio`)
    or a positive number (that factor); ``live_probe`` the live run's
    :func:`~kvrl.executors.host_speed.probe_stats`; ``profile`` the sim's (None: roofline, no host
    terms). Returns ``live_host_probe``, ``host_probe_ratio`` (the measured factor, NaN where either
    side has no probes), ``host_speed`` (applied) and ``host_speed_note``."""
    from kvrl.executors.host_speed import host_speed_factor, host_speed_ratio

    prof_probe = profile.meta.get("host_probe") if profile is not None else None
    raw = host_speed_factor(live_probe, prof_probe)
    if setting == "probe":
        speed, note = host_speed_ratio(live_probe, prof_probe)
    else:
        speed, note = float(setting), f"host_speed={float(setting):g} as configured"
    return {"live_host_probe": live_probe, "host_probe_ratio": raw, "host_speed": speed, "host_speed_note": note}


def run_pair(live, make_sim, requests, ecfg: dict, pcfg: dict, slo: dict, out: Path, max_wall_s: Optional[float],
             plots: bool, title: str, live_repeats: int = 1, host_speed=1.0, on_first_live=None,
             earlier: Sequence[float] = (), ensemble: int = 1) -> dict:
    """Serve ``requests`` live (``live_repeats`` times) and in the sim (``make_sim(host_speed,
    step_time_scale, noise_seed)`` builds one, with step-time jitter where ``noise_seed`` is not None;
    ``make_sim()`` one at the profile's speeds), replay the first live run's
    batches through the sim's cost model, and write the pair's files into ``out``; ``ensemble`` as
    :func:`serve_sims` takes it (the deterministic sim's summary is then kept as ``sim_deterministic``,
    and its steps are the ones written); ``host_speed``
    as :func:`pair_host_speed` takes it, the live side's host probes pooled over every live run of
    the pair (the sim is compared with their mean). ``on_first_live(recorder, engine)``, if given, runs
    after the first live run, before anything is priced (kvrl-fidelity's ``profile=select``).
    ``earlier``: the replay errors of the pairs served before this one on the same host, for
    :func:`add_speed_sims`."""
    from kvrl.files import atomic_write, write_json

    res: dict[str, Any] = {}
    recorder = StepRecorder()
    eng = pair_engine(ecfg, live, pcfg, slo)
    wall = time.perf_counter()
    with GcPauses() as pauses:
        error = serve_live(eng, requests, recorder, max_wall_s)
    if error:
        log.warning("%s: %s; pair skipped", title, error)
        res["error"] = error
    res["live_wall_s"] = time.perf_counter() - wall
    res["live_gc"] = pauses.summary()
    if on_first_live is not None and not error:
        on_first_live(recorder, eng)
    resolved = dict(ecfg, num_blocks=eng.config.num_blocks, num_cpu_blocks=eng.config.num_cpu_blocks,
                    max_model_len=eng.config.max_model_len)
    live_m = summarize(eng)
    (out / "live").mkdir(parents=True, exist_ok=True)
    write_json(out / "live" / "metrics.json", live_m)
    atomic_write(out / "live" / "steps.csv", eng.metrics.write_steps_csv)
    repeats, host = [], recorder.cpu.meter
    for _ in range(live_repeats - 1 if "error" not in res else 0):   # the same live run again: how far live is from itself
        again, rec = pair_engine(ecfg, live, pcfg, slo, record_steps=False), StepRecorder()
        error = serve_live(again, requests, rec, max_wall_s)
        host.merge(rec.cpu.meter)
        if error:
            log.warning("%s: repeat: %s", title, error)
        else:
            repeats.append(summarize(again))
    pricer = make_sim()
    res.update(pair_host_speed(host_speed, host.stats(), pricer.profile))
    pricer.host_speed = res["host_speed"]
    pricer.allocate_kv(eng.config.num_blocks, eng.config.num_cpu_blocks, eng.config.block_size)
    replay = recorder.replay(pricer, live)
    recorder.batches.clear()
    with open(out / "replay.csv", "w", newline="") as f:
        w = csv.DictWriter(f, ["step", *(replay[0] if replay else ("live_s", "sim_s"))])
        w.writeheader()
        w.writerows({"step": i + 1, **row} for i, row in enumerate(replay))

    if "error" in res:
        res.update(live=live_m, sim={}, engine=resolved)
        return res
    if repeats:
        res["live_again"], res["live_repeats"] = repeats[0], repeats
    serve = lambda scale: lambda seed: serve_sim(requests, resolved, make_sim(res["host_speed"], scale, seed), pcfg, slo)
    sim = make_sim(res["host_speed"])
    seng = pair_engine(resolved, sim, pcfg, slo)
    wall = time.perf_counter()
    seng.run(requests)
    res["sim_wall_s"] = time.perf_counter() - wall
    sim_m = summarize(seng)
    (out / "sim").mkdir(parents=True, exist_ok=True)
    write_json(out / "sim" / "metrics.json", sim_m)
    atomic_write(out / "sim" / "steps.csv", seng.metrics.write_steps_csv)

    if replay:
        res["replay"] = replay_summary(replay)
    res.update(live=live_m, sim=sim_m, engine=resolved)
    add_ensemble_sim(res, serve(1.0), ensemble)
    add_speed_sims(res, earlier, serve, ensemble)
    if plots:
        live_t, sim_t = np.asarray([r["live_s"] for r in replay]), np.asarray([r["sim_s"] for r in replay])
        plot_pair(eng.metrics.steps, seng.metrics.steps, live_t, sim_t, out.parent.parent.parent /
                  f"steps_{out.parent.name}_{out.name}.png", title)
    return res


def serve_sim(requests, ecfg: dict, sim, pcfg: dict, slo: dict) -> dict:
    """:func:`~kvrl.fidelity.compare.summarize` of ``requests`` served on ``sim`` with the pair's engine."""
    engine = pair_engine(ecfg, sim, pcfg, slo)
    engine.run(requests)
    return summarize(engine)


def replay_error(res: dict) -> float:
    """A pair's total replay error (``sum(sim) / sum(live) - 1`` over its first live run's steps); NaN without a
    replay (a pair that failed live)."""
    return res.get("replay", {}).get("total_rel_err", math.nan)


def serve_sims(serve: Callable[[Optional[int]], dict], ensemble: int) -> tuple[dict, list[dict]]:
    """A sim prediction of a pair and the runs it is made of: ``serve(None)``, one deterministic run, where
    ``ensemble`` is 1; else the mean of every metric (:func:`~kvrl.fidelity.compare.mean_summary`) over
    ``ensemble`` runs whose step times jitter, ``serve(seed)`` for seeds 0 to ``ensemble - 1``: the sim's
    expected value where a small change of timing changes the schedule (docs/fidelity.md, "Runs 58-60"),
    and those runs."""
    if ensemble <= 1:
        return serve(None), []
    runs = [serve(seed) for seed in range(ensemble)]
    return mean_summary(runs), runs


def add_sims(res: dict, key: str, serve: Callable[[Optional[int]], dict], ensemble: int) -> None:
    """``res[key]`` = :func:`serve_sims`'s prediction, and ``res[key + "_runs"]`` its runs' summaries where it
    has several."""
    res[key], runs = serve_sims(serve, ensemble)
    if runs:
        res[f"{key}_runs"] = runs


def add_ensemble_sim(res: dict, serve: Callable[[Optional[int]], dict], ensemble: int) -> None:
    """With ``ensemble`` > 1: the deterministic sim ``res["sim"]`` kept as ``sim_deterministic``, and ``res["sim"]``
    replaced by the ensemble's prediction (:func:`add_sims`); nothing otherwise."""
    if ensemble > 1:
        res["sim_deterministic"] = res["sim"]
        add_sims(res, "sim", serve, ensemble)


def add_speed_sims(res: dict, earlier: Sequence[float], serve: Callable[[float], Callable[[Optional[int]], dict]],
                   ensemble: int = 1) -> None:
    """The pair's sim again at two host speeds (``serve(step_time_scale)``: what :func:`add_sims` serves, the
    pair's requests on a sim whose every step takes that factor longer, by noise seed), where the replay
    errors give one
    (:func:`~kvrl.fidelity.compare.speed_scale`): ``sim_host`` at ``host_speed_scale``, from this pair's own
    replay (``res["replay"]``), a calibration after the fact whose error is the cost model's shape alone;
    ``sim_cal`` at ``calibration_scale``, from ``earlier`` (the replay errors of the pairs served before
    this one on the same host), a prediction of the live run (docs/fidelity.md, "The sim calibrated on
    earlier runs")."""
    own = speed_scale([replay_error(res)])
    for key, sim, scale in (("host_speed_scale", "sim_host", own), ("calibration_scale", "sim_cal", speed_scale(earlier))):
        if math.isfinite(scale):
            res[key] = scale
            add_sims(res, sim, serve(scale), ensemble)


def step_noise(setting, profile) -> float:
    """The sim's per-step jitter for ``sim_step_noise`` = ``setting``: the profile's measured scatter of
    repeated step timings (:attr:`~kvrl.executors.profile.StepProfile.step_noise`) for ``"profile"`` (0 for
    the roofline, ``profile`` None), else the number given."""
    if setting == "profile":
        return profile.step_noise if profile is not None else 0.0
    return float(setting)


def shared_engine(cfg: dict, live) -> dict:
    """The engine keys every workload shares (``cfg["engine"]``), with ``num_blocks: 0`` resolved
    once: the pool that fits the live GPU's free memory, or ``cpu_device_num_blocks`` on CPU."""
    base = dict(cfg["engine"])
    cpu_blocks = int(base.pop("cpu_device_num_blocks", 2048))
    if not base.get("num_blocks"):
        base["num_blocks"] = (live.kv_capacity_blocks(base.get("block_size", 16), base.get("gpu_memory_utilization", 0.9))
                              if live.device.type == "cuda" else cpu_blocks)
    return base


def workload_engine(base: dict, w: dict) -> dict:
    """A workload's engine configuration: ``base`` with the workload's ``engine`` overrides (its
    ``num_blocks: 0`` meaning the shared pool)."""
    ecfg = {**base, **(w.get("engine") or {})}
    if ecfg.get("num_blocks", 0) == 0:
        ecfg["num_blocks"] = base["num_blocks"]
    return ecfg


def workload_requests(w: dict, max_requests: Optional[int], vocab_size: int, max_model_len: int) -> list:
    """The requests of workload entry ``w``, capped at ``max_requests`` when given."""
    from kvrl.workloads import build_workload

    wl = dict(w["workload"])
    if max_requests:
        wl["max_requests"] = min(int(max_requests), int(wl.get("max_requests") or 1 << 30))
    return build_workload(wl, vocab_size=vocab_size, max_model_len=max_model_len)
