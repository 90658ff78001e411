"""Fitting the pressure terms of a step model from recorded live serving steps.

A ``kvrl-fidelity`` run records every live step (``runs/<workload>/<policy>/replay.csv``: the
cost-model features, the host-work counters, live ``elapsed_s`` and the seconds inside
``execute``). :func:`fit_live_terms` refits, from the steps of the workloads it is given (and only
those: the others stay held out for evaluation):

* the **host model** (all of :data:`~kvrl.executors.profile.HOST_WORK_TERMS` with the base,
  per-sequence and per-prefill terms) on the live gaps between steps (``live_s`` minus
  ``live_execute_s``), by :func:`~kvrl.executors.profile.fit_host`: the engine's own Python
  under pressure (admissions, preemptions, swaps, queued sequences, prefix hashing of the previous
  step's prefill), which the profile's short engine runs sample only thinly;
* ``mixed_dec``, the eager model's extra cost per decode sequence of a step that also prefills,
  raised by the non-negative least-squares increment (on relative error) that the mixed steps'
  live ``execute`` time needs over the profile's prediction; never lowered.

The returned profile records which data fitted which term in ``meta["live_fit"]`` (run directory,
workloads and policies used, step counts, the terms before and after).
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Iterable, Optional

import numpy as np


class LiveFitError(ValueError):
    """Replay data that cannot fit the terms (no such workload, no steps)."""


def replay_files(run_dir: Path, workloads: Iterable[str], policies: Optional[Iterable[str]] = None) -> dict[str, Path]:
    """``{"<workload>/<policy>": replay.csv}`` of ``run_dir`` for the named workloads (every policy
    recorded unless ``policies``); a named workload without replay files is an error naming it."""
    run_dir = Path(run_dir)
    out: dict[str, Path] = {}
    for w in workloads:
        found = sorted((run_dir / "runs" / w).glob("*/replay.csv"))
        found = [p for p in found if policies is None or p.parent.name in set(policies)]
        if not found:
            raise LiveFitError(f"fit_workloads: no runs/{w}/*/replay.csv under {run_dir}")
        out.update({f"{w}/{p.parent.name}": p for p in found})
    return out


def host_rows(steps: list[dict]) -> list[list[float]]:
    """``[num_seqs, n_pre, gap_s, *HOST_WORK]`` rows (the input of
    :func:`~kvrl.executors.profile.fit_host`) of the steps that ran a forward pass."""
    from kvrl.executors.profile import HOST_WORK

    return [[s["n_pre"] + s["n_dec"], s["n_pre"], max(s["live_s"] - s["live_execute_s"], 0.0),
             *(s.get(k, 0) for k in HOST_WORK)] for s in steps if s["n_pre"] or s["n_dec"]]


def mixed_increment(model, steps: list[dict], cuda_graphs: bool = True) -> tuple[float, int]:
    """The non-negative seconds per decode sequence that mixed steps (prefill and decodes, no block
    operations) need on top of ``model``'s forward pass to match their live ``execute`` time, by
    least squares on relative error; and how many steps fitted it."""
    from kvrl.executors.profile import nnls

    mixed = [s for s in steps if s["n_pre"] and s["n_dec"]
             and not (s.get("copies") or s.get("swap_out") or s.get("swap_in"))]
    if not mixed:
        return 0.0, 0
    t = np.asarray([s["live_execute_s"] for s in mixed])
    pred = np.asarray([model.predict_features(s, cuda_graphs) for s in mixed])
    b = np.asarray([float(s["n_dec"]) for s in mixed])
    x = nnls((b / t)[:, None], (t - pred) / t)
    return float(x[0]), len(mixed)


def fit_live_terms(profile, run_dir: Path, workloads: Iterable[str], policies: Optional[Iterable[str]] = None,
                   cuda_graphs: bool = True):
    """``profile`` (a :class:`~kvrl.executors.profile.StepProfile`) with its host model and
    ``mixed_dec`` fitted from the recorded live steps of ``workloads`` in the ``kvrl-fidelity`` run
    ``run_dir`` (see the module doc); the input profile is not changed."""
    from kvrl.executors.profile import StepModel, fit_host
    from kvrl.fidelity.replay import read_replay_csv

    workloads = list(workloads)
    files = replay_files(run_dir, workloads, policies)
    steps = {pair: read_replay_csv(p) for pair, p in files.items()}
    every = [s for rows in steps.values() for s in rows]
    rows = host_rows(every)
    if len(rows) < 3:
        raise LiveFitError(f"fit_workloads {workloads}: {len(rows)} live steps, too few to fit the host model")
    model = StepModel.from_dict(profile.model.to_dict())
    host_before = dict(model.host)
    model.host = fit_host(rows)
    k_eager = float(model.engine_factor.get("eager", 1.0)) or 1.0
    inc, n_mixed = mixed_increment(model, every, cuda_graphs)
    coef = model.eager["coef"]
    mixed_before = float(coef.get("mixed_dec", 0.0))
    model.eager = {**model.eager, "coef": {**coef, "mixed_dec": mixed_before + inc / k_eager}}
    model.rebuild()
    meta = dict(profile.meta)
    meta["live_fit"] = {
        "run": str(run_dir), "workloads": workloads, "pairs": sorted(steps), "steps": len(every),
        "host": {"fitted_from": "live gaps between steps (elapsed_s - execute) of these pairs", "steps": len(rows),
                 "before": host_before, "after": dict(model.host)},
        "mixed_dec": {"fitted_from": "live execute time of these pairs' mixed steps over the profile's prediction",
                      "steps": n_mixed, "before": mixed_before, "after": mixed_before + inc / k_eager},
        "profile": profile.path}
    path = f"{profile.path} (live-fitted)" if profile.path else None
    return replace(profile, model=model, meta=meta, path=path)
