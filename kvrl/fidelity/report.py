"""``kvrl-fidelity``'s outputs: per-pair plots, the Markdown/CSV/JSON report with per-metric errors,
the sim against the mean of the live runs, and whether the policy ranking agrees.
"""
from __future__ import annotations

import csv
import json
import logging
import math
from pathlib import Path
from typing import Any, Optional

import numpy as np

from kvrl.fidelity.compare import METRICS, RANK_METRICS, TARGETS, rel_err, within_targets


log = logging.getLogger("kvrl.fidelity")


def plot_pair(live_steps, sim_steps, replay_live, replay_sim, path: Path, title: str) -> None:
    """Per-step time over engine time (live and sim, each on its own schedule) and the replay
    scatter. Skipped with a warning when matplotlib is missing (see :func:`replot`)."""
    try:
        import matplotlib
    except ImportError:
        log.warning("matplotlib is not installed: %s not written (re-plot later with kvrl.fidelity.report.replot)",
                    path.name)
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from kvrl.files import atomic_write

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    ax = axes[0]
    for steps, label, alpha in ((live_steps, "live", 0.8), (sim_steps, "sim", 0.6)):
        if steps:
            a = np.asarray([(s[1], s[2]) for s in steps])
            ax.plot(a[:, 0], a[:, 1] * 1e3, ".", ms=2, alpha=alpha, label=f"{label} ({len(steps)} steps)")
    ax.set_xlabel("engine time (s)")
    ax.set_ylabel("step duration (ms)")
    ax.set_yscale("log")
    ax.legend(loc="upper right", fontsize=8)
    ax.set_title("per-step time, each run on its own schedule", fontsize=9)
    ax = axes[1]
    if len(replay_live):
        lo = max(min(replay_live.min(), replay_sim.min()) * 1e3, 1e-3)
        hi = max(replay_live.max(), replay_sim.max()) * 1e3
        ax.loglog(replay_live * 1e3, replay_sim * 1e3, ".", ms=3, alpha=0.5)
        ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
    ax.set_xlabel("live step time (ms)")
    ax.set_ylabel("sim prediction for the same batch (ms)")
    ax.set_title("replay: the live run's batches priced by the sim", fontsize=9)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=100), mode="wb")
    plt.close(fig)


def replot(run_dir: str) -> list[Path]:
    """Re-draw every ``steps_<workload>_<policy>.png`` of a finished kvrl-fidelity run directory
    from its ``steps.csv`` and ``replay.csv`` files (e.g. on a machine with matplotlib when the
    GPU machine had none): ``python -c "from kvrl.fidelity.report import replot; replot('DIR')"``."""
    root = Path(run_dir)
    written = []
    for pair in sorted(p for p in (root / "runs").glob("*/*") if (p / "replay.csv").exists()):
        def steps(side):
            f = pair / side / "steps.csv"
            if not f.exists():
                return []
            with open(f) as fh:
                rows = list(csv.reader(fh))[1:]
            return [(int(r[0]), float(r[1]), float(r[2])) for r in rows]
        with open(pair / "replay.csv") as fh:
            rep = np.asarray([[float(r["live_s"]), float(r["sim_s"])] for r in csv.DictReader(fh)]).reshape(-1, 2)
        path = root / f"steps_{pair.parent.name}_{pair.name}.png"
        plot_pair(steps("live"), steps("sim"), rep[:, 0], rep[:, 1], path, f"{pair.parent.name} / {pair.name}")
        written.append(path)
    return written


def slow_cell(share: Optional[float]) -> str:
    """A replay's :func:`~kvrl.fidelity.replay.host_slow_share` as a table cell."""
    return "n/a" if share is None or math.isnan(share) else f"{share:.0%}"


def fast_cell(totals: Optional[dict]) -> str:
    """The replay's total error over its steps on a fast host (``fast_host`` of
    :func:`~kvrl.fidelity.replay.replay_summary`) as a table cell."""
    if not totals or totals["live_s"] <= 0:
        return "n/a"
    return f"{pct(rel_err(totals['live_s'], totals['sim_s']))} ({totals['steps']} steps)"


def fmt(v: Any) -> str:
    if isinstance(v, float):
        if not math.isfinite(v):
            return "n/a" if math.isnan(v) else ("inf" if v > 0 else "-inf")
        return f"{v:.4g}"
    return str(v)


def pct(v: float) -> str:
    return "n/a" if not math.isfinite(v) else f"{v:+.1%}"


