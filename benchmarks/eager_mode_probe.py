"""Is an eager (mixed) step's time a function of the batch? A small mixed step is bound by the host
that launches its kernels, and run 31 saw the same batch take ~4 ms at one time and ~8 ms minutes
later on the same host. This executes a few fixed batches over and over for ``--seconds`` per
phase and records, per execution: wall seconds, the process's CPU seconds (``time.process_time``;
the end-of-step synchronisation spins, so it tracks wall time whether the host or the GPU is slow),
the CPU it ran on and that CPU's clock where the machine exposes it. Phases alternate (``--phases``):
``free``, the scheduler places the thread; ``pinned``, the thread is pinned to the CPU it was on
(``os.sched_setaffinity``). CUDA-graph decode (GPU-bound) is the control.

    python benchmarks/eager_mode_probe.py [--seconds 30] [--phases 2] [--out probe.json]
"""
from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np


def current_cpu() -> int:
    """The CPU this thread last ran on (field 39 of /proc/self/stat), -1 if unknown."""
    try:
        with open("/proc/self/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[36])
    except (OSError, IndexError, ValueError):
        return -1


def cpu_khz(cpu: int) -> float:
    """The current clock of ``cpu`` in kHz (cpufreq), NaN where the VM does not expose it."""
    try:
        with open(f"/sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_cur_freq") as fh:
            return float(fh.read())
    except (OSError, ValueError):
        return float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen3-0.6b")
    ap.add_argument("--seconds", type=float, default=30.0, help="per phase")
    ap.add_argument("--phases", type=int, default=2, help="free, pinned, free, pinned, ... (this many)")
    ap.add_argument("--out", default="")
    args = ap.parse_args()

    from kvrl.apps.live_schema import compose_fidelity
    from kvrl.executors.live_build import build_live
    from kvrl.profiling.batches import BatchFactory
    from kvrl.profiling.timing import fill_kv, warm_graphs

    cfg = compose_fidelity([f"model={args.model}"])
    ex = build_live(cfg["model"], cfg["live"])
    pool = 8192 if ex.device.type == "cuda" else 1024
    ex.allocate_kv(pool, 16, 16)
    fill_kv(ex, "zeros")
    factory = BatchFactory(pool, 16, ex.vocab_size, ex.max_model_len, seed=0)
    warm_graphs(ex, factory, 16)
    scale = 1 if ex.device.type == "cuda" else 8
    batches = {"mixed_small": factory.batch(decode_lens=[800 // scale] * 4, prefills=[(200 // scale, 0)]),
               "mixed_mid": factory.batch(decode_lens=[900 // scale] * 16, prefills=[(600 // scale, 0)]),
               "prefill": factory.batch(prefills=[(400 // scale, 0)]),
               "decode_graph": factory.batch(decode_lens=[900 // scale] * 16)}
    for b in batches.values():
        for _ in range(3):
            ex.execute(b)
    rows = []
    cpus = sorted(os.sched_getaffinity(0))
    phases = [("free", "pinned")[i % 2] for i in range(args.phases)]
    for phase in phases:
        if phase == "pinned":
            os.sched_setaffinity(0, {current_cpu() if current_cpu() in cpus else cpus[0]})
        else:
            os.sched_setaffinity(0, cpus)
        t_end = time.perf_counter() + args.seconds
        while time.perf_counter() < t_end:
            for name, b in batches.items():
                c0, w0 = time.process_time(), time.perf_counter()
                ex.execute(b)
                w1, c1 = time.perf_counter(), time.process_time()
                cpu = current_cpu()
                rows.append({"phase": phase, "batch": name, "t": w1 - w0, "cpu_s": c1 - c0, "cpu": cpu,
                             "khz": cpu_khz(cpu), "at": w1})
    os.sched_setaffinity(0, cpus)
    t0 = rows[0]["at"]
    print("| phase | batch | runs | wall ms p10 / p50 / p90 | CPU ms p50 | share of runs > 1.5x the p10 | CPUs used | clock MHz p50 |")
    print("|---|---|---:|---|---:|---:|---:|---:|")
    for phase in ("free", "pinned"):
        for name in batches:
            r = [x for x in rows if x["phase"] == phase and x["batch"] == name]
            t = np.asarray([x["t"] for x in r]) * 1e3
            c = np.asarray([x["cpu_s"] for x in r]) * 1e3
            p10, p50, p90 = np.percentile(t, [10, 50, 90])
            khz = np.asarray([x["khz"] for x in r])
            print(f"| {phase} | {name} | {len(r)} | {p10:.2f} / {p50:.2f} / {p90:.2f} | {np.median(c):.2f} | "
                  f"{np.mean(t > 1.5 * p10):.0%} | {len({x['cpu'] for x in r})} | "
                  f"{np.nanmedian(khz) / 1e3 if np.isfinite(khz).any() else float('nan'):.0f} |")
    print("\nmixed_mid wall ms over time (median per 2 s window; f free, p pinned):")
    r = [x for x in rows if x["batch"] == "mixed_mid"]
    for w in range(int((r[-1]["at"] - t0) // 2) + 1):
        sel = [x for x in r if w * 2 <= x["at"] - t0 < (w + 1) * 2]
        if sel:
            print(f"  {w * 2:4d}s {sel[0]['phase'][0]} {1e3 * np.median([x['t'] for x in sel]):6.2f}",
                  end="\n" if w % 6 == 5 else "")
    print()
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(rows, fh)


if __name__ == "__main__":
    main()
