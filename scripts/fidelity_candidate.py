"""A candidate step-time profile against the shipped one, on every committed live run that kept its
live steps, offline.

    python scripts/fidelity_candidate.py qwen3-0.6b=<profile.json> llama-3-8b=<profile.json> [--work DIR] [--out FILE]
    python scripts/fidelity_candidate.py qwen3-0.6b=<profile.json> --runs run56_qwen_pressure ... [--sim ARG ...]
    python scripts/fidelity_candidate.py --table FILE    # an --out file as a Markdown table

Each single-H200 run of ``docs/results/fidelity_same_host`` with a ``replay.tar.xz`` (runs 41-52, the
pressure set, the blind set and the Mooncake workloads; see docs/fidelity.md) is re-simulated share by
share (``kvrl-fidelity resim=``, this tree's code) with the shipped profile of its shape and with the
candidate given for that shape, against the same live runs. One JSON line per run: per profile, each target
metric's mean absolute error and pairs within its target (scripts/docs_facts.py ``_target_facts``), the
pairs that meet every target at once, and the resolved live orders its sim reverses; a last line per shape
and in all with the totals. The Mooncake runs (51-52) need the traces at ``.dev/traces/``. CPU, about a
minute per run. ``--runs`` scores other runs of that folder instead (folder names; one shape), and ``--sim``
passes overrides to every re-simulation, both profiles alike (e.g. ``sim_ensemble=1`` for runs that recorded
a 16-run ensemble).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import docs_facts as F  # noqa: E402  (the run registry and the target counts)
from fidelity_scale_rule import profile_path, resim, unpack  # noqa: E402

from kvrl.fidelity.report import resolved_rankings  # noqa: E402

#: per shape, the runs on single-H200 VMs (the shipped profiles' host class) that kept their live steps
RUNS = {"qwen3-0.6b": ("run41", "run42", "run46", "run48", "run51"),
        "llama-3-8b": ("run44", "run45", "run47", "run49", "run52")}


def scores(live: dict, sims: dict[str, dict]) -> dict[str, dict]:
    """Per sim: :func:`docs_facts._target_facts` and the resolved live orders it reverses."""
    rows = [r for r in resolved_rankings(live, sims) if r["resolved"]]
    return {name: {**F._target_facts({p: {**live[p], "sim": sim[p]["sim"]} for p in live}),
                   "reversed": f"{sum(not r['same'][name] for r in rows)} of {len(rows)}"}
            for name, sim in sims.items()}


def count(rows: list[dict], name: str, key: str) -> str:
    """``"k of n"`` summed over ``rows``' ``row[name][key]``."""
    parts = [tuple(int(x) for x in r[name][key].split(" of ")) for r in rows]
    return f"{sum(k for k, _ in parts)} of {sum(n for _, n in parts)}"


#: the table's metric columns: (title, key of the JSON line)
COLUMNS = (("every target", "every_target"), ("throughput within 3%", "throughput_within"),
           ("TTFT p50 within 10%", "ttft_p50_within"), ("TTFT p99 within 20%", "ttft_p99_within"),
           ("TPOT p50 within 10%", "tpot_p50_within"), ("resolved orders reversed", "reversed"))


def table(path: Path, names: tuple[str, ...] = ("shipped", "candidate")) -> str:
    """An ``--out`` file as Markdown: per run and per shape's total, each column ``names[0] -> names[1] ...``
    (the sims' keys in each line)."""
    lines = ["| run | shape | " + " | ".join(f"{t}: {' -> '.join(names)}" for t, _ in COLUMNS) + " |",
             "|---|---|" + "---:|" * len(COLUMNS)]
    for row in map(json.loads, path.read_text().splitlines()):
        name, shape = (row["run"], row["shape"]) if "run" in row else ("**all**", row["total"])
        cells = [" -> ".join(row[n][k] for n in names) for _, k in COLUMNS]
        lines.append(f"| {name} | {shape} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("candidates", nargs="*", help="shape=profile.json")
    ap.add_argument("--work", type=Path, default=Path("/tmp/kvrl-candidate"))
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--table", type=Path, default=None, help="print this --out file as a Markdown table and stop")
    ap.add_argument("--runs", nargs="+", default=None, help="folders of docs/results/fidelity_same_host to score")
    ap.add_argument("--sim", nargs="+", default=[], help="overrides for every re-simulation")
    args = ap.parse_args()
    if args.table:
        print(table(args.table))
        return
    if not args.candidates:
        raise SystemExit("give shape=profile.json for at least one shape (or --table FILE)")
    candidates = dict(c.split("=", 1) for c in args.candidates)
    unknown = set(candidates) - set(RUNS)
    if unknown:
        raise SystemExit(f"unknown shape(s) {sorted(unknown)}: one of {sorted(RUNS)}")
    if args.runs and len(candidates) != 1:
        raise SystemExit("--runs scores one shape: give one shape=profile.json")
    lines = []
    for shape, candidate in candidates.items():
        shipped, rows = profile_path(shape, "shipped"), []
        for run in args.runs or RUNS[shape]:
            dst, shares, _ = unpack(run, args.work)
            sims = {"shipped": {}, "candidate": {}}
            for share in shares:
                sims["shipped"].update(resim(dst / share, shipped, 1.0, dst / f"shipped_{share}", args.sim))
                sims["candidate"].update(resim(dst / share, candidate, 1.0, dst / f"candidate_{share}", args.sim))
            row = {"run": run, "shape": shape, "pairs": len(sims["shipped"]), "candidate": candidate,
                   **scores(sims["shipped"], sims)}
            print(json.dumps(row), flush=True)
            rows.append(row)
        lines += rows
        keys = [k for k in rows[0]["shipped"] if k.endswith("_within") or k in ("every_target", "reversed")]
        total = {"total": shape, **{name: {k: count(rows, name, k) for k in keys} for name in ("shipped", "candidate")}}
        print(json.dumps(total), flush=True)
        lines.append(total)
    if args.out:
        args.out.write_text("".join(json.dumps(r) + "\n" for r in lines))


if __name__ == "__main__":
    main()
