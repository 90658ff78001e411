"""GPU-only prefix caching vs + a CPU tier on one workload, over seeds (issue #20, docs/tiers.md).

Composes ``conf/run.yaml`` with the given Hydra overrides (the workload, pool sizes, backend),
runs every variant on every seed and writes ``results.json`` (every run's metrics.json summary
plus the workload's working set) and ``table.md`` (mean over seeds, min-max in brackets) under
``--out``. Variants:

* ``gpu``: ``engine.cpu_tier_blocks=0`` (today's engine);
* ``cpu``: ``engine.cpu_tier_blocks=<--tier-blocks>``, ``tier=offload_all``;
* ``cost``: the same tier with ``tier=cost_aware``;
* ``disk``: the CPU tier plus a disk tier of ``--disk-blocks`` blocks, ``tier=offload_all``;
* ``disk_cost``: the same two tiers with ``tier=cost_aware`` (offload / demote only where the
  reload beats a recompute);
* ``prefetch``: the same two tiers with ``tier=prefetch``;
* ``disk_ra``: as ``disk``, with disk read-ahead (``engine.disk_tier_read_ahead_blocks`` =
  :data:`READ_AHEAD_BLOCKS`, :mod:`kvrl.engine.tier_read_ahead`).

Live (``backend=live`` among the overrides): one executor is built for the whole study (random
weights drawn on the device by default, ``--weights``) and warmed up once (``--warmup`` requests,
:func:`kvrl.builder.warm_up`); every run then builds its engine on it (same KV pool shape: the pool
and the captured graphs are reused), so model load, kernel compilation and graph capture are paid
once and charged to no run. ``results.json`` and ``table.md`` are rewritten after every run, so a
study cut short (a device call's time limit) keeps the runs that finished.

Working set: at every arrival, the sum over conversations (prefix groups) that have started and
not yet sent their last turn of their latest prompt length, plus the shared system prompt once;
reported as mean and peak over arrivals, in tokens and as a multiple of the GPU pool's tokens.

Example (the sim numbers of docs/tiers.md)::

    python scripts/tiers_study.py --out runs/tiers/sim --seeds 0 1 2 -- workload=multi_turn \\
        workload.num_conversations=200 ...
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

READ_AHEAD_BLOCKS = 64      # the disk_ra variant's staging buffers (128 MiB of host memory on Llama-3-8B)
VARIANTS = {
    "gpu": lambda blocks, disk: ["engine.cpu_tier_blocks=0"],
    "cpu": lambda blocks, disk: [f"engine.cpu_tier_blocks={blocks}", "tier=offload_all"],
    "cost": lambda blocks, disk: [f"engine.cpu_tier_blocks={blocks}", "tier=cost_aware"],
    "disk": lambda blocks, disk: [f"engine.cpu_tier_blocks={blocks}", f"engine.disk_tier_blocks={disk}",
                                  "tier=offload_all"],
    "disk_cost": lambda blocks, disk: [f"engine.cpu_tier_blocks={blocks}", f"engine.disk_tier_blocks={disk}",
                                       "tier=cost_aware"],
    "prefetch": lambda blocks, disk: [f"engine.cpu_tier_blocks={blocks}", f"engine.disk_tier_blocks={disk}",
                                      "tier=prefetch"],
    "disk_ra": lambda blocks, disk: [f"engine.cpu_tier_blocks={blocks}", f"engine.disk_tier_blocks={disk}",
                                     "tier=offload_all", f"engine.disk_tier_read_ahead_blocks={READ_AHEAD_BLOCKS}"],
}
COLUMNS = ("ttft_p50_s", "ttft_p99_s", "throughput_tok_s", "prefix_hit_rate", "tier_gpu_hit_rate",
           "tier_cpu_hit_rate", "tier_disk_hit_rate", "tier_loaded_blocks", "tier_disk_loaded_blocks",
           "tier_prefetch_used_blocks", "tier_load_s", "tier_disk_load_s", "tier_disk_read_ahead_used_blocks",
           "recomputed_tokens", "preemptions")


def compose(overrides: list[str]):
    import kvrl.apps  # noqa: F401  (config resolvers)
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from kvrl import plugins
    from kvrl.apps.schema import register_schemas, validate_config
    register_schemas()
    plugins.available("tier")            # registers the built-ins' Hydra config options
    with initialize_config_module("kvrl.conf", version_base="1.3"):
        cfg = hydra_compose("run", overrides=overrides)
    validate_config(cfg)
    return cfg


def working_set(requests, pool_tokens: int, system_len: int) -> dict:
    """Mean and peak over arrivals of the live conversations' latest prompt tokens (see module doc)."""
    groups: dict[str, list] = {}
    for r in requests:
        groups.setdefault(r.prefix_group or r.request_id, []).append(r)
    spans = [(min(r.arrival_s for r in rs), max(r.arrival_s for r in rs), sorted(rs, key=lambda r: r.arrival_s))
             for rs in groups.values()]
    sizes = []
    for t in sorted(r.arrival_s for r in requests):
        live = 0
        for first, last, rs in spans:
            if first <= t <= last:
                live += max(r.prompt_len for r in rs if r.arrival_s <= t) - system_len
        sizes.append(live + system_len)
    mean, peak = float(np.mean(sizes)), float(np.max(sizes))
    return {"working_set_mean_tokens": mean, "working_set_peak_tokens": peak,
            "working_set_mean_x_pool": mean / pool_tokens, "working_set_peak_x_pool": peak / pool_tokens}


