"""Length distributions for prompts, outputs and suffixes.

``dist`` is one of:

* ``constant``: always ``mean``.
* ``uniform``: integers in ``[low, high]`` (both inclusive).
* ``lognormal``: rounded lognormal whose *mean* is ``mean`` (not the mean of the log); its spread is
  ``sigma`` (std of the log) or, when ``sigma`` is None, the coefficient of variation ``cv``
  (``sigma**2 = log(1 + cv**2)``).
* ``empirical``: resampled with replacement from the ``field`` (``prompt`` or ``output``) lengths of
  ``trace`` (``azure_code`` = the packaged trace, or a path to any supported trace file).

Every sample is at least 1; for the non-uniform kinds ``low`` / ``high`` (if set) clamp the result.
"""
from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass
from typing import Any, Mapping, Optional

import numpy as np

DISTS = ("constant", "uniform", "lognormal", "empirical")
KEYS = ("dist", "low", "high", "mean", "sigma", "cv", "trace", "field")
FIELDS = ("prompt", "output")


@dataclass(frozen=True)
class LengthDist:
    dist: str = "constant"
    low: Optional[int] = None
    high: Optional[int] = None
    mean: Optional[float] = None
    sigma: Optional[float] = None
    cv: Optional[float] = None
    trace: Optional[str] = None
    field: str = "prompt"

    def __post_init__(self):
        d = self.dist
        if d not in DISTS:
            raise ValueError(f"dist must be one of {DISTS}, got {d!r}")
        for k in ("low", "high"):
            v = getattr(self, k)
            if v is not None and v < 1:
                raise ValueError(f"{k} must be >= 1, got {v!r}")
        if self.low is not None and self.high is not None and self.low > self.high:
            raise ValueError(f"low ({self.low}) must be <= high ({self.high})")
        if d == "uniform" and (self.low is None or self.high is None):
            raise ValueError("uniform lengths need low and high")
        if d in ("constant", "lognormal"):
            if self.mean is None or not (math.isfinite(self.mean) and self.mean >= 1):
                raise ValueError(f"{d} lengths need mean >= 1, got {self.mean!r}")
        if d == "constant" and not (self.low or 1) <= round(self.mean) <= (self.high or math.inf):
            raise ValueError(f"the constant length {self.mean:g} lies outside [low={self.low}, high={self.high}], "
                             f"which would clamp every sample (set low/high to null, e.g. when switching from "
                             f"a uniform default)")
        if d == "lognormal":
            if self.sigma is not None:
                if not (math.isfinite(self.sigma) and self.sigma >= 0):
                    raise ValueError(f"sigma must be a finite number >= 0, got {self.sigma!r}")
            elif self.cv is None or not (math.isfinite(self.cv) and self.cv >= 0):
                raise ValueError(f"lognormal lengths need sigma or cv >= 0, got cv={self.cv!r}")
        if d == "empirical":
            if not self.trace:
                raise ValueError("empirical lengths need trace (azure_code or a file path)")
            if self.field not in FIELDS:
                raise ValueError(f"field must be one of {FIELDS}, got {self.field!r}")

    @classmethod
    def from_spec(cls, spec: "LengthDist | Mapping[str, Any] | int") -> "LengthDist":
        """From a mapping with keys in :data:`KEYS` (missing = None), or an int (constant)."""
        if isinstance(spec, LengthDist):
            return spec
        if isinstance(spec, (int, np.integer)) and not isinstance(spec, bool):
            return cls("constant", mean=float(spec))
        if not isinstance(spec, Mapping):
            raise ValueError(f"a length distribution must be a mapping, got {spec!r}")
        unknown = [k for k in spec if k not in KEYS]
        if unknown:
            raise ValueError(f"unknown length-distribution key {unknown[0]!r} (known: {KEYS})")
        kw = {k: v for k, v in spec.items() if v is not None}
        return cls(**kw)

    @property
    def sigma_value(self) -> float:
        if self.sigma is not None:
            return float(self.sigma)
        return math.sqrt(math.log1p(float(self.cv) ** 2))

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` lengths as an int64 array, each >= 1."""
        n = int(n)
        d = self.dist
        if d == "uniform":
            return rng.integers(self.low, self.high + 1, size=n, dtype=np.int64)
        if d == "constant":
            out = np.full(n, int(round(self.mean)), dtype=np.int64)
        elif d == "lognormal":
            s = self.sigma_value
            mu = math.log(self.mean) - 0.5 * s * s
            out = np.rint(rng.lognormal(mu, s, size=n)).astype(np.int64)
        else:
            values = empirical_lengths(self.trace, self.field)
            if values.size == 0:
                raise ValueError(f"trace {self.trace!r} has no requests to resample")
            out = rng.choice(values, size=n, replace=True)
        lo = max(1, self.low or 1)
        hi = self.high if self.high is not None else np.iinfo(np.int64).max
        return np.clip(out, lo, hi)

    @property
    def expected(self) -> float:
        """The mean of the distribution before clamping (uniform/constant/lognormal: exact)."""
        if self.dist == "uniform":
            return (self.low + self.high) / 2.0
        if self.dist in ("constant", "lognormal"):
            return float(self.mean)
        return float(empirical_lengths(self.trace, self.field).mean())

    def upper(self) -> Optional[int]:
        """The largest possible value, if bounded."""
        if self.dist == "constant":
            v = int(round(self.mean))
            return min(v, self.high) if self.high is not None else v
        if self.high is not None:
            return self.high
        if self.dist == "empirical":
            return int(empirical_lengths(self.trace, self.field).max())
        return None


def empirical_lengths(trace: str, field: str = "prompt") -> np.ndarray:
    """The prompt or output lengths of a trace (``azure_code`` or a file path), cached."""
    from .formats import PACKAGED, packaged_trace_path

    path = packaged_trace_path(trace) if trace in PACKAGED else os.fspath(trace)
    try:
        mtime = os.stat(path).st_mtime_ns
    except OSError as e:
        raise ValueError(f"empirical lengths: cannot read trace {trace!r} ({e.strerror})") from None
    return _lengths_cached(path, mtime, field)


@functools.lru_cache(maxsize=16)
def _lengths_cached(path: str, mtime: int, field: str) -> np.ndarray:
    from .azure import read_azure_csv
    from .burstgpt import read_burstgpt_csv
    from .formats import detect_format
    from .jsonl import load_jsonl
    from .mooncake import read_mooncake

    fmt = detect_format(path)
    if fmt == "mooncake":
        t = read_mooncake(path)
        out = t.prompt_len if field == "prompt" else t.output_len
    elif fmt == "jsonl":
        reqs = load_jsonl(path, vocab_size=1 << 31)
        vals = [r.prompt_len if field == "prompt" else r.output_len for r in reqs]
        out = np.array(vals, dtype=np.int64)
    else:
        t = read_azure_csv(path) if fmt == "azure" else read_burstgpt_csv(path)
        out = np.maximum(t.prompt_len if field == "prompt" else t.output_len, 1)
    out.flags.writeable = False
    return out
