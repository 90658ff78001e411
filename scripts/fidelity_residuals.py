"""Where the sim's per-step error comes from: the recorded live steps of a ``kvrl-fidelity`` run
(``runs/<workload>/<policy>/replay.csv``) priced by one or two profiles, per step kind and pair,
and the step features the residuals follow.

    python scripts/fidelity_residuals.py --run <fidelity run dir> --before <profile.json> \\
        [--after <profile.json>] [--fit-workloads a,b,c] [--out docs/results/<name>]

Writes ``<out>.md`` and ``<out>.csv`` (``--out``; else prints the Markdown). Step kinds as in the
fidelity report (decode, mixed, prefill, swap); ``host`` is the engine's time between steps (live
``elapsed_s`` minus the time inside ``execute``) against the profile's host term; the forward kinds
compare the time inside ``execute`` with the profile's compute-stream price (no host term, no swap
stream: a step waiting for an earlier swap-in is counted as the step's own time). Pairs whose
workload is in ``--fit-workloads`` are marked ``fit`` (their steps fitted the after-profile's live
terms); the others ``held out``.
"""
from __future__ import annotations

import argparse
import csv
import io
import json
from pathlib import Path

import numpy as np

KINDS = ("decode", "mixed", "prefill", "swap", "host")


def load_pairs(run: Path) -> dict[str, list[dict]]:
    from kvrl.fidelity.replay import read_replay_csv

    return {f"{p.parent.parent.name}/{p.parent.name}": read_replay_csv(p)
            for p in sorted(run.glob("runs/*/*/replay.csv"))}


