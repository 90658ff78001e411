"""How fast the host runs Python right now, and what that does to the sim's host terms.

A step-time profile prices the engine's own time between steps (its host terms: scheduling,
block tables, sampling bookkeeping; all Python) as its engine runs measured it, on the host that
profiled and at that host's speed. The lent GPU VMs differ in CPU speed between machines and, in
windows of seconds, within one (docs/fidelity.md, runs 30-32): the fresh profile of run 32 priced
the host time of live runs two minutes later on the same machine 35% high.

:func:`host_probe_s` times a fixed piece of pure Python. ``kvrl-profile`` records the median probe
of its engine runs (``meta["host_probe_s"]``), a live run records its own (``kvrl-fidelity``:
``live_host_probe_s`` per pair), and :func:`host_speed_ratio` of the two is what the sim's
``host_speed`` multiplies the host terms by (:class:`~kvrl.executors.sim.SimExecutor`). The probe
only compares hosts running the same Python build; a ratio outside :data:`PLAUSIBLE` is refused
(1.0, with the reason), since it means the probe measured something else.
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


def median_probe_s(probes: Sequence[float]) -> float:
    """The median of ``probes`` (seconds; NaN when there are none)."""
    vals = sorted(p for p in probes if math.isfinite(p) and p > 0)
    if not vals:
        return math.nan
    mid = len(vals) // 2
    return vals[mid] if len(vals) % 2 else 0.5 * (vals[mid - 1] + vals[mid])


def host_speed_ratio(live_probe_s: Optional[float], profile_probe_s: Optional[float]) -> tuple[float, str]:
    """(the factor the sim's host terms take for a live host whose median probe is
    ``live_probe_s``, given the profile's ``profile_probe_s``; why, in a few words). The factor is
    ``live / profile`` (above 1: the live host is slower than the profiling one); 1.0 when either
    probe is missing or the ratio lies outside :data:`PLAUSIBLE`."""
    ok = lambda x: x is not None and math.isfinite(x) and x > 0
    if not ok(profile_probe_s):
        return 1.0, "the profile recorded no host probe (profiled before session 20)"
    if not ok(live_probe_s):
        return 1.0, "the live run recorded no host probe"
    ratio = float(live_probe_s) / float(profile_probe_s)
    lo, hi = PLAUSIBLE
    if not lo <= ratio <= hi:
        return 1.0, f"host probe ratio {ratio:.2f} is outside {lo}-{hi}: not comparable, not applied"
    return ratio, f"live probe {live_probe_s * 1e6:.0f} us / profile probe {profile_probe_s * 1e6:.0f} us"
