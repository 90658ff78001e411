"""Summary statistics and a diagnostic plot for a workload."""
from __future__ import annotations

import os
from collections import Counter
from typing import Any, Sequence

import numpy as np

from kvrl.engine.request import Request

from .tokens import prefix_block_ids

PERCENTILES = (50, 90, 99)
#: tokens per block of :func:`prefix_reuse` (the engine's default block size)
REUSE_BLOCK = 16


def length_summary(values: np.ndarray) -> dict[str, float]:
    """mean, p50/p90/p99 (numpy's default linear interpolation) and max."""
    if values.size == 0:
        return {"mean": float("nan"), **{f"p{p}": float("nan") for p in PERCENTILES},
                "max": float("nan")}
    pct = np.percentile(values, PERCENTILES)
    return {"mean": float(values.mean()), **{f"p{p}": float(v) for p, v in zip(PERCENTILES, pct)},
            "max": float(values.max())}


def interarrival_cv(arrivals: np.ndarray) -> float:
    """Coefficient of variation (std / mean) of inter-arrival gaps: 1 for Poisson, > 1 bursty.
    NaN with fewer than 3 requests or a zero mean gap (offline)."""
    if arrivals.size < 3:
        return float("nan")
    gaps = np.diff(np.sort(arrivals))
    m = gaps.mean()
    return float(gaps.std() / m) if m > 0 else float("nan")


def prefix_reuse(requests: Sequence[Request], block: int = REUSE_BLOCK) -> float:
    """Share of prompt tokens that an unbounded prefix cache with the engine's default tenant scope
    would find: tokens in full blocks of ``block`` tokens whose whole prefix, up to and with the block,
    a prompt of the same tenant and cache salt holds too (every holder but one counts). An upper bound
    on what any prefix cache can hit in the trace. Traces that record lengths only get random ids and
    share nothing unless their loader says so, as prefix groups and Mooncake block ids do. 0.0 for no
    prompt tokens."""
    total = sum(r.prompt_len for r in requests)
    if total == 0:
        return 0.0
    ids = prefix_block_ids(requests, block, full_blocks_only=True, scope=lambda r: (r.tenant, r.cache_salt))
    blocks = sum(map(len, ids))
    distinct = 1 + max((i for row in ids for i in row), default=-1)
    return block * (blocks - distinct) / total


def trace_stats(requests: Sequence[Request]) -> dict[str, Any]:
    """Counts, duration, rate, length percentiles, burstiness, tenants, groups, prefix reuse
    (:func:`prefix_reuse`), parallel sampling."""
    arr = np.array([r.arrival_s for r in requests], dtype=np.float64)
    plen = np.array([r.prompt_len for r in requests], dtype=np.int64)
    olen = np.array([r.output_len for r in requests], dtype=np.int64)
    ns = np.array([r.n for r in requests], dtype=np.int64)
    duration = float(arr.max() - arr.min()) if arr.size else 0.0
    return {
        "num_requests": len(requests),
        "duration_s": duration,
        "mean_rate": (len(requests) - 1) / duration if duration > 0 else float("nan"),
        "interarrival_cv": interarrival_cv(arr),
        "prompt_len": length_summary(plen),
        "output_len": length_summary(olen),
        "prompt_tokens": int(plen.sum()),
        "output_tokens": int((olen * ns).sum()),
        "parallel_requests": int((ns > 1).sum()),
        "tenants": dict(Counter(r.tenant for r in requests)),
        "prefix_groups": len({r.prefix_group for r in requests if r.prefix_group is not None}),
        "prefix_reuse": prefix_reuse(requests),
        "with_slo": sum(1 for r in requests if r.slo_ttft_s is not None or r.slo_tpot_s is not None),
    }


def format_stats(stats: dict[str, Any], title: str = "") -> str:
    """A human-readable block for :func:`trace_stats` output."""
    lines = [title] if title else []
    def add(label: str, text: str) -> None:
        lines.append(f"{label:<17}{text}")

    add("requests", f"{stats['num_requests']}")
    add("duration", f"{stats['duration_s']:.3f} s")
    add("mean rate", f"{stats['mean_rate']:.4g} req/s")
    add("inter-arrival CV", f"{stats['interarrival_cv']:.4g}  (1 = Poisson, > 1 = bursty)")
    for key, name in (("prompt_len", "prompt len"), ("output_len", "output len")):
        s = stats[key]
        add(name, f"mean {s['mean']:.1f}  p50 {s['p50']:g}  p90 {s['p90']:g}  p99 {s['p99']:g}  "
                  f"max {s['max']:g}")
    add("tokens", f"prompt {stats['prompt_tokens']}  output {stats['output_tokens']} (x n)")
    tenants = ", ".join(f"{k}={v}" for k, v in sorted(stats["tenants"].items()))
    add("tenants", f"{len(stats['tenants'])} ({tenants})")
    add("prefix groups", f"{stats['prefix_groups']}")
    add("prefix reuse", f"{100 * stats['prefix_reuse']:.1f}% of prompt tokens in {REUSE_BLOCK}-token blocks another "
                        f"prompt holds (an unbounded prefix cache's hit rate)")
    add("n > 1 requests", f"{stats['parallel_requests']}")
    add("with SLOs", f"{stats['with_slo']}")
    return "\n".join(lines)


def plot_stats(requests: Sequence[Request], path: str | os.PathLike, title: str = "") -> None:
    """PNG with arrivals over time (requests/s) and prompt / output length histograms.

    Renders with matplotlib's Agg canvas directly (no pyplot), so it works headless and leaves the
    caller's backend alone."""
    from matplotlib.figure import Figure  # no pyplot: the global backend is left alone

    arr = np.array([r.arrival_s for r in requests], dtype=np.float64)
    plen = np.array([r.prompt_len for r in requests], dtype=np.int64)
    olen = np.array([r.output_len for r in requests], dtype=np.int64)
    fig = Figure(figsize=(15, 4))
    axes = fig.subplots(1, 3)
    ax = axes[0]
    span = float(arr.max() - arr.min()) if arr.size else 0.0
    if span > 0:
        bins = int(min(200, max(10, np.sqrt(arr.size))))
        edges = np.histogram_bin_edges(arr, bins=bins)
        width = np.diff(edges)
        tenants = sorted({r.tenant for r in requests})
        ax.stairs(np.histogram(arr, bins=edges)[0] / width, edges, label="all")
        if 1 < len(tenants) <= 8:
            ten = np.array([r.tenant for r in requests])
            for t in tenants:
                ax.stairs(np.histogram(arr[ten == t], bins=edges)[0] / width, edges, label=t)
            ax.legend(fontsize="small")
        ax.set_ylabel("arrivals / s")
    else:
        ax.text(0.5, 0.5, f"offline: {arr.size} requests at t={arr[0] if arr.size else 0:g}",
                ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("time (s)")
    ax.set_title("arrivals over time")
    for ax, vals, name in ((axes[1], plen, "prompt length"), (axes[2], olen, "output length")):
        if vals.size:
            ax.hist(vals, bins=50)
        ax.set_xlabel(f"{name} (tokens)")
        ax.set_ylabel("requests")
        ax.set_title(name)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100, format="png")
