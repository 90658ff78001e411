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


def probe_stats(probes: Sequence[float]) -> Optional[dict]:
    """``{"mean_s", "median_s", "p10_s", "p90_s", "n"}`` of ``probes`` (seconds; non-finite and
    non-positive ones dropped); None when none is left. The mean is what the sim's host terms
    follow (:data:`RATIO_STAT`): a probe descheduled for a few ms counts in it as the engine's
    gaps that were descheduled count in their total; the median shows a slow CPU alone."""
    vals = sorted(p for p in probes if math.isfinite(p) and p > 0)
    if not vals:
        return None
    q = lambda f: vals[min(int(f * len(vals)), len(vals) - 1)]
    mid = len(vals) // 2
    median = vals[mid] if len(vals) % 2 else 0.5 * (vals[mid - 1] + vals[mid])
    return {"mean_s": sum(vals) / len(vals), "median_s": median, "p10_s": q(0.1), "p90_s": q(0.9), "n": len(vals)}


#: the statistic of :func:`probe_stats` whose live / profile ratio is the sim's ``host_speed``
RATIO_STAT = "mean_s"


def host_speed_ratio(live: Optional[dict], profile: Optional[dict]) -> tuple[float, str]:
    """(the factor the sim's host terms take for a live host whose probes are ``live``, given the
    profile's ``profile``, both :func:`probe_stats`; why, in a few words). The factor is the ratio
    of their :data:`RATIO_STAT` (above 1: the live host is slower than the profiling one); 1.0 when
    either is missing or the ratio lies outside :data:`PLAUSIBLE`."""
    if not profile:
        return 1.0, "the profile recorded no host probe (profiled before session 20)"
    if not live:
        return 1.0, "the live run recorded no host probe"
    a, b = live[RATIO_STAT], profile[RATIO_STAT]
    ratio = a / b
    lo, hi = PLAUSIBLE
    if not lo <= ratio <= hi:
        return 1.0, f"host probe ratio {ratio:.2f} is outside {lo}-{hi}: not comparable, not applied"
    return ratio, f"live probe {a * 1e6:.0f} us / profile probe {b * 1e6:.0f} us ({RATIO_STAT.removesuffix('_s')})"


class HostProbes:
    """Engine callback (:mod:`kvrl.engine.callbacks`) that times :func:`host_probe_s` after every
    ``every``-th step of a live run (about 0.1 ms each, in that step's gap): the live side of
    :func:`host_speed_ratio` for ``kvrl-run``/``kvrl-eval`` with the live backend."""

    def __init__(self, every: int = 16) -> None:
        if every < 1:
            raise ValueError(f"HostProbes every={every}: must be at least 1")
        self.every = every
        self.probes: list[float] = []
        self._steps = 0

    def on_step(self, event) -> bool:
        self._steps += 1
        if self._steps % self.every == 0:
            self.probes.append(host_probe_s())
        return True
