"""``kvrl-run``: serve a workload through the engine with the configured policies.

Writes into the Hydra run directory (``runs/run/<date>/<HH-MM-SS-microseconds-random>`` by default,
unique per launch): ``metrics.json`` (docs/design.md §5), ``steps.csv`` (one row per engine step),
``requests.csv`` (one row per request: rejected and dropped ones too, with what clipping changed),
``kv_usage.png`` and ``config.yaml`` (the resolved config), then prints a summary table. With ``logger=csv|wandb`` the
job's metrics and plot also go to the tracker (kvrl/apps/tracking.py), inside the job.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from kvrl import plugins
from kvrl.apps.progress import job_progress
from kvrl.apps.outputs import atomic_write, plot_steps, summary_table, write_json
from kvrl.apps import sim_beside, tracking
from kvrl.executors.host_speed import HostProbes
from kvrl.apps.schema import register_schemas, validate_config
from kvrl.builder import build_engine, to_dict
from kvrl.workloads import build_workload

log = logging.getLogger("kvrl.run")

plugins.load_entry_points()   # third-party plugins become config options before Hydra composes
plugins.available("scheduler")  # and the built-ins too
register_schemas()


def run(cfg: DictConfig, out_dir: Path) -> dict:
    """Build everything from ``cfg``, serve the workload, write outputs to ``out_dir``."""
    engine = build_engine(cfg)
    requests = build_workload(to_dict(cfg.workload), vocab_size=engine.executor.vocab_size,
                              max_model_len=engine.config.max_model_len)
    engine.metrics.dropped.extend(requests.dropped)    # overlong=drop: counted and listed in requests.csv
    log.info("workload: %d requests; engine: %d GPU blocks of %d tokens, %d CPU blocks; backend %s",
             len(requests), engine.config.num_blocks, engine.config.block_size, engine.config.num_cpu_blocks,
             engine.executor.name)
    wall = time.perf_counter()
    live = engine.executor.name == "live"
    probes = HostProbes() if live else None   # the live host's speed (#16)
    step_log = sim_beside.StepLog() if live else None   # the steps that choose the sim's profile (#16)
    metrics = engine.run(requests, progress=job_progress(cfg.progress), max_steps=cfg.max_steps,
                         callbacks=[probes, step_log] if live else ())
    metrics["wall_s"] = time.perf_counter() - wall
    metrics.update(engine.metrics.wall_clock())   # policy_time_s, host gaps (#15)
    metrics["num_blocks"] = engine.config.num_blocks
    out_dir.mkdir(parents=True, exist_ok=True)
    if live:    # the sim's prediction of this run, beside it (#16)
        predicted = sim_beside.predict(cfg, engine, requests, probes.meter.stats(), steps=step_log)
        predicted["error"] = sim_beside.compare(metrics, predicted)
        predicted["error_at_host_speed"] = sim_beside.compare(metrics, predicted["at_host_speed"])
        write_json(out_dir / "sim_prediction.json", predicted)
        metrics["sim_error"] = predicted["error"]
        log.info("%s (%s)", sim_beside.describe(predicted["error"]), predicted["cost_source"])
        log.info("at this run's host speed (x%.3f), %s", predicted["host_speed_scale"],
                 sim_beside.describe(predicted["error_at_host_speed"]))
    write_json(out_dir / "metrics.json", metrics)
    atomic_write(out_dir / "steps.csv", engine.metrics.write_steps_csv)
    atomic_write(out_dir / "requests.csv", engine.metrics.write_requests_csv)
    atomic_write(out_dir / "config.yaml", lambda f: f.write(OmegaConf.to_yaml(cfg, resolve=True)))
    if cfg.plots:
        plot_steps(out_dir / "steps.csv", out_dir / "kv_usage.png",
                   title=f"{cfg.scheduler.name} / {cfg.watermark.name} / {cfg.eviction.name} / {cfg.prefix_cache.name}")
    return metrics


@hydra.main(config_path="pkg://kvrl.conf", config_name="run", version_base="1.3")
def main(cfg: DictConfig) -> float:
    validate_config(cfg)
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    with tracking.start_run(cfg, out_dir, app="run") as tracker:
        metrics = run(cfg, out_dir)
        tracker.log(metrics, images={"kv_usage": out_dir / "kv_usage.png"})
    print(summary_table(f"kvrl-run ({cfg.backend.name})", metrics))
    if "sim_error" in metrics:
        print(sim_beside.describe(metrics["sim_error"]) + "  (sim_prediction.json)")
    print(f"outputs: {out_dir}")          # on its own line: a rich title would wrap the path mid-name
    return metrics["goodput_tok_s"]


if __name__ == "__main__":
    main()
