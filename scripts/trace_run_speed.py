"""Seconds of ``Engine.run`` for the whole packaged Azure code trace as ``kvrl-run`` builds it
(per-step records on), median of 3 runs (then one JSON line with every run's CPU and wall seconds),
for comparing trees: it uses only APIs that 87fbe4f
already had, so it runs unchanged on a checkout of an older commit (``PYTHONPATH=<checkout>``,
with kernels/, envs/ and conf/ linked under its kvrl/ as benchmarks/device_env.sh does).

    python scripts/trace_run_speed.py [override ...]      # e.g. engine.prefix_hash=xxh3
"""
from __future__ import annotations

import json
import statistics
import sys
import time

from hydra import compose, initialize_config_module

from kvrl import plugins
from kvrl.apps.schema import register_schemas
from kvrl.builder import build_engine, to_dict
from kvrl.workloads import build_workload


def main(overrides: list[str]) -> None:
    plugins.available("scheduler")
    register_schemas()
    with initialize_config_module("kvrl.conf", version_base="1.3"):
        cfg = compose("run", overrides=["workload.max_requests=null", *overrides])
    times = []
    for _ in range(3):
        engine = build_engine(cfg, record_steps=True)
        requests = build_workload(to_dict(cfg.workload), vocab_size=engine.executor.vocab_size,
                                  max_model_len=engine.config.max_model_len)
        cpu, wall = time.process_time(), time.perf_counter()
        engine.run(requests)
        times.append((time.process_time() - cpu, time.perf_counter() - wall))
    cpu, wall = statistics.median(c for c, _ in times), statistics.median(w for _, w in times)
    print(f"{' '.join(overrides) or '(defaults)'}: {len(requests)} requests, Engine.run median of 3: "
          f"CPU {cpu:.2f} s, wall {wall:.2f} s")
    print(json.dumps({"script": "trace_run_speed", "overrides": overrides, "requests": len(requests),
                      "cpu_s": [round(c, 3) for c, _ in times], "wall_s": [round(w, 3) for _, w in times],
                      "median_cpu_s": round(cpu, 3), "median_wall_s": round(wall, 3)}))


if __name__ == "__main__":
    main(sys.argv[1:])
