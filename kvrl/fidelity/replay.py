"""The live run, step by step: an engine callback keeps every executed batch and its live times
(:class:`StepRecorder`, with CPU contention counters every few steps: :mod:`kvrl.fidelity.cpu`),
the sim's cost model prices the same batches afterwards (the replay), and GC pauses are counted.
"""
from __future__ import annotations

import csv
import gc
import time
from pathlib import Path

import numpy as np

from kvrl.engine.callbacks import EngineCallback


class StepRecorder(EngineCallback):
    """Engine callback on the live run: keeps every executed batch, its live ``elapsed_s`` and the
    wall seconds inside ``execute`` (priced by the sim's cost model after the run, so between live
    steps nothing happens but three list appends, and every ``cpu_every`` steps the CPU sampler's
    two ``/proc`` reads and host probe, about 0.1 ms). The run's wall-time limit is the serving
    loop's (:func:`kvrl.fidelity.pairs.serve_live`)."""

    def __init__(self, cpu_every: int = 16) -> None:
        from kvrl.fidelity.cpu import CpuSampler

        self.batches: list = []
        self.elapsed: list[float] = []
        self.inside: list[float] = []     # wall seconds inside execute (elapsed_s adds the engine's gap)
        #: per step, the prefix-cache blocks its decodes read, as :func:`prefix_reads` sees them at the step
        self.prefix_reads: list[tuple] = []
        self._first_block: dict[int, int] = {}    # seq_id -> first block of its table, while it had one
        #: CPU contention counters every ``cpu_every`` steps (kvrl.fidelity.cpu)
        self.cpu = CpuSampler(cpu_every)

    def on_run_start(self, engine) -> None:
        self.cpu.meter.start()

    def on_run_end(self, engine) -> None:
        self.cpu.meter.stop()

    def on_step(self, event) -> bool:
        self.cpu.on_step(len(self.inside))
        self.inside.append(event.execute_wall_s)
        self.batches.append(event.batch)
        self.elapsed.append(event.output.elapsed_s)
        self.prefix_reads.append(prefix_reads(event.batch, self._first_block))
        return True

    def replay(self, pricer, live) -> list[dict]:
        """Per executed step, in order (the pricer's swap stream sees the same sequence): live and
        sim seconds, the step's kind and cost-model features, the live seconds inside ``execute``
        and the sim's host term at the pricer's ``host_speed`` (so the run can be re-priced offline
        with another profile); ``live`` is the live executor (its CUDA-graph sizes)."""
        from kvrl.executors.profile import HOST_WORK, batch_features, host_work_rows

        model = pricer.profile.model if pricer.profile is not None else None
        rows = []
        cpu = self.cpu.columns(len(self.batches))
        for batch, work, live_s, inside_s, cpu_row, reads in zip(self.batches, host_work_rows(self.batches),
                                                                 self.elapsed, self.inside, cpu, self.prefix_reads):
            f = {**batch_features(batch), **work, **batch_co_reads(reads)}
            n_dec, n_pre = f["n_dec"], f["n_pre"]
            host_s = pricer.host_speed * model.host_s(n_pre + n_dec, n_pre, *(f[k] for k in HOST_WORK)) \
                if model is not None and batch.seqs else 0.0
            rows.append({"live_s": live_s, "sim_s": pricer.execute(batch).elapsed_s, "kind": step_kind(batch, n_pre, n_dec),
                         "live_execute_s": inside_s, "sim_host_s": host_s, "tokens": batch.num_tokens, **f,
                         "graph": int(live.uses_graph(n_pre, n_dec)), **cpu_row})
        return rows


def prefix_reads(batch, first_block: dict[int, int]) -> tuple:
    """``(first block, tokens)`` of each decode of ``batch`` that reads prefix-cache blocks: the first
    block of its table (which names the prefix it reads: one tenant's system prompt, one shared
    document) and the KV tokens of its prefix-cache hit it reads (``shared_prefix_tokens``, at most its
    context). Called right after the step (a loop over its sequences: microseconds, so the live step it
    follows is not slowed), when a sequence the step finished has given its blocks back: ``first_block``
    (``seq_id`` -> first block, updated here from every sequence of the step that still holds blocks)
    remembers its first block from an earlier step."""
    reads = []
    for item in batch.seqs:
        seq = item.seq
        if seq.block_table:
            first_block[seq.seq_id] = seq.block_table[0]
        if item.num_tokens == 1 and seq.shared_prefix_tokens and seq.seq_id in first_block:
            reads.append((first_block[seq.seq_id], min(seq.shared_prefix_tokens, item.start + 1)))
    return tuple(reads)


