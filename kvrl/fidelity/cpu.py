"""What the machine's CPUs did during a live run, sampled every few steps: was the engine's thread
waiting for a CPU, were the VM's CPUs stolen by the hypervisor, how busy were the CPUs.

The fidelity replay shows the engine's time between steps and the CPU-launched mixed steps slowing
down together by up to 1.5-1.9x for seconds at a time (docs/fidelity.md, "Replay error before and
after"), which no step feature predicts. These counters say whether such windows coincide with
CPU contention. Linux ``/proc`` only; elsewhere nothing is recorded (the columns are NaN).
"""
from __future__ import annotations

import math
import os
import time
from typing import Optional

#: the replay.csv columns (per step: the ratios over the sampling window that holds it)
CPU_COLUMNS = ("cpu_wait", "cpu_steal", "cpu_busy")


def cpu_counters() -> Optional[tuple[float, float, float, float]]:
    """(this thread's seconds waiting on a run queue, the machine's stolen CPU seconds, its busy
    (non-idle) CPU seconds, its total CPU seconds), cumulative; None without ``/proc``."""
    try:
        with open("/proc/stat") as f:
            vals = [int(v) for v in f.readline().split()[1:9]]
        with open("/proc/thread-self/schedstat") as f:
            wait_ns = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    hz = float(os.sysconf("SC_CLK_TCK"))
    vals += [0] * (8 - len(vals))
    total = float(sum(vals))
    idle = vals[3] + vals[4]          # idle + iowait
    return wait_ns / 1e9, vals[7] / hz, (total - idle) / hz, total / hz


class CpuSampler:
    """Samples :func:`cpu_counters` with the wall clock every ``every`` steps (one read of two small
    ``/proc`` files, tens of microseconds, in that step's gap) and turns consecutive samples into
    per-step window ratios (:data:`CPU_COLUMNS`): ``cpu_wait`` the share of wall time this thread
    was runnable but not running, ``cpu_steal`` and ``cpu_busy`` the shares of all CPU time that
    was stolen / not idle."""

    def __init__(self, every: int = 64) -> None:
        if every < 1:
            raise ValueError(f"CpuSampler every={every}: must be at least 1")
        self.every = every
        self.samples: list[tuple[int, float, tuple]] = []

    def on_step(self, step_index: int) -> None:
        if step_index % self.every == 0:
            c = cpu_counters()
            if c is not None:
                self.samples.append((step_index, time.perf_counter(), c))

    def columns(self, num_steps: int) -> list[dict[str, float]]:
        """Per step, the :data:`CPU_COLUMNS` of the window between the samples around it (a sample
        is taken after its step; NaN outside the sampled windows and without ``/proc``)."""
        out = [dict.fromkeys(CPU_COLUMNS, math.nan) for _ in range(num_steps)]
        for (i0, t0, c0), (i1, t1, c1) in zip(self.samples, self.samples[1:]):
            wall, cpu_total = t1 - t0, c1[3] - c0[3]
            row = {"cpu_wait": (c1[0] - c0[0]) / wall if wall > 0 else math.nan,
                   "cpu_steal": (c1[1] - c0[1]) / cpu_total if cpu_total > 0 else math.nan,
                   "cpu_busy": (c1[2] - c0[2]) / cpu_total if cpu_total > 0 else math.nan}
            for i in range(i0 + 1, min(i1 + 1, num_steps)):   # a sample follows its step: steps i0+1 .. i1
                out[i] = dict(row)
        return out
