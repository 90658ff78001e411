"""Arrival processes: Poisson, gamma (bursty), constant rate, offline (all at 0).

All processes put the first arrival at ``start_s`` (0 by default); later arrivals follow i.i.d.
inter-arrival gaps with mean ``1 / rate``. The gamma process has a coefficient of variation ``cv``
(``cv = 1`` is Poisson; ``cv > 1`` is burstier, ``cv < 1`` smoother).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

PROCESSES = ("poisson", "gamma", "constant", "offline")


def _gaps(process: str, n: int, rate: float, cv: float, rng: np.random.Generator) -> np.ndarray:
    if process == "poisson":
        return rng.exponential(1.0 / rate, size=n)
    if process == "gamma":
        shape = 1.0 / (cv * cv)
        return rng.gamma(shape, 1.0 / (rate * shape), size=n)
    if process == "constant":
        return np.full(n, 1.0 / rate)
    raise ValueError(f"unknown arrival process {process!r} (known: {', '.join(PROCESSES)})")


@dataclass(frozen=True)
class ArrivalProcess:
    """An arrival process: ``process`` in {poisson, gamma, constant, offline}, ``rate`` in
    requests/s (ignored when offline), ``cv`` the gamma coefficient of variation."""

    process: str = "poisson"
    rate: Optional[float] = 1.0
    cv: float = 1.0

    def __post_init__(self):
        if self.process not in PROCESSES:
            raise ValueError(f"arrival process must be one of {PROCESSES}, got {self.process!r}")
        if self.process != "offline":
            if self.rate is None or not (math.isfinite(self.rate) and self.rate > 0):
                raise ValueError(f"arrival rate must be a finite number > 0, got {self.rate!r}")
        if self.process == "gamma" and not (math.isfinite(self.cv) and self.cv > 0):
            raise ValueError(f"gamma arrival cv must be a finite number > 0, got {self.cv!r}")

    def times(self, n: int, rng: np.random.Generator, start_s: float = 0.0) -> np.ndarray:
        """``n`` sorted arrival times (float64)."""
        n = int(n)
        if n < 0:
            raise ValueError(f"number of arrivals must be >= 0, got {n}")
        if self.process == "offline" or n == 0:
            return np.full(n, float(start_s))
        gaps = _gaps(self.process, n - 1, float(self.rate), float(self.cv), rng)
        return start_s + np.concatenate([[0.0], np.cumsum(gaps)])

    def until(self, horizon_s: float, rng: np.random.Generator, start_s: float = 0.0) -> np.ndarray:
        """All arrivals in ``[start_s, horizon_s)`` (the first at ``start_s`` if it is before the
        horizon)."""
        if self.process == "offline":
            raise ValueError("an offline arrival process has no horizon; give a request count")
        if horizon_s <= start_s:
            return np.zeros(0)
        expect = (horizon_s - start_s) * float(self.rate)
        chunk = int(expect + 4.0 * math.sqrt(expect) * max(1.0, self.cv) + 16)
        gaps = _gaps(self.process, chunk, float(self.rate), float(self.cv), rng)
        times = start_s + np.concatenate([[0.0], np.cumsum(gaps)])
        while times[-1] < horizon_s:  # rare: extend with fresh gaps
            more = _gaps(self.process, chunk, float(self.rate), float(self.cv), rng)
            times = np.concatenate([times, times[-1] + np.cumsum(more)])
        return times[times < horizon_s]


def poisson_arrivals(n: int, rate: float, rng: np.random.Generator) -> np.ndarray:
    """``n`` Poisson arrivals at ``rate`` per second (first at 0)."""
    return ArrivalProcess("poisson", rate).times(n, rng)


def gamma_arrivals(n: int, rate: float, cv: float, rng: np.random.Generator) -> np.ndarray:
    """``n`` gamma-renewal arrivals: mean rate ``rate``, inter-arrival CV ``cv`` (first at 0)."""
    return ArrivalProcess("gamma", rate, cv).times(n, rng)


def constant_arrivals(n: int, rate: float) -> np.ndarray:
    """``n`` evenly spaced arrivals at ``rate`` per second (first at 0)."""
    return np.arange(int(n), dtype=np.float64) / float(rate)


def offline_arrivals(n: int) -> np.ndarray:
    """``n`` arrivals all at time 0 (an offline batch)."""
    return np.zeros(int(n), dtype=np.float64)
