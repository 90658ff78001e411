"""The engine run of a profile: a short run on the live executor (timed by an engine callback)
measures the engine's own time between steps and the steps an engine actually takes.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from kvrl.engine.callbacks import EngineCallback
from kvrl.executors.host_speed import HostMeter
from kvrl.workloads.lengths import LengthDist


class StepTimer(EngineCallback):
    """Engine callback that keeps each executed batch, the engine-measured wall seconds inside
    ``execute`` and the live ``elapsed_s`` (which adds the engine's own time since the previous
    step). Its :class:`~kvrl.executors.host_speed.HostMeter` keeps the engine thread's scheduler
    times over the run, and a host probe every ``probe_every`` steps (the host's speed while the
    engine runs, which the profile records), whose wall time is taken out of the next step's
    ``elapsed_s``; otherwise it does one list append, so the gaps it keeps are the engine's."""

    def __init__(self, probe_every: int = 16) -> None:
        self.rows: list[tuple[Any, float, float]] = []
        self.meter = HostMeter()
        self.probe_every = probe_every
        self._probe_wall = 0.0     # wall seconds this callback spent probing after the previous step

    def on_run_start(self, engine) -> None:
        self.meter.start()

    def on_run_end(self, engine) -> None:
        self.meter.stop()

    def on_step(self, event) -> bool:
        self.rows.append((event.batch, event.execute_wall_s, event.output.elapsed_s - self._probe_wall))
        self._probe_wall = 0.0
        if len(self.rows) % self.probe_every == 0:
            t0 = time.perf_counter()
            self.meter.probe()
            self._probe_wall = time.perf_counter() - t0
        return True


@dataclass
class HostRun:
    """One engine run of a profile: per step (features incl. :data:`HOST_WORK`, seconds inside
    execute, live elapsed_s), and the most KV blocks in use at once (after any step)."""

    steps: list[tuple[dict, float, float]]
    peak_blocks: int
    #: host probes and the engine thread's scheduler times during the run
    host: HostMeter


def engine_run_lengths(kind: str, lo: int, hi: int) -> LengthDist:
    """``grid.host_lengths`` as a :class:`~kvrl.workloads.lengths.LengthDist` over [lo, hi]:
    ``uniform``, or ``lognormal`` with its median at sqrt(lo * hi) and ``hi`` two sigmas above it (a
    CV of about 1 for the default ranges), clamped to the range: most requests short, a few long, as
    LLM traffic is, so decode batches mix short and long contexts."""
    if kind == "uniform":
        return LengthDist("uniform", low=lo, high=hi)
    sigma = math.log(hi / lo) / 4
    return LengthDist("lognormal", mean=math.sqrt(lo * hi) * math.exp(sigma * sigma / 2), sigma=sigma,
                      low=lo, high=hi)


def host_run(ex, g: dict, num_blocks: int, num_cpu_blocks: int, block_size: int, seed: int,
             eviction: Optional[dict] = None, scheduler: Optional[dict] = None, burst: bool = False) -> HostRun:
    """Serve a small workload through a real engine on ``ex`` (lengths drawn within
    ``host_prompt``/``host_output`` as ``host_lengths`` says: uniform or lognormal; every other
    request behind one of ``host_shared_prefix[0]`` shared prefixes) with ``eviction`` (plugin
    config; default lifo) and ``scheduler`` (default fcfs). On a pool smaller than the run's peak
    use (:attr:`HostRun.peak_blocks` of a run on a large pool) the run preempts and queues, so the
    host model sees preemptions, swaps, queued requests and re-admissions. ``burst``: every request
    arrives at once (not at ``host_rate``), so the queue starts ``host_requests`` long and drains
    as requests finish: the queue lengths of an overloaded server (hundreds), where the Poisson runs
    queue a few tens, so the host model can tell a per-step queue cost from a per-request one."""
    from kvrl.builder import build_engine
    from kvrl.engine.metrics import STEP_COLUMNS
    from kvrl.engine.request import Request
    from kvrl.executors.profile import batch_features, host_work_rows

    rng = np.random.default_rng(seed + 31)
    n = g["host_requests"]
    plo, phi = g["host_prompt"]
    olo, ohi = g["host_output"]
    max_len = ex.max_model_len
    num_prefixes, lo, hi = g.get("host_shared_prefix") or (0, 0, 0)
    prefixes = [rng.integers(0, ex.vocab_size, int(rng.integers(lo, hi + 1)), dtype=np.int32)
                for _ in range(int(num_prefixes))]
    reqs, arrival = [], 0.0
    kind = g.get("host_lengths", "uniform")       # a grid saved before the key drew uniform lengths
    prompt_len, output_len = engine_run_lengths(kind, plo, phi), engine_run_lengths(kind, olo, ohi)
    for i in range(n):
        p = int(min(prompt_len.sample(1, rng)[0], max_len // 2))
        o = int(min(output_len.sample(1, rng)[0], max_len - p))
        prompt = rng.integers(0, ex.vocab_size, p, dtype=np.int32)
        if prefixes and i % 2:   # every other request behind a shared prefix: prefix-hit steps
            prompt = np.concatenate([prefixes[int(rng.integers(len(prefixes)))], prompt])[:max_len - o]
        reqs.append(Request(f"h{i}", arrival, prompt, max(o, 1)))
        if g.get("host_rate") and not burst:   # Poisson arrivals: queues like a server's
            arrival += float(rng.exponential(1.0 / g["host_rate"]))
    timed = StepTimer()
    engine = dict(num_blocks=num_blocks, block_size=block_size, num_cpu_blocks=num_cpu_blocks,
                  max_num_seqs=max(g["decode_batch"]), max_num_batched_tokens=max(g["prefill_tokens"]),
                  max_model_len=max_len)
    eng = build_engine({"engine": engine, "scheduler": dict(scheduler or {"name": "fcfs"}), "watermark": {"name": "fixed"},
                        "eviction": dict(eviction or {"name": "lifo"}), "prefix_cache": {"name": "hash_lru"}},
                       executor=ex, record_steps=True)
    eng.run(reqs, callbacks=[timed])
    # the first steps follow an idle gap (elapsed_s then counts only execute)
    work = host_work_rows([b for b, _, _ in timed.rows])
    used = STEP_COLUMNS.index("used_blocks")
    peak = max((row[used] for row in eng.metrics.steps), default=0)
    return HostRun([({**batch_features(b), **w}, inner, el) for (b, inner, el), w in list(zip(timed.rows, work))[2:]],
                   int(peak), timed.meter)


def engine_samples(ex, steps) -> list[dict]:
    """The engine run's steps as profile samples (group ``engine``; ``t`` = seconds in execute)."""
    return [{"group": "engine", "graph": bool(ex.uses_graph(f["n_pre"], f["n_dec"])), **f, "t": inner}
            for f, inner, _ in steps]
