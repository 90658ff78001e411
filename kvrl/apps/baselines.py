"""Baselines of ``kvrl-eval`` beyond the given heuristics: parameters tuned on ``val``, the best
constant in hindsight on ``test`` (an oracle), and the agent's strongest competitor.

* :func:`tune_on_val`: for each heuristic named in ``tune.<kind>`` (a grid per parameter), every
  point of the grid's Cartesian product runs on the ``val`` split (every seed); the point with
  the best mean goodput (the first of equals, in grid order) becomes a policy labelled
  ``name(params) [val-tuned]`` that kvrl-eval then runs on ``test``.
* :func:`oracle_on_test`: every fixed watermark of the sweep runs on ``test``; the best mean
  goodput there is the hindsight-best constant, a reference line (kind ``oracle``) that no real
  policy could pick in advance.
* :func:`strongest_competitor`: the non-agent, non-oracle policy with the best mean test
  goodput, the reference of the agent's paired difference.

Runs go through a ``runner(entries, split, kind) -> results`` callable (kvrl-eval's job runner:
``entries`` are ``(label, plugin)`` pairs, each run once per seed), so this module builds no
engine itself.
"""
from __future__ import annotations

import itertools
import logging
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from kvrl import plugins
from kvrl.envs.agent_io import JOINT_SLOTS

log = logging.getLogger("kvrl.eval")

Runner = Callable[[Sequence[tuple[str, dict]], str, str], list[dict]]
RANK_BY = "goodput_tok_s"
VAL_TUNED = "val-tuned"
ORACLE = "oracle"
COMPETITOR_KINDS = ("heuristic", "val-best", VAL_TUNED)   # what an agent has to beat (no oracle, no agent)


def label_of(plugin: Mapping[str, Any]) -> str:
    """``name(k=v, ...)`` of a plugin config (``name`` alone without parameters); of a joint
    policy (a plugin per slot of :data:`~kvrl.envs.agent_io.JOINT_SLOTS`), the slots' labels
    joined by `` + ``."""
    if "name" not in plugin and set(plugin) == set(JOINT_SLOTS):
        return " + ".join(label_of(plugin[slot]) for slot in JOINT_SLOTS)
    params = ", ".join(f"{k}={v}" for k, v in plugin.items() if k != "name")
    return f"{plugin['name']}({params})" if params else str(plugin["name"])


def grid_points(kind: str, plugin: Mapping[str, Any], grid: Mapping[str, Sequence[Any]], key: str) -> list[dict]:
    """Every point of ``grid``'s Cartesian product (the first key varies slowest) over the
    baseline ``plugin``'s own parameters, each validated by the plugin. A bad grid (not a
    mapping of non-empty lists, an unknown parameter, an invalid value) raises ``ValueError``
    naming ``key`` (the config key, e.g. ``tune.watermark.opt_factor``)."""
    if not isinstance(grid, Mapping) or not grid:
        raise ValueError(f"{key}: expected a mapping of parameter -> list of values, got {grid!r}")
    for name, values in grid.items():
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or len(values) == 0:
            raise ValueError(f"{key}.{name}: expected a non-empty list of values, got {values!r}")
    points = []
    for combo in itertools.product(*grid.values()):
        point = {**plugin, **dict(zip(grid, combo))}
        params = {k: v for k, v in point.items() if k != "name"}
        try:
            plugins.make_params(kind, point["name"], **params)
        except ValueError as exc:
            raise ValueError(f"{key}: {exc}") from exc
        points.append(point)
    return points


def tuning_grids(kind: str, baselines: Sequence[Mapping[str, Any]],
                 tune: Optional[Mapping[str, Any]]) -> dict[str, list[dict]]:
    """``{baseline label: grid points}`` for each plugin named in ``tune`` (``tune.<kind>``)
    that is one of the baselines. A grid for a registered plugin that is not among the baselines
    is not run (logged, so that a shorter ``baselines`` list needs no matching ``tune``); an
    unknown plugin name, or one that two baselines share, raises ``ValueError`` naming the key."""
    out = {}
    if not tune:                # nothing to tune (the joint task, whose kind is no plugin kind, has no grids)
        return out
    known = plugins.available(kind)
    for name, grid in (tune or {}).items():
        key = f"tune.{kind}.{name}"
        if name not in known:
            raise ValueError(f"{key}: no {kind} plugin {name!r}; known: {', '.join(known)}")
        matches = [b for b in baselines if b["name"] == name]
        if not matches:
            log.info("%s: %s is not among baselines.%s; its grid is not run", key, name, kind)
            continue
        if len(matches) > 1:
            raise ValueError(f"{key}: baselines.{kind} has {len(matches)} entries named {name!r} "
                             f"({[label_of(m) for m in matches]}); a grid needs exactly one")
        out[label_of(matches[0])] = grid_points(kind, matches[0], grid, key)
    return out


def mean_goodput(results: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Mean goodput per policy label, in order of first appearance."""
    labels = list(dict.fromkeys(r["policy"] for r in results))
    return {p: float(np.mean([r[RANK_BY] for r in results if r["policy"] == p])) for p in labels}


def best_of(candidates: Sequence[Mapping[str, Any]], results: Sequence[Mapping[str, Any]]) -> dict:
    """The candidate (plugin config) with the best mean goodput in ``results``; the first of equals."""
    goodput = mean_goodput(results)
    return dict(max(candidates, key=lambda p: goodput[label_of(p)]))


def tune_on_val(kind: str, baselines: Sequence[Mapping[str, Any]], tune: Optional[Mapping[str, Any]],
                runner: Runner, tag: str = VAL_TUNED) -> tuple[list[tuple[str, dict]], list[dict]]:
    """The val-tuned policies, as ``(label [tag], plugin)``, and every val run (for results.csv).
    All grids run in one batch (so workers stay busy)."""
    grids = tuning_grids(kind, baselines, tune)
    if not grids:
        return [], []
    entries: dict[str, dict] = {}
    for points in grids.values():
        for p in points:
            entries.setdefault(label_of(p), p)      # a point shared by two grids runs once
    results = runner(list(entries.items()), "val", "tuning")
    tuned = []
    for points in grids.values():
        best = best_of(points, results)
        tuned.append((f"{label_of(best)} [{tag}]", best))
    return tuned, results


def oracle_on_test(sweep: Sequence[float], runner: Runner,
                   points: Optional[Sequence[dict]] = None) -> tuple[str, list[dict], list[dict]]:
    """``(oracle label, the oracle's test runs relabelled as kind oracle, every sweep test run)``:
    the fixed watermark of ``sweep`` with the best mean test goodput (or the best of ``points``,
    plugin configs labelled by the runner's results, when given: the joint task's pairs)."""
    if points is None:
        points = [{"name": "fixed", "fraction": float(f)} for f in sweep]
    results = runner([(label_of(p), p) for p in points], "test", "sweep")
    best = best_of(points, results)
    label = f"{label_of(best)} [{ORACLE}: best constant on test]"
    oracle = [{**r, "policy": label, "kind": ORACLE} for r in results if r["policy"] == label_of(best)]
    return label, oracle, results


def strongest_competitor(results: Sequence[Mapping[str, Any]]) -> Optional[str]:
    """The label of the policy of kind heuristic, val-best or val-tuned with the best mean
    goodput in ``results`` (test runs); None without one."""
    goodput = mean_goodput([r for r in results if r["kind"] in COMPETITOR_KINDS])
    return max(goodput, key=goodput.get) if goodput else None

