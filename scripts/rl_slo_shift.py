"""A shifting SLO mix (``env=slo_shift``): does what knowing the regime gains in stationary regimes
survive when the regimes alternate during serving?

"Regime headroom" (docs/rl.md, session 17) found one place where the best constant watermark moves:
the TPOT objective. The ``slo_shift`` task alternates two tenants (``chat``: tight TPOT objective,
``batch``: loose) every ``phase_s`` seconds. On ``--split``, each of ``--seeds`` (kvrl-eval's
resample of 0.8), this script serves:

* **regimes**: each tenant alone at its busy-phase rate (the other at 0.01 requests/s), every
  constant of ``--constants``. The *stationary regime gain* is what a policy that knows the phase
  would gain if the phases were independent regimes of equal length: (best constant of one regime
  + best of the other) over the best single constant of their sum, per seed;
* **the mix** (the task as configured), every constant;
* **the phase oracle**: a schedule that knows the phase clock: constant ``a`` while ``chat`` is busy
  and ``b`` while ``batch`` is, for every pair of constants; the clock is fitted to each job's
  requests (the phase offset whose busy tenant matches most arrivals), so it knows what no causal
  policy can;
* **slo_mix**: the watermark plugin that reacts to the share of tight-TPOT requests among the
  running and waiting ones, over the grid :data:`SLO_MIX_GRID`.

The table gives, per measure, the best policy (picked on the mean over seeds, which favours the
schedules and rules: they have more candidates) and its paired gain over the best constant of the
same runs (95% interval over seeds).

    python scripts/rl_slo_shift.py --seeds 0,1,2 --workers 2 --out slo_shift.jsonl [overrides...]
    python scripts/rl_slo_shift.py --table slo_shift.jsonl
"""
from __future__ import annotations

import argparse
import functools
import itertools
import json
import logging
import os
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
from scipy import stats

from kvrl.plugins.base import WatermarkPolicy, check_range
from kvrl.plugins.registry import register
from rl_regime_headroom import serve_to_jsonl   # scripts/ is on sys.path when run as a script

RESAMPLE = 0.8
SLO_MIX_GRID = {"tight": [0.1, 0.2, 0.3], "loose": [0.0, 0.01], "share": [0.3, 0.5, 0.7], "tight_tpot_s": [0.005]}


@register("watermark", "phase_oracle")
class PhaseOracle(WatermarkPolicy):
    """A study-only oracle (registered by this script, not a built-in): ``busy_a`` of the GPU
    blocks free while engine time ``t`` has ``floor((t - offset_s) / phase_s)`` even, else
    ``busy_b``."""

    @dataclass
    class Params:
        busy_a: float = 0.0
        busy_b: float = 0.0
        phase_s: float = 20.0
        offset_s: float = 0.0

        def __post_init__(self):
            check_range("busy_a", self.busy_a, 0.0, 1.0, hi_inclusive=False)
            check_range("busy_b", self.busy_b, 0.0, 1.0, hi_inclusive=False)
            check_range("phase_s", self.phase_s, 1e-9)

    def reserved_blocks(self) -> int:
        p = self.params
        even = int((self.engine.now - p.offset_s) // p.phase_s) % 2 == 0
        return int((p.busy_a if even else p.busy_b) * self.engine.num_blocks)


def _task(overrides: list[str]):
    from kvrl.envs.config import load_task
    return load_task("slo_shift", overrides)[1].run


@functools.lru_cache(maxsize=None)
def task_phase_clock(overrides: tuple[str, ...], split: str, seed: int) -> tuple[float, float]:
    """:func:`phase_clock` of the task with ``overrides``, once per worker process for every oracle
    schedule that serves the same job."""
    return phase_clock(_task(list(overrides)), split, seed)


def phase_clock(run: dict, split: str, seed: int) -> tuple[float, float]:
    """(phase_s, offset_s) of the job's engine clock: the tenants' phase length as the resample
    compresses it, and the offset (0.25 s grid over two phases) at which the first tenant is busy in
    even phases for the most arrivals."""
    from kvrl.apps.eval import job_workload
    from kvrl.workloads import build_workload

    wl = job_workload(run["workload"], split, seed, RESAMPLE)
    reqs = build_workload(wl, vocab_size=int(run["model"]["vocab_size"]))
    first = wl["tenants"][0]["name"]
    phase = float(wl["tenants"][0]["phase_s"]) / float(wl["rate_scale"])
    t = np.array([r.arrival_s for r in reqs])
    is_first = np.array([r.tenant == first for r in reqs])
    offsets = np.arange(0.0, 2 * phase, 0.25)
    score = [np.mean(((np.floor((t - o) / phase) % 2) == 0) == is_first) for o in offsets]
    return phase, float(offsets[int(np.argmax(score))])


def regime_overrides(run: dict, busy: int) -> list[str]:
    """Tenant ``busy`` alone at its busy-phase rate, the other at 0.01 requests/s, no phases."""
    out = []
    for i, t in enumerate(run["workload"]["tenants"]):
        rate = float(t["arrival"]["rate"]) * max(t["rate_phases"]) if i == busy else 0.01
        out += [f"workload.tenants.{i}.arrival.rate={rate}", f"workload.tenants.{i}.rate_phases=[1.0]"]
    return out


def _cell(args: tuple) -> dict:
    measure, plugin, split, seed, overrides = args
    logging.disable(logging.WARNING)
    from kvrl.apps.eval import Job, Policy, label_of, run_job

    run = _task(overrides)
    if measure.startswith("regime:"):
        run = _task(overrides + regime_overrides(run, int(measure.split(":")[1])))
    if plugin["name"] == "phase_oracle":          # only on the mix: run is the task with overrides
        phase, offset = task_phase_clock(tuple(overrides), split, seed)
        plugin = {**plugin, "phase_s": phase, "offset_s": offset}
    label = label_of({k: v for k, v in plugin.items() if k not in ("phase_s", "offset_s")})
    r = run_job(run, "watermark", Job(Policy(label, "x", plugin), split, seed), RESAMPLE)
    return {"measure": measure, "policy": label, "kind": plugin["name"], "split": split, "seed": seed,
            "goodput_tok_s": r["goodput_tok_s"], "preemptions": r["preemptions"]}


def cells(constants: list[float], seeds: list[int], split: str, overrides: list[str]) -> list[tuple]:
    fixed = [{"name": "fixed", "fraction": c} for c in constants]
    oracle = [{"name": "phase_oracle", "busy_a": a, "busy_b": b} for a, b in itertools.product(constants, constants)
              if a != b]
    slo_mix = [{"name": "slo_mix", **dict(zip(SLO_MIX_GRID, v))} for v in itertools.product(*SLO_MIX_GRID.values())]
    jobs = []
    for p in fixed:
        jobs += [("regime:0", p), ("regime:1", p), ("mix", p)]
    jobs += [("mix", p) for p in oracle + slo_mix]
    return [(m, p, split, s, overrides) for m, p in jobs for s in seeds]


def _half_width(x: np.ndarray) -> float:
    return float(stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x))) if len(x) > 1 else float("nan")


