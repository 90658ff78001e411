"""``kvrl-profile``: measure the live executor's step times over a grid of step shapes and write a
step-time profile for the sim (:mod:`kvrl.executors.profile`).

What is timed is :meth:`LiveExecutor.execute` on real tensors: batches are built directly from
minimal :class:`Sequence` objects whose block tables point into the executor's own KV pool (blocks
are reused cyclically when a shape needs more than the pool holds; the bytes read are the same and
far exceed the GPU's L2). Each point runs ``warmup`` times, then up to ``reps`` times (at least 3,
stopping once ``point_budget_s`` is spent); the median is kept, with p10/p90.

The grid: decode batches x context lengths, as CUDA-graph replays and eager; ragged decode batches
(lengths spread over [L/8, 2L]); prefills of N tokens split over 1..S sequences; prefix hits
(short queries over long cached contexts); mixed decode + prefill steps; block copies; swap-outs
and swap-ins (also timed until their transfer ends), alone and a swap-in issued with a decode step
(overlap); ``random`` engine-like steps (ragged lognormal decode batches, several prefills, both).
Then ``holdout`` random steps the fit never sees measure its error, and a short engine run measures
the engine's own time between steps (which live ``elapsed_s`` includes) and replays the fitted
model on the steps it took. With ``interleave`` (both presets) the repetitions run in rounds over
all points, so each timed step follows a different one, as in an engine, instead of a copy of
itself (a step repeated back to back can run faster than the same step inside an engine).

Writes ``profile.json`` (and ``profile.md``, the fit report) into the run directory, and with
``install_dir`` set also ``<install_dir>/<device>_<model>_<dtype>.json``.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import platform
import time
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from kvrl.engine.callbacks import EngineCallback

log = logging.getLogger("kvrl.profile")

# --------------------------------------------------------------------------------- grids
GRIDS: dict[str, dict[str, Any]] = {
    "gpu": dict(
        decode_batch=[1, 2, 4, 8, 16, 32, 64, 128, 256],
        decode_ctx=[128, 512, 1024, 2048, 4096],
        eager_decode=True,
        ragged_batch=[8, 64, 256], ragged_ctx=[512, 2048],
        prefill_tokens=[16, 64, 256, 512, 1024, 2048, 4096, 8192],
        prefill_seqs=[1, 4, 16],
        prefix_query=[16, 128, 512, 2048], prefix_cached=[1024, 4096, 16384],
        mixed_batch=[16, 64, 256], mixed_ctx=[512, 2048], mixed_prefill=[256, 2048],
        copies=[1, 16, 128, 1024],
        swaps=[1, 4, 16, 64, 128, 256, 512, 1024],
        overlap_batch=64, overlap_ctx=1024, overlap_swap_in=[16, 256],
        random=160, holdout=40,
        host_requests=192, host_prompt=[32, 1024], host_output=[16, 256], host_rate=60.0,
        host_shared_prefix=[4, 256, 768],
        warmup=3, reps=7, point_budget_s=1.0, fit_stat="median", interleave=True,
    ),
    "cpu": dict(
        decode_batch=[1, 2, 4, 8, 16, 32],
        decode_ctx=[16, 64, 256, 512],
        eager_decode=True,
        ragged_batch=[4, 16], ragged_ctx=[64, 256],
        prefill_tokens=[2, 8, 32, 64, 128, 256],
        prefill_seqs=[1, 4],
        prefix_query=[8, 64], prefix_cached=[64, 512],
        mixed_batch=[4, 16], mixed_ctx=[64, 256], mixed_prefill=[32, 128],
        copies=[1, 4, 16, 64],
        swaps=[1, 4, 16, 64],
        overlap_batch=8, overlap_ctx=64, overlap_swap_in=[4, 32],
        random=24, holdout=24,
        host_requests=24, host_prompt=[8, 128], host_output=[4, 32], host_rate=None,
        host_shared_prefix=[2, 16, 48],
        warmup=1, reps=7, point_budget_s=0.25, fit_stat="min", interleave=True,
    ),
}


# --------------------------------------------------------------------------------- building the executor
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


# --------------------------------------------------------------------------------- batches
class BatchFactory:
    """Builds :class:`ScheduledBatch` objects over minimal sequences whose block tables take
    blocks of the executor's pool in order (cyclically when a batch needs more than the pool)."""

    def __init__(self, num_blocks: int, block_size: int, vocab_size: int, max_len: int, seed: int = 0) -> None:
        self.num_blocks, self.block_size = num_blocks, block_size
        rng = np.random.default_rng(seed)
        self.tokens = rng.integers(0, vocab_size, max_len + 1, dtype=np.int32)
        self._next_block = 0
        self._next_id = 0

    def _seq(self, length: int):
        from kvrl.engine.request import Request, Sequence

        req = Request(f"p{self._next_id}", 0.0, self.tokens[:length], 1)
        seq = Sequence(self._next_id, req)
        self._next_id += 1
        n = -(-length // self.block_size)
        seq.block_table = [(self._next_block + i) % self.num_blocks for i in range(n)]
        self._next_block = (self._next_block + n) % self.num_blocks
        return seq

    def batch(self, decode_lens=(), prefills=(), copies: int = 0, swap_out: int = 0, swap_in: int = 0):
        """``decode_lens``: context length of each decode (its last token is computed);
        ``prefills``: ``(query_tokens, cached_tokens)`` pairs."""
        from kvrl.engine.batch import ScheduledBatch, ScheduledSeq

        self._next_block = 0
        items = []
        for k, start in prefills:
            items.append(ScheduledSeq(self._seq(start + k), start, k, 1))
        for length in decode_lens:
            items.append(ScheduledSeq(self._seq(length), length - 1, 1, 1))
        nb = self.num_blocks
        b = ScheduledBatch(seqs=items)
        # block operations use blocks from the top of the pool: disjoint src/dst for copies
        b.copies = [((nb - 1 - i) % nb, (nb - 1 - copies - i) % nb) for i in range(copies)]
        b.swap_out = [((nb - 1 - i) % nb, i) for i in range(swap_out)]
        b.swap_in = [(i, (nb - 1 - i) % nb) for i in range(swap_in)]
        return b


def ragged(batch: int, ctx: int) -> list[int]:
    """``batch`` lengths spread evenly over [ctx/8, 2 ctx - ctx/8] (mean ctx)."""
    lo, hi = max(ctx // 8, 1), max(2 * ctx - ctx // 8, 1)
    return [int(round(v)) for v in np.linspace(lo, hi, batch)] if batch > 1 else [ctx]


def grid_points(g: dict, graphs: bool, max_len: int) -> list[tuple[str, bool, dict]]:
    """(group, use_graph, batch kwargs) for every grid point."""
    pts: list[tuple[str, bool, dict]] = []
    modes = ([True] if graphs else []) + ([False] if (g["eager_decode"] or not graphs) else [])
    for graph in modes:
        for b in g["decode_batch"]:
            for L in g["decode_ctx"]:
                if L <= max_len:
                    pts.append(("decode", graph, {"decode_lens": [L] * b}))
        for b in g["ragged_batch"]:
            for L in g["ragged_ctx"]:
                if 2 * L <= max_len:
                    pts.append(("ragged", graph, {"decode_lens": ragged(b, L)}))
    for n in g["prefill_tokens"]:
        for s in g["prefill_seqs"]:
            if n // s >= 2 and n // s <= max_len:
                sizes = [n // s + (1 if i < n % s else 0) for i in range(s)]
                pts.append(("prefill", False, {"prefills": [(k, 0) for k in sizes]}))
    for q in g["prefix_query"]:
        for c in g["prefix_cached"]:
            if q >= 2 and q + c <= max_len:
                pts.append(("prefix", False, {"prefills": [(q, c)]}))
    for b in g["mixed_batch"]:
        for L in g["mixed_ctx"]:
            for n in g["mixed_prefill"]:
                if L <= max_len and n <= max_len:
                    pts.append(("mixed", False, {"decode_lens": [L] * b, "prefills": [(n, 0)]}))
    for n in g["copies"]:
        pts.append(("copy", False, {"copies": n}))
    for n in g["swaps"]:
        pts.append(("swap_out", False, {"swap_out": n}))
        pts.append(("swap_in", False, {"swap_in": n}))
    for n in g["overlap_swap_in"]:
        pts.append(("overlap", graphs, {"decode_lens": [g["overlap_ctx"]] * g["overlap_batch"], "swap_in": n}))
    return pts


def random_points(g: dict, n: int, graphs: bool, max_len: int, seed: int, group: str = "holdout") -> list[tuple[str, bool, dict]]:
    """``n`` random steps like the engine makes, inside the grid's ranges but off its points:
    decode batches with lognormal context lengths (coefficient of variation 0.2-1.5, so some
    batches are as ragged as a serving trace's), one to four prefills (fresh or over a cached
    prefix), or both. ``group="random"`` steps are fitted; ``holdout`` ones (another seed) never."""
    rng = np.random.default_rng(seed + (7919 if group == "holdout" else 104729))
    max_b, max_l = max(g["decode_batch"]), min(max(g["decode_ctx"]), max_len)
    min_l = min(g["decode_ctx"])
    max_n = max(g["prefill_tokens"])
    logu = lambda lo, hi: float(np.exp(rng.uniform(np.log(lo), np.log(hi))))
    pts = []
    for _ in range(n):
        r = rng.random()
        decodes, prefills = [], []
        if r < 0.8:
            b = max(1, int(round(logu(1, max_b))))
            mean, cv = logu(min_l, max_l), rng.uniform(0.2, 1.5)
            sigma = float(np.sqrt(np.log1p(cv * cv)))
            lens = rng.lognormal(np.log(mean) - sigma * sigma / 2, sigma, b)
            decodes = [int(v) for v in np.clip(lens, 2, min(4 * max_l, max_len))]
        if r >= 0.4 or not decodes:
            for _ in range(int(rng.integers(1, 5))):
                k = max(2, int(logu(2, max_n / 2)))
                start = 0 if rng.random() < 0.6 else int(logu(16, max_l))
                k = min(k, max_len - start)
                if k >= 2:
                    prefills.append((k, start))
        graph = graphs and not prefills and rng.random() < 0.85
        pts.append((group, graph, {"decode_lens": decodes, "prefills": prefills}))
    return pts


# --------------------------------------------------------------------------------- timing
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
        out.append(row)
    return out


class _Timed(EngineCallback):
    """Engine callback that keeps each executed batch, the engine-measured wall seconds inside
    ``execute`` and the live ``elapsed_s`` (which adds the engine's own time since the previous
    step). It does nothing else between steps (one list append), so the gaps it sees are the engine's."""

    def __init__(self) -> None:
        self.rows: list[tuple[Any, float, float]] = []

    def on_step(self, event) -> bool:
        self.rows.append((event.batch, event.execute_wall_s, event.output.elapsed_s))
        return True


def host_run(ex, g: dict, num_blocks: int, num_cpu_blocks: int, block_size: int, seed: int,
             eviction: Optional[dict] = None) -> list[tuple[dict, float, float]]:
    """Serve a small workload through a real engine on ``ex`` (uniform lengths, every other
    request behind one of ``host_shared_prefix[0]`` shared prefixes) with ``eviction`` (plugin
    config; default lifo); returns per step (features incl. :data:`HOST_WORK`, seconds inside
    execute, live elapsed_s). On a pool smaller than the workload's demand the run preempts, so
    the host model sees preemptions, swaps and re-admissions."""
    from kvrl.builder import build_engine
    from kvrl.engine.request import Request
    from kvrl.executors.profile import batch_features, host_work

    rng = np.random.default_rng(seed + 31)
    n = g["host_requests"]
    plo, phi = g["host_prompt"]
    olo, ohi = g["host_output"]
    max_len = ex.max_model_len
    num_prefixes, lo, hi = g.get("host_shared_prefix") or (0, 0, 0)
    prefixes = [rng.integers(0, ex.vocab_size, int(rng.integers(lo, hi + 1)), dtype=np.int32)
                for _ in range(int(num_prefixes))]
    reqs, arrival = [], 0.0
    for i in range(n):
        p = int(min(rng.integers(plo, phi + 1), max_len // 2))
        o = int(min(rng.integers(olo, ohi + 1), max_len - p))
        prompt = rng.integers(0, ex.vocab_size, p, dtype=np.int32)
        if prefixes and i % 2:   # every other request behind a shared prefix: prefix-hit steps
            prompt = np.concatenate([prefixes[int(rng.integers(len(prefixes)))], prompt])[:max_len - o]
        reqs.append(Request(f"h{i}", arrival, prompt, max(o, 1)))
        if g.get("host_rate"):   # Poisson arrivals: queues like a server's, not one offline burst
            arrival += float(rng.exponential(1.0 / g["host_rate"]))
    timed = _Timed()
    engine = dict(num_blocks=num_blocks, block_size=block_size, num_cpu_blocks=num_cpu_blocks,
                  max_num_seqs=max(g["decode_batch"]), max_num_batched_tokens=max(g["prefill_tokens"]),
                  max_model_len=max_len)
    eng = build_engine({"engine": engine, "scheduler": {"name": "fcfs"}, "watermark": {"name": "fixed"},
                        "eviction": dict(eviction or {"name": "lifo"}), "prefix_cache": {"name": "hash_lru"}},
                       executor=ex, record_steps=True)
    eng.run(reqs, callbacks=[timed])
    # the first steps follow an idle gap (elapsed_s then counts only execute)
    return [({**batch_features(b), **host_work(b)}, inner, el) for b, inner, el in timed.rows[2:]]


def engine_samples(ex, steps) -> list[dict]:
    """The engine run's steps as profile samples (group ``engine``; ``t`` = seconds in execute)."""
    return [{"group": "engine", "graph": bool(ex.uses_graph(f["n_pre"], f["n_dec"])), **f, "t": inner}
            for f, inner, _ in steps]


# --------------------------------------------------------------------------------- the whole profile
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


def run_profile(ex, grid: dict, block_size: int = 16, num_blocks: int = 0, gpu_memory_utilization: float = 0.9,
                seed: int = 0, model_name: str = "", progress: bool = False):
    """Measure ``ex`` over ``grid``, fit, and return the :class:`StepProfile` (not yet saved)."""
    import torch

    from kvrl.executors.fingerprint import profile_fingerprint
    from kvrl.executors.profile import (HOST_WORK, ProfileKey, StepModel, StepProfile, error_stats, fit_engine_factor,
                                        fit_host)

    max_len = ex.max_model_len
    nb = pool_blocks(ex, grid, block_size, num_blocks, gpu_memory_utilization, max_len)
    n_cpu = max(max(grid["swaps"]), max(grid["overlap_swap_in"])) + 1
    ex.allocate_kv(nb, n_cpu, block_size)
    ex.kv.zero_()                      # no NaN/denormal garbage in the slots the kernels read
    ex.cpu_pool.zero_()
    factory = BatchFactory(nb, block_size, ex.vocab_size, max_len, seed)
    graphs = bool(ex.use_cuda_graphs)
    t_start = time.perf_counter()
    warm_graphs(ex, factory, max(grid["decode_batch"]))
    points = grid_points(grid, graphs, max_len)
    points += random_points(grid, int(grid["random"]), graphs, max_len, seed, group="random")
    holdout = random_points(grid, int(grid["holdout"]), graphs, max_len, seed)
    log.info("profiling %d grid points + %d held-out steps on %s (pool %d blocks of %d)", len(points),
             len(holdout), device_name(ex), nb, block_size)
    def report(i: int, n: int) -> None:
        if progress and (i == n or i % 25 == 0):
            log.info("  %d/%d points (%.0f s)", i, n, time.perf_counter() - t_start)

    # measured in one pass: with interleaved rounds (CPU) grid and held-out steps then see the
    # same background load
    measured = measure(ex, factory, points + holdout, grid, report)
    samples, held = measured[:len(points)], measured[len(points):]
    t_grid = time.perf_counter() - t_start
    # the engine run: its steps are fitted with the grid (in-engine step times, prefix hits,
    # chunked prefills as an engine schedules them) and its gaps give the host model
    steps = host_run(ex, grid, nb, n_cpu, block_size, seed)
    # and under memory pressure (a pool of a quarter of the run's demand; recompute, then swap
    # victims): mixed steps of re-prefills beside decodes, preemptions, swaps and re-admissions
    demand = grid["host_requests"] * (grid["host_prompt"][1] + grid["host_output"][1]) // block_size
    tight = max(demand // 4, 4 * (grid["host_prompt"][1] + grid["host_output"][1]) // block_size)
    if tight < nb:
        for i, evict in enumerate(({"name": "lifo", "mode": "recompute"}, {"name": "most_blocks", "mode": "swap"})):
            steps += host_run(ex, grid, tight, n_cpu, block_size, seed + 1 + i, evict)
    engine = engine_samples(ex, steps)
    graph_sizes = list(ex.GRAPH_BATCH_SIZES) if graphs else []
    token_sizes = list(ex.piecewise_sizes) if ex.use_piecewise else []
    model = StepModel.fit(samples + engine, graph_sizes, token_sizes=token_sizes)
    pred = lambda rows: [model.predict_features(s, bool(s["graph"])) for s in rows]
    # grid and held-out steps are timed alike, so their errors are those of the grid fit alone
    fit = {"grid": error_stats(pred(samples), [s["t"] for s in samples]),
           "holdout": error_stats(pred(held), [s["t"] for s in held])}
    by_group = {g: error_stats(pred(sel), [s["t"] for s in sel]) for g in sorted({s["group"] for s in samples})
                for sel in [[s for s in samples if s["group"] == g]]}

    host_rows = [(f["n_pre"] + f["n_dec"], f["n_pre"], max(el - inner, 0.0), *(f[k] for k in HOST_WORK))
                 for f, inner, el in steps]
    model.host = fit_host(host_rows)
    model.engine_factor = fit_engine_factor(model, engine)
    model._build()
    fit.update({"engine_replay": error_stats([model.predict_features(s, s["graph"]) for s in engine],
                                             [s["t"] for s in engine]),
                "engine_replay_with_host": error_stats(
                    [model.predict_features(s, s["graph"], host=True) for s in engine], [el for _, _, el in steps]),
                "host": {"steps": len(host_rows),
                         "median_gap_s": float(np.median([r[2] for r in host_rows])) if host_rows else 0.0},
                "seconds": {"grid": t_grid, "total": time.perf_counter() - t_start}, "by_group": by_group})
    xfer = [s for s in samples if s.get("t_xfer")]
    if xfer:
        fit["transfers"] = error_stats(
            [model.swap_out_xfer(s["swap_out"]) + model.swap_in_xfer(s["swap_in"]) for s in xfer],
            [s["t_xfer"] for s in xfer])
    meta = {"created": time.time(), "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "model": model_name, "block_size": block_size, "num_blocks": nb, "cuda_graphs": graphs,
            "graph_batch_sizes": graph_sizes, "piecewise_token_sizes": token_sizes, "sampling": dataclasses.asdict(ex.sampling),
            "torch": torch.__version__, "triton": _version("triton"), "transformers": _version("transformers"),
            "host": platform.node(), "cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
            "grid": grid, "fit_stat": grid.get("fit_stat", "median"),
            "timing": f"{grid.get('fit_stat', 'median')} of LiveExecutor.execute wall time (synchronised) after warm-up",
            "cpu_threads": torch.get_num_threads() if ex.device.type == "cpu" else None,
            "holdout_seed": seed, "fingerprint": profile_fingerprint(device_name(ex))}
    # the file keeps evenly spaced subsets of the engine run (the model was fitted on all of it;
    # a refit from the file, after a fit-version change, uses the subset)
    key = profile_key_dict(ex)
    return StepProfile(ProfileKey.from_dict(key), model, meta, samples + held,
                       [list(r) for r in thin(host_rows, 400)], fit, key, engine_samples=thin(engine, 600))


def thin(rows: list, n: int) -> list:
    """At most ``n`` evenly spaced elements of ``rows`` (first and last kept)."""
    return rows if len(rows) <= n else [rows[i] for i in np.linspace(0, len(rows) - 1, n).astype(int)]


def _version(module: str) -> str:
    try:
        return __import__(module).__version__
    except Exception:   # not installed (CPU-only machines have no triton wheel sometimes)
        return "n/a"


def render_report(prof) -> str:
    """The fit report as Markdown."""
    k, f = prof.raw_key, prof.fit_report
    lines = [f"# Step-time profile: {k.get('gpu_name')} / {prof.meta.get('model')} ({k.get('dtype')})", "",
             f"shape: {prof.key.describe()}; block size {prof.meta.get('block_size')}; CUDA graphs "
             f"{prof.meta.get('cuda_graphs')}; torch {prof.meta.get('torch')}, triton {prof.meta.get('triton')}; "
             f"{len(prof.samples)} samples; {f.get('seconds', {}).get('total', float('nan')):.1f} s", "",
             "| set | n | median abs rel err | p90 | max | total-time rel err |", "|---|---:|---:|---:|---:|---:|"]
    rows = [("grid (fitted)", f.get("grid", {})), ("held-out random steps", f.get("holdout", {})),
            ("engine run (fitted; execute only; sets the engine factor)", f.get("engine_replay", {})),
            ("engine run (fitted; elapsed, with host)", f.get("engine_replay_with_host", {}))]
    rows += [(f"grid: {g}", st) for g, st in sorted(f.get("by_group", {}).items())]
    rows.append(("swap-stream transfers (swap_out, swap_in)", f.get("transfers", {})))
    for name, st in rows:
        if st.get("n"):
            lines.append(f"| {name} | {st['n']} | {st['median_abs_rel_err']:.1%} | {st['p90_abs_rel_err']:.1%} | "
                         f"{st['max_abs_rel_err']:.1%} | {st['total_rel_err']:+.1%} |")
    h = prof.model.host
    m = prof.model
    xfer = "; ".join(f"{name} {op.c0 * 1e6:.0f} us + {op.c1 * 1e6:.1f} us/block"
                     for name, op in (("swap-out", m.swap_out_xfer), ("swap-in", m.swap_in_xfer)))
    k = m.engine_factor
    lines += ["", f"engine-context factor on forward passes (median live / model over the engine run's steps, "
                  f"applied): CUDA graph x{k['graph']:.3f}, eager x{k['eager']:.3f}",
              f"engine time between steps: {h['base'] * 1e6:.1f} us + {h['per_seq'] * 1e6:.2f} us/seq + "
                  f"{h['per_prefill'] * 1e6:.2f} us/prefill seq (median gap {f.get('host', {}).get('median_gap_s', 0) * 1e6:.0f} us)",
              f"swap-stream transfers: {xfer}"]
    return "\n".join(lines)


def install_name(prof) -> str:
    k = prof.raw_key
    model = prof.meta.get("model") or f"l{k['num_layers']}h{k['hidden_size']}"
    return f"{k['device']}_{model}_{k.get('dtype', k['dtype_bytes'])}.json"


def main_impl(cfg: dict, out_dir: Path) -> Any:
    from kvrl.apps.outputs import atomic_write
    from kvrl.executors.live_build import build_live

    ex = build_live(cfg["model"], cfg["backend"], seed=int(cfg.get("seed", 0)), weights=cfg.get("weights", "memory"))
    configure_cpu(ex.device.type, int(cfg.get("cpu_threads", 1)), bool(cfg.get("flush_denormal", True)))
    preset = cfg.get("grid_preset", "auto")
    if preset == "auto":
        preset = "gpu" if ex.device.type == "cuda" else "cpu"
    if preset not in GRIDS:
        raise ValueError(f"grid_preset must be auto or one of {sorted(GRIDS)}, got {preset!r}")
    grid = dict(GRIDS[preset])
    overrides = {k: v for k, v in (cfg.get("grid") or {}).items() if v is not None}
    unknown = sorted(set(overrides) - set(grid))
    if unknown:
        raise ValueError(f"unknown grid key(s) {unknown}; known: {sorted(grid)}")
    grid.update(overrides)
    prof = run_profile(ex, grid, block_size=int(cfg.get("block_size", 16)), num_blocks=int(cfg.get("num_blocks", 0)),
                       gpu_memory_utilization=float(cfg.get("gpu_memory_utilization", 0.9)),
                       seed=int(cfg.get("seed", 0)), model_name=str(cfg["model"].get("name", "")),
                       progress=bool(cfg.get("progress", True)))
    disk = cfg.get("disk") or {}
    if disk.get("measure", True):     # the disk tier's bandwidth (kvrl.engine.disk_tier; the sim prices disk I/O from it)
        from kvrl.engine.disk_tier import measure_disk_bandwidth
        block_bytes = ex.kv_block_bytes(int(cfg.get("block_size", 16)))
        files = min(512, max(8, int(float(disk.get("mb", 256)) * 2**20 // block_bytes)))
        prof.meta["disk"] = measure_disk_bandwidth(disk.get("dir"), block_bytes=block_bytes, num_blocks=files)
        log.info("disk: read %.2f GB/s, write %.2f GB/s", prof.meta["disk"]["read_bytes_per_s"] / 1e9,
                 prof.meta["disk"]["write_bytes_per_s"] / 1e9)
    out_dir.mkdir(parents=True, exist_ok=True)
    prof.save(out_dir / "profile.json")
    report = render_report(prof)
    atomic_write(out_dir / "profile.md", lambda f: f.write(report + "\n"))
    if cfg.get("install_dir"):
        dest = Path(cfg["install_dir"]) / install_name(prof)
        prof.save(dest)
        log.info("installed %s", dest)
    print(report)
    print(f"\nprofile: {out_dir / 'profile.json'} ({(out_dir / 'profile.json').stat().st_size / 1024:.0f} KiB)")
    return prof


try:
    import hydra
    from omegaconf import DictConfig, OmegaConf

    @hydra.main(config_path="pkg://kvrl.conf", config_name="profile", version_base="1.3")
    def main(cfg: DictConfig) -> None:
        from hydra.core.hydra_config import HydraConfig

        main_impl(OmegaConf.to_container(cfg, resolve=True), Path(HydraConfig.get().runtime.output_dir))
except ImportError:       # pragma: no cover - hydra is a dependency; kept importable without it
    def main() -> None:
        raise SystemExit("kvrl-profile needs hydra-core")


if __name__ == "__main__":
    main()
