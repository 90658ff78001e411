"""Transforms on a list of Requests sorted by arrival. None of them modifies its input.

Request ids, tenants and token ids are preserved; only arrival times, lengths or membership change.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional, Sequence

import numpy as np

from kvrl.engine.request import Request

from ._rng import make_rng

SPLITS = ("train", "val", "test")
DEFAULT_SPLIT_FRACTIONS = (0.6, 0.2, 0.2)


def _replace(r: Request, **changes) -> Request:
    return dataclasses.replace(r, **changes)


def scale_rate(requests: Sequence[Request], factor: float) -> list[Request]:
    """Speed the trace up by ``factor`` (arrival times divided by it; 2.0 = twice the rate)."""
    if not (math.isfinite(factor) and factor > 0):
        raise ValueError(f"rate_scale must be a finite number > 0, got {factor!r}")
    if factor == 1.0:
        return list(requests)
    out = []
    for r in requests:
        t = r.arrival_s / factor
        if not math.isfinite(t):
            raise ValueError(f"workload.rate_scale={factor!r} turns request {r.request_id!r}'s arrival time "
                             f"{r.arrival_s} s into {t}: use a rate_scale that keeps arrival times finite")
        out.append(_replace(r, arrival_s=t))
    return out


def time_window(requests: Sequence[Request], start_s: float = 0.0,
                duration_s: Optional[float] = None) -> list[Request]:
    """Requests arriving in ``[start_s, start_s + duration_s)`` (None = to the end), re-based so
    that ``start_s`` becomes time 0."""
    if not (math.isfinite(start_s) and start_s >= 0):
        raise ValueError(f"start_s must be a finite number >= 0, got {start_s!r}")
    if duration_s is not None and not (math.isfinite(duration_s) and duration_s > 0):
        raise ValueError(f"duration_s must be a finite number > 0 or None, got {duration_s!r}")
    end = math.inf if duration_s is None else start_s + duration_s
    return [_replace(r, arrival_s=r.arrival_s - start_s) if start_s else r
            for r in requests if start_s <= r.arrival_s < end]


def subsample(requests: Sequence[Request], fraction: float, seed: int = 0) -> list[Request]:
    """A seeded random subset of ``round(fraction * len)`` requests, kept in arrival order."""
    if not (0.0 < fraction <= 1.0):
        raise ValueError(f"subsample fraction must be in (0, 1], got {fraction!r}")
    n = len(requests)
    k = int(round(fraction * n))
    if k >= n:
        return list(requests)
    keep = np.sort(make_rng(seed, "subsample").choice(n, size=k, replace=False))
    return [requests[i] for i in keep.tolist()]


def with_length_hints(requests: Sequence[Request], sigma: float, seed: int = 0) -> list[Request]:
    """Each request with ``output_len_hint = max(1, round(output_len * exp(sigma * z)))``, ``z`` a
    standard normal drawn per request in list order from ``seed``: what a length predictor with
    log-error ``sigma`` would tell the server (0 = the exact length). Apply it to the whole trace
    before any window or split, so a request's hint does not depend on the window it is served in."""
    if not (math.isfinite(sigma) and sigma >= 0):
        raise ValueError(f"length_hint_sigma must be a finite number >= 0, got {sigma!r}")
    z = make_rng(seed, "length_hint").standard_normal(len(requests))
    return [_replace(r, output_len_hint=max(1, int(round(r.output_len * math.exp(sigma * float(zi))))))
            for r, zi in zip(requests, z)]


def take(requests: Sequence[Request], max_requests: Optional[int]) -> list[Request]:
    """The first ``max_requests`` requests by arrival (None = all)."""
    if max_requests is None:
        return list(requests)
    if isinstance(max_requests, bool) or int(max_requests) != max_requests or max_requests < 0:
        raise ValueError(f"max_requests must be an integer >= 0 or None, got {max_requests!r}")
    return list(requests[: int(max_requests)])


#: What a workload does with a request longer than ``max_model_len`` (``workload.overlong``).
OVERLONG = ("reject", "clip", "drop")


def _overlong_text(r: Request, m: int) -> str:
    return f"prompt ({r.prompt_len}) + output ({r.output_len}) tokens exceed max_model_len={m}"


def fit_lengths(requests: Sequence[Request], max_model_len: int,
                overlong: str = "reject") -> tuple[list[Request], list[tuple[str, str]]]:
    """Apply ``overlong`` to every request with ``prompt_len + output_len > max_model_len``.

    ``reject`` keeps it unchanged (the engine rejects it with the reason); ``clip`` follows vLLM: a
    prompt longer than ``max_model_len - 1`` is truncated to it (its head is kept, so shared prefixes
    survive), then the output is capped at what is left, as if generation stopped at the model
    length; the clipped request's ``clipped`` field says what changed (``"prompt 3000->255, output
    200->1"``). ``drop`` removes it. Returns ``(kept, dropped)`` with ``(request_id, reason)`` per
    dropped request.
    """
    if isinstance(max_model_len, bool) or int(max_model_len) != max_model_len or max_model_len < 2:
        raise ValueError(f"max_model_len must be an integer >= 2, got {max_model_len!r}")
    if overlong not in OVERLONG:
        raise ValueError(f"overlong must be one of {OVERLONG}, got {overlong!r}")
    m = int(max_model_len)
    out: list[Request] = []
    dropped: list[tuple[str, str]] = []
    for r in requests:
        if r.prompt_len + r.output_len <= m or overlong == "reject":
            out.append(r)
        elif overlong == "drop":
            dropped.append((r.request_id, f"{_overlong_text(r, m)} (workload.overlong=drop)"))
        else:
            p = min(r.prompt_len, m - 1)
            o = min(r.output_len, m - p)
            out.append(_replace(r, prompt_token_ids=r.prompt_token_ids[:p], output_len=o,
                                clipped=f"prompt {r.prompt_len}->{p}, output {r.output_len}->{o}"))
    return out, dropped


