"""One leaderboard from several shares of one kvrl-eval evaluation.

A live evaluation is often served in shares: one ``kvrl-eval`` per GPU (benchmarks/rl_live.sh with
``GPUS=2``) and one device call per group of seeds. Each share writes its own ``results.csv``; this
joins them (a run that two shares both hold must be the same in each, as the sim serves it) and writes
what kvrl-eval would have written for the whole evaluation: ``results.csv``, ``leaderboard.csv`` and ``leaderboard.md``,
with the paired goodput comparisons to each ``--reference`` (kvrl.apps.leaderboard).

    python scripts/merge_eval.py --out docs/results/rl_live_h200/slo_shift --prefix live_ \
        --reference 'fixed(fraction=0.2)' --reference slo_mix --note 'H200, 4 calls x 2 GPUs' \
        call1/live_g0/results.csv call1/live_g1/results.csv ...

A share given as ``TAG=path`` has `` [TAG]`` appended to its policy labels, so evaluations that differ in a
setting the labels do not carry (the scheduler: docs/rl.md, "Choosing the admission order") join as rows of
their own: ``lpm=runs/a/results.csv fcfs=runs/b/results.csv``. ``--learned TAG`` makes a tagged share's rows agent
rows (``agent TAG [<label>]``): a learned policy that is not an SB3 agent (scripts/order_search.py's schedulers).

A reference is a policy label or the start of one (the first label, in file order, that starts with
it). Only ``split=test`` rows enter the leaderboard, a val-best sweep's own runs (kind ``sweep``) aside,
as in kvrl-eval's; every row is kept in the merged results, unless
``--policy`` names the policies to keep (labels or their starts, as a reference): then only theirs, e.g.
one agent and its reference joined over evaluations that served more policies on fewer seeds.
"""
from __future__ import annotations

import argparse
import csv
import math
from pathlib import Path

from rl_live_compare import resolve_reference   # scripts/ is on sys.path when this file runs as a script

from kvrl.apps.eval_files import write_results
from kvrl.apps.leaderboard import build_rows, markdown, write_csv
from kvrl.apps.outputs import atomic_write

#: the non-numeric columns of kvrl-eval's results.csv (sim_cost_source: what priced the sim beside a live run)
TEXT_FIELDS = ("policy", "kind", "split", "backend", "workload", "sim_cost_source")


def _value(field: str, text: str):
    if field in TEXT_FIELDS:
        return text
    if field == "seed":
        return int(text)
    return float(text) if text not in ("", "nan") else math.nan


def _measured(row: dict) -> dict:
    """A results row without its place in its seed's run order (which depends on what else the
    evaluation served)."""
    return {k: v for k, v in row.items() if k != "seed_position"}


def tagged(spec: str) -> tuple[str, str]:
    """``(path, tag)`` of a results argument: ``TAG=path`` or a plain path (tag "")."""
    tag, sep, path = spec.partition("=")
    return (path, tag) if sep and not tag.endswith(".csv") else (spec, "")


def read_shares(paths: list[str], learned: frozenset = frozenset()) -> tuple[list[str], list[dict]]:
    """The header and rows of every share; raises ValueError when a (policy, kind, split, seed) is in two
    shares with different values (the same run twice, as the deterministic sim serves it, is kept
    once: evaluations that share baselines join) or the shares' columns differ. A share given as
    ``TAG=path`` has `` [TAG]`` appended to each of its policy labels: the same policy served under another
    setting the evaluation does not name (another scheduler) stays a row of its own. A share whose tag is in
    ``learned`` served a learned policy that kvrl-eval does not load as an agent (a learned scheduler, set by
    overrides): its rows become agent rows, ``agent TAG [<label>]`` of kind ``agent``."""
    header, rows, seen = None, [], {}
    for spec in paths:
        path, tag = tagged(spec)
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            if header is None:
                header = list(reader.fieldnames or [])
            elif list(reader.fieldnames or []) != header:
                raise ValueError(f"{path}: its columns differ from {tagged(paths[0])[0]}'s")
            for r in reader:
                if tag in learned:
                    r["policy"], r["kind"] = f"agent {tag} [{r['policy']}]", "agent"
                elif tag:
                    r["policy"] = f"{r['policy']} [{tag}]"
                key = (r["policy"], r.get("kind", ""), r["split"], r["seed"])   # a sweep's row beside its baseline's
                if key in seen:
                    first_path, first = seen[key]
                    if _measured(first) != _measured(r):
                        raise ValueError(f"{path}: {key} is also in {first_path}, with other values")
                    continue
                seen[key] = (path, r)
                rows.append(r)
    if header is None:
        raise ValueError("no results files given")
    return header, rows


def resolve(reference: str, labels: list[str]) -> str:
    """The label ``reference`` names (rl_live_compare's rule); an error if none."""
    match = resolve_reference(reference, labels)
    if match is None:
        raise ValueError(f"no policy label is or starts with {reference!r}; labels: {labels}")
    return match


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", nargs="+", help="the shares' results.csv files (TAG=path: its labels get ' [TAG]')")
    p.add_argument("--out", required=True, help="directory for the merged files")
    p.add_argument("--prefix", default="", help="file name prefix (e.g. live_ or sim_)")
    p.add_argument("--reference", action="append", default=[], help="policy label (or its start); repeatable")
    p.add_argument("--title", default="Leaderboard (merged shares)")
    p.add_argument("--note", action="append", default=[], help="a line under the title; repeatable")
    p.add_argument("--policy", action="append", default=[],
                   help="keep only this policy (a label or its start); repeatable; default: every policy")
    p.add_argument("--learned", action="append", default=[], metavar="TAG",
                   help="the share tagged TAG served a learned policy (e.g. a learned scheduler): its rows are agent "
                        "rows, 'agent TAG [<label>]'; repeatable")
    a = p.parse_args()
    _, rows = read_shares(a.results, frozenset(a.learned))
    if a.policy:
        labels = list(dict.fromkeys(r["policy"] for r in rows))
        keep = {resolve(policy, labels) for policy in a.policy}
        rows = [r for r in rows if r["policy"] in keep]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows.sort(key=lambda r: (r["split"], r["policy"], int(r["seed"])))
    write_results(rows, out / f"{a.prefix}results.csv")
    test = [{k: _value(k, v) for k, v in r.items()} for r in rows
            if r["split"] == "test" and r.get("kind") != "sweep"]    # as kvrl-eval's: sweep runs feed the oracle row
    labels = list(dict.fromkeys(r["policy"] for r in test))
    references = [resolve(ref, labels) for ref in a.reference]
    board = build_rows(test, references)
    write_csv(board, out / f"{a.prefix}leaderboard.csv")
    seeds = sorted({r["seed"] for r in test})
    notes = [*a.note, f"Merged from {len(a.results)} results files: {len(test)} test runs, {len(seeds)} seeds {seeds}.",
             "Cells: mean ± 95% CI half-width (Student t) over seeds; Δ columns: paired per-seed goodput "
             "difference to the reference policy (same requests), mean ± 95% CI."]
    atomic_write(out / f"{a.prefix}leaderboard.md", lambda f: f.write(markdown(board, a.title, notes)))
    print(f"{len(rows)} rows ({len(test)} test) -> {out}/{a.prefix}{{results,leaderboard}}.csv, {a.prefix}leaderboard.md")


if __name__ == "__main__":
    main()
