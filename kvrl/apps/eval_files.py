"""kvrl-eval's result files: ``results.csv`` (every run's metrics, :func:`write_results`) and
``step_traces.npz`` (every test job's per-step record, :func:`write_step_traces` and
:func:`read_step_traces`)."""
from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from typing import Sequence

import numpy as np

from kvrl.apps.outputs import atomic_write


#: per-job arrays of a result, not CSV columns
_ARRAYS = ("trace", "steps")


def write_results(results: Sequence[dict], path: Path) -> None:
    """Every result's scalar columns (the union of their keys, not the per-job arrays) as CSV at ``path``,
    written atomically."""
    keys = list(dict.fromkeys(k for r in results for k in r if k not in _ARRAYS))
    def write(f):
        w = csv.DictWriter(f, keys, extrasaction="ignore")
        w.writeheader()
        w.writerows(results)
    atomic_write(path, write)


def write_step_traces(results: Sequence[dict], path: Path) -> None:
    """The whole per-step record of every test job that kept one (``step_traces=all``), in one
    compressed ``.npz``: ``job<i>`` an array of one row per engine step and one column per
    ``columns`` entry (:data:`~kvrl.engine.metrics.STEP_COLUMNS`), and ``index`` a JSON list of
    ``{"policy", "seed", "split", "backend"}`` whose i-th entry describes ``job<i>``."""
    from kvrl.engine.metrics import STEP_COLUMNS

    kept = [r for r in results if "steps" in r]
    index = [{k: r[k] for k in ("policy", "seed", "split", "backend")} for r in kept]
    arrays = {f"job{i}": r["steps"] for i, r in enumerate(kept)}
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez_compressed(tmp, index=np.array(json.dumps(index)), columns=np.array(STEP_COLUMNS), **arrays)
    os.replace(tmp, path)


def read_step_traces(path: Path) -> list[tuple[dict, dict[str, np.ndarray]]]:
    """The jobs of a :func:`write_step_traces` file: per job its index entry and its columns by name."""
    with np.load(path) as f:
        index, columns = json.loads(str(f["index"])), [str(c) for c in f["columns"]]
        return [(entry, {c: f[f"job{i}"][:, j] for j, c in enumerate(columns)}) for i, entry in enumerate(index)]
