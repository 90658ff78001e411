#!/usr/bin/env python
"""Engine speed per block-identity hash (issue #14): serve the whole Azure code trace on the sim
(what ``kvrl-run workload.max_requests=null engine.prefix_hash=<h>`` serves) with each
``engine.prefix_hash`` and with ``prefix_cache=none``, in interleaved rounds, and print the median
wall and CPU seconds of ``Engine.run`` (workload building and start-up excluded) as Markdown.

    python scripts/prefix_hash_speed.py [--rounds 3] [override ...]   # e.g. prefix_cache=radix_lru

CPU seconds (``time.process_time``) are the figure to compare on a shared machine: wall time
there also counts the time other processes hold the cores.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

from hydra import compose, initialize_config_module

from kvrl import plugins
from kvrl.apps.schema import register_schemas
from kvrl.builder import build_engine, build_executor
from kvrl.workloads import build_workload

VARIANTS = {"xxh3": ["engine.prefix_hash=xxh3"], "blake2b (default)": ["engine.prefix_hash=blake2b"],
            "sha256": ["engine.prefix_hash=sha256"], "no prefix cache": ["prefix_cache=none"]}


def serve(overrides: list[str]) -> tuple[float, float, dict]:
    with initialize_config_module("kvrl.conf", version_base="1.3"):
        cfg = compose("run", overrides=["workload.max_requests=null", *overrides])
    executor = build_executor(cfg)
    requests = build_workload(cfg.workload, vocab_size=executor.vocab_size, max_model_len=executor.max_model_len)
    engine = build_engine(cfg, executor=executor, record_steps=False)
    wall, cpu = time.perf_counter(), time.process_time()
    summary = engine.run(requests)
    return time.perf_counter() - wall, time.process_time() - cpu, summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of conf/run.yaml for every variant")
    args = parser.parse_args()
    plugins.available("scheduler")
    register_schemas()
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in VARIANTS}
    first: dict = {}
    for _ in range(args.rounds):
        for name, extra in VARIANTS.items():
            wall, cpu, summary = serve([*args.overrides, *extra])
            times[name].append((wall, cpu))
            first.setdefault("summary", summary)
            if summary["finished"] != first["summary"]["finished"]:
                raise AssertionError(f"{name}: {summary['finished']} finished, not {first['summary']['finished']}")
            print(f"# {name}: wall {wall:.2f} s, cpu {cpu:.2f} s, load {os.getloadavg()[0]:.1f}", flush=True)
    s = first["summary"]
    print(f"\n{s['finished']} requests served, prefix hit rate {s['prefix_hit_rate']:.3f}; "
          f"median of {args.rounds} interleaved rounds\n")
    print("| engine.prefix_hash | Engine.run CPU (s) | vs xxh3 | Engine.run wall (s) |")
    print("|---|---|---|---|")
    base = statistics.median(c for _, c in times["xxh3"])
    for name, runs in times.items():
        cpu = statistics.median(c for _, c in runs)
        wall = statistics.median(w for w, _ in runs)
        print(f"| {name} | {cpu:.2f} | {100 * (cpu / base - 1):+.1f}% | {wall:.2f} |")


if __name__ == "__main__":
    main()