#: the replay's columns from :func:`batch_co_reads` (diagnostic: no step model prices them)
BATCH_READ_COLUMNS = ("dec_prefixes", "dec_coread_batch", "dec_prefix_unique")


def batch_co_reads(reads: tuple) -> dict[str, int]:
    """What a step's decodes read of the prefix cache together (:func:`prefix_reads`):
    ``dec_prefixes``, the distinct prefixes read; ``dec_coread_batch``, the KV tokens that decodes read
    in prefix blocks another decode of the same step also reads (per decode, its hit up to the longest
    other reader's of the same prefix), where the step model's ``dec_coread`` counts the blocks another
    sequence held when the decode was admitted; ``dec_prefix_unique``, the prefix tokens the step
    reads counting each prefix once (per prefix, its longest reader's hit)."""
    by_prefix: dict[int, list[int]] = {}
    for first, tokens in reads:
        by_prefix.setdefault(first, []).append(tokens)
    coread = unique = 0
    for hits in by_prefix.values():
        top = sorted(hits, reverse=True)
        unique += top[0]
        if len(top) > 1:
            coread += min(top[0], top[1]) + sum(top[1:])      # the longest reads up to the second-longest
    return {"dec_prefixes": len(by_prefix), "dec_coread_batch": coread, "dec_prefix_unique": unique}


class GcPauses:
    """Context manager recording the cyclic garbage collector's pauses (seconds) while it is open:
    in a live run they are stalls the sim does not price."""

    def __init__(self) -> None:
        self.pauses: list[float] = []
        self._t0 = 0.0

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.pauses.append(time.perf_counter() - self._t0)

    def __enter__(self) -> "GcPauses":
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self._callback)

    def summary(self) -> dict:
        return {"collections": len(self.pauses), "total_s": float(sum(self.pauses)),
                "max_s": float(max(self.pauses, default=0.0))}


def step_kind(batch, n_pre: int, n_dec: int) -> str:
    """swap (any swap-out or swap-in), decode, prefill or mixed."""
    if batch.swap_out or batch.swap_in:
        return "swap"
    if not n_pre:
        return "decode"
    return "mixed" if n_dec else "prefill"


def replay_summary(replay: list[dict]) -> dict:
    """Per-step relative errors of a (non-empty) replay: median, p90, total, and per step kind."""
    live_t = np.asarray([r["live_s"] for r in replay])
    sim_t = np.asarray([r["sim_s"] for r in replay])
    e = np.abs(sim_t - live_t) / np.maximum(live_t, 1e-12)
    return {"steps": int(live_t.size), "median_abs_rel_err": float(np.median(e)),
            "p90_abs_rel_err": float(np.percentile(e, 90)),
            "total_rel_err": float((sim_t.sum() - live_t.sum()) / max(live_t.sum(), 1e-12)),
            "host_slow_share": host_slow_share(replay), "fast_host": fast_host_totals(replay),
            "by_kind": replay_breakdown(replay)}


def on_fast_host(replay: list[dict]) -> list[dict]:
    """The steps whose sampling window found the host fast (``host_slow`` below
    :data:`~kvrl.fidelity.cpu.HOST_SLOW_THRESHOLD`); none where the column was not recorded."""
    from kvrl.fidelity.cpu import HOST_SLOW_THRESHOLD

    return [r for r in replay if r.get("host_slow", np.nan) < HOST_SLOW_THRESHOLD]


def fast_host_totals(replay: list[dict]) -> dict:
    """Live and sim seconds summed over the steps on a fast host (:func:`on_fast_host`), in all
    and per step kind (``host``: the engine's time between steps, as :func:`replay_breakdown`): the
    replay error with the lent machine's slow windows left out. Empty without the column."""
    fast = on_fast_host(replay)
    if not fast:
        return {}
    out = {"all": {"steps": len(fast), "live_s": float(sum(r["live_s"] for r in fast)),
                   "sim_s": float(sum(r["sim_s"] for r in fast))}}
    for kind, k in replay_breakdown(fast).items():
        out[kind] = {"steps": k["steps"], "live_s": k["live_s"], "sim_s": k["sim_s"]}
    return out


