"""Timing steps on a live executor: CPU set-up, the device's name and profile key, timing one batch
(warm-up, repetitions within a budget, median with p10/p90), measuring a grid in interleaved
rounds, graph warm-up and the KV pool's size.
"""
from __future__ import annotations

import time
from typing import Callable, Optional

import numpy as np

from kvrl.profiling.batches import BatchFactory


def configure_cpu(device_type: str, threads: int = 1, flush_denormal: bool = True) -> None:
    """On CPU, time the torch reference single-threaded with denormals flushed: on a shared
    machine, idle-spinning intra-op threads and denormal softmax tails (exp of very negative
    scores) otherwise make step times vary by 10-100x. The fidelity app applies the same settings
    to the live runs it compares against."""
    if device_type != "cpu":
        return
    import torch

    if threads:
        torch.set_num_threads(int(threads))
    torch.set_flush_denormal(bool(flush_denormal))


#: what :func:`fill_kv` can put in the KV pool before it is timed (``grid.kv_fill``)
KV_FILLS = ("zeros", "random")


def fill_kv(ex, how: str, seed: int = 0) -> None:
    """Fill the live executor's KV pool (``ex.kv``, allocated) in place: ``zeros``, or ``random``:
    independent N(0, 1) values, the magnitude of the normalised keys and values a serving engine's
    prefills write. Either way no NaN or denormal garbage sits in the slots the kernels read. The
    grid's decode batches read KV that no prefill of theirs wrote: with ``zeros`` they read zeros,
    which a serving engine never does; on an H200 that changed no step time consistently
    (docs/fidelity.md, "Run 31"), so ``zeros`` stays the default."""
    import torch

    if how not in KV_FILLS:
        raise ValueError(f"kv fill must be one of {KV_FILLS}, got {how!r}")
    if how == "zeros":
        ex.kv.zero_()
        return
    gen = torch.Generator(device=ex.kv.device)
    gen.manual_seed(int(seed))
    ex.kv.normal_(0.0, 1.0, generator=gen)


def device_name(ex) -> str:
    import torch

    if ex.device.type == "cuda":
        return torch.cuda.get_device_name(ex.device)
    return "cpu"


def profile_key_dict(ex) -> dict:
    from kvrl.executors.profile import device_key

    shape = ex.cost_model.model
    gpu = device_name(ex)
    return {"device": device_key(gpu), "gpu_name": gpu, "num_layers": shape.num_layers,
            "hidden_size": shape.hidden_size, "num_heads": shape.num_heads, "num_kv_heads": shape.num_kv_heads,
            "head_dim": shape.head_dim, "intermediate_size": shape.intermediate_size,
            "vocab_size": shape.vocab_size, "dtype": str(ex.dtype).removeprefix("torch."),
            "dtype_bytes": shape.dtype_bytes}


def time_batch(ex, batch, warmup: int, reps: int, budget_s: float, transfer: bool = False) -> tuple[list[float], list[float]]:
    """Run ``warmup`` untimed (only one if it alone takes over half the budget), then time up to
    ``reps`` runs (at least 3, fewer once ``budget_s`` is spent). Returns the times of ``execute``
    and, with ``transfer``, the times from its start until the swap stream has finished too
    (every run then starts on an idle swap stream)."""
    for i in range(warmup):
        t0 = time.perf_counter()
        ex.execute(batch)
        if i == 0 and warmup > 1 and time.perf_counter() - t0 > budget_s / 2:
            break
    ex.sync_swaps()
    times: list[float] = []
    transfers: list[float] = []
    spent = 0.0
    for _ in range(max(reps, 1)):
        t0 = time.perf_counter()
        ex.execute(batch)
        dt = time.perf_counter() - t0
        if transfer:
            ex.sync_swaps()
            transfers.append(time.perf_counter() - t0)
        times.append(dt)
        spent += transfers[-1] if transfer else dt
        if len(times) >= 3 and spent > budget_s:
            break
    ex.sync_swaps()
    return times, transfers


#: grid groups measured for the fit report only, never fitted (see kvrl.profiling.batches.grid_points)
DIAGNOSTIC_GROUPS = ("scatter", "scatter_ref")


