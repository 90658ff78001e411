"""Small decode steps of the same shape under two policies: does the live engine take the same time?

    python scripts/fidelity_small_decode.py <run dir or replay.tar.xz> [--max-batch 4] [--quiet-steps 20] [--out F.json]

Reads every ``pressure_*/runs/<workload>/<policy>/replay.csv`` of a kvrl-fidelity run (a directory, or the
``replay.tar.xz`` that docs/results keeps) and, per workload and policy, takes the decode steps of at most
``--max-batch`` sequences that ran with no request waiting and no swap in the last ``--quiet-steps`` steps.
For them: how many, the mean live time inside ``execute`` (ms), and the served profile's price of their
compute (the replay's ``sim_s`` less its host term) against it. Steps of one shape, alike but for what came
before them, so a gap between two policies is a cost the step's features do not carry (docs/fidelity.md,
"Runs 48-49").
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import tarfile
from collections import defaultdict
from pathlib import Path


def replay_files(src: Path) -> dict[str, str]:
    """``workload/policy`` -> the text of its replay.csv."""
    found: dict[str, str] = {}
    if src.is_dir():
        for f in sorted(src.glob("pressure_*/runs/*/*/replay.csv")):
            found[f"{f.parent.parent.name}/{f.parent.name}"] = f.read_text()
        return found
    with tarfile.open(src) as tar:
        for m in tar.getmembers():
            parts = m.name.split("/")
            if m.isfile() and parts[-1] == "replay.csv":
                found[f"{parts[-3]}/{parts[-2]}"] = tar.extractfile(m).read().decode()
    return found


def small_decode(text: str, max_batch: int, quiet_steps: int) -> dict:
    """Count, mean live execute ms and priced compute error of the quiet small decode steps of one replay."""
    live = priced = 0.0
    n, last_swap = 0, -10 ** 9
    for i, r in enumerate(csv.DictReader(io.StringIO(text))):
        if int(r["swap_out"]) + int(r["swap_in"]):
            last_swap = i
        if (r["kind"] != "decode" or int(r["n_dec"]) > max_batch or int(r["n_wait"]) > 0
                or i - last_swap <= quiet_steps):
            continue
        live += float(r["live_execute_s"])
        priced += float(r["sim_s"]) - float(r["sim_host_s"])
        n += 1
    return {"steps": n, "live_ms": 1e3 * live / n if n else float("nan"),
            "priced_err": priced / live - 1 if n else float("nan")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("--max-batch", type=int, default=4)
    ap.add_argument("--quiet-steps", type=int, default=20)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    rows: dict[str, dict] = defaultdict(dict)
    for pair, text in replay_files(args.src).items():
        workload, policy = pair.split("/")
        rows[workload][policy] = small_decode(text, args.max_batch, args.quiet_steps)
    out = {"max_batch": args.max_batch, "quiet_steps": args.quiet_steps, "workloads": dict(sorted(rows.items()))}
    for w, pols in out["workloads"].items():
        print(w, "; ".join(f"{p}: {v['steps']} steps, {v['live_ms']:.3f} ms live, priced {100 * v['priced_err']:+.1f}%"
                           for p, v in sorted(pols.items())))
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
