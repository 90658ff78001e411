"""How fast the host runs Python right now, and what that does to the sim's host terms.

A step-time profile prices the engine's own time between steps (its host terms: scheduling,
block tables, sampling bookkeeping; all Python) as its engine runs measured it, on the host that
profiled and at that host's speed. The lent GPU VMs differ in CPU speed between machines and, in
windows of seconds, within one (docs/fidelity.md, runs 30-32): the fresh profile of run 32 priced
the host time of live runs two minutes later on the same machine 35% high.

:func:`host_probe_s` times a fixed piece of pure Python. ``kvrl-profile`` records the statistics
of the probes taken while its engine runs (``meta["host_probe"]``, :func:`probe_stats`), a live run
records its own (``kvrl-fidelity``: ``live_host_probe`` per pair), and :func:`host_speed_ratio` of
the two is what the sim's ``host_speed`` multiplies the host terms by
(:class:`~kvrl.executors.sim.SimExecutor`). The probe only compares hosts running the same Python
build; a ratio outside :data:`PLAUSIBLE` is refused (1.0, with the reason), since it means the
probe measured something else.
"""
from __future__ import annotations

import math
import statistics
import time
from typing import Optional, Sequence

#: loop iterations of one probe: about 50-100 us on a GPU host's CPU
PROBE_ITERATIONS = 2000
#: host-speed ratios taken as a measurement; outside, the probe is not comparable (another
#: interpreter, a debugger, a machine under a load the engine did not see)
PLAUSIBLE = (0.25, 4.0)


def host_probe_s(iterations: int = PROBE_ITERATIONS) -> float:
    """Wall seconds of a fixed piece of integer Python: the host's speed right now."""
    t0 = time.perf_counter()
    acc = 0
    for i in range(iterations):
        acc += i * i % 7
    return time.perf_counter() - t0


