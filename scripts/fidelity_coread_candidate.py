"""A fit-12 candidate of a fit-11 profile: the same model, its shared KV token prices re-based onto the
co-read tokens (``dec_coread``, kvrl.executors.profile.features), every other term as fitted.

Fit version 12 prices a decode's prefix-cache tokens as shared only where another sequence held the
blocks at its admission. On the profile grid's shared points (every decode of a batch reads one common
prefix) that counts every decode but the first (:func:`~kvrl.executors.profile.features.co_read_of`). Each
shared price is re-based so that those points price as the source profile priced them: ``graph.shared``
on the CUDA-graph ``shared`` points, ``eager.coef.dec_shared`` on the eager ones, ``eager.coef.mixed_shared``
on ``shared_mixed``, each the least-squares ``s`` (on relative error, the fit's own criterion) of
``s * co_read = s_old * dec_shared`` over its points. The measurements are not re-read: steps whose shared
tokens are all co-read price about as before (a little more for the first reader's share, spread over its
batch), a cached block that one decode reads alone now prices as a private one, and steps without prefix
hits price exactly as the source profile prices them. A fresh ``kvrl-profile`` fits every term at once.

    python scripts/fidelity_coread_candidate.py SOURCE.json OUT.json    # prints each price before and after
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from kvrl.executors.profile import StepModel
from kvrl.executors.profile.features import co_read_of
from kvrl.executors.profile.model import CO_READ_FIT_VERSION

#: (points: grid group, CUDA graph), the price it identifies: (model section, key path)
PRICES = ((("shared", True), ("graph", ("shared",))),
          (("shared", False), ("eager", ("coef", "dec_shared"))),
          (("shared_mixed", False), ("eager", ("coef", "mixed_shared"))))


def _get(d: dict, path: tuple) -> float:
    for k in path[:-1]:
        d = d[k]
    return d[path[-1]]


def _set(d: dict, path: tuple, value: float) -> None:
    for k in path[:-1]:
        d = d[k]
    d[path[-1]] = value


def rebase_shared(model_d: dict, samples: list[dict]) -> tuple[dict, list[dict]]:
    """``model_d`` (a fit-11 model dict) as fit version 12, its shared prices re-based on ``samples``
    (see the module doc), and per price a row: before, after, the points and the median absolute
    relative error of the grid model on them before (fit 11) and after."""
    out = json.loads(json.dumps(model_d))
    out["fit_version"] = CO_READ_FIT_VERSION
    rows = []
    for (group, graph), (section, path) in PRICES:
        points = [s for s in samples if s.get("group") == group and bool(s.get("graph")) == graph
                  and not (s.get("holdout") or s.get("diagnostic"))]
        if not points or out[section] is None or (section == "eager" and path[-1] not in out["eager"]["coef"]):
            continue
        before = _get(out[section], path)
        t = np.asarray([s["t"] for s in points])
        x_old = np.asarray([float(s.get("dec_shared", 0)) for s in points]) / t
        x_new = np.asarray([co_read_of(s) for s in points]) / t
        after = before * float(x_new @ x_old / (x_new @ x_new))
        _set(out[section], path, after)
        grid = lambda d: StepModel.from_dict({**d, "engine_factor": None})
        err = lambda m: float(np.median([abs(m.predict_features(s, graph) / s["t"] - 1) for s in points]))
        rows.append({"price": f"{section}.{'.'.join(path)}", "points": len(points), "before": before, "after": after,
                     "error_before": err(grid(model_d)), "error_after": err(grid(out))})
    return out, rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source", type=Path)
    ap.add_argument("out", type=Path)
    args = ap.parse_args(argv)
    prof = json.loads(args.source.read_text())
    if int(prof["model"].get("fit_version", 0)) >= CO_READ_FIT_VERSION:
        sys.exit(f"{args.source} is already fit version {prof['model']['fit_version']}")
    prof["model"], rows = rebase_shared(prof["model"], prof["samples"])
    prof["meta"]["derived"] = {"from": args.source.name, "by": "scripts/fidelity_coread_candidate.py",
                               "what": "fit version 12: shared prices re-based onto co-read tokens, other terms as fitted",
                               "prices": rows}
    args.out.write_text(json.dumps(prof, indent=1) + "\n")
    print("| price | points | before (s/token) | after | median abs. error before | after |\n|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['price']} | {r['points']} | {r['before']:.3g} | {r['after']:.3g} | {r['error_before']:.1%} | "
              f"{r['error_after']:.1%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
