"""The sim calibrated on earlier pairs, offline, on every committed single-H200 fidelity run that kept its
live steps: does the host speed measured before a pair predict that pair's live run?

    python scripts/fidelity_calibrated.py [--work DIR] [--out FILE] [run ...]
    python scripts/fidelity_calibrated.py --live NAME=DIR ... [--out FILE]   # as recorded live, no resim
    python scripts/fidelity_calibrated.py --table FILE    # an --out file as a Markdown table

The runs of ``fidelity_candidate.RUNS`` (the pressure set, the blind set and the Mooncake workloads; the
Mooncake runs 51-52 need the traces at ``.dev/traces/``) are re-simulated share by share with the shipped
profile of their shape (``kvrl-fidelity resim=``, this tree's code). Each share is one kvrl-fidelity process,
and resim serves every pair after a share's first also at the host speed that the re-priced replays of the
pairs before it measured (``sim_cal``; kvrl-fidelity does the same live since session 34). Scored on those
pairs, against the mean of each pair's live runs: the sim as priced and calibrated, per target metric, every
target at once, and the resolved live orders each reverses (``fidelity_candidate.scores``); beside them the
sim at each pair's own replay's host speed (``sim_host``), a calibration after the fact that bounds what any
host-speed calibration could do. One JSON line per
run to ``--out``, then one per shape with the totals. CPU, about a minute per run. ``--live`` scores runs
that recorded the three sims themselves (kvrl-fidelity since session 34) as they recorded them, in seconds.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fidelity_candidate import RUNS, count, scores, table  # noqa: E402
from fidelity_scale_rule import extract_replays, profile_path, resim, unpack  # noqa: E402

#: the sims scored (keys of each JSON line) and the keys of resim's results they come from
SIMS = {"as priced": "sim", "calibrated": "sim_cal", "own speed": "sim_host"}
NAMES = tuple(SIMS)


def score(run: str, shape: str, shares: dict[str, dict]) -> dict:
    """One JSON line: the pairs of ``shares`` (share -> its fidelity.json) that have a calibrated sim,
    each of :data:`SIMS` scored against the mean of their live runs."""
    live, sims, scales = {}, {name: {} for name in NAMES}, []
    for results in shares.values():
        for pair, res in results.items():
            if "sim_cal" in res:
                live[pair] = res
                for name, key in SIMS.items():
                    sims[name][pair] = {"sim": res[key]}
                scales.append(res["calibration_scale"])
    return {"run": run, "shape": shape, "pairs": len(live), "shares": len(shares),
            "scales": [min(scales), max(scales)], **replay_spread(shares), **scores(live, sims)}


def replay_spread(shares: dict[str, dict]) -> dict:
    """How the pairs' replay errors (total, sum(sim) / sum(live) - 1) spread within each share: their standard
    deviation (``replay_sd``, per share), the median absolute difference between the two policies of one workload
    (``policy_diff``, per share) and the decode steps' share of the live time (``decode_share``, over the run)."""
    sd, diff, decode, total = [], [], 0.0, 0.0
    for results in shares.values():
        errors, by_workload = [], {}
        for pair, res in results.items():
            if "replay" in res:
                errors.append(res["replay"]["total_rel_err"])
                by_workload.setdefault(pair.split("/")[0], []).append(errors[-1])
                kinds = res["replay"]["by_kind"]
                decode += kinds.get("decode", {}).get("live_s", 0.0)
                total += sum(k["live_s"] for k in kinds.values())
        sd.append(statistics.pstdev(errors))
        diff.append(statistics.median([abs(v[0] - v[1]) for v in by_workload.values() if len(v) == 2] or [math.nan]))
    return {"replay_sd": sd, "policy_diff": diff, "decode_share": decode / total}


def resimulated(run: str, shape: str, work: Path, ensemble: int = 1) -> dict[str, dict]:
    """A committed run's shares re-simulated with the shipped profile of ``shape`` (cached in ``work``), each sim
    the mean of ``ensemble`` jittered runs where that is above 1 (``kvrl-fidelity sim_ensemble=``)."""
    dst, shares, _ = unpack(run, work)
    tag, extra = ("", ()) if ensemble <= 1 else (f"ens{ensemble}_", (f"sim_ensemble={ensemble}",))
    return {share: resim(dst / share, profile_path(shape, "shipped"), 1.0, dst / f"cal_{tag}{share}", extra)
            for share in shares}