def group_transfers(group: str) -> bool:
    """Whether a grid group's points also time their swap stream (``t_xfer``)."""
    return group in ("swap_out", "swap_in")


def measure(ex, factory: BatchFactory, points, g: dict, progress: Optional[Callable[[int, int], None]] = None) -> list[dict]:
    """Time every point; ``g["interleave"]``: run the repetitions in rounds over all points
    (each round times every point once), so that a burst of load from other processes on a
    shared machine hits every point a little instead of a few points entirely."""
    from kvrl.executors.profile import batch_features

    graphs_default = ex.use_cuda_graphs
    batches = [factory.batch(**kw) for _, _, kw in points] if g.get("interleave") else None
    times: list[list[float]] = [[] for _ in points]
    transfers: list[list[float]] = [[] for _ in points]
    try:
        if batches is not None:
            for i, (_, graph, _) in enumerate(points):
                ex.use_cuda_graphs = bool(graph) and graphs_default
                for _ in range(g["warmup"]):
                    ex.execute(batches[i])
            for r in range(max(g["reps"], 1)):
                for i, (_, graph, _) in enumerate(points):
                    ex.use_cuda_graphs = bool(graph) and graphs_default
                    t0 = time.perf_counter()
                    ex.execute(batches[i])
                    times[i].append(time.perf_counter() - t0)
                    ex.sync_swaps()   # no transfer of this point runs into the next one
                    if group_transfers(points[i][0]):
                        transfers[i].append(time.perf_counter() - t0)
                if progress:
                    progress((r + 1) * len(points) // max(g["reps"], 1), len(points))
        else:
            batches = []
            for i, (_, graph, kw) in enumerate(points):
                batch = factory.batch(**kw)
                ex.use_cuda_graphs = bool(graph) and graphs_default
                times[i], transfers[i] = time_batch(ex, batch, g["warmup"], g["reps"], g["point_budget_s"],
                                                    group_transfers(points[i][0]))
                batches.append(batch)
                if progress:
                    progress(i + 1, len(points))
    finally:
        ex.use_cuda_graphs = graphs_default
    out = []
    for (group, graph, _), batch, ts, xs in zip(points, batches, times, transfers):
        f = batch_features(batch)
        used_graph = bool(graph and graphs_default and batch.seqs and all(s.is_decode for s in batch.seqs)
                          and len(batch.seqs) <= max(ex.GRAPH_BATCH_SIZES))
        stat = np.min if g.get("fit_stat", "median") == "min" else np.median
        t = float(stat(ts))
        row = {"group": group, "graph": used_graph, **f, "t": t, "t_median": float(np.median(ts)),
               "t_min": float(np.min(ts)), "t_p90": float(np.percentile(ts, 90)), "reps": len(ts)}
        if xs:
            row["t_xfer"] = float(stat(xs))
        if group == "holdout":
            row["holdout"] = True
        if group in DIAGNOSTIC_GROUPS:
            row["diagnostic"] = True
        out.append(row)
    return out


def warm_graphs(ex, factory: BatchFactory, max_batch: int) -> None:
    """Capture every decode graph size up to ``max_batch`` before anything is timed."""
    if not ex.use_cuda_graphs:
        return
    for size in ex.GRAPH_BATCH_SIZES:
        if size > max(max_batch, 1):
            break
        ex.execute(factory.batch(decode_lens=[16] * size))


def pool_blocks(ex, g: dict, block_size: int, requested: int, gpu_memory_utilization: float, max_len: int) -> int:
    need_tokens = max(
        max(g["decode_batch"]) * min(max(g["decode_ctx"]), max_len),
        max(g["prefill_tokens"]) + max(g["prefill_seqs"]) * block_size,
        max(g["prefix_query"]) + max(g["prefix_cached"]),
        max(g["mixed_batch"]) * max(g["mixed_ctx"]) + max(g["mixed_prefill"]),
        g["host_requests"] * (g["host_prompt"][1] + g["host_output"][1]))
    need = -(-need_tokens // block_size) + 2 * max(max(g["copies"]), max(g["swaps"])) + 16
    if requested:
        return int(requested)
    if ex.device.type == "cuda":
        return int(min(need, ex.kv_capacity_blocks(block_size, gpu_memory_utilization)))
    return int(min(need, 1 << 16))
