"""Re-run committed sim leaderboards from the command they record, and say whether they reproduce.

kvrl-eval writes the command it ran into its ``leaderboard.md`` (``Command: `kvrl-eval ...` ``). This
runs that command again on this tree (its ``hydra.run.dir`` and ``workers`` replaced, ``plots=false``)
and compares the new ``results.csv`` with the committed one beside the leaderboard
(``<name>_leaderboard.md`` -> ``<name>_results.csv``): row by row on (policy, split, seed), every
column. Where only the leaderboard was committed, its ``leaderboard.csv`` is compared instead, row by
row on the policy (the means, CIs and paired columns). A leaderboard *reproduces* when every committed row is there with every value equal; else
the line says how many rows differ, in which columns, and the largest relative goodput difference
(a changed profile or engine moves many rows a little; a changed policy moves its own rows).

One JSON object per leaderboard is printed (and appended to ``--out``): the leaderboard, its verdict
(``reproduces``, ``differs``, ``skipped`` with the reason, ``failed`` with the command's tail), the
row counts, the columns that differ and the wall seconds.

``--regenerate`` makes a leaderboard that was measured on an earlier tree today's: the command runs
into ``runs/regen/<name>`` and its ``leaderboard.md``, ``leaderboard.csv`` and ``results.csv`` replace
the committed ``<name>_leaderboard.md``, ``<name>_leaderboard.csv`` and ``<name>_results.csv`` (the
results are written even where only the leaderboard was committed before). The new ``leaderboard.md``
records the command as run here, so a later plain re-run compares against it; the line gets
``regenerated`` and the comparison with what was committed before. Live leaderboards are skipped (they cannot
be re-run bit for bit). An agent path of the command that is not in this checkout (a device run's
``/root/out/agents/x``) is read from ``docs/results/agents/x`` where the agents were committed
(``remapped`` in the line); the rows keep their labels, which name only the agent's directory. A command
with an agent found in neither place is skipped.

    python scripts/rerun_leaderboard.py docs/results/rl_sim_suite/pressure_leaderboard.md --workers 2
    python scripts/rerun_leaderboard.py docs/results/rl_*/**/*leaderboard.md --out rerun.jsonl
    python scripts/rerun_leaderboard.py docs/results/rl_sim_rcpi/pool512_leaderboard.md --regenerate

``--profile P`` adds ``backend.profile=P`` to the re-run (replacing a recorded one): the committed sim leaderboards
of sessions 26-31 ran on the fit-10 profiles shipped then, archived since session 32 (docs/rl.md, "Reproducing a
committed leaderboard"). Without it, a leaderboard that records its cost model (``Sim cost model: profile <path>
(..., fit version N)``, since session 32) whose shipped profile has since been replaced re-runs on the archived one,
``archive/<name>_fitN.json`` (:func:`recorded_profile`): the fit-11 leaderboards after session 39's re-profile. ``--into DIR`` (with ``--regenerate``) writes the regenerated files under
``DIR/<the leaderboard's folder below docs/results>/`` instead of over the committed ones, e.g. the same leaderboards
on another profile beside the committed ones.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the columns that identify a row of results.csv (one run) and of leaderboard.csv (one policy)
RESULTS_KEY = ("policy", "split", "seed")
BOARD_KEY = ("policy",)
#: overrides the re-run replaces (where it writes, how many processes, figures)
REPLACED = ("hydra.run.dir", "workers", "plots")
#: where committed agents live: a recorded agent path missing here is looked up by its last component
AGENTS = "docs/results/agents"


def recorded_command(leaderboard: Path) -> list[str]:
    """The kvrl-eval overrides of ``leaderboard``'s ``Command:`` line (without ``kvrl-eval``);
    ValueError if it has none."""
    m = re.search(r"^Command: `kvrl-eval (.*)`", leaderboard.read_text(), re.MULTILINE)
    if not m:
        raise ValueError(f"{leaderboard}: no 'Command: `kvrl-eval ...`' line")
    return shlex.split(m.group(1))


def recorded_profile(leaderboard: Path) -> "str | None":
    """The archived profile a leaderboard ran on, where the shipped one at the path it records has moved on: its
    ``Sim cost model: profile <path> (sha256 ..., fit version N)`` line names a packaged profile whose fit version
    is no longer N, and ``archive/<that name>_fitN.json`` is there (shipping a re-profile archives the one it
    replaces under that name). None: the recorded profile is still shipped, or the line or archive is missing."""
    m = re.search(r"^Sim cost model: profile (\S+) \(sha256 \w+, fit version (\d+)\)", leaderboard.read_text(), re.MULTILINE)
    if not m:
        return None
    recorded, fit = Path(m.group(1)), int(m.group(2))
    packaged = ROOT / "kvrl" / "executors" / "profiles"
    current = recorded if recorded.is_absolute() else ROOT / recorded
    if current.exists() and json.loads(current.read_text()).get("model", {}).get("fit_version") == fit:
        return None
    archived = packaged / "archive" / f"{recorded.stem}_fit{fit}.json"
    return str(archived.relative_to(packaged)) if archived.exists() else None


def committed_table(leaderboard: Path) -> "tuple[Path, str, tuple[str, ...]] | None":
    """What to compare for ``leaderboard``: (the committed file, the file kvrl-eval writes that matches it,
    the key columns). ``x_results.csv`` beside ``x_leaderboard.md`` if there is one, else
    ``x_leaderboard.csv``; None if neither is there."""
    results = leaderboard.with_name(leaderboard.name.replace("leaderboard.md", "results.csv"))
    board = leaderboard.with_suffix(".csv")
    if results.exists():
        return results, "results.csv", RESULTS_KEY
    if board.exists():
        return board, "leaderboard.csv", BOARD_KEY
    return None


def remap_agents(overrides: list[str]) -> tuple[list[str], list[str]]:
    """``overrides`` with every agent path that is not in this checkout replaced by
    ``docs/results/agents/<its last component>`` where that exists; and the paths remapped."""
    out, remapped = [], []
    for o in overrides:
        key, _, value = o.partition("=")
        if key == "agents":
            paths = []
            for a in (p for p in value.strip("[]").split(",") if p):
                local = f"{AGENTS}/{Path(a).name}"
                if not (ROOT / a).exists() and (ROOT / local).exists():
                    remapped.append(a)
                    a = local
                paths.append(a)
            o = f"agents=[{','.join(paths)}]"
        out.append(o)
    return out, remapped


def skip_reason(overrides: list[str]) -> "str | None":
    """Why a recorded command (its agent paths remapped, :func:`remap_agents`) cannot be re-run here, or None."""
    for o in overrides:
        key, _, value = o.partition("=")
        if key == "backend" and value != "sim":
            return f"backend={value}: not re-runnable bit for bit"
        if key == "agents":
            missing = [a for a in value.strip("[]").split(",") if a and not (ROOT / a).exists()]
            if missing:
                return f"agent paths not in this checkout: {', '.join(missing)}"
    return None


def read_rows(path: Path, key: tuple[str, ...] = RESULTS_KEY) -> dict[tuple, dict[str, str]]:
    with open(path, newline="") as f:
        return {tuple(r[k] for k in key): r for r in csv.DictReader(f)}


def _rel(a: str, b: str) -> float:
    try:
        x, y = float(a), float(b)
    except ValueError:
        return math.inf
    if x == y or (math.isnan(x) and math.isnan(y)):
        return 0.0
    return abs(y - x) / max(abs(x), 1e-12)


#: how results.csv writes a missing value
EMPTY = ("", "nan")


def compare(committed: dict, rerun: dict) -> dict:
    """Row-by-row comparison of two results tables (:func:`read_rows`)."""
    missing = [k for k in committed if k not in rerun]
    differing, columns, worst = 0, set(), 0.0
    for k, row in committed.items():
        if k not in rerun:
            continue
        # a column kvrl-eval no longer writes (session 31 moved ``steps`` out of results.csv) is no difference
        # where the committed file held no value in it
        diff = [c for c, v in row.items() if rerun[k].get(c) != v and not (c not in rerun[k] and v in EMPTY)]
        if diff:
            differing += 1
            columns.update(diff)
            goodput = "goodput_tok_s" if "goodput_tok_s" in row else "goodput_tok_s_mean"
            if goodput in row:
                worst = max(worst, _rel(row[goodput], rerun[k].get(goodput, "nan")))
    verdict = "reproduces" if not missing and not differing else "differs"
    return {"verdict": verdict, "rows": len(committed), "missing": len(missing), "differing": differing,
            "columns": sorted(columns), "max_goodput_rel_diff": worst}


#: kvrl-eval's output files that --regenerate copies over the committed ones (``<name>_<file>``)
REGENERATED = ("leaderboard.md", "leaderboard.csv", "results.csv")


def regen_dir(leaderboard: Path) -> str:
    """Where --regenerate runs ``leaderboard``'s command: ``runs/regen/<its folder>/<name>``, relative to the root."""
    stem = leaderboard.name.removesuffix("leaderboard.md").rstrip("_")
    return f"runs/regen/{leaderboard.parent.name}/{stem or 'leaderboard'}"