def rerun_recorded(name: str, directory: Path, work: Path, ensemble: int) -> tuple[str, dict[str, dict]]:
    """A live run of ``recorded`` (``directory``) re-simulated share by share (``kvrl-fidelity resim=``, cached in
    ``work/name``) with the profile each share chose live (``profile_select``; this tree's copy of it) and
    ``sim_ensemble=ensemble``: the same live runs scored with another sim (1: the deterministic one)."""
    shape, shares = recorded(directory)
    dst = work / name
    extract_replays(directory, dst)
    out = {}
    for share, results in shares.items():
        (dst / share / "fidelity.json").write_text(json.dumps(results))
        first = next(iter(results.values()))
        if "profile_select" not in first:
            raise SystemExit(f"{directory}/{share}: not a profile=select run (no profile_select in its fidelity.json)")
        chosen = Path(first["profile_select"]["profile"])
        local = Path(profile_path(shape, "h200x4" if chosen.parent.name == "h200x4" else "shipped"))
        if local.name != chosen.name:
            raise SystemExit(f"{directory}/{share}: chose {chosen}, which this tree does not ship")
        out[share] = resim(dst / share, str(local), 1.0, dst / f"ens{ensemble}_{share}", (f"sim_ensemble={ensemble}",))
    return shape, out


def compare(before: Path, after: Path) -> str:
    """Two ``--out`` files of the same runs (e.g. the sim deterministic and as an ensemble) as one Markdown table of
    each shape's totals: per sim, every target and throughput within 3%, ``before -> after``."""
    totals = lambda path: {r["total"]: r for r in map(json.loads, path.read_text().splitlines()) if "total" in r}
    a, b = totals(before), totals(after)
    cols = [(name, key) for name in NAMES for key in ("every_target", "throughput_within")]
    lines = ["| shape | " + " | ".join(f"{n}: {'every target' if k == 'every_target' else 'throughput within 3%'}"
                                         for n, k in cols) + " |", "|---|" + "---:|" * len(cols)]
    for shape in a:
        lines.append(f"| {shape} | " + " | ".join(f"{a[shape][n][k]} -> {b[shape][n][k]}" for n, k in cols) + " |")
    return "\n".join(lines)


def recorded(directory: Path) -> tuple[str, dict[str, dict]]:
    """The shape and shares of a kvrl-fidelity run that recorded its calibrated sims live (``pressure_<i>/``)."""
    import yaml

    shares = sorted(directory.glob("pressure_[0-9]"))
    if not shares:
        raise SystemExit(f"{directory}: no pressure_<i>/ share")
    with tarfile.open(directory / "replay.tar.xz") as t:
        cfg = yaml.safe_load(t.extractfile(f"./{shares[0].name}/.hydra/config.yaml"))
    return cfg["model"]["name"], {d.name: json.loads((d / "fidelity.json").read_text()) for d in shares}


def totals(rows: list[dict], shape: str) -> dict:
    """The last line of a shape: each sim's counts summed over its runs' lines (``rows``)."""
    keys = [k for k in rows[0][NAMES[0]] if k.endswith("_within") or k in ("every_target", "reversed")]
    return {"total": shape, **{name: {k: count(rows, name, k) for k in keys} for name in NAMES}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="*", help="runs of fidelity_candidate.RUNS (default: all)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/kvrl-calibrated"))
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--live", nargs="+", default=None, metavar="NAME=DIR",
                    help="score these runs' calibrated sims as kvrl-fidelity recorded them live instead (DIR: pressure_<i>/ "
                         "shares with fidelity.json, and replay.tar.xz with their configs)")
    ap.add_argument("--table", type=Path, default=None, help="print this --out file as a Markdown table and stop")
    ap.add_argument("--compare", type=Path, nargs=2, default=None, metavar=("BEFORE", "AFTER"),
                    help="print two --out files' per-shape totals side by side (BEFORE -> AFTER) and stop")
    ap.add_argument("--resim-ensemble", type=int, default=None, metavar="K",
                    help="with --live: score the live runs re-simulated with each share's chosen profile and "
                         "sim_ensemble=K (1: the deterministic sim) instead of as recorded")
    ap.add_argument("--ensemble", type=int, default=1, metavar="K",
                    help="each sim the mean of K runs whose step times jitter by the profile's measured scatter "
                         "(kvrl-fidelity sim_ensemble=K; docs/fidelity.md, \"Runs 58-60\")")
    args = ap.parse_args()
    if args.table:
        print(table(args.table, NAMES))
        return
    if args.compare:
        print(compare(*args.compare))
        return
    lines = []
    if args.live:
        runs = [spec.split("=", 1) for spec in args.live]
        rows = [score(name, *(recorded(Path(d)) if args.resim_ensemble is None else
                              rerun_recorded(name, Path(d), args.work, args.resim_ensemble))) for name, d in runs]
        by_shape = {r["shape"]: [x for x in rows if x["shape"] == r["shape"]] for r in rows}
    else:
        by_shape = {shape: [score(run, shape, resimulated(run, shape, args.work, args.ensemble))
                            for run in runs if not args.runs or run in args.runs] for shape, runs in RUNS.items()}
    for shape, rows in by_shape.items():
        if rows:
            lines += [*rows, totals(rows, shape)]
    text = "".join(json.dumps(r) + "\n" for r in lines)
    print(text, end="")
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