def summarise(rows: list[dict]) -> list[str]:
    """The Markdown table of the module doc."""
    g: dict = defaultdict(lambda: defaultdict(dict))      # measure -> policy -> seed -> goodput
    kind: dict[str, str] = {}
    for r in rows:
        g[r["measure"]][r["policy"]][r["seed"]] = r["goodput_tok_s"]
        kind[r["policy"]] = r["kind"]
    seeds = sorted({r["seed"] for r in rows})
    vec = lambda m, p: np.array([g[m][p][s] for s in seeds])
    fixed = [p for p in g["mix"] if kind[p] == "fixed"]
    lines = ["| measure | best constant (goodput tok/s) | best other policy (goodput tok/s) | its gain over the best "
             "constant, 95% CI over seeds |", "|---|---|---|---:|"]
    for m in ("regime:0", "regime:1"):
        best = max(fixed, key=lambda p: vec(m, p).mean())
        lines.append(f"| {m.replace('regime:0', 'chat alone (tight TPOT)').replace('regime:1', 'batch alone (loose TPOT)')} "
                     f"| {best} ({vec(m, best).mean():,.0f}) | - | - |")
    both = lambda p: vec("regime:0", p) + vec("regime:1", p)
    mixture = max(fixed, key=lambda p: both(p).mean())
    b0 = max(fixed, key=lambda p: vec("regime:0", p).mean())
    b1 = max(fixed, key=lambda p: vec("regime:1", p).mean())
    gain = ((vec("regime:0", b0) + vec("regime:1", b1)) / both(mixture) - 1) * 100
    lines.append(f"| stationary regimes, equal time | {mixture} ({both(mixture).mean() / 2:,.0f}) | {b0} / {b1} "
                 f"({(vec('regime:0', b0) + vec('regime:1', b1)).mean() / 2:,.0f}) "
                 f"| {gain.mean():+.1f}% ({gain.mean() - _half_width(gain):+.1f} to {gain.mean() + _half_width(gain):+.1f}) |")
    best_c = max(fixed, key=lambda p: vec("mix", p).mean())
    for k, name in (("phase_oracle", "the mix: phase oracle"), ("slo_mix", "the mix: slo_mix")):
        cands = [p for p in g["mix"] if kind[p] == k]
        if not cands:
            continue
        best = max(cands, key=lambda p: vec("mix", p).mean())
        d = (vec("mix", best) / vec("mix", best_c) - 1) * 100
        lines.append(f"| {name} | {best_c} ({vec('mix', best_c).mean():,.0f}) | {best} ({vec('mix', best).mean():,.0f}) "
                     f"| {d.mean():+.1f}% ({d.mean() - _half_width(d):+.1f} to {d.mean() + _half_width(d):+.1f}) |")
    return lines


def main() -> None:
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("overrides", nargs="*", help="Hydra overrides of the slo_shift task")
    ap.add_argument("--constants", default="0.0,0.01,0.05,0.1,0.2,0.3")
    ap.add_argument("--split", default="val")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default="slo_shift.jsonl")
    ap.add_argument("--table", default=None, help="only render the table of this JSONL")
    args = ap.parse_args()
    if args.table:
        print("\n".join(summarise([json.loads(line) for line in open(args.table)])))
        return
    todo = cells([float(c) for c in args.constants.split(",")], [int(s) for s in args.seeds.split(",")],
                 args.split, list(args.overrides))
    print("\n".join(summarise(serve_to_jsonl(_cell, todo, args.workers, args.out))))


if __name__ == "__main__":
    main()
