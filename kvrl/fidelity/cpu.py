"""What the machine's CPUs did during a live run, sampled every few steps: was the engine's thread
waiting for a CPU, were the VM's CPUs stolen by the hypervisor, how busy were the CPUs, and how
fast the host ran a fixed piece of Python (:func:`~kvrl.executors.host_speed.host_probe_s`).

The fidelity replay shows the engine's time between steps and the CPU-launched mixed steps slowing
down together by up to 1.5-1.9x for seconds at a time (docs/fidelity.md, "Replay error before and
after"), which no step feature predicts. These counters say whether such windows coincide with
CPU contention. Linux ``/proc`` only; elsewhere nothing is recorded (the columns are NaN).

On the lent H200 VMs the windows are the vCPU itself running about 1.7x slower (docs/fidelity.md,
"Run 31"): a pure-Python loop slows with the steps while no steal is reported. ``host_slow``
records that directly: the probe's time over the run's fastest tenth of probes.
"""
from __future__ import annotations

import math
import os
import time
from typing import Optional

from kvrl.executors.host_speed import HostMeter

#: the replay.csv columns (per step: the ratios over the sampling window that holds it)
CPU_COLUMNS = ("cpu_wait", "cpu_steal", "cpu_busy", "host_slow")


#: a step whose window has ``host_slow`` at or above this ran on a slow host (run 31: 1.6-1.8x)
HOST_SLOW_THRESHOLD = 1.4


def cpu_counters() -> Optional[tuple[float, float, float, float]]:
    """(this thread's seconds waiting on a run queue, the machine's stolen CPU seconds, its busy
    (non-idle) CPU seconds, its total CPU seconds), cumulative; None without ``/proc/stat``; the
    wait NaN where the kernel keeps no scheduler statistics (``/proc/thread-self/schedstat``)."""
    try:
        with open("/proc/stat") as f:
            vals = [int(v) for v in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    try:
        with open("/proc/thread-self/schedstat") as f:
            wait_ns = float(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        wait_ns = math.nan
    hz = float(os.sysconf("SC_CLK_TCK"))
    vals += [0] * (8 - len(vals))
    total = float(sum(vals))
    idle = vals[3] + vals[4]          # idle + iowait
    return wait_ns / 1e9, vals[7] / hz, (total - idle) / hz, total / hz


class CpuSampler:
    """Samples :func:`cpu_counters` and a host probe (:class:`~kvrl.executors.host_speed.HostMeter`)
    with the wall clock every ``every``
    steps (two small ``/proc`` reads and the probe, about 0.1 ms, in that step's gap) and turns
    consecutive samples into per-step window values (:data:`CPU_COLUMNS`): ``cpu_wait`` the share of
    wall time this thread was runnable but not running, ``cpu_steal`` and ``cpu_busy`` the shares of
    all CPU time that was stolen / not idle, ``host_slow`` the larger of the window's two probes
    over the run's 10th-percentile probe (1 on a fast host; about 1.7 in run 31's slow windows)."""

    def __init__(self, every: int = 64) -> None:
        if every < 1:
            raise ValueError(f"CpuSampler every={every}: must be at least 1")
        self.every = every
        self.samples: list[tuple[int, float, tuple]] = []
        #: the probes, and the thread's scheduler times between start() and stop(): the live side
        #: of the sim's ``host_speed`` (kvrl.executors.host_speed)
        self.meter = HostMeter()

    def on_step(self, step_index: int) -> None:
        if step_index % self.every == 0:
            c = cpu_counters()
            if c is None:                      # no /proc: counters NaN, the probe still runs
                c = (math.nan,) * 4
            probe = self.meter.probe()
            self.samples.append((step_index, time.perf_counter(), (*c, probe)))

    def columns(self, num_steps: int) -> list[dict[str, float]]:
        """Per step, the :data:`CPU_COLUMNS` of the window between the samples around it (a sample
        is taken after its step; NaN outside the sampled windows and without ``/proc``)."""
        out = [dict.fromkeys(CPU_COLUMNS, math.nan) for _ in range(num_steps)]
        probes = sorted(c[4] for _, _, c in self.samples)
        fast = probes[len(probes) // 10] if probes else math.nan
        for (i0, t0, c0), (i1, t1, c1) in zip(self.samples, self.samples[1:]):
            wall, cpu_total = t1 - t0, c1[3] - c0[3]
            row = {"cpu_wait": (c1[0] - c0[0]) / wall if wall > 0 else math.nan,
                   "cpu_steal": (c1[1] - c0[1]) / cpu_total if cpu_total > 0 else math.nan,
                   "cpu_busy": (c1[2] - c0[2]) / cpu_total if cpu_total > 0 else math.nan,
                   "host_slow": max(c0[4], c1[4]) / fast if fast > 0 else math.nan}
            for i in range(i0 + 1, min(i1 + 1, num_steps)):   # a sample follows its step: steps i0+1 .. i1
                out[i] = dict(row)
        return out
