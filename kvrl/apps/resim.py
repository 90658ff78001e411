"""Re-run the sim side of a finished ``kvrl-fidelity`` run, offline, against its recorded live results.

``kvrl-fidelity resim=<run dir> profile=<profile.json> [refit=true] [host_speed=probe] [sim_step_scale=0.97]`` (no GPU): reads the earlier run's
``.hydra/config.yaml`` (workloads, policies, SLO, seed) and ``fidelity.json`` (live metrics of
every live run, the resolved engine configuration of each pair), serves the same requests through
the sim with the given profile, re-prices the recorded live batches of ``runs/*/*/replay.csv`` with
that profile, and writes the same report (``fidelity.md`` / ``.csv`` / ``.json``) into the new run
directory. ``refit=true`` first fits the profile's model again from its samples with this kvrl's
fitting code. So a cost-model change (a refit, a new feature) is checked against real live runs
without spending GPU time on the live side again.

The replay prices each recorded step from its features as the sim does
(:func:`kvrl.executors.profile.StepModel.predict_features`, host term included, on the sim's swap
stream), so with the run's own profile it reproduces the run's replay column; the sim serves the
model shape and device of the profile's key (stated in the report header). As live
(:func:`kvrl.fidelity.pairs.add_speed_sims`), each pair is also served at its own re-priced replay's host
speed (``sim_host``) and, after the first re-simulated, at the speed the re-priced replays of the pairs
before it measure (``sim_cal``), in the recorded order.
"""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger("kvrl.fidelity")


class ResimError(ValueError):
    """A run directory that cannot be re-simulated (missing files, no profile)."""


def load_run(run_dir: Path) -> tuple[dict, dict]:
    """The earlier run's composed config and its ``fidelity.json`` results."""
    import yaml

    cfg_path, res_path = run_dir / ".hydra" / "config.yaml", run_dir / "fidelity.json"
    for p in (cfg_path, res_path):
        if not p.exists():
            raise ResimError(f"resim={run_dir}: {p.name} is missing (need the output directory of a kvrl-fidelity "
                             f"run: .hydra/config.yaml, fidelity.json, runs/*/*/replay.csv)")
    with open(cfg_path) as f:
        cfg = yaml.safe_load(f)
    with open(res_path) as f:
        results = json.load(f)
    return cfg, results


def sim_target(profile) -> tuple[Any, Any]:
    """(ModelShape, DeviceSpec) of a profile's key: the shape and device the live run had."""
    from dataclasses import replace

    from kvrl.executors.hardware import DEVICES, MODEL_SHAPES, DeviceSpec, ModelShape
    from kvrl.executors.profile import SHAPE_FIELDS

    key = profile.key
    base = next((s for s in MODEL_SHAPES.values() if all(getattr(s, f) == getattr(key, f) for f in SHAPE_FIELDS)),
                ModelShape())
    shape = replace(base, **{f: getattr(key, f) for f in SHAPE_FIELDS})
    device = DEVICES.get(key.device) or DeviceSpec(name=key.device)
    return shape, device


def reprice(replay_csv: Path, model, cuda_graphs: bool, host_speed: float = 1.0) -> list[dict]:
    """The recorded live steps of ``replay_csv`` priced by ``model`` as the sim prices them (compute
    stream + host term times ``host_speed``, on the sim's swap stream: a step waits for the swap-ins
    issued before it and for a pending swap-out, as :class:`~kvrl.executors.sim.SwapStream` models
    the live executor)."""
    from kvrl.executors.profile import HOST_WORK
    from kvrl.executors.sim import SwapStream
    from kvrl.fidelity.replay import read_replay_csv

    rows = []
    stream, now = SwapStream(), 0.0
    for feats in read_replay_csv(replay_csv):
        busy = feats.get("n_pre", 0) or feats.get("n_dec", 0)
        host = host_speed * model.host_s(feats.get("n_pre", 0) + feats.get("n_dec", 0), feats.get("n_pre", 0),
                                         *(feats.get(k, 0) for k in HOST_WORK)) if busy else 0.0
        elapsed = model.predict_features(feats, cuda_graphs, host=True, host_scale=host_speed)
        n_out, n_in = feats.get("swap_out", 0), feats.get("swap_in", 0)
        if n_out or n_in or stream.busy_until > now:
            forward = model.forward_features(feats, cuda_graphs)
            elapsed = stream.step_s(now, elapsed, forward)
            stream.issue(now, now + elapsed, model.swap_out_xfer(n_out), model.swap_in_xfer(n_in))
        now += elapsed
        rows.append({"live_s": feats["live_s"], "live_execute_s": feats["live_execute_s"], "kind": feats["kind"],
                     "sim_s": elapsed, "sim_host_s": host, "host_slow": feats.get("host_slow", float("nan"))})
    return rows