#: where committed result files live; ``--into`` mirrors the folders below it
RESULTS = ROOT / "docs" / "results"


def replace_committed(leaderboard: Path, run_dir: Path, into: "Path | None" = None) -> list[Path]:
    """Copy kvrl-eval's :data:`REGENERATED` files from ``run_dir`` over ``leaderboard``'s committed ones
    (``x_leaderboard.md`` -> ``x_leaderboard.md``, ``x_leaderboard.csv``, ``x_results.csv``), or with ``into``
    to the same names under ``into/<leaderboard's folder relative to docs/results>``; the paths written."""
    prefix = leaderboard.name.removesuffix("leaderboard.md")
    folder = leaderboard.parent if into is None else into / leaderboard.parent.relative_to(RESULTS)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name in REGENERATED:
        target = folder / f"{prefix}{name}"
        target.write_bytes((run_dir / name).read_bytes())
        written.append(target)
    return written


def rerun(leaderboard: Path, workers: int, regenerate: bool = False, profile: "str | None" = None,
          into: "Path | None" = None) -> dict:
    """Re-run one leaderboard's command and compare (see the module docstring); with ``regenerate``,
    in ``runs/regen/<name>``, and the new files replace the committed ones (or go under ``into``). ``profile``:
    the sim's ``backend.profile`` for the re-run, in place of the recorded one."""
    out = {"leaderboard": str(leaderboard.relative_to(ROOT) if leaderboard.is_absolute() else leaderboard)}
    overrides, remapped = remap_agents(recorded_command(leaderboard))
    if remapped:
        out["remapped"] = len(remapped)
    table = committed_table(leaderboard)
    reason = skip_reason(overrides) or (None if table else "no results.csv or leaderboard.csv beside it")
    if reason:
        return {**out, "verdict": "skipped", "reason": reason}
    committed_path, written, key = table
    out["compared"] = committed_path.name
    if profile is None and not any(o.startswith("backend.profile=") for o in overrides):
        profile = recorded_profile(leaderboard)      # the archived profile it ran on (None: still shipped)
        if profile:
            out["profile_from"] = "the leaderboard's recorded profile and fit version"
    replaced = REPLACED + (("backend.profile",) if profile else ())
    kept = [o for o in overrides if o.partition("=")[0] not in replaced]
    if profile:
        kept.append(f"backend.profile={profile}")
        out["profile"] = profile
    with tempfile.TemporaryDirectory(prefix="kvrl-rerun-") as tmp:
        run_dir = regen_dir(leaderboard) if regenerate else f"{tmp}/run"
        cmd = [sys.executable, "-m", "kvrl.apps.eval", *kept, f"workers={workers}", "plots=false",
               f"hydra.run.dir={run_dir}"]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        out["wall_s"] = round(time.perf_counter() - t0, 1)
        new = ROOT / run_dir / written
        if proc.returncode != 0 or not new.exists():
            return {**out, "verdict": "failed", "tail": (proc.stdout + proc.stderr)[-800:]}
        out.update(compare(read_rows(committed_path, key), read_rows(new, key)))
        if regenerate:
            replace_committed(leaderboard, ROOT / run_dir, into)
            out["regenerated"] = True
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("leaderboards", nargs="+", type=Path, help="committed leaderboard.md files")
    ap.add_argument("--workers", type=int, default=2, help="kvrl-eval workers for each re-run")
    ap.add_argument("--out", type=Path, help="JSON-lines file to append each result to")
    ap.add_argument("--regenerate", action="store_true",
                    help="replace the committed leaderboard.md/.csv and results.csv with the re-run's")
    ap.add_argument("--profile", help="backend.profile for every re-run (e.g. archive/<name>.json), "
                                       "in place of the recorded command's")
    ap.add_argument("--into", type=Path, help="with --regenerate: write the new files under this folder "
                                                "(mirroring docs/results/), not over the committed ones")
    a = ap.parse_args()
    if a.into and not a.regenerate:
        ap.error("--into needs --regenerate")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    for lb in a.leaderboards:
        res = {"commit": commit, **rerun(lb.resolve(), a.workers, a.regenerate, a.profile,
                                         a.into.resolve() if a.into else None)}
        line = json.dumps(res)
        print(line, flush=True)
        if a.out:
            with open(a.out, "a") as f:
                f.write(line + "\n")


if __name__ == "__main__":
    main()
