"""``kvrl-profile``: measure the live executor's step times over a grid of step shapes and write a
step-time profile for the sim (:mod:`kvrl.executors.profile`).

What is timed is :meth:`LiveExecutor.execute` on real tensors: batches are built directly from
minimal :class:`Sequence` objects whose block tables point into the executor's own KV pool (blocks
are reused cyclically when a shape needs more than the pool holds; the bytes read are the same and
far exceed the GPU's L2). Each point runs ``warmup`` times, then up to ``reps`` times (at least 3,
stopping once ``point_budget_s`` is spent); the median is kept, with p10/p90.

The grid: decode batches x context lengths, as CUDA-graph replays and eager; ragged decode batches
(lengths spread over [L/8, 2L]); prefills of N tokens split over 1..S sequences; prefix hits
(short queries over long cached contexts); mixed decode + prefill steps; block copies; swap-outs
and swap-ins (also timed until their transfer ends), alone and a swap-in issued with a decode step
(overlap); ``random`` engine-like steps (ragged lognormal decode batches, several prefills, both).
Then ``holdout`` random steps the fit never sees measure its error, and a short engine run measures
the engine's own time between steps (which live ``elapsed_s`` includes) and replays the fitted
model on the steps it took. With ``interleave`` (both presets) the repetitions run in rounds over
all points, so each timed step follows a different one, as in an engine, instead of a copy of
itself (a step repeated back to back can run faster than the same step inside an engine).

Writes ``profile.json`` (and ``profile.md``, the fit report) into the run directory, and with
``install_dir`` set also ``<install_dir>/<device>_<model>_<dtype>.json``.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig

from kvrl.apps.live_schema import register_live_schemas, validate_profile
from kvrl.profiling.batches import GRIDS
from kvrl.profiling.run import install_name, render_report, run_profile
from kvrl.profiling.timing import configure_cpu

log = logging.getLogger("kvrl.profile")


def main_impl(cfg: dict, out_dir: Path) -> Any:
    """Profile the live executor of ``cfg`` (a plain dict checked by
    :func:`~kvrl.apps.live_schema.validate_profile`); write the outputs into ``out_dir``."""
    from kvrl.apps.outputs import atomic_write
    from kvrl.executors.live_build import build_live

    ex = build_live(cfg["model"], cfg["backend"], seed=cfg["seed"], weights=cfg["weights"])
    configure_cpu(ex.device.type, cfg["cpu_threads"], cfg["flush_denormal"])
    preset = cfg["grid_preset"]
    if preset == "auto":
        preset = "gpu" if ex.device.type == "cuda" else "cpu"
    grid = {**GRIDS[preset], **{k: v for k, v in cfg["grid"].items() if v is not None}}
    prof = run_profile(ex, grid, block_size=cfg["block_size"], num_blocks=cfg["num_blocks"],
                       gpu_memory_utilization=cfg["gpu_memory_utilization"], seed=cfg["seed"],
                       model_name=cfg["model"]["name"], progress=cfg["progress"])
    disk = cfg["disk"]
    if disk["measure"]:     # the disk tier's bandwidth (kvrl.engine.disk_tier; the sim prices disk I/O from it)
        from kvrl.engine.disk_tier import measure_disk_bandwidth
        block_bytes = ex.kv_block_bytes(cfg["block_size"])
        files = min(512, max(8, int(disk["mb"] * 2**20 // block_bytes)))
        prof.meta["disk"] = measure_disk_bandwidth(disk["dir"], block_bytes=block_bytes, num_blocks=files)
        log.info("disk: read %.2f GB/s, write %.2f GB/s", prof.meta["disk"]["read_bytes_per_s"] / 1e9,
                 prof.meta["disk"]["write_bytes_per_s"] / 1e9)
    out_dir.mkdir(parents=True, exist_ok=True)
    prof.save(out_dir / "profile.json")
    report = render_report(prof)
    atomic_write(out_dir / "profile.md", lambda f: f.write(report + "\n"))
    if cfg["install_dir"]:
        dest = Path(cfg["install_dir"]) / install_name(prof)
        prof.save(dest)
        log.info("installed %s", dest)
    print(report)
    print(f"\nprofile: {out_dir / 'profile.json'} ({(out_dir / 'profile.json').stat().st_size / 1024:.0f} KiB)")
    return prof


register_live_schemas()      # profile_schema in Hydra's ConfigStore before Hydra composes


@hydra.main(config_path="pkg://kvrl.conf", config_name="profile", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    plain = validate_profile(cfg)           # every key checked before the live executor is built
    main_impl(plain, Path(HydraConfig.get().runtime.output_dir))


if __name__ == "__main__":
    main()
