"""The engine's time between steps, live against the sim's host terms, with and without the host
speed (issue 16): for kvrl-fidelity runs and their ``host_speed=probe`` re-simulations, per pair,
the replay's host total live, priced at the profile's host speed (1.0) and at the probe ratio.

    python scripts/host_speed_table.py [--load N] LABEL=RUN_DIR:PROBE_RESIM_DIR ...

``benchmarks/host_speed_cpu.sh`` runs it; it works on any kvrl-fidelity run whose live side
recorded host probes (session 20 on) and its ``host_speed=probe`` resim.
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path


def rows(label: str, run: Path, probe: Path) -> list[dict]:
    """One row per pair of ``run`` (its fidelity.json) and ``probe`` (the re-simulation's)."""
    first, second = (json.loads((d / "fidelity.json").read_text()) for d in (run, probe))
    out = []
    for pair, r in first.items():
        if "error" in r or "replay" not in r or pair not in second:
            continue
        live_h = r["replay"]["by_kind"]["host"]["live_s"]
        flat = r["replay"]["by_kind"]["host"]["sim_s"] / r.get("host_speed", 1.0)
        scaled = second[pair]["replay"]["by_kind"]["host"]["sim_s"]
        lp = r.get("live_host_probe") or {}
        out.append({"run": label, "pair": pair, "n": lp.get("n", 0), "mean_us": lp.get("mean_s", math.nan) * 1e6,
                    "median_us": lp.get("median_s", math.nan) * 1e6, "contention": lp.get("contention", math.nan),
                    "ratio": second[pair]["host_speed"],
                    "live_s": live_h, "err_flat": flat / live_h - 1, "err_probe": scaled / live_h - 1})
    return out


def table(all_rows: list[dict], load: int | None) -> str:
    lines = ["| run | pair | live probes: n, mean, median (us) | live contention | host speed applied | live host s | "
             "sim host error at 1.0 | with the probe ratio |", "|---|---|---|---:|---:|---:|---:|---:|"]
    for r in all_rows:
        lines.append(f"| {r['run']} | {r['pair']} | {r['n']}, {r['mean_us']:.0f}, {r['median_us']:.0f} | "
                     f"x{r['contention']:.3f} | "
                     f"x{r['ratio']:.2f} | {r['live_s']:.3f} | {r['err_flat']:+.1%} | {r['err_probe']:+.1%} |")
    lines.append("")
    for run in dict.fromkeys(r["run"] for r in all_rows):
        sel = [r for r in all_rows if r["run"] == run]
        mean = lambda k: sum(abs(r[k]) for r in sel) / len(sel)
        lines.append(f"- {run}: mean absolute host-time error {mean('err_flat'):.1%} at the profile's host speed, "
                     f"{mean('err_probe'):.1%} with the probe ratio ({len(sel)} pairs)"
                     + (f"; {load} busy processes competed in the loaded run" if run == "loaded" and load else "") + ".")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="LABEL=RUN_DIR:PROBE_RESIM_DIR")
    ap.add_argument("--load", type=int, default=None, help="busy processes in the run labelled 'loaded'")
    args = ap.parse_args(argv)
    all_rows = []
    for spec in args.runs:
        label, _, dirs = spec.partition("=")
        run, _, probe = dirs.partition(":")
        if not (label and run and probe):
            ap.error(f"{spec!r}: give LABEL=RUN_DIR:PROBE_RESIM_DIR")
        all_rows += rows(label, Path(run), Path(probe))
    print(table(all_rows, args.load))


if __name__ == "__main__":
    main()
