"""Is an eager (mixed) step's time a function of the batch? A small mixed step is bound by the host
that launches its kernels, and run 31 saw the same batch take ~4 ms at one time and ~8 ms minutes
later on the same host. This executes a few fixed batches over and over for ``--seconds`` per
phase and records, per execution: wall seconds, the process's CPU seconds (``time.process_time``;
the end-of-step synchronisation spins, so it tracks wall time whether the host or the GPU is slow),
the CPU it ran on and that CPU's clock where the machine exposes it. Phases alternate (``--phases``):
``free``, the scheduler places the thread; ``pinned``, the thread is pinned to the CPU it was on
(``os.sched_setaffinity``). CUDA-graph decode (GPU-bound) is the control. Two loads without the model
tell the host from the launch path: ``cpu_only`` (pure Python and small numpy work, no GPU) and
``launch_only`` (400 one-element CUDA ops, then a synchronisation: launch-bound GPU work). If
``cpu_only`` slows down in the same windows as the mixed steps, the host's CPU is slower then.

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


def cpu_only() -> None:
    """About 1-2 ms of the host's Python and numpy work, no GPU (the same work every call)."""
    acc = 0
    for i in range(20000):
        acc += i * i % 7
    np.sort(np.arange(20000, 0, -1))


def launch_only(x) -> None:
    """400 one-element CUDA ops and a synchronisation: launch-bound GPU work without the model."""
    import torch

    for _ in range(400):
        x.add_(1.0)
    if x.is_cuda:
        torch.cuda.synchronize(x.device)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen3-0.6b")
    ap.add_argument("--seconds", type=float, default=30.0, help="per phase")
    ap.add_argument("--phases", type=int, default=2, help="free, pinned, free, pinned, ... (this many)")
    ap.add_argument("--out", default="")
    args = ap.parse_args()

    import torch

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
    runs = {name: (lambda b=b: ex.execute(b)) for name, b in batches.items()}
    runs["cpu_only"] = cpu_only
    tiny = torch.zeros(1, device=ex.device)
    runs["launch_only"] = lambda: launch_only(tiny)
    for run in runs.values():
        for _ in range(3):
            run()
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
            for name, run in runs.items():
                c0, w0 = time.process_time(), time.perf_counter()
                run()
                w1, c1 = time.perf_counter(), time.process_time()
                cpu = current_cpu()
                rows.append({"phase": phase, "batch": name, "t": w1 - w0, "cpu_s": c1 - c0, "cpu": cpu,
                             "khz": cpu_khz(cpu), "at": w1})
    os.sched_setaffinity(0, cpus)
    t0 = rows[0]["at"]
    print("| phase | batch | runs | wall ms p10 / p50 / p90 | CPU ms p50 | share of runs > 1.5x the p10 | CPUs used | clock MHz p50 |")
    print("|---|---|---:|---|---:|---:|---:|---:|")
    for phase in ("free", "pinned"):
        for name in runs:
            r = [x for x in rows if x["phase"] == phase and x["batch"] == name]
            if not r:
                continue
            t = np.asarray([x["t"] for x in r]) * 1e3
            c = np.asarray([x["cpu_s"] for x in r]) * 1e3
            p10, p50, p90 = np.percentile(t, [10, 50, 90])
            khz = np.asarray([x["khz"] for x in r])
            print(f"| {phase} | {name} | {len(r)} | {p10:.2f} / {p50:.2f} / {p90:.2f} | {np.median(c):.2f} | "
                  f"{np.mean(t > 1.5 * p10):.0%} | {len({x['cpu'] for x in r})} | "
                  f"{np.nanmedian(khz) / 1e3 if np.isfinite(khz).any() else float('nan'):.0f} |")
    print("\nmedian wall ms per 2 s window (phase f free, p pinned): mixed_mid / cpu_only / launch_only / decode_graph")
    names = ("mixed_mid", "cpu_only", "launch_only", "decode_graph")
    for w in range(int((rows[-1]["at"] - t0) // 2) + 1):
        sel = [x for x in rows if w * 2 <= x["at"] - t0 < (w + 1) * 2]
        if sel:
            cells = [np.median([x["t"] for x in sel if x["batch"] == n] or [np.nan]) * 1e3 for n in names]
            print(f"  {w * 2:4d}s {sel[0]['phase'][0]} " + " ".join(f"{c:6.2f}" for c in cells))
    windows = [[np.median([x["t"] for x in rows if x["batch"] == n and w * 2 <= x["at"] - t0 < (w + 1) * 2] or [np.nan])
                for n in names] for w in range(int((rows[-1]["at"] - t0) // 2) + 1)]
    a = np.asarray(windows, dtype=float)
    a = a[np.isfinite(a).all(axis=1)]
    if len(a) > 2:
        print("correlation over windows of mixed_mid with " + ", ".join(
            f"{n} {np.corrcoef(a[:, 0], a[:, i])[0, 1]:+.2f}" for i, n in enumerate(names) if i))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(rows, fh)


if __name__ == "__main__":
    main()
