"""Re-price a pressure set served in GPU shares (benchmarks/fidelity_pressure_gpus.sh) with other
profiles, offline, and merge each into one ``fidelity.json`` for scripts/fidelity_compare.py.

    python scripts/fidelity_resim_shares.py <run dir> [name=<profile.json> ...]

``<run dir>`` holds the shares ``pressure_<i>/`` (each a kvrl-fidelity run directory: ``.hydra/``,
``fidelity.json``, and ``runs/*/*/replay.csv`` where the replay was kept). Writes:
- ``<run dir>/pressure/fidelity.json``: the shares as served (the sim of the call's own profile);
- per ``name=<profile.json>``: ``<run dir>/<name>_pressure_<i>/`` (kvrl-fidelity ``resim=`` of share i
  with that profile: fidelity.json, fidelity.md) and ``<run dir>/<name>_pressure/fidelity.json`` merged.
The sim is deterministic, so a re-run writes the same numbers (CPU; seconds per share).
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def merge(shares: list[Path], out: Path) -> int:
    """The shares' ``fidelity.json`` merged into ``out/fidelity.json``; returns the number of pairs."""
    merged: dict = {}
    for share in shares:
        merged.update(json.loads((share / "fidelity.json").read_text()))
    out.mkdir(parents=True, exist_ok=True)
    (out / "fidelity.json").write_text(json.dumps(merged, indent=1) + "\n")
    return len(merged)


def resim(share: Path, profile: Path, out: Path) -> None:
    """kvrl-fidelity ``resim=share profile=profile``; keeps its fidelity.json and fidelity.md in ``out``."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "kvrl.apps.fidelity", f"resim={share}", f"profile={profile}", "plots=false",
               f"hydra.run.dir={tmp}"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
        out.mkdir(parents=True, exist_ok=True)
        for name in ("fidelity.json", "fidelity.md"):
            shutil.copy(Path(tmp) / name, out / name)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="the directory holding pressure_<i>/")
    ap.add_argument("profiles", nargs="*", help="name=<profile.json>")
    args = ap.parse_args(argv)
    shares = sorted(p for p in args.run.glob("pressure_*") if (p / "fidelity.json").exists())
    if not shares:
        raise SystemExit(f"{args.run}: no pressure_<i>/fidelity.json")
    print(f"as served: {merge(shares, args.run / 'pressure')} pairs -> {args.run / 'pressure'}")
    for spec in args.profiles:
        name, sep, path = spec.partition("=")
        if not sep or not Path(path).is_file():
            raise SystemExit(f"profile {spec!r}: give name=<profile.json> (an existing file)")
        outs = []
        for share in shares:
            out = args.run / f"{name}_{share.name}"
            resim(share.resolve(), Path(path).resolve(), out)
            outs.append(out)
        print(f"{name}: {merge(outs, args.run / f'{name}_pressure')} pairs -> {args.run / f'{name}_pressure'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