def host_slow_share(replay: list[dict]) -> float:
    """The share of the live run's time spent in steps whose sampling window found the host slow
    (``host_slow`` at or above :data:`~kvrl.fidelity.cpu.HOST_SLOW_THRESHOLD`), among the steps
    that have the column; NaN where none has it. A run with a large share met the lent machine's
    slow windows, which no step model prices (docs/fidelity.md, "Run 31")."""
    from kvrl.fidelity.cpu import HOST_SLOW_THRESHOLD

    rows = [r for r in replay if np.isfinite(r.get("host_slow", np.nan))]
    total = sum(r["live_s"] for r in rows)
    if not rows or total <= 0:
        return float("nan")
    return float(sum(r["live_s"] for r in rows if r["host_slow"] >= HOST_SLOW_THRESHOLD) / total)


def replay_breakdown(replay: list[dict]) -> dict:
    """Replay totals per step kind, plus the engine's time between steps ("host": live
    ``elapsed_s`` minus the time inside ``execute``, vs the profile's host term)."""
    out: dict[str, dict] = {}
    for kind in ("decode", "prefill", "mixed", "swap"):
        rows = [r for r in replay if r["kind"] == kind]
        if rows:
            live_t = np.asarray([r["live_s"] for r in rows])
            sim_t = np.asarray([r["sim_s"] for r in rows])
            out[kind] = {"steps": len(rows), "live_s": float(live_t.sum()), "sim_s": float(sim_t.sum()),
                         "median_abs_rel_err": float(np.median(np.abs(sim_t - live_t) / np.maximum(live_t, 1e-12)))}
    if replay:
        live_h = float(sum(max(r["live_s"] - r["live_execute_s"], 0.0) for r in replay))
        out["host"] = {"steps": len(replay), "live_s": live_h, "sim_s": float(sum(r["sim_host_s"] for r in replay)),
                       "median_abs_rel_err": float("nan")}
    return out


def read_replay_csv(path: Path) -> list[dict]:
    """The rows of a run's ``replay.csv`` (one per executed live step, in order) as dicts: the
    cost-model features and host-work counters as ints (:data:`~kvrl.executors.profile.FEATURES`,
    ``dec_coread`` where recorded (since fit version 12; without it a fit-12 model prices every
    prefix hit as shared, as the live run's profile did), ``pre_max_q`` where recorded (since fit
    version 13; without it the longest prefill chunk is taken as all of the step's prefill tokens),
    :data:`~kvrl.executors.profile.HOST_WORK`),
    ``kind``, ``live_s``, ``live_execute_s`` and
    ``graph``, and the CPU contention columns where recorded (:data:`~kvrl.fidelity.cpu.CPU_COLUMNS`) and
    the step's prefix reads where recorded (:data:`BATCH_READ_COLUMNS`, since session 55).
    Counters that files written before fit version 9 lack (``pre_tok_prev``,
    ``swap_blocks``, ``swap_step``) follow from the rows in order, as
    :func:`~kvrl.executors.profile.host_work_rows` computes them live."""
    from kvrl.executors.profile import FEATURES, HOST_WORK
    from kvrl.executors.profile.features import CO_READ, PRE_MAX_Q
    from kvrl.fidelity.cpu import CPU_COLUMNS

    rows, prev_pre_tok = [], 0
    with open(path) as f:
        for r in csv.DictReader(f):
            feats = {k: int(float(r[k])) for k in (*FEATURES, CO_READ, PRE_MAX_Q, *HOST_WORK, *BATCH_READ_COLUMNS)
                     if r.get(k) not in (None, "")}
            swaps = feats.get("swap_out", 0) + feats.get("swap_in", 0)
            feats.setdefault("pre_tok_prev", prev_pre_tok)
            feats.setdefault("swap_blocks", swaps)
            feats.setdefault("swap_step", int(swaps > 0))
            prev_pre_tok = feats.get("pre_tok", 0)
            feats.update(kind=r["kind"], live_s=float(r["live_s"]), live_execute_s=float(r["live_execute_s"]),
                         graph=int(float(r.get("graph", 0) or 0)))
            feats.update({k: float(r[k]) for k in CPU_COLUMNS if r.get(k) not in (None, "")})
            rows.append(feats)
    return rows
