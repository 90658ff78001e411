"""A whole profile: measure a live executor over a grid, fit the step model, report the fit.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import platform
import time

import numpy as np

from kvrl.profiling.batches import BatchFactory, grid_points, random_points
from kvrl.profiling.host import engine_samples, host_run
from kvrl.profiling.timing import device_name, fill_kv, measure, pool_blocks, profile_key_dict, warm_graphs


log = logging.getLogger("kvrl.profile")


def run_profile(ex, grid: dict, block_size: int = 16, num_blocks: int = 0, gpu_memory_utilization: float = 0.9,
                seed: int = 0, model_name: str = "", progress: bool = False):
    """Measure ``ex`` over ``grid``, fit, and return the :class:`StepProfile` (not yet saved)."""
    import torch

    from kvrl.executors.fingerprint import profile_fingerprint
    from kvrl.executors.profile import (HOST_WORK, ProfileKey, StepModel, StepProfile, error_stats, fit_engine_factor,
                                        fit_host, unidentified_host_terms)

    max_len = ex.max_model_len
    nb = pool_blocks(ex, grid, block_size, num_blocks, gpu_memory_utilization, max_len)
    n_cpu = max(max(grid["swaps"]), max(grid["overlap_swap_in"])) + 1
    ex.allocate_kv(nb, n_cpu, block_size)
    fill_kv(ex, grid.get("kv_fill", "zeros"), seed)   # a grid saved before the key had zeros
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
    first = host_run(ex, grid, nb, n_cpu, block_size, seed)
    runs = {"fcfs/lifo": first.steps}
    host = first.host
    # and under memory pressure (a pool of half the blocks that run had in use at its peak;
    # recompute, then swap victims; then swap under oracle SJF, kvrl-fidelity's sjf_swap kind of
    # policy; then every request at once, a queue hundreds long): mixed steps of re-prefills beside
    # decodes, preemptions, swaps, queued requests and re-admissions, and each policy kind's host time
    tight = pressure_pool(first.peak_blocks, grid, block_size)
    pool = {"peak_blocks": first.peak_blocks, "pressure_blocks": tight}
    if tight < nb:
        for i, (label, sched, evict, burst) in enumerate(PRESSURE_RUNS):
            hr = host_run(ex, grid, tight, n_cpu, block_size, seed + 1 + i, evict, sched, burst)
            runs[label] = hr.steps
            host.merge(hr.host)
    steps = [row for rows in runs.values() for row in rows]
    engine = engine_samples(ex, steps)
    graph_sizes = list(ex.GRAPH_BATCH_SIZES) if graphs else []
    token_sizes = list(ex.piecewise_sizes) if ex.use_piecewise else []
    whole_steps = getattr(ex, "_step_graphs", None)
    step_rule = whole_steps.rule.to_dict() if whole_steps is not None else None   # the path term's rule (fit version 13)
    model = StepModel.fit(samples + engine, graph_sizes, token_sizes=token_sizes, step_rule=step_rule)
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
    model.rebuild()
    fit.update({"engine_replay": error_stats([model.predict_features(s, s["graph"]) for s in engine],
                                             [s["t"] for s in engine]),
                "engine_replay_with_host": error_stats(
                    [model.predict_features(s, s["graph"], host=True) for s in engine], [el for _, _, el in steps]),
                "host": {"steps": len(host_rows),
                         "median_gap_s": float(np.median([r[2] for r in host_rows])) if host_rows else 0.0},
                "host_by_run": {label: host_error(model, rows) for label, rows in runs.items()},
                "host_unidentified": unidentified_host_terms(host_rows),
                "host_pool": pool, "host_run_work": {label: run_work(rows) for label, rows in runs.items()},
                "seconds": {"grid": t_grid, "total": time.perf_counter() - t_start}, "by_group": by_group})
    scatter = scatter_ratios(samples)
    if scatter:
        fit["scatter"] = scatter
    xfer = [s for s in samples if s.get("t_xfer")]
    if xfer:
        fit["transfers"] = error_stats(
            [model.swap_out_xfer(s["swap_out"]) + model.swap_in_xfer(s["swap_in"]) for s in xfer],
            [s["t_xfer"] for s in xfer])
    meta = {"created": time.time(), "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "model": model_name, "block_size": block_size, "num_blocks": nb, "cuda_graphs": graphs,
            "step_graphs": bool(getattr(ex, "use_step_graphs", False)), "step_rule": step_rule,
            "graph_batch_sizes": graph_sizes, "piecewise_token_sizes": token_sizes, "sampling": dataclasses.asdict(ex.sampling),
            "torch": torch.__version__, "triton": package_version("triton"), "transformers": package_version("transformers"),
            "host": platform.node(), "cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
            "grid": grid, "fit_stat": grid.get("fit_stat", "median"),
            "timing": f"{grid.get('fit_stat', 'median')} of LiveExecutor.execute wall time (synchronised) after warm-up",
            "cpu_threads": torch.get_num_threads() if ex.device.type == "cpu" else None,
            "holdout_seed": seed, "fingerprint": profile_fingerprint(device_name(ex)),
            # the host's speed while the engine runs were timed (kvrl.executors.host_speed)
            "host_probe": host.stats(), "python": platform.python_version()}
    # the file keeps evenly spaced subsets of the engine run (the model was fitted on all of it;
    # a refit from the file, after a fit-version change, uses the subset)
    key = profile_key_dict(ex)
    return StepProfile(ProfileKey.from_dict(key), model, meta, samples + held,
                       [list(r) for r in thin(host_rows, 400)], fit, key, engine_samples=thin(engine, 600))


#: the profile's engine runs under memory pressure: (label, scheduler, eviction) plugin configs and
#: whether every request arrives at once (:func:`~kvrl.profiling.host.host_run`'s ``burst``: the last
#: run, since fit version 11, queues an overloaded server's hundreds)
PRESSURE_RUNS = (("pressure fcfs/lifo recompute", None, {"name": "lifo", "mode": "recompute"}, False),
                 ("pressure fcfs/most_blocks swap", None, {"name": "most_blocks", "mode": "swap"}, False),
                 ("pressure oracle sjf/most_blocks swap", {"name": "sjf", "oracle": True},
                  {"name": "most_blocks", "mode": "swap"}, False),
                 ("pressure fcfs/most_blocks swap, all at once", None, {"name": "most_blocks", "mode": "swap"}, True))


def pressure_pool(peak_blocks: int, grid: dict, block_size: int) -> int:
    """KV blocks of the pressured engine runs: ``grid["host_pressure_fraction"]`` (0.5 in both
    presets) of ``peak_blocks`` (the most the unpressured run had in use at once), and at least twice
    the largest request's blocks (it must fit). A pool sized from the workload's worst-case demand
    instead (a quarter of it, before) can exceed the peak use: on an H200 the three pressure runs of
    run 21 never preempted or queued. Llama-3-8B's runs at half the peak preempted 0-2 times (run 29),
    hence the knob. Raises ``ValueError`` naming the key unless the fraction is in (0, 1]."""
    fraction = grid["host_pressure_fraction"]
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"grid.host_pressure_fraction={fraction}: give a fraction in (0, 1] of the "
                         "unpressured engine run's peak KV blocks")
    largest = -(-(grid["host_prompt"][1] + grid["host_output"][1]) // block_size)
    return max(int(peak_blocks * fraction), 2 * largest)


def run_work(steps) -> dict:
    """What one engine run did (``steps`` as :attr:`~kvrl.profiling.host.HostRun.steps`): steps,
    preemptions, swapped blocks, steps with a request left waiting after admission, most waiting."""
    return {"steps": len(steps), "preemptions": int(sum(f["n_preempt"] for f, _, _ in steps)),
            "swap_blocks": int(sum(f["swap_blocks"] for f, _, _ in steps)),
            "queued_steps": int(sum(f["n_wait"] > f["n_admit"] for f, _, _ in steps)),
            "max_waiting": int(max((f["n_wait"] for f, _, _ in steps), default=0))}


def host_error(model, steps) -> dict:
    """The host model against one engine run's gaps between steps (``steps`` as
    :attr:`~kvrl.profiling.host.HostRun.steps`): relative error statistics per step and
    of the run's total."""
    from kvrl.executors.profile import HOST_WORK, error_stats

    busy = [(f, el - inner) for f, inner, el in steps if f["n_pre"] or f["n_dec"]]
    pred = [model.host_s(f["n_pre"] + f["n_dec"], f["n_pre"], *(f[k] for k in HOST_WORK)) for f, _ in busy]
    return error_stats(pred, [max(g, 1e-9) for _, g in busy])