def ranking(results: dict, workload: str, metric: str, better: int) -> tuple[str, str]:
    """Policies of ``workload`` best first by ``metric``, live and sim, as ``"a > b"`` (equal
    values, e.g. when neither policy ever had to decide anything, as ``"a = b"``)."""
    pairs = [(p, r) for (w, p), r in results.items() if w == workload and "error" not in r]
    sign = -1 if better > 0 else 1

    def order(side: str) -> str:
        vals = sorted(((sign * r[side].get(metric, float("nan")), p) for p, r in pairs),
                      key=lambda t: (not math.isfinite(t[0]), t[0], t[1]))
        text = vals[0][1] if vals else ""
        for (a, _), (b, name) in zip(vals, vals[1:]):
            tie = math.isfinite(a) and math.isfinite(b) and abs(a - b) <= 1e-9 * max(abs(a), abs(b), 1e-12)
            text += (" = " if tie else " > ") + name
        return text
    return order("live"), order("sim")


def render(results: dict, header: list[str]) -> tuple[str, list[list]]:
    lines = list(header)
    csv_rows: list[list] = [["workload", "policy", "metric", "live", "sim", "rel_err"]]
    lines += ["", "## Per-metric error (sim vs live)", "",
              "| workload | policy | " + " | ".join(label for _, label, _ in METRICS) + " |",
              "|---|---|" + "---:|" * len(METRICS)]
    errs: dict[str, list[float]] = {k: [] for k, _, _ in METRICS}
    for (w, p), r in results.items():
        if "error" in r:
            lines.append(f"| {w} | {p} | " + " | ".join("skipped" for _ in METRICS) + " |")
            continue
        cells = []
        for key, _, _ in METRICS:
            lv, sv = r["live"].get(key, float("nan")), r["sim"].get(key, float("nan"))
            e = rel_err(lv, sv)
            if math.isfinite(e):
                errs[key].append(abs(e))
            cells.append(f"{fmt(lv)} / {fmt(sv)} ({pct(e)})")
            csv_rows.append([w, p, key, lv, sv, e])
        lines.append(f"| {w} | {p} | " + " | ".join(cells) + " |")
    lines += ["", "Cells: live / sim (relative error of sim).", "", "## Summary over pairs", "",
              "| metric | pairs | mean abs rel err | max abs rel err |", "|---|---:|---:|---:|"]
    for key, label, _ in METRICS:
        v = errs[key]
        lines.append(f"| {label} | {len(v)} | {np.mean(v):.1%} | {np.max(v):.1%} |" if v else f"| {label} | 0 | n/a | n/a |")
    lines.append("")
    for key, bound in TARGETS.items():
        v, label = errs[key], next(lab for k, lab, _ in METRICS if k == key)
        if v:
            lines.append(f"- Target {label}: under {bound:.0%} on every pair: {'met' if max(v) < bound else 'NOT met'} "
                         f"(max {max(v):.1%}; {sum(e < bound for e in v)} of {len(v)} pairs within).")
    again = [(w, p, r) for (w, p), r in results.items() if r.get("live_again")]
    if again:
        lines += ["", "## Live vs live: the same live run repeated", "",
                  "Relative difference of a second live run from the first: the noise floor any sim error is "
                  "measured against.", "",
                  "| workload | policy | " + " | ".join(label for _, label, _ in METRICS) + " |",
                  "|---|---|" + "---:|" * len(METRICS)]
        for w, p, r in again:
            pairs = [(k, r["live"].get(k), r["live_again"].get(k)) for k, _, _ in METRICS]
            lines.append(f"| {w} | {p} | " + " | ".join(pct(rel_err(a, b)) for _, a, b in pairs) + " |")
            csv_rows += [[w, p, f"{k}_live_again", a, b, rel_err(a, b)] for k, a, b in pairs]
    lines += mean_section(results)
    lines += calibrated_section(results)
    lines += ensemble_section(results)
    lines += ["", "## Policy ranking (best first)", "", "| workload | metric | live | sim | same |", "|---|---|---|---|---|"]
    agree = total = ties = 0
    for w in dict.fromkeys(w for w, _ in results):
        for key in RANK_METRICS:
            better = next(b for k, _, b in METRICS if k == key)
            lo, so = ranking(results, w, key, better)
            if " " not in lo:
                continue          # fewer than two policies finished
            if lo == so:
                verdict = "yes"
            elif " = " in lo or " = " in so:
                verdict = "tie"
            else:
                verdict = "NO"
            agree += verdict == "yes"
            ties += verdict == "tie"
            total += 1
            lines.append(f"| {w} | {key} | {lo} | {so} | {verdict} |")
            csv_rows.append([w, "ranking", key, lo, so, {"yes": "same", "tie": "tie", "NO": "differs"}[verdict]])
    lines.append("")
    lines.append(f"Ranking agrees in {agree} of {total} (workload, metric) cases"
                 + (f"; {ties} with a tie on one side (policies equal there: not a disagreement in order)." if ties else "."))
    lines += ["", "## Replay: the live run's batches priced by the sim's cost model", "",
              "| workload | policy | steps | median abs rel err | p90 | total time rel err | live wall s | sim wall s | "
              "live GC pauses: n, total s, max s | live time on a slow host | total time rel err on a fast host | "
              "sim host speed (live / profile host probe) |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for (w, p), r in results.items():
        rp, g = r.get("replay"), r.get("live_gc")
        if rp:
            gc_cell = f"{g['collections']}, {g['total_s']:.3f}, {g['max_s']:.3f}" if g else "n/a"
            lines.append(f"| {w} | {p} | {rp['steps']} | {rp['median_abs_rel_err']:.1%} | {rp['p90_abs_rel_err']:.1%} | "
                         f"{pct(rp['total_rel_err'])} | {r.get('live_wall_s', 0):.1f} | {r.get('sim_wall_s', 0):.2f} | "
                         f"{gc_cell} | {slow_cell(rp.get('host_slow_share'))} | "
                         f"{fast_cell((rp.get('fast_host') or {}).get('all'))} | {host_speed_cell(r)} |")
    lines += ["", "### Replay by step kind (total seconds over the run; host = the engine's time between steps)", "",
              "| workload | policy | kind | steps | live s | sim s | total rel err | median abs rel err | "
              "total rel err on a fast host |",
              "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for (w, p), r in results.items():
        fast = (r.get("replay") or {}).get("fast_host") or {}
        for kind, k in (r.get("replay") or {}).get("by_kind", {}).items():
            med = k["median_abs_rel_err"]
            lines.append(f"| {w} | {p} | {kind} | {k['steps']} | {k['live_s']:.3f} | {k['sim_s']:.3f} | "
                         f"{pct(rel_err(k['live_s'], k['sim_s']))} | {'' if math.isnan(med) else f'{med:.1%}'} | "
                         f"{fast_cell(fast.get(kind))} |")
    return "\n".join(lines), csv_rows


def host_speed_cell(r: dict) -> str:
    """The factor the sim put on the profile's host terms for a pair, and the measured ratio of
    the live run's host probe to the profile's (runs before session 20 recorded neither)."""
    if "host_speed" not in r:
        return "n/a"
    ratio = r.get("host_probe_ratio")
    measured = f"{ratio:.2f}" if ratio is not None and math.isfinite(ratio) else "n/a"
    return f"x{r['host_speed']:.2f} ({measured})"


def mean_and_spread(runs: list[dict], key: str) -> tuple[float, float]:
    """Mean of metric ``key`` over ``runs`` (run summaries) and their spread: the largest absolute relative deviation
    of one run from that mean."""
    vals = [m.get(key, float("nan")) for m in runs]
    mean = float(np.mean(vals))
    spread = max(abs(rel_err(mean, v)) for v in vals) if mean else float("nan")
    return mean, spread


def live_mean_and_spread(r: dict, key: str) -> tuple[float, float]:
    """:func:`mean_and_spread` over all live runs of a pair."""
    return mean_and_spread([r["live"], *r.get("live_repeats", [])], key)


def meets_every_target(live_pair: dict, sim: dict) -> bool:
    """Whether ``sim`` (a pair's sim metrics) is within every bound of :data:`TARGETS` of the mean of
    ``live_pair``'s live runs (:func:`live_mean_and_spread`); a missing sim metric misses."""
    return within_targets({k: live_mean_and_spread(live_pair, k)[0] for k in TARGETS}, sim)


def resolved_rankings(live: dict[str, dict], sims: dict[str, dict[str, dict]]) -> list[dict]:
    """Per workload and ranked metric (:data:`RANK_METRICS`), the two best policies by their live
    means (``live``: ``"workload/policy"`` -> a pair's result with ``live`` and ``live_repeats``) and
    whether each sim of ``sims`` (name -> pair -> ``{"sim": metrics}``) orders them the same way.
    The live order is *resolved* when the two means differ by more than the larger of the two live
    spreads (:func:`live_mean_and_spread`; the gap relative to the larger mean): issue 16's rule
    counts only a resolved order that a sim reverses. Rows: ``workload, metric, first, second, gap,
    spread, resolved, same`` (name -> bool)."""
    better = {k: b for k, _, b in METRICS}
    by_w: dict[str, list[str]] = {}
    for pair in live:
        by_w.setdefault(pair.split("/")[0], []).append(pair)
    rows = []
    for w, pairs in by_w.items():
        if len(pairs) < 2:
            continue
        for key in RANK_METRICS:
            stats = {p: live_mean_and_spread(live[p], key) for p in pairs}
            a, b = sorted(pairs, key=lambda p: -better[key] * stats[p][0])[:2]
            gap = abs(stats[a][0] - stats[b][0]) / max(abs(stats[a][0]), abs(stats[b][0]), 1e-300)
            spread = max(stats[a][1], stats[b][1])
            same = {n: better[key] * (sim[a]["sim"].get(key, float("nan")) - sim[b]["sim"].get(key, float("nan"))) >= 0
                    for n, sim in sims.items()}
            rows.append({"workload": w, "metric": key, "first": a.split("/", 1)[1], "second": b.split("/", 1)[1],
                         "gap": gap, "spread": spread, "resolved": gap > spread, "same": same})
    return rows


def mean_section(results: dict) -> list[str]:
    """With repeated live runs: the target metrics of the sim against the mean of the live runs,
    next to how far single live runs are from that mean."""
    done = [(w, p, r) for (w, p), r in results.items() if r.get("live_repeats") and "error" not in r]
    if not done:
        return []
    n = 1 + max(len(r["live_repeats"]) for _, _, r in done)
    keys = list(TARGETS) + ["goodput_tok_s"]
    labels = {k: lab for k, lab, _ in METRICS}
    lines = ["", f"## Sim vs the mean of the live runs ({n} per pair)", "",
             "Cells: mean of the live runs / sim (relative error of sim; in brackets the largest deviation "
             "of one live run from the live mean).", "",
             "| workload | policy | " + " | ".join(labels[k] for k in keys) + " |", "|---|---|" + "---:|" * len(keys)]
    within = {k: 0 for k in TARGETS}
    every = 0
    for w, p, r in done:
        cells, hits = [], 0
        for k in keys:
            mean, spread = live_mean_and_spread(r, k)
            e = rel_err(mean, r["sim"].get(k, float("nan")))
            if k in TARGETS and abs(e) < TARGETS[k]:
                within[k] += 1
                hits += 1
            cells.append(f"{fmt(mean)} / {fmt(r['sim'].get(k))} ({pct(e)}; [{spread:.1%}])")
        every += hits == len(TARGETS)
        lines.append(f"| {w} | {p} | " + " | ".join(cells) + " |")
    lines.append("")
    for k, bound in TARGETS.items():
        lines.append(f"- {labels[k]} against the live mean: {within[k]} of {len(done)} pairs within {bound:.0%}.")
    lines.append(f"- every target at once: {every} of {len(done)} pairs.")
    return lines


#: the sims of a pair compared in :func:`calibrated_section`: its result's key and the name shown
SPEED_SIMS = (("sim", "as priced"), ("sim_cal", "calibrated on earlier pairs"), ("sim_host", "at its own host speed"))


def calibrated_section(results: dict) -> list[str]:
    """The pairs with a calibrated sim (``sim_cal``, a prediction; :func:`kvrl.fidelity.pairs.add_speed_sims`):
    each target metric against the mean of the live runs, as priced, calibrated and at the pair's own
    host speed (``sim_host``, after the fact)."""
    done = [(w, p, r) for (w, p), r in results.items() if r.get("sim_cal") and r.get("sim_host") and "error" not in r]
    if not done:
        return []
    labels = {k: lab for k, lab, _ in METRICS}
    names = " -> ".join(name for _, name in SPEED_SIMS)
    lines = ["", "## The sim calibrated on earlier pairs: a prediction", "",
             "Each pair after the first served again in the sim with every step scaled by 1 / (1 + the mean replay "
             "error of the pairs before it in this run): the host's speed as measured before the pair; and at its "
             "own replay's speed, after the fact (the cost model's shape alone). Cells: relative error against the "
             f"mean of the live runs, {names}.", "",
             "| workload | policy | scale: calibrated, own | " + " | ".join(labels[k] for k in TARGETS) + " |",
             "|---|---|---:|" + "---:|" * len(TARGETS)]
    within = {side: {k: 0 for k in TARGETS} for side, _ in SPEED_SIMS}
    every = {side: 0 for side, _ in SPEED_SIMS}
    for w, p, r in done:
        mean = {k: live_mean_and_spread(r, k)[0] for k in TARGETS}
        for side in every:
            every[side] += within_targets(mean, r[side])
            for k, bound in TARGETS.items():
                within[side][k] += abs(rel_err(mean[k], r[side].get(k, math.nan))) < bound
        cells = [" -> ".join(pct(rel_err(mean[k], r[side].get(k, math.nan))) for side, _ in SPEED_SIMS) for k in TARGETS]
        lines.append(f"| {w} | {p} | x{r['calibration_scale']:.3f}, x{r['host_speed_scale']:.3f} | "
                     + " | ".join(cells) + " |")
    lines.append("")
    for k, bound in [*TARGETS.items(), ("every target at once", None)]:
        counts = every if bound is None else {side: within[side][k] for side in within}
        what = k if bound is None else f"{labels[k]} within {bound:.0%}"
        lines.append(f"- {what}: " + ", ".join(f"{counts[side]} of {len(done)} {name}" for side, name in SPEED_SIMS) + ".")
    return lines


def ensemble_section(results: dict) -> list[str]:
    """With ``sim_ensemble`` > 1: per pair and target metric, how far one jittered sim run lies from the ensemble's
    mean beside how far one live run lies from the live mean. A pair whose ensemble spreads beyond a target's bound
    is one whose schedule a small change of timing moves that far: one live mean is a noisy reference for it."""
    done = [(w, p, r) for (w, p), r in results.items() if r.get("sim_runs") and "error" not in r]
    if not done:
        return []
    labels = {k: lab for k, lab, _ in METRICS}
    lines = ["", f"## The sim's own spread ({len(done[0][2]['sim_runs'])} jittered runs per prediction)", "",
             "Cells: the largest deviation of one sim run from the ensemble mean / of one live run from the live mean; "
             "`!` where the sim's exceeds the metric's target.", "",
             "| workload | policy | " + " | ".join(labels[k] for k in TARGETS) + " |", "|---|---|" + "---:|" * len(TARGETS)]
    wide = 0
    for w, p, r in done:
        spreads = {k: mean_and_spread(r["sim_runs"], k)[1] for k in TARGETS}
        flags = {k: "!" if spreads[k] > bound else "" for k, bound in TARGETS.items()}
        wide += any(flags.values())
        lines.append(f"| {w} | {p} | " + " | ".join(
            f"{spreads[k]:.1%}{flags[k]} / {live_mean_and_spread(r, k)[1]:.1%}" for k in TARGETS) + " |")
    lines += ["", f"- {wide} of {len(done)} pairs have a sim ensemble that spreads beyond some target's bound."]
    return lines


def write_report(results: dict, out_dir: Path, header: list[str], final: bool) -> str:
    """Write fidelity.md / .csv / .json for the pairs done so far; returns the Markdown."""
    from kvrl.files import atomic_write

    if not final:
        header = header + ["", "**Partial: the run is still going (or was stopped).**"]
    table, csv_rows = render(results, header)
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(out_dir / "fidelity.md", lambda f: f.write(table + "\n"))
    atomic_write(out_dir / "fidelity.csv", lambda f: csv.writer(f).writerows(csv_rows))
    atomic_write(out_dir / "fidelity.json", lambda f: json.dump(
        {f"{w}/{p}": r for (w, p), r in results.items()}, f, indent=1, default=lambda x: None))
    return table


def ensemble_line(cfg: dict) -> str:
    """The report's line on what one sim prediction is (``sim_ensemble``, ``sim_step_noise``)."""
    if cfg["sim_ensemble"] <= 1:
        return "sim: one deterministic run per prediction (sim_ensemble=1)."
    return (f"sim: every prediction the mean of {cfg['sim_ensemble']} runs whose step times jitter "
            f"(sim_step_noise={cfg['sim_step_noise']}: a mean-one lognormal factor per step); the deterministic run "
            "is kept as sim_deterministic.")
