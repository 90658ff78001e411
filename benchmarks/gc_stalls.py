"""Who collects garbage in the middle of a live run, and for how long?

Serves kvrl-fidelity workloads live (vllm policy, the engine's defaults: ``engine.pause_gc`` on)
with a ``gc.callbacks`` hook that keeps the Python stack at the start of every collection and
prints, for each collection longer than ``--min-ms``, its generation, duration, whether automatic
collection was enabled, how many objects were frozen, and the stack that triggered it.

    python benchmarks/gc_stalls.py [--workloads long_prompts poisson] [--min-ms 20]
"""
from __future__ import annotations

import argparse
import gc
import time
import traceback

from kvrl import plugins
from kvrl.builder import warm_up
from kvrl.apps.live_schema import compose_fidelity
from kvrl.fidelity.pairs import pair_engine, shared_engine, workload_engine, workload_requests
from kvrl.executors.live_build import build_live


class Collections:
    """gc callback: (generation, seconds, enabled, frozen, stack) of every collection."""

    def __init__(self) -> None:
        self.rows: list[tuple] = []
        self._start = (0.0, [], True, 0)

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = (time.perf_counter(), traceback.format_stack(limit=14)[:-1], gc.isenabled(),
                           gc.get_freeze_count())
        else:
            t0, stack, enabled, frozen = self._start
            self.rows.append((info["generation"], time.perf_counter() - t0, enabled, frozen, stack))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workloads", nargs="+", default=["long_prompts", "poisson"])
    ap.add_argument("--model", default="qwen3-0.6b")
    ap.add_argument("--min-ms", type=float, default=20.0)
    ap.add_argument("--max-requests", type=int, default=0)
    args = ap.parse_args()
    plugins.load_entry_points()
    cfg = compose_fidelity([f"model={args.model}"])
    live = build_live(cfg["model"], cfg["live"])
    base = shared_engine(cfg, live)
    print(f"before anything: gc enabled {gc.isenabled()}, frozen {gc.get_freeze_count()}, "
          f"thresholds {gc.get_threshold()}")
    hook = Collections()
    gc.callbacks.append(hook)
    for name in args.workloads:
        w = cfg["workloads"][name]
        ecfg = workload_engine(base, w)
        reqs = workload_requests(w, args.max_requests, live.vocab_size, live.max_model_len)
        warm_up(live, ecfg, 256 if live.device.type == "cuda" else 4, seed=101)
        hook.rows.clear()
        eng = pair_engine(ecfg, live, cfg["policies"]["vllm"], cfg["slo"])
        t0 = time.perf_counter()
        eng.run(reqs)
        wall = time.perf_counter() - t0
        long = [r for r in hook.rows if r[1] * 1e3 >= args.min_ms]
        total = sum(r[1] for r in hook.rows)
        print(f"\n=== {name}: {wall:.1f} s live, {len(hook.rows)} collections, {total * 1e3:.1f} ms in all, "
              f"{len(long)} over {args.min_ms:g} ms; after the run: gc enabled {gc.isenabled()}, "
              f"frozen {gc.get_freeze_count()}")
        for gen, dt, enabled, frozen, stack in long:
            print(f"--- generation {gen}, {dt * 1e3:.1f} ms, automatic collection enabled {enabled}, frozen {frozen}")
            print("".join(stack[-10:]))


if __name__ == "__main__":
    main()