def resim_impl(cfg: dict, out_dir: Path) -> dict:
    """See the module doc. ``cfg``: this run's config (``resim``, ``profile``, ``refit``,
    ``only_workloads``, ``only_policies``, ``plots``, ``host_speed``, ``sim_step_scale``); everything else
    comes from the earlier run."""
    from kvrl import plugins
    from kvrl.apps.live_schema import check_subset
    from kvrl.executors.profile import load_cached, profile_file
    from kvrl.executors.sim import SimExecutor
    from kvrl.fidelity.compare import summarize
    from kvrl.fidelity.pairs import (add_ensemble_sim, add_speed_sims, pair_engine, pair_host_speed, replay_error,
                                     serve_sim, step_noise, workload_requests)
    from kvrl.fidelity.replay import replay_summary
    from kvrl.fidelity.report import ensemble_line, plot_pair, write_report

    plugins.load_entry_points()
    run_dir = Path(str(cfg["resim"])).expanduser()
    old_cfg, old = load_run(run_dir)
    spec = cfg.get("profile", "auto")
    if spec in (None, "auto", "none", "select"):
        raise ResimError(f"resim needs profile=<profile.json> (the cost model to check); got profile={spec!r}")
    profile = load_cached(profile_file(spec))
    if cfg.get("refit"):
        profile = profile.refitted()
    shape, device = sim_target(profile)
    graphs = bool(old_cfg.get("live", {}).get("cuda_graphs", True))
    steps = bool(old_cfg.get("live", {}).get("step_graphs", False))
    seed = int(old_cfg.get("seed", 0))
    slo = dict(old_cfg.get("slo") or {})
    ensemble, jitter = int(cfg.get("sim_ensemble", 1)), step_noise(cfg.get("sim_step_noise", "profile"), profile)
    only_w, only_p = cfg.get("only_workloads"), cfg.get("only_policies")
    check_subset("only_workloads", only_w, old_cfg["workloads"], " in the run re-simulated")
    check_subset("only_policies", only_p, old_cfg["policies"], " in the run re-simulated")

    results: dict[tuple[str, str], dict] = {}
    earlier: list[float] = []       # the re-priced replay errors of the pairs before, in the recorded order
    t_all = time.perf_counter()
    header = [f"# kvrl-fidelity (re-simulated offline): sim vs the live runs of {run_dir}", "",
              f"model {old_cfg['model'].get('name')}; CUDA graphs {graphs}; sim cost model: profile "
              f"{profile.describe()}.",
              "Live metrics as recorded by that run; sim runs and the replay re-done on this machine (replay priced "
              "from step features on the sim's swap stream).",
              f"SLO: TTFT {slo.get('ttft_s')} s, TPOT {slo.get('tpot_s')} s.",
              f"sim host speed: {cfg.get('host_speed', 1.0)} (factor on the profile's host terms; 'probe' = the live "
              "run's recorded host probe over the profile's; per pair in the replay table).",
              f"sim step scale: {cfg.get('sim_step_scale', 1.0)} (factor on every sim step's compute time: a "
              "sensitivity check; the replay table prices the live steps as profiled).", ensemble_line(cfg)]
    for pair, old_res in old.items():
        wname, pname = pair.split("/", 1)
        if (only_w and wname not in only_w) or (only_p and pname not in only_p):
            continue
        if "error" in old_res or not old_res.get("live"):
            results[(wname, pname)] = {"error": old_res.get("error", "no live result")}
            continue
        w, pcfg = old_cfg["workloads"][wname], old_cfg["policies"][pname]
        ecfg = dict(old_res["engine"])
        requests = workload_requests(w, old_cfg.get("max_requests"), shape.vocab_size, ecfg["max_model_len"])
        speed = pair_host_speed(cfg.get("host_speed", 1.0), old_res.get("live_host_probe"), profile)
        make_sim = lambda scale, noise_seed=None: SimExecutor(
            shape, device, seed, profile=profile, cuda_graphs=graphs, step_graphs=steps, host_speed=speed["host_speed"],
            step_time_scale=scale, step_noise=0.0 if noise_seed is None else jitter, noise_seed=noise_seed or 0)
        seng = pair_engine(ecfg, make_sim(float(cfg.get("sim_step_scale", 1.0))), pcfg, slo)
        wall = time.perf_counter()
        seng.run(requests)
        res = {k: old_res[k] for k in ("live", "live_again", "live_repeats", "live_wall_s", "live_gc")
               if k in old_res}
        res.update(sim=summarize(seng), sim_wall_s=time.perf_counter() - wall, engine=ecfg, **speed)
        replay_csv = run_dir / "runs" / wname / pname / "replay.csv"
        if replay_csv.exists():
            rp = reprice(replay_csv, profile.model, graphs, speed["host_speed"])
            res["replay"] = replay_summary(rp)
            if cfg.get("plots", True):
                live_t, sim_t = np.asarray([r["live_s"] for r in rp]), np.asarray([r["sim_s"] for r in rp])
                plot_pair([], seng.metrics.steps, live_t, sim_t, out_dir / f"steps_{wname}_{pname}.png",
                          f"{wname} / {pname} (re-simulated)")
        serve = lambda scale: lambda noise_seed: serve_sim(requests, ecfg, make_sim(scale, noise_seed), pcfg, slo)
        add_ensemble_sim(res, serve(float(cfg.get("sim_step_scale", 1.0))), ensemble)
        add_speed_sims(res, earlier, serve, ensemble)
        earlier.append(replay_error(res))
        results[(wname, pname)] = res
    if not results:
        raise ResimError(f"resim={run_dir}: no pair left to re-simulate (only_workloads={only_w}, only_policies={only_p})")
    header.append(f"{time.perf_counter() - t_all:.1f} s of sim.")
    table = write_report(results, out_dir, header, final=True)
    print(table)
    return results