def live_executor(overrides: list[str], weights: str, warmup: int):
    """The one executor of a live study (see module doc): built from the first run's config with
    ``weights`` (:func:`~kvrl.executors.live_build.build_live`) and warmed up with ``warmup``
    requests (0: none) on that config's engine without a tier."""
    from kvrl.builder import to_dict, warm_up
    from kvrl.executors.live_build import build_live
    cfg = compose([*overrides, "engine.cpu_tier_blocks=0", "engine.disk_tier_blocks=0"])
    t0 = time.perf_counter()
    executor = build_live(to_dict(cfg.model), to_dict(cfg.backend), seed=int(cfg.seed), weights=weights)
    built = time.perf_counter()
    if warmup > 0:
        warm_up(executor, to_dict(cfg.engine), warmup, seed=12345)
    print(f"live executor: built in {built - t0:.1f} s, warmed up ({warmup} requests) in "
          f"{time.perf_counter() - built:.1f} s", flush=True)
    return executor


def run_one(overrides: list[str], executor=None) -> dict:
    """One run of ``overrides``: on ``executor`` when given (a live study's shared one), else on
    an executor built for it."""
    from kvrl.builder import build_engine, to_dict
    from kvrl.workloads import build_workload
    cfg = compose(overrides)
    if executor is not None and hasattr(executor, "reset_step_state"):
        executor.reset_step_state()
    engine = build_engine(cfg, executor=executor, record_steps=False)
    requests = build_workload(to_dict(cfg.workload), vocab_size=engine.executor.vocab_size,
                              max_model_len=engine.config.max_model_len)
    wall = time.perf_counter()
    metrics = engine.run(list(requests))
    metrics["wall_s"] = time.perf_counter() - wall
    metrics["busy_s"] = engine.metrics.busy_time_s       # engine seconds with a step running (live: ~ wall)
    pool = engine.config.num_blocks * engine.config.block_size
    metrics.update(working_set(requests, pool, int(cfg.workload.get("system_prompt_len", 0) or 0)))
    metrics["num_blocks"] = engine.config.num_blocks
    metrics["backend"] = engine.executor.name
    metrics["cost_source"] = getattr(engine.executor, "cost_source", "measured")
    metrics["device"] = str(getattr(engine.executor, "device", ""))
    return metrics


def table(results: list[dict], variants: list[str]) -> str:
    def cell(values):
        values = [v for v in values if v is not None]
        if not values:
            return "-"
        mean = float(np.mean(values))
        fmt = (lambda x: f"{x:.4g}")
        return fmt(mean) if len(values) == 1 else f"{fmt(mean)} [{fmt(min(values))}-{fmt(max(values))}]"
    lines = ["| variant | " + " | ".join(COLUMNS) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    for v in variants:
        rows = [r for r in results if r["variant"] == v]
        lines.append(f"| {v} | " + " | ".join(cell([r.get(c) for r in rows]) for c in COLUMNS) + " |")
    ws = results[0]
    lines.append("")
    lines.append(f"working set (seed {ws['seed']}): mean {ws['working_set_mean_tokens']:.0f} tokens = "
                 f"{ws['working_set_mean_x_pool']:.1f}x the GPU pool, peak {ws['working_set_peak_tokens']:.0f} = "
                 f"{ws['working_set_peak_x_pool']:.1f}x; runs per variant: "
                 + ", ".join(f"{v} {sum(r['variant'] == v for r in results)}" for v in variants))
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--variants", nargs="+", default=["gpu", "cpu", "cost"], choices=list(VARIANTS))
    parser.add_argument("--tier-blocks", type=int, default=8192, help="engine.cpu_tier_blocks of the tier variants")
    parser.add_argument("--disk-blocks", type=int, default=32768, help="engine.disk_tier_blocks of disk/prefetch")
    parser.add_argument("--disk-bandwidth", default=None,
                        help="a measure_disk_bandwidth JSON (benchmarks/tiers_live.sh writes one): the sim prices disk "
                             "I/O with it where the profile has no disk measurement, instead of the default")
    parser.add_argument("--weights", default="memory",
                        help="live: backend weights (memory: random, drawn on the device; disk: kvrl-run's random "
                             "checkpoint; else a checkpoint directory)")
    parser.add_argument("--warmup", type=int, default=64, help="live: warm-up requests before the first run (0: none)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of conf/run.yaml (after --)")
    args = parser.parse_args(argv)
    if args.disk_bandwidth:
        from kvrl.engine import disk_tier
        measured = json.loads(Path(args.disk_bandwidth).read_text())
        disk_tier.DEFAULT_DISK_BANDWIDTH = disk_tier.DiskBandwidth(
            float(measured["read_bytes_per_s"]), float(measured["write_bytes_per_s"]), f"measured ({args.disk_bandwidth})")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    live = "backend=live" in args.overrides
    executor = live_executor([*args.overrides, f"seed={args.seeds[0]}"], args.weights, args.warmup) if live else None
    for seed in args.seeds:
        for variant in args.variants:
            overrides = [*args.overrides, f"seed={seed}", *VARIANTS[variant](args.tier_blocks, args.disk_blocks)]
            metrics = run_one(overrides, executor)
            metrics.update(variant=variant, seed=seed, overrides=overrides)
            results.append(metrics)
            print(f"seed {seed} {variant}: ttft p50 {metrics['ttft_p50_s']:.4f} s p99 {metrics['ttft_p99_s']:.4f} s, "
                  f"{metrics['throughput_tok_s']:.1f} tok/s, hit {metrics['prefix_hit_rate']:.3f} "
                  f"(cpu {metrics.get('tier_cpu_hit_rate', 0.0):.3f}), busy {metrics['busy_s']:.1f} s, "
                  f"wall {metrics['wall_s']:.1f} s", flush=True)
            (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
            done = [v for v in args.variants if any(r["variant"] == v for r in results)]
            text = table(results, done)
            (out / "table.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