def price(model, steps: list[dict], cuda_graphs: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(compute-stream seconds, host seconds) of every step under ``model`` (``cuda_graphs``: the
    live executor's setting, as the sim and kvrl-fidelity's replay use it)."""
    from kvrl.executors.profile import HOST_WORK

    fwd = np.asarray([model.predict_features(s, cuda_graphs) for s in steps])
    host = np.asarray([model.host_s(s["n_pre"] + s["n_dec"], s["n_pre"], *(s.get(k, 0) for k in HOST_WORK))
                       if (s["n_pre"] or s["n_dec"]) else 0.0 for s in steps])
    return fwd, host


def kind_totals(steps: list[dict], fwd: np.ndarray, host: np.ndarray) -> dict[str, tuple[int, float, float]]:
    """Per kind: (steps, live s, sim s)."""
    kind = np.asarray([s["kind"] for s in steps])
    inside = np.asarray([s["live_execute_s"] for s in steps])
    gap = np.asarray([max(s["live_s"] - s["live_execute_s"], 0.0) for s in steps])
    out = {}
    for k in KINDS[:-1]:
        sel = kind == k
        if sel.any():
            out[k] = (int(sel.sum()), float(inside[sel].sum()), float(fwd[sel].sum()))
    out["host"] = (len(steps), float(gap.sum()), float(host.sum()))
    return out


def pct(sim: float, live: float) -> str:
    return f"{(sim - live) / live:+.1%}" if live > 0 else "n/a"


def binned_ratio(steps, fwd, sel, values, edges, name) -> list[str]:
    """Rows: median and total ratio live / model of the selected steps, binned by ``values``."""
    inside = np.asarray([s["live_execute_s"] for s in steps])
    lines = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        b = sel & (values >= lo) & (values < hi)
        if b.sum() >= 10:
            r = inside[b] / fwd[b]
            lines.append(f"| {name} | [{lo:g}, {hi:g}) | {int(b.sum())} | {np.median(r):.3f} | "
                         f"{inside[b].sum() / fwd[b].sum():.3f} |")
    return lines


def host_by_queue(steps: list[dict], policy: np.ndarray, host: np.ndarray, name: str) -> list[str]:
    """Rows per policy and bin of waiting requests (``n_wait``): the mean time between steps live (``live_s``
    minus the time inside ``execute``) and as the ``name`` profile's host terms price it, in ms: a scheduler
    whose own work grows with the queue shows here (docs/fidelity.md, "Runs 68-69")."""
    gap = np.asarray([max(s["live_s"] - s["live_execute_s"], 0.0) for s in steps])
    waiting = np.asarray([float(s.get("n_wait", 0)) for s in steps])
    lines = ["", f"## The time between steps by waiting requests ({name} profile)", "",
             "Mean over steps of the engine's time between steps, live and as the profile's host terms price it.", "",
             "| policy | waiting | steps | live ms | model ms |", "|---|---|---:|---:|---:|"]
    for pol in sorted(set(policy)):
        for lo, hi in ((0, 1), (1, 32), (32, 64), (64, 129), (129, np.inf)):
            b = (policy == pol) & (waiting >= lo) & (waiting < hi)
            if b.sum():
                lines.append(f"| {pol} | [{lo:g}, {hi:g}) | {int(b.sum())} | {1e3 * gap[b].mean():.3f} | "
                             f"{1e3 * host[b].mean():.3f} |")
    return lines


def episodes(pairs: dict[str, list[dict]], priced: dict, windows: int = 8) -> list[str]:
    """Whether the residuals are local in time: each pair's run cut into ``windows`` windows of
    consecutive steps; per window the median ratio live / model of host gaps, mixed steps and
    decode steps; per pair their correlation across windows and their range."""
    lines = ["", f"## Residuals over time (each run in {windows} windows of consecutive steps; median live / model "
                 "per window)", "",
             "CPU columns (runs recorded with kvrl.fidelity.cpu): correlation of the host ratio with the engine "
             "thread's run-queue wait share, and the ranges of that share and of the stolen CPU share.", "",
             "| workload / policy | windows | corr(host, mixed) | corr(host, decode) | host range | mixed range | "
             "decode range | corr(host, cpu wait) | cpu wait range | cpu steal range |",
             "|---|---:|---:|---:|---|---|---|---:|---|---|"]
    for pair, steps in pairs.items():
        fwd, host = priced[pair]
        n = len(steps)
        width = max(n // windows, 50)
        rows = []
        for i in range(0, n - width + 1, width):
            sl = steps[i:i + width]
            f, h = fwd[i:i + width], host[i:i + width]
            busy = [j for j, s in enumerate(sl) if s["n_pre"] or s["n_dec"]]
            mix = [j for j, s in enumerate(sl) if s["kind"] == "mixed"]
            dec = [j for j, s in enumerate(sl) if s["kind"] == "decode"]
            if len(mix) >= 3 and len(dec) >= 10:
                ratio = lambda js, live, model: float(np.median([live(sl[j]) / model[j] for j in js]))
                cpu = lambda k: float(np.nanmean([s.get(k, np.nan) for s in sl])) if any(
                    np.isfinite(s.get(k, np.nan)) for s in sl) else np.nan
                rows.append((ratio(busy, lambda s: max(s["live_s"] - s["live_execute_s"], 0.0), h),
                             ratio(mix, lambda s: s["live_execute_s"], f), ratio(dec, lambda s: s["live_execute_s"], f),
                             cpu("cpu_wait"), cpu("cpu_steal")))
        if len(rows) >= 4:
            a = np.asarray(rows)
            c = np.corrcoef(a[:, :3].T)
            rng = lambda k: f"{np.nanmin(a[:, k]):.2f}-{np.nanmax(a[:, k]):.2f}" if np.isfinite(a[:, k]).any() else "-"
            ok = np.isfinite(a[:, 3])
            cw = f"{np.corrcoef(a[ok, 0], a[ok, 3])[0, 1]:+.2f}" if ok.sum() >= 4 and np.std(a[ok, 3]) > 0 else "-"
            lines.append(f"| {pair} | {len(rows)} | {c[0, 1]:+.2f} | {c[0, 2]:+.2f} | {rng(0)} | {rng(1)} | {rng(2)} | "
                         f"{cw} | {rng(3)} | {rng(4)} |")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", required=True, type=Path)
    ap.add_argument("--before", required=True, help="profile the sim used (the baseline)")
    ap.add_argument("--after", default=None, help="a second profile to compare (e.g. with live-fitted terms)")
    ap.add_argument("--fit-workloads", default="", help="workloads whose steps fitted --after's live terms")
    ap.add_argument("--out", default=None, help="write <out>.md and <out>.csv")
    args = ap.parse_args(argv)

    from kvrl.executors.profile import StepProfile

    fit_w = {w for w in args.fit_workloads.split(",") if w}
    profiles = {"before": StepProfile.load(args.before)}
    if args.after:
        profiles["after"] = StepProfile.load(args.after)
    pairs = load_pairs(args.run)
    if not pairs:
        raise SystemExit(f"--run {args.run}: no runs/*/*/replay.csv")
    results = json.loads((args.run / "fidelity.json").read_text()) if (args.run / "fidelity.json").exists() else {}
    names = list(profiles)
    priced = {n: {pair: price(p.model, steps) for pair, steps in pairs.items()} for n, p in profiles.items()}

    md = [f"# Replay residuals: {args.run}", "",
          f"Profiles: {', '.join(f'{n} = {profiles[n].path}' for n in names)}. "
          f"Fit workloads (their steps fitted the after-profile's live terms): {sorted(fit_w) or 'none'}.",
          "Forward kinds: time inside `execute` vs the compute-stream price (no swap stream); host: the engine's "
          "time between steps vs the host term. Error = (sim - live) / live over the pair's steps of that kind.", "",
          "## Per pair and step kind", "",
          "| workload / policy | set | preemptions (live) | kind | steps | live s | " +
          " | ".join(f"error {n}" for n in names) + " |",
          "|---|---|---:|---|---:|---:|" + "---:|" * len(names)]
    rows_csv = []
    pooled: dict[tuple[str, str, str], list[float]] = {}
    for pair, steps in pairs.items():
        w = pair.split("/")[0]
        group = "fit" if w in fit_w else "held out"
        live_pre = (results.get(pair, {}).get("live") or {}).get("preemptions", float("nan"))
        pressured = bool(live_pre and live_pre > 0)
        tots = {n: kind_totals(steps, *priced[n][pair]) for n in names}
        for k in KINDS:
            if k not in tots[names[0]]:
                continue
            n_steps, live, _ = tots[names[0]][k]
            errs = [pct(tots[n][k][2], live) for n in names]
            md.append(f"| {pair} | {group} | {live_pre:g} | {k} | {n_steps} | {live:.3f} | " + " | ".join(errs) + " |")
            rows_csv.append({"pair": pair, "set": group, "live_preemptions": live_pre, "kind": k, "steps": n_steps,
                             "live_s": live, **{f"sim_s_{n}": tots[n][k][2] for n in names}})
            for n in names:
                for key in ((group, "all", k), (group, "pressured" if pressured else "unpressured", k)):
                    acc = pooled.setdefault(key + (n,), [0.0, 0.0, []])
                    acc[0] += live
                    acc[1] += tots[n][k][2]
                    acc[2].append(abs(tots[n][k][2] - live) / live if live > 0 else 0.0)

    md += ["", "## Pooled (sum over pairs; and the mean over pairs of each pair's absolute error)", "",
           "| set | pairs | kind | live s | " + " | ".join(f"error {n}" for n in names) + " | " +
           " | ".join(f"mean abs pair error {n}" for n in names) + " |",
           "|---|---|---|---:|" + "---:|" * (2 * len(names))]
    for group in ("fit", "held out"):
        for sub in ("pressured", "unpressured", "all"):
            for k in KINDS:
                if (group, sub, k, names[0]) in pooled:
                    live = pooled[(group, sub, k, names[0])][0]
                    md.append(f"| {group} | {sub} | {k} | {live:.3f} | " +
                              " | ".join(pct(pooled[(group, sub, k, n)][1], live) for n in names) + " | " +
                              " | ".join(f"{np.mean(pooled[(group, sub, k, n)][2]):.1%}" for n in names) + " |")

    # what the residuals follow (baseline profile)
    every = [s for steps in pairs.values() for s in steps]
    fwd = np.concatenate([priced[names[0]][p][0] for p in pairs])
    kind = np.asarray([s["kind"] for s in every])
    col = lambda k: np.asarray([float(s.get(k, 0)) for s in every])
    mixed, decode = kind == "mixed", kind == "decode"
    after_swap = np.r_[False, (kind == "swap")[:-1]]
    first = np.cumsum([0] + [len(s) for s in pairs.values()])[:-1]
    after_swap[first] = False
    policy = np.concatenate([[p.split("/")[1]] * len(s) for p, s in pairs.items()])
    md += ["", f"## What the residuals follow ({names[0]} profile, all pairs)", "",
           "Ratio live / model of the time inside `execute`: median over steps, and total (sum live / sum model).", "",
           "| feature | bin | steps | median ratio | total ratio |", "|---|---|---:|---:|---:|"]
    md += binned_ratio(every, fwd, mixed, col("n_dec"), [1, 4, 8, 16, 32, 64, 128, 257], "mixed: decodes")
    md += binned_ratio(every, fwd, mixed, col("pre_tok"), [2, 64, 256, 512, 1024, 2048, 8193], "mixed: prefill tokens")
    md += binned_ratio(every, fwd, mixed, col("pre_ctx") - col("pre_tok"), [0, 1, 1024, 4096, 1e9],
                       "mixed: cached prefix tokens")
    md += binned_ratio(every, fwd, mixed, col("dec_max"), [0, 1024, 2048, 4096, 1e9], "mixed: longest decode")
    for pol in sorted(set(policy)):
        md += binned_ratio(every, fwd, decode & (policy == pol), after_swap.astype(float), [0, 1, 2],
                           f"decode ({pol}): after a swap step")
        md += binned_ratio(every, fwd, mixed & (policy == pol), col("n_dec"), [1, 16, 64, 257], f"mixed ({pol}): decodes")
    md += host_by_queue(every, policy, np.concatenate([priced[names[0]][p][1] for p in pairs]), names[0])
    md += episodes(pairs, priced[names[0]])
    write_report("\n".join(md) + "\n", rows_csv, args.out)
    return 0


def write_report(text: str, rows: list[dict], out: str | None) -> None:
    """``text`` (Markdown) to ``<out>.md`` and ``rows`` to ``<out>.csv`` (``out`` whole: a dotted
    name such as ``residuals_qwen3-0.6b`` keeps its dot; a trailing ``.md`` or ``.csv`` is dropped
    first); only ``text`` to stdout without ``out``. Shared by scripts/fidelity_compare.py."""
    if not out:
        print(text)
        return
    base = str(out).removesuffix(".md").removesuffix(".csv")
    Path(base).parent.mkdir(parents=True, exist_ok=True)
    Path(f"{base}.md").write_text(text)
    buf = io.StringIO()
    wr = csv.DictWriter(buf, fieldnames=list(rows[0]))
    wr.writeheader()
    wr.writerows(rows)
    Path(f"{base}.csv").write_text(buf.getvalue())
    print(f"wrote {base}.md and .csv")


if __name__ == "__main__":
    raise SystemExit(main())
