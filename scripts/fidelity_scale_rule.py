"""profile=select plus a step-time scale calibrated on the first pair, tried offline on the same-host runs.

    python scripts/fidelity_scale_rule.py [--work DIR] [--out FILE] [run ...]

For each run of ``docs_facts.SELECT_RUNS`` (all that kept their live step traces by default; docs/fidelity.md
"Runs 48-49"): the first
pair's replay gives each candidate profile's compute-time ratio (live over priced: decode, mixed and
prefill steps, the host term left out); every share is re-simulated with that candidate and
``sim_step_scale`` = the ratio (``kvrl-fidelity resim=``; the live step traces come from the run's
``replay.tar.xz``, and for runs before 46, which kept no ``.hydra/config.yaml``, the config is composed
from today's conf/fidelity.yaml, checked by re-simulating share 0 unscaled against the committed sim).
Then how many of the run's other pairs meet every target at once, without and with the scale, per
candidate and for the one profile=select chose. One JSON line per run to ``--out``; CPU, minutes.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
import docs_facts as F  # noqa: E402  (the run registry and the candidates)

from kvrl.fidelity.report import meets_every_target  # noqa: E402

PROFILES = "kvrl/executors/profiles"


def profile_path(shape: str, candidate: str) -> str:
    sub = "h200x4/" if candidate == "h200x4" else ""
    return f"{PROFILES}/{sub}h200_{shape}_bfloat16_step_graphs.json"


def extract_replays(src: Path, dst: Path) -> None:
    """A run's ``replay.tar.xz`` (each share's config and live step traces) unpacked into ``dst``, once."""
    if not dst.exists():
        dst.mkdir(parents=True)
        with tarfile.open(src / "replay.tar.xz") as t:
            t.extractall(dst, filter="data")


def unpack(run: str, work: Path) -> tuple[Path, list[str], str]:
    """The run's shares with their live traces, fidelity.json and config under ``work/run``: ``run`` a
    name of ``docs_facts.SAME_HOST_RUNS`` or a folder of ``docs/results/fidelity_same_host``."""
    d = F.SAME_HOST_RUNS[run][0] if run in F.SAME_HOST_RUNS else run
    src, dst = Path(F.SAME_HOST) / d, work / run
    shape = "llama-3-8b" if "llama" in d else "qwen3-0.6b"
    extract_replays(src, dst)
    shares = sorted(p.name for p in src.glob("pressure_[0-9]"))
    for share in shares:
        shutil.copy(src / share / "fidelity.json", dst / share / "fidelity.json")
        cfg = dst / share / ".hydra" / "config.yaml"
        if not cfg.exists():
            cfg.parent.mkdir(parents=True, exist_ok=True)
            extra = ["max_requests=200"] if shape == "llama-3-8b" else []
            cfg.write_text(subprocess.run([sys.executable, "-m", "kvrl.apps.fidelity", f"model={shape}", *extra,
                                           "--cfg", "job"], capture_output=True, text=True, check=True).stdout)
    return dst, shares, shape


def resim(share: Path, profile: str, scale: float, out: Path, extra: Sequence[str] = ()) -> dict:
    """kvrl-fidelity resim of one share (cached in ``out``), with ``extra`` overrides (e.g. ``sim_ensemble=8``)."""
    if not (out / "fidelity.json").exists():
        tmp = out.with_name(out.name + "_tmp")
        done = subprocess.run([sys.executable, "-m", "kvrl.apps.fidelity", f"resim={share}", f"profile={profile}",
                               f"sim_step_scale={scale}", "plots=false", f"hydra.run.dir={tmp}", *extra],
                              capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(done.stderr[-3000:])
        out.mkdir(parents=True, exist_ok=True)
        shutil.copy(tmp / "fidelity.json", out / "fidelity.json")
        shutil.rmtree(tmp)
    return json.loads((out / "fidelity.json").read_text())


def compute_ratio(replay: dict) -> float:
    """Live over priced time of the replayed decode, mixed and prefill steps."""
    kinds = [v for k, v in replay["by_kind"].items() if k != "host"]
    return sum(v["live_s"] for v in kinds) / sum(v["sim_s"] for v in kinds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="*", default=list(F.SELECT_RUNS))
    ap.add_argument("--work", type=Path, default=Path("/tmp/kvrl-scale-rule"))
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    lines = []
    for run in args.runs:
        if not (Path(F.SAME_HOST) / F.SAME_HOST_RUNS[run][0] / "replay.tar.xz").exists():
            print(f"{run}: no replay.tar.xz kept, skipped", flush=True)
            continue
        dst, shares, shape = unpack(run, args.work)
        d, subs = F.SAME_HOST_RUNS[run]
        keys = F.SELECT_RUNS[run]
        served = {c: json.loads((Path(F.SAME_HOST) / d / subs[keys[c]] / "fidelity.json").read_text())
                  for c in F.SELECT_CANDIDATES}
        live = served["shipped"]
        first = next(iter(live))
        chosen = min(F.SELECT_CANDIDATES, key=lambda c: abs(served[c][first]["replay"]["total_rel_err"]))
        check = resim(dst / shares[0], profile_path(shape, "shipped"), 1.0, dst / f"check_{shares[0]}")
        if any(check[p]["sim"] != live[p]["sim"] for p in check):
            raise SystemExit(f"{run}: the re-simulated share {shares[0]} differs from the committed sim (config?)")
        rest = [p for p in live if p != first]
        row = {"run": run, "shape": shape, "first_pair": first, "chosen": chosen, "pairs": len(rest)}
        for c in F.SELECT_CANDIDATES:
            scale = round(compute_ratio(served[c][first]["replay"]), 4)
            scaled = {}
            for share in shares:
                scaled.update(resim(dst / share, profile_path(shape, c), scale, dst / f"{c}_x{scale}_{share}"))
            row[f"{c}_scale"] = scale
            row[c] = sum(meets_every_target(live[p], served[c][p]["sim"]) for p in rest)
            row[f"{c}+scale"] = sum(meets_every_target(live[p], scaled[p]["sim"]) for p in rest)
        row["chosen_every"], row["chosen+scale_every"] = row[chosen], row[f"{chosen}+scale"]
        print(json.dumps(row), flush=True)
        lines.append(row)
    total = {k: sum(r[k] for r in lines) for k in ("pairs", "chosen_every", "chosen+scale_every",
                                                    *F.SELECT_CANDIDATES, *(f"{c}+scale" for c in F.SELECT_CANDIDATES))}
    print(json.dumps({"total": total}))
    if args.out:
        args.out.write_text("".join(json.dumps(r) + "\n" for r in [*lines, {"total": total}]))


if __name__ == "__main__":
    main()