def scatter_ratios(samples: list[dict]) -> dict:
    """Measured time of each ``scatter`` point (KV blocks scattered over the pool) over its
    ``scatter_ref`` twin (the same decode batch on consecutive blocks): ``{"points": [[n_dec,
    dec_max, ratio], ...], "median_ratio": ...}``, empty without such points."""
    ref = {(s["n_dec"], s["dec_max"], s["graph"]): s["t"] for s in samples if s.get("group") == "scatter_ref"}
    pts = [[s["n_dec"], s["dec_max"], s["t"] / ref[k]] for s in samples if s.get("group") == "scatter"
           for k in [(s["n_dec"], s["dec_max"], s["graph"])] if ref.get(k)]
    return {"points": pts, "median_ratio": float(np.median([p[2] for p in pts]))} if pts else {}


def thin(rows: list, n: int) -> list:
    """At most ``n`` evenly spaced elements of ``rows`` (first and last kept)."""
    return rows if len(rows) <= n else [rows[i] for i in np.linspace(0, len(rows) - 1, n).astype(int)]


def package_version(module: str) -> str:
    try:
        return __import__(module).__version__
    except Exception:   # not installed (CPU-only machines have no triton wheel sometimes)
        return "n/a"


def render_report(prof) -> str:
    """The fit report as Markdown."""
    from kvrl.executors.profile import HOST_TERMS

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
    if f.get("host_by_run"):
        lines += ["", "engine time between steps, model vs each engine run (total over the run; median per step): " +
                  "; ".join(f"{label} {st['total_rel_err']:+.1%} ({st['median_abs_rel_err']:.0%})"
                            for label, st in f["host_by_run"].items() if st.get("n"))]
    if f.get("scatter"):
        sc = f["scatter"]
        lines += ["", f"diagnostic (not fitted): decode batches on KV blocks scattered over the pool take "
                      f"x{sc['median_ratio']:.3f} the time of the same batches on consecutive blocks (median of "
                      f"{len(sc['points'])}: " + ", ".join(f"B{int(b)}/L{int(L)} x{r:.3f}" for b, L, r in sc["points"]) + ")"]
    h = prof.model.host
    m = prof.model
    xfer = "; ".join(f"{name} {op.c0 * 1e6:.0f} us + {op.c1 * 1e6:.1f} us/block"
                     for name, op in (("swap-out", m.swap_out_xfer), ("swap-in", m.swap_in_xfer)))
    k = m.engine_factor
    lines += ["", f"engine-context factor on forward passes (median live / model over the engine run's steps, "
                  f"applied): CUDA graph x{k['graph']:.3f}, eager x{k['eager']:.3f}",
              f"engine time between steps: {h['base'] * 1e6:.1f} us + {h['per_seq'] * 1e6:.2f} us/seq + "
                  f"{h['per_prefill'] * 1e6:.2f} us/prefill seq (median gap {f.get('host', {}).get('median_gap_s', 0) * 1e6:.0f} us); "
                  + ", ".join(f"{k} {h.get(k, 0.0) * 1e6:.3g} us" for k in HOST_TERMS[3:]),
              f"decodes beside a prefill (mixed_dec): {m.eager['coef'].get('mixed_dec', 0.0) * 1e6:.2f} us each",
              f"shared KV token of an eager decode (dec_shared): {m.eager['coef'].get('dec_shared', 0.0):.3g} s; beside a "
              f"prefill (mixed_shared, fit version 10): " + (f"{m.eager['coef']['mixed_shared']:.3g} s"
                                                            if "mixed_shared" in m.eager["coef"] else "not fitted (dec_shared)"),
              f"swap-stream transfers: {xfer}"]
    if f.get("host_run_work"):
        hp = f.get("host_pool", {})
        lines.append(f"engine runs (pressure pool {hp.get('pressure_blocks')} blocks, "
                     f"{prof.meta.get('grid', {}).get('host_pressure_fraction', 0.5):g} of the unpressured run's peak "
                     f"{hp.get('peak_blocks')}): " + "; ".join(
                         f"{label}: {w['steps']} steps, {w['preemptions']} preemptions, {w['swap_blocks']} swapped "
                         f"blocks, {w['queued_steps']} steps with requests left waiting (at most {w['max_waiting']})"
                         for label, w in f["host_run_work"].items()))
    probe = prof.meta.get("host_probe")
    if probe:
        lines.append(f"host speed while the engine runs were timed (kvrl.executors.host_speed): {probe['n']} probes, "
                     f"mean {probe['mean_s'] * 1e6:.1f} us, median {probe['median_s'] * 1e6:.1f} us (p10 "
                     f"{probe['p10_s'] * 1e6:.1f}, p90 {probe['p90_s'] * 1e6:.1f} us), python {prof.meta.get('python')}"
                     + (f"; engine thread waited for a CPU {probe['wait_s']:.3f} s over {probe['cpu_s']:.2f} s on one "
                        f"(contention x{probe['contention']:.3f})" if "contention" in probe else ""))
    if "host_unidentified" in f:
        lines.append(f"host terms the engine runs do not identify (no such work, or it always moved with an earlier "
                     f"term's; not fitted, 0): {', '.join(f['host_unidentified']) or 'none'}")
    return "\n".join(lines)


def install_name(prof) -> str:
    k = prof.raw_key
    model = prof.meta.get("model") or f"l{k['num_layers']}h{k['hidden_size']}"
    suffix = "_step_graphs" if prof.meta.get("step_graphs") else ""
    return f"{k['device']}_{model}_{k.get('dtype', k['dtype_bytes'])}{suffix}.json"
