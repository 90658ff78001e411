"""``kvrl-fidelity``: serve the same workloads with the same policies through the live executor and
the sim, and report how far the sim's metrics are from live.

For every workload x policy pair: one live run and one sim run of the same requests on the same
engine configuration (the sim gets the live run's resolved ``num_blocks``/``num_cpu_blocks``), each
with fresh policy instances; cost-aware policies see the same estimates in both (the live
executor's ``cost_model`` is replaced by the sim's). Live runs are preceded, once per engine
configuration, by a warm-up run (:func:`kvrl.builder.warm_up`, ``warmup_requests``) that captures every CUDA
graph and compiles every kernel, so no capture lands in a timed step. During the live run each executed batch is also priced by the
sim's cost model ("replay"): a per-step error on identical batches, independent of how the two
schedules diverge.

Writes into the run directory: ``fidelity.md`` and ``fidelity.csv`` (per-metric live, sim, error;
per-metric summary; whether the policy ranking agrees), ``runs/<workload>/<policy>/{live,sim}/``
(``metrics.json``, ``steps.csv``), ``replay.csv`` per pair, and ``steps_<workload>_<policy>.png``
(per-step time live vs sim over engine time, and replayed sim vs live step times).
The library is :mod:`kvrl.fidelity`; this app composes the config, builds the live executor and
the sim, and runs every pair. Each pair is also served in the sim at its own live run's host speed
(``sim_host``, after the fact) and, after the first, at the host speed the pairs before it measured
(``sim_cal``, a prediction; :func:`kvrl.fidelity.pairs.add_speed_sims`), both in ``fidelity.json`` and the
report's calibrated section.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Optional

import hydra
from omegaconf import DictConfig

from kvrl.apps.live_schema import register_live_schemas, validate_fidelity
from kvrl.apps.sim_beside import select_profile
from kvrl.fidelity.compare import rel_err
from kvrl.fidelity.pairs import replay_error, run_pair, shared_engine, step_noise, workload_engine, workload_requests
from kvrl.fidelity.report import ensemble_line, pct, write_report

log = logging.getLogger("kvrl.fidelity")


def main_impl(cfg: dict, out_dir: Path) -> dict:
    """Run every pair of ``cfg`` (a plain dict checked by
    :func:`~kvrl.apps.live_schema.validate_fidelity`) and write the report into ``out_dir``."""
    import torch

    from kvrl import plugins
    from kvrl.builder import warm_up
    from kvrl.executors.live_build import build_live
    from kvrl.executors.sim import SimExecutor
    from kvrl.profiling.timing import configure_cpu, device_name

    plugins.load_entry_points()
    seed = cfg["seed"]
    live = build_live(cfg["model"], cfg["live"], seed=seed, weights=cfg["weights"])
    configure_cpu(live.device.type, cfg["cpu_threads"], cfg["flush_denormal"])
    shape, dev = live.cost_model.model, live.cost_model.device
    graphs, steps = bool(live.use_cuda_graphs), bool(live.use_step_graphs)
    select = cfg["profile"] == "select"
    first = SimExecutor(shape, dev, seed, profile="auto" if select else cfg["profile"], cuda_graphs=graphs,
                        step_graphs=steps)
    #: the sim's profile; with profile=select, replaced once by the first live run's choice (select_once)
    chosen: dict = {"spec": first.profile if first.profile is not None else "none"}
    def make_sim(host_speed=1.0, step_time_scale=1.0, noise_seed=None) -> SimExecutor:
        """The sim of every pair: the chosen profile, with per-step jitter (``sim_step_noise``) under ``noise_seed``."""
        profile = chosen["spec"] if chosen["spec"] != "none" else None
        return SimExecutor(shape, dev, seed, profile=chosen["spec"], cuda_graphs=graphs, step_graphs=steps,
                           host_speed=host_speed, step_time_scale=step_time_scale,
                           step_noise=0.0 if noise_seed is None else step_noise(cfg["sim_step_noise"], profile),
                           noise_seed=noise_seed or 0)
    live.cost_model = make_sim()          # cost-aware policies see the same estimates live and in sim

    def select_once(recorder, engine, pair: str) -> None:
        """profile=select: after the first pair's first live run, the matching profile that prices
        that run's own steps closest to their live time (sim_beside.select_profile) prices every
        pair from then on (that first pair included), and the policies' cost model with it: only that
        first live run's cost-aware policies saw the estimates of ``auto``'s profile."""
        if not select or "pair" in chosen:
            return
        best, errors = select_profile(live.cost_model, recorder, engine.config, graphs, steps)
        chosen.update(spec=best if best is not None else "none", pair=pair, errors=errors)
        live.cost_model = make_sim()
        log.info("profile=select on %s's steps: %s (total replay error per candidate: %s)", pair,
                 best.path if best is not None else "roofline",
                 ", ".join(f"{k}: {v:+.1%}" for k, v in errors.items()))
    slo = dict(cfg["slo"])

    base = shared_engine(cfg, live)
    workloads, policies = dict(cfg["workloads"]), dict(cfg["policies"])
    if cfg["only_workloads"] is not None:            # names checked by validate_fidelity
        workloads = {k: workloads[k] for k in cfg["only_workloads"]}
    if cfg["only_policies"] is not None:
        policies = {k: policies[k] for k in cfg["only_policies"]}

    results: dict[tuple[str, str], dict] = {}
    #: the replay errors of the pairs served so far in this process: the host's measured speed
    earlier: list[float] = []
    warmed: Optional[tuple] = None
    t_all = time.perf_counter()
    gpu = device_name(live)
    try:
        import triton
        tv = triton.__version__
    except Exception:
        tv = "n/a"

    def header_lines() -> list[str]:
        import platform
        return [f"# kvrl-fidelity: sim vs live on {gpu}", "",
                f"model {cfg['model']['name']} ({shape.num_layers} layers, hidden {shape.hidden_size}, {live.dtype}); "
                f"CUDA graphs {graphs}; sim cost model: " + (selected_line() if select else first.cost_source
                + (f" ({first.profile.describe()})" if first.profile is not None else "")) + ".",
                f"torch {torch.__version__}, triton {tv}; host {platform.node()}; {time.perf_counter() - t_all:.0f} s so far.",
                f"sim host speed: {cfg['host_speed']} (factor on the profile's host terms; 'probe' = the live run's "
                "host probe over the profile's; per pair in the replay table).", ensemble_line(cfg),
                f"SLO: TTFT {slo.get('ttft_s')} s, TPOT {slo.get('tpot_s')} s. Workloads: "
                + "; ".join(f"{k}: {v.get('doc', v['workload'].get('name'))}" for k, v in workloads.items()) + "."]

    def selected_line() -> str:
        if "pair" not in chosen:
            return "profile=select (not chosen yet)"
        name = getattr(chosen["spec"], "path", None) or "roofline"
        return (f"profile=select: {name}, the candidate whose prices of {chosen['pair']}'s first live run summed "
                "closest to its live time (total replay error: " +
                ", ".join(f"{k} {v:+.1%}" for k, v in chosen["errors"].items()) + ")")

    for wname, w in workloads.items():
        ecfg = workload_engine(base, w)
        requests = workload_requests(w, cfg["max_requests"], live.vocab_size,
                                     ecfg.get("max_model_len") or live.max_model_len)
        key = (ecfg["num_blocks"], ecfg.get("num_cpu_blocks"), ecfg.get("swap_space_gb"), ecfg["block_size"])
        if key != warmed:
            if cfg["warmup_requests"] > 0:
                warm_up(live, ecfg, cfg["warmup_requests"], seed=seed + 101)
            warmed = key
        for pname, pcfg in policies.items():
            title = f"{wname} / {pname}: {len(requests)} requests, {ecfg['num_blocks']} blocks ({device_name(live)})"
            log.info("running %s", title)
            out = out_dir / "runs" / wname / pname
            res = run_pair(live, make_sim, requests, ecfg, pcfg, slo, out, cfg["max_live_wall_s"],
                           cfg["plots"], title, cfg["live_repeats"], cfg["host_speed"],
                           on_first_live=lambda rec, eng, pair=f"{wname}/{pname}": select_once(rec, eng, pair),
                           earlier=earlier, ensemble=cfg["sim_ensemble"])
            earlier.append(replay_error(res))
            if select:
                res["profile_select"] = {"profile": getattr(chosen["spec"], "path", None) or "roofline",
                                         "chosen_on": chosen.get("pair"), "replay_errors": chosen.get("errors", {})}
            results[(wname, pname)] = res
            write_report(results, out_dir, header_lines(), final=False)   # partial results survive a timeout
            if "error" not in res:
                lm, sm = res["live"], res["sim"]
                log.info("  live %.0f tok/s, sim %.0f tok/s (%s); replay median err %s", lm["throughput_tok_s"],
                         sm["throughput_tok_s"], pct(rel_err(lm["throughput_tok_s"], sm["throughput_tok_s"])),
                         f"{res.get('replay', {}).get('median_abs_rel_err', float('nan')):.1%}")

    table = write_report(results, out_dir, header_lines(), final=True)
    print(table)
    return results


register_live_schemas()      # fidelity_schema in Hydra's ConfigStore before Hydra composes


@hydra.main(config_path="pkg://kvrl.conf", config_name="fidelity", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    plain = validate_fidelity(cfg)          # every key checked before the live executor is built
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    if plain["resim"]:
        from kvrl.apps.resim import resim_impl
        resim_impl(plain, out_dir)
    else:
        main_impl(plain, out_dir)


if __name__ == "__main__":
    main()