def clip_lengths(requests: Sequence[Request], max_model_len: int, *,
                 drop: bool = False) -> list[Request]:
    """Make every request fit ``prompt_len + output_len <= max_model_len``: :func:`fit_lengths`
    with ``clip`` (or ``drop`` when ``drop=True``), returning the kept requests."""
    return fit_lengths(requests, max_model_len, "drop" if drop else "clip")[0]


def make_offline(requests: Sequence[Request]) -> list[Request]:
    """Every request arrives at time 0 (an offline batch); the order is kept."""
    return [r if r.arrival_s == 0.0 else _replace(r, arrival_s=0.0) for r in requests]


def with_default_slos(requests: Sequence[Request], slo_ttft_s: Optional[float] = None,
                      slo_tpot_s: Optional[float] = None) -> list[Request]:
    """Fill ``slo_ttft_s`` / ``slo_tpot_s`` of requests that have none."""
    for name, v in (("slo_ttft_s", slo_ttft_s), ("slo_tpot_s", slo_tpot_s)):
        if v is not None and not (math.isfinite(v) and v > 0):
            raise ValueError(f"{name} must be a finite number > 0 or None, got {v!r}")
    out = []
    for r in requests:
        ch = {}
        if r.slo_ttft_s is None and slo_ttft_s is not None:
            ch["slo_ttft_s"] = float(slo_ttft_s)
        if r.slo_tpot_s is None and slo_tpot_s is not None:
            ch["slo_tpot_s"] = float(slo_tpot_s)
        out.append(_replace(r, **ch) if ch else r)
    return out


def _check_fractions(fractions: Sequence[float]) -> tuple[float, float, float]:
    fr = tuple(float(f) for f in fractions)
    if len(fr) != 3 or any(not (math.isfinite(f) and f >= 0) for f in fr) \
            or abs(sum(fr) - 1.0) > 1e-6:
        raise ValueError(f"split_fractions must be 3 non-negative numbers summing to 1, "
                         f"got {list(fractions)!r}")
    return fr  # type: ignore[return-value]


def split_windows(requests: Sequence[Request],
                  fractions: Sequence[float] = DEFAULT_SPLIT_FRACTIONS) -> dict[str, tuple[float, float]]:
    """The ``[start, end)`` time window of each split: consecutive pieces of the trace's span
    ``[first arrival, last arrival]`` in the given proportions (the test window includes the end)."""
    fr = _check_fractions(fractions)
    if not requests:
        return {s: (0.0, 0.0) for s in SPLITS}
    t0 = requests[0].arrival_s
    t1 = requests[-1].arrival_s
    span = t1 - t0
    cuts = [t0, t0 + fr[0] * span, t0 + (fr[0] + fr[1]) * span, t1]
    return {s: (cuts[i], cuts[i + 1]) for i, s in enumerate(SPLITS)}


def split_by_time(requests: Sequence[Request],
                  fractions: Sequence[float] = DEFAULT_SPLIT_FRACTIONS, *,
                  rebase: bool = True) -> dict[str, list[Request]]:
    """Deterministic train/val/test splits as contiguous, disjoint time windows.

    Every request lands in exactly one split (the one whose window holds its arrival; the last
    arrival belongs to ``test``), so an agent is never evaluated on its training window. With
    ``rebase`` each split's times are shifted so its window starts at 0. A trace whose arrivals are all
    equal (offline) has no time span; it is split by position in the same proportions instead.
    """
    fr = _check_fractions(fractions)
    reqs = list(requests)
    if any(reqs[i].arrival_s > reqs[i + 1].arrival_s for i in range(len(reqs) - 1)):
        reqs.sort(key=lambda r: r.arrival_s)
    out: dict[str, list[Request]] = {s: [] for s in SPLITS}
    if not reqs:
        return out
    windows = split_windows(reqs, fr)
    if windows["test"][1] == windows["train"][0]:  # zero span: split by position
        n = len(reqs)
        a = int(round(fr[0] * n))
        b = int(round((fr[0] + fr[1]) * n))
        parts = {"train": reqs[:a], "val": reqs[a:b], "test": reqs[b:]}
        return parts
    ends = [windows["train"][1], windows["val"][1]]
    for r in reqs:
        s = "train" if r.arrival_s < ends[0] else "val" if r.arrival_s < ends[1] else "test"
        out[s].append(r)
    if rebase:
        for s in SPLITS:
            start = windows[s][0]
            out[s] = [_replace(r, arrival_s=max(r.arrival_s - start, 0.0)) for r in out[s]]
    return out


def select_split(requests: Sequence[Request], split: Optional[str],
                 fractions: Sequence[float] = DEFAULT_SPLIT_FRACTIONS) -> list[Request]:
    """One split of :func:`split_by_time` (None = the whole trace)."""
    if split is None:
        return list(requests)
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS} or None, got {split!r}")
    return split_by_time(requests, fractions)[split]
