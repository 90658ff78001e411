"""How the engine's run time grows with the number of requests (issue #15, "Load").

Serves ``synthetic`` workloads (kvrl-run's defaults: prompts uniform in [32, 512], outputs
lognormal with mean 128; qwen3-0.6b on the h200 cost model; fcfs / fixed / lifo / hash_lru;
67,335 GPU blocks as kvrl-run sizes them on an H200) with all requests at t=0 (``offline``) or
Poisson arrivals at ``--rate`` per second, and prints the CPU seconds of ``Engine.run`` (workload
building excluded) per size as a Markdown table, then all rows as one JSON line (with the commit of
the kvrl tree that ran, for re-timing on a quiet machine). CPU time, not wall time, so that other
work on a shared machine does not inflate the numbers; the process is single-threaded.

    python scripts/engine_growth.py --sizes 5000 20000 40000 --processes offline poisson
    python scripts/engine_growth.py --sizes 40000 --processes offline --phases   # where the time goes
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import subprocess
import sys
import time

# the kvrl of this script's own checkout, not whichever one the environment installed (timing an
# older checkout with its own script must time that checkout)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kvrl  # noqa: E402

from kvrl.builder import build_engine  # noqa: E402
from kvrl.executors.hardware import DEVICES, MODEL_SHAPES  # noqa: E402
from kvrl.executors.sim import SimExecutor  # noqa: E402
from kvrl.workloads import build_workload  # noqa: E402


#: engine phases --phases times (class, method): the time of a nested one is also in its caller's
PHASES = (("kvrl.engine.loop:ServingLoop", "_arrivals"), ("kvrl.engine.planning:PlanningMixin", "_schedule_running"),
          ("kvrl.engine.planning:PlanningMixin", "_schedule_waiting"),
          ("kvrl.engine.paged_allocator:PagedAllocator", "match_prefix"),
          ("kvrl.engine.paged_allocator:PagedAllocator", "admit"), ("kvrl.executors.sim:SimExecutor", "execute"),
          ("kvrl.engine.accounting:AccountingMixin", "apply"),
          ("kvrl.engine.paged_allocator:PagedAllocator", "on_computed_batch"),
          ("kvrl.engine.accounting:AccountingMixin", "_finish"))


def time_phases() -> dict[str, float]:
    """Wrap each of :data:`PHASES` in a process-time timer (a few percent of overhead); returns the
    dict of seconds per phase that the timers fill."""
    import importlib
    totals: dict[str, float] = {}

    def timed(fn, name):
        def call(*args, **kwargs):
            t0 = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                totals[name] = totals.get(name, 0.0) + time.process_time() - t0
        return call

    for where, method in PHASES:
        module, cls = where.split(":")
        owner = getattr(importlib.import_module(module), cls)
        setattr(owner, method, timed(getattr(owner, method), f"{cls}.{method}"))
    return totals


def measure(num_requests: int, process: str, rate: float, prefix_cache: str = "hash_lru") -> dict:
    shape = MODEL_SHAPES["qwen3-0.6b"]
    engine = build_engine({"engine": dict(num_blocks=67335, block_size=16, num_cpu_blocks=2340,
                                          max_model_len=shape.max_model_len),
                           "scheduler": {"name": "fcfs"}, "watermark": {"name": "fixed"}, "eviction": {"name": "lifo"},
                           "prefix_cache": {"name": prefix_cache}},
                          executor=SimExecutor(shape, DEVICES["h200"]), record_steps=False)
    workload = {"name": "synthetic", "num_requests": num_requests, "arrival": {"process": process, "rate": rate}}
    requests = build_workload(workload, vocab_size=shape.vocab_size, max_model_len=shape.max_model_len)
    cpu = time.process_time()
    summary = engine.run(requests)
    return {"requests": num_requests, "process": process, "cpu_s": time.process_time() - cpu,
            "finished": summary["finished"], "duration_s": summary["duration_s"]}


def tree_commit() -> str:
    """The commit of the kvrl checkout being run (with ``+dirty`` for uncommitted changes), or
    ``"unknown"`` outside a git checkout."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(kvrl.__file__)))
    try:
        head = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no", "kvrl"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[5000, 20000, 40000, 100000, 200000])
    parser.add_argument("--processes", nargs="+", default=["offline", "poisson"], choices=["offline", "poisson"])
    parser.add_argument("--prefix-cache", default="hash_lru", help="prefix_cache plugin (none: no block hashing)")
    parser.add_argument("--rate", type=float, default=300.0, help="Poisson arrivals per second (above the ~190 the engine serves, so a queue builds)")
    parser.add_argument("--phases", action="store_true",
                        help="also time the engine's phases (process-time timers; summed over all sizes, printed last)")
    args = parser.parse_args()
    logging.getLogger("kvrl").setLevel(logging.ERROR)
    phases = time_phases() if args.phases else None
    print("| arrivals | requests | CPU s of Engine.run | us per request | finished | simulated s |")
    print("|---|---:|---:|---:|---:|---:|")
    rows = []
    for process in args.processes:
        for n in args.sizes:
            r = measure(n, process, args.rate, args.prefix_cache)
            rows.append({**r, "cpu_s": round(r["cpu_s"], 3), "duration_s": round(r["duration_s"], 3)})
            print(f"| {process} | {n:,} | {r['cpu_s']:.1f} | {1e6 * r['cpu_s'] / n:.0f} | {r['finished']:,} | "
                  f"{r['duration_s']:,.0f} |", flush=True)
    print(json.dumps({"script": "engine_growth", "commit": tree_commit(), "python": platform.python_version(),
                      "prefix_cache": args.prefix_cache, "rate": args.rate, "rows": rows}))
    if phases is not None:
        print("CPU s per phase (a nested phase's time is also in its caller's):",
              ", ".join(f"{name} {seconds:.1f}" for name, seconds in phases.items()))


if __name__ == "__main__":
    main()