def thread_sched_s() -> Optional[tuple[float, float]]:
    """(seconds this thread has run on a CPU, seconds it has waited runnable on a run queue),
    cumulative, from ``/proc/thread-self/schedstat``; None where the kernel keeps no scheduler
    statistics (not Linux, or schedstats off)."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            run_ns, wait_ns = (float(v) for v in f.read().split()[:2])
    except (OSError, ValueError):
        return None
    return run_ns / 1e9, wait_ns / 1e9


def probe_stats(probes: Sequence[float], sched: Optional[tuple[float, float]] = None) -> Optional[dict]:
    """What one run (or several, pooled) measured of the host: ``mean_s``, ``median_s``, ``p10_s``,
    ``p90_s`` and ``n`` of ``probes`` (seconds; non-finite and non-positive ones dropped), and with
    ``sched`` (the engine thread's on-CPU and run-queue seconds over the runs, :class:`HostMeter`)
    ``cpu_s``, ``wait_s`` and ``contention`` = 1 + wait / on-CPU: how much longer the thread's CPU
    work took for waiting on other processes. None when no probe is left."""
    vals = sorted(p for p in probes if math.isfinite(p) and p > 0)
    if not vals:
        return None
    q = lambda f: vals[min(int(f * len(vals)), len(vals) - 1)]
    out = {"mean_s": statistics.fmean(vals), "median_s": statistics.median(vals), "p10_s": q(0.1), "p90_s": q(0.9),
           "n": len(vals)}
    if sched is not None and sched[0] > 0:
        out.update(cpu_s=sched[0], wait_s=sched[1], contention=1.0 + sched[1] / sched[0])
    return out


def host_speed_ratio(live: Optional[dict], profile: Optional[dict]) -> tuple[float, str]:
    """(the factor the sim's host terms take for a live host that measured ``live``, given the
    profile's ``profile``, both :func:`probe_stats`; why, in a few words). The factor is the ratio of
    the median probes (how fast the CPU runs Python when the thread runs: a slower VM, a slow vCPU
    window) times the ratio of the engine thread's ``contention`` where both sides have it (how long
    it waited for a CPU that other processes held). Above 1: the live host is slower than the
    profiling one. 1.0 when either side is missing or the factor lies outside :data:`PLAUSIBLE`.

    Not the mean probe: a probe is ~0.1 ms and a descheduling lasts milliseconds, so the mean of the
    few dozen probes of a run swings by tens of percent with one of them (docs/fidelity.md, "Host
    speed"); the scheduler's own count of the thread's waits covers the whole run."""
    if not profile:
        return 1.0, "the profile recorded no host probe (profiled before session 20)"
    if not live:
        return 1.0, "the live run recorded no host probe"
    speed = host_speed_factor(live, profile)
    why = f"median probe {live['median_s'] * 1e6:.0f} us live / {profile['median_s'] * 1e6:.0f} us profiled"
    if "contention" in live and "contention" in profile:
        why += f", contention x{live['contention']:.2f} live / x{profile['contention']:.2f} profiled"
    lo, hi = PLAUSIBLE
    if not lo <= speed <= hi:
        return 1.0, f"host speed {speed:.2f} ({why}) is outside {lo}-{hi}: not comparable, not applied"
    return speed, why


def host_speed_factor(live: Optional[dict], profile: Optional[dict]) -> float:
    """The factor of :func:`host_speed_ratio` before its plausibility check (NaN where either side
    is missing): what the two measurements say, recorded whether or not it is applied."""
    if not live or not profile:
        return math.nan
    speed = live["median_s"] / profile["median_s"]
    if "contention" in live and "contention" in profile:
        speed *= live["contention"] / profile["contention"]
    return speed


class HostMeter:
    """The host's speed over one or more runs of the engine thread: :func:`host_probe_s` probes
    taken by :meth:`probe`, and the thread's scheduler times between :meth:`start` and :meth:`stop`
    (summed over start/stop pairs); :meth:`stats` is their :func:`probe_stats`."""

    def __init__(self) -> None:
        self.probes: list[float] = []
        self.sched: Optional[tuple[float, float]] = None
        self._at_start: Optional[tuple[float, float]] = None

    def start(self) -> None:
        self._at_start = thread_sched_s()

    def stop(self) -> None:
        end, begin = thread_sched_s(), self._at_start
        if end is not None and begin is not None:
            run, wait = self.sched or (0.0, 0.0)
            self.sched = (run + end[0] - begin[0], wait + end[1] - begin[1])
        self._at_start = None

    def probe(self) -> float:
        """Time one probe, keep it and return it (seconds)."""
        p = host_probe_s()
        self.probes.append(p)
        return p

    def merge(self, other: "HostMeter") -> None:
        """Pool ``other``'s probes and scheduler times into this meter (the live runs of one pair)."""
        self.probes += other.probes
        if other.sched is not None:
            run, wait = self.sched or (0.0, 0.0)
            self.sched = (run + other.sched[0], wait + other.sched[1])

    def stats(self) -> Optional[dict]:
        return probe_stats(self.probes, self.sched)


class HostProbes:
    """Engine callback (:mod:`kvrl.engine.callbacks`) that keeps a :class:`HostMeter` over a live
    run, probing after every ``every``-th step (about 0.1 ms, in that step's gap): the live side of
    :func:`host_speed_ratio` for ``kvrl-run``/``kvrl-eval`` with the live backend."""

    def __init__(self, every: int = 16) -> None:
        if every < 1:
            raise ValueError(f"HostProbes every={every}: must be at least 1")
        self.every = every
        self.meter = HostMeter()
        self._steps = 0

    def on_run_start(self, engine) -> None:
        self.meter.start()

    def on_run_end(self, engine) -> None:
        self.meter.stop()

    def on_step(self, event) -> bool:
        self._steps += 1
        if self._steps % self.every == 0:
            self.meter.probe()
        return True
