"""``kvrl-fidelity``: serve the same workloads with the same policies through the live executor and
the sim, and report how far the sim's metrics are from live.

For every workload x policy pair: one live run and one sim run of the same requests on the same
engine configuration (the sim gets the live run's resolved ``num_blocks``/``num_cpu_blocks``), each
with fresh policy instances; cost-aware policies see the same estimates in both (the live
executor's ``cost_model`` is replaced by the sim's). Live runs are preceded, once per engine
configuration, by a warm-up run that captures every CUDA graph and compiles every kernel, so
no capture lands in a timed step. During the live run each executed batch is also priced by the
sim's cost model ("replay"): a per-step error on identical batches, independent of how the two
schedules diverge.

Writes into the run directory: ``fidelity.md`` and ``fidelity.csv`` (per-metric live, sim, error;
per-metric summary; whether the policy ranking agrees), ``runs/<workload>/<policy>/{live,sim}/``
(``metrics.json``, ``steps.csv``), ``replay.csv`` per pair, and ``steps_<workload>_<policy>.png``
(per-step time live vs sim over engine time, and replayed sim vs live step times).
"""
from __future__ import annotations

import csv
import gc
import json
import logging
import math
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np

from kvrl.engine.callbacks import EngineCallback

log = logging.getLogger("kvrl.fidelity")

#: (key, label, better): better = +1 when larger is better, -1 when smaller is, 0 for neither.
METRICS = (
    ("throughput_tok_s", "throughput tok/s", +1),
    ("goodput_tok_s", "goodput tok/s", +1),
    ("ttft_p50_s", "TTFT p50 s", -1),
    ("ttft_mean_s", "TTFT mean s", -1),
    ("ttft_p99_s", "TTFT p99 s", -1),
    ("tpot_p50_s", "TPOT p50 s", -1),
    ("tpot_mean_s", "TPOT mean s", -1),
    ("tpot_p99_s", "TPOT p99 s", -1),
    ("preemptions", "preemptions", 0),
    ("kv_utilization", "KV utilization", 0),
)
RANK_METRICS = ("goodput_tok_s", "throughput_tok_s", "ttft_p99_s", "tpot_mean_s")
#: docs/design.md §11 / issue targets: metric -> largest acceptable absolute relative error
TARGETS = {"throughput_tok_s": 0.03, "ttft_p50_s": 0.10, "tpot_p50_s": 0.10, "ttft_p99_s": 0.20}


class _Recorder(EngineCallback):
    """Engine callback on the live run: keeps every executed batch, its live ``elapsed_s`` and the
    wall seconds inside ``execute`` (priced by the sim's cost model after the run, so nothing but
    three list appends happens between live steps), and stops the run after the step that exceeds
    ``max_wall_s`` of wall time since the run started (``error`` then says so)."""

    def __init__(self, max_wall_s: Optional[float]) -> None:
        self.max_wall_s = max_wall_s
        self.batches: list = []
        self.elapsed: list[float] = []
        self.inside: list[float] = []     # wall seconds inside execute (elapsed_s adds the engine's gap)
        self.error: Optional[str] = None
        self._t0 = time.perf_counter()

    def on_run_start(self, engine) -> None:
        self._t0 = time.perf_counter()

    def on_step(self, event) -> bool:
        self.inside.append(event.execute_wall_s)
        self.batches.append(event.batch)
        self.elapsed.append(event.output.elapsed_s)
        if self.max_wall_s and time.perf_counter() - self._t0 > self.max_wall_s:
            self.error = f"live run exceeded max_live_wall_s={self.max_wall_s}"
            return False
        return True

    def replay(self, pricer, live) -> list[dict]:
        """Per executed step, in order (the pricer's swap stream sees the same sequence): live and
        sim seconds, the step's kind and cost-model features, the live seconds inside ``execute``
        and the sim's host term (so the run can be re-priced offline with another profile); ``live``
        is the live executor (its CUDA-graph sizes)."""
        from kvrl.executors.profile import HOST_WORK, batch_features, host_work

        model = pricer.profile.model if pricer.profile is not None else None
        rows = []
        for batch, live_s, inside_s in zip(self.batches, self.elapsed, self.inside):
            f = {**batch_features(batch), **host_work(batch)}
            n_dec, n_pre = f["n_dec"], f["n_pre"]
            host_s = model.host_s(n_pre + n_dec, n_pre, *(f[k] for k in HOST_WORK)) \
                if model is not None and batch.seqs else 0.0
            rows.append({"live_s": live_s, "sim_s": pricer.execute(batch).elapsed_s, "kind": step_kind(batch, n_pre, n_dec),
                         "live_execute_s": inside_s, "sim_host_s": host_s, "tokens": batch.num_tokens, **f,
                         "graph": int(live.uses_graph(n_pre, n_dec))})
        return rows


class GcPauses:
    """Context manager recording the cyclic garbage collector's pauses (seconds) while it is open:
    in a live run they are stalls the sim does not price."""

    def __init__(self) -> None:
        self.pauses: list[float] = []
        self._t0 = 0.0

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.pauses.append(time.perf_counter() - self._t0)

    def __enter__(self) -> "GcPauses":
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self._callback)

    def summary(self) -> dict:
        return {"collections": len(self.pauses), "total_s": float(sum(self.pauses)),
                "max_s": float(max(self.pauses, default=0.0))}


def step_kind(batch, n_pre: int, n_dec: int) -> str:
    """swap (any swap-out or swap-in), decode, prefill or mixed."""
    if batch.swap_out or batch.swap_in:
        return "swap"
    if not n_pre:
        return "decode"
    return "mixed" if n_dec else "prefill"


def replay_summary(replay: list[dict]) -> dict:
    """Per-step relative errors of a (non-empty) replay: median, p90, total, and per step kind."""
    live_t = np.asarray([r["live_s"] for r in replay])
    sim_t = np.asarray([r["sim_s"] for r in replay])
    e = np.abs(sim_t - live_t) / np.maximum(live_t, 1e-12)
    return {"steps": int(live_t.size), "median_abs_rel_err": float(np.median(e)),
            "p90_abs_rel_err": float(np.percentile(e, 90)),
            "total_rel_err": float((sim_t.sum() - live_t.sum()) / max(live_t.sum(), 1e-12)),
            "by_kind": replay_breakdown(replay)}


def replay_breakdown(replay: list[dict]) -> dict:
    """Replay totals per step kind, plus the engine's time between steps ("host": live
    ``elapsed_s`` minus the time inside ``execute``, vs the profile's host term)."""
    out: dict[str, dict] = {}
    for kind in ("decode", "prefill", "mixed", "swap"):
        rows = [r for r in replay if r["kind"] == kind]
        if rows:
            live_t = np.asarray([r["live_s"] for r in rows])
            sim_t = np.asarray([r["sim_s"] for r in rows])
            out[kind] = {"steps": len(rows), "live_s": float(live_t.sum()), "sim_s": float(sim_t.sum()),
                         "median_abs_rel_err": float(np.median(np.abs(sim_t - live_t) / np.maximum(live_t, 1e-12)))}
    if replay:
        live_h = float(sum(max(r["live_s"] - r["live_execute_s"], 0.0) for r in replay))
        out["host"] = {"steps": len(replay), "live_s": live_h, "sim_s": float(sum(r["sim_host_s"] for r in replay)),
                       "median_abs_rel_err": float("nan")}
    return out


def _engine(ecfg: dict, executor, pcfg: dict, slo: dict, record_steps: bool = True):
    """The engine of one (workload, policy) pair: engine config ``ecfg``, the plugin kinds of
    ``pcfg`` (every kind needed; other keys ignored), ``slo``."""
    from kvrl import plugins
    from kvrl.builder import build_engine

    kinds = {kind: dict(pcfg[kind]) for kind in (*plugins.KINDS, "tier") if kind in pcfg}
    return build_engine({"engine": ecfg, **kinds, "slo": slo}, executor=executor, record_steps=record_steps)


def summarize(engine) -> dict:
    """The engine's summary plus mean TTFT and TPOT over finished requests."""
    m = engine.metrics.summary()
    done = [r for r in engine.metrics.requests.values() if r.finish_s is not None and not r.error]
    ttft = [r.ttft_s for r in done if r.ttft_s is not None]
    tpot = [r.tpot_s for r in done if r.tpot_s is not None]
    m["ttft_mean_s"] = float(np.mean(ttft)) if ttft else float("nan")
    m["tpot_mean_s"] = float(np.mean(tpot)) if tpot else float("nan")
    return m


def rel_err(live: float, sim: float) -> float:
    if live is None or sim is None or not (math.isfinite(live) and math.isfinite(sim)):
        return float("nan")
    if live == 0:
        return 0.0 if sim == 0 else float("inf")
    return (sim - live) / abs(live)


def warmup(live, ecfg: dict, n: int, seed: int) -> None:
    """Serve ``n`` requests on ``live`` with engine config ``ecfg`` so that every decode batch size
    from ``n`` down to 1 occurs (graphs captured) and prompts of many lengths are prefilled."""
    from kvrl.engine.request import Request

    if n <= 0:
        return
    rng = np.random.default_rng(seed + 101)
    bs = ecfg["block_size"]
    max_prompt = int(max(16, min(2048, live.max_model_len // 4, ecfg["num_blocks"] * bs // max(4 * n // 16, 4))))
    lens = np.unique(np.geomspace(8, max_prompt, 12).astype(int))
    reqs = [Request(f"warm{i}", 0.0, rng.integers(0, live.vocab_size, int(lens[i % len(lens)]), dtype=np.int32),
                    1 + i % n) for i in range(n)]
    pol = {"scheduler": {"name": "fcfs"}, "watermark": {"name": "fixed"}, "eviction": {"name": "lifo"},
           "prefix_cache": {"name": "none"}}
    t0 = time.perf_counter()
    _engine(ecfg, live, pol, {}, record_steps=False).run(reqs)
    log.info("warm-up: %d requests in %.1f s", n, time.perf_counter() - t0)


def run_pair(live, make_sim, requests, ecfg: dict, pcfg: dict, slo: dict, out: Path, max_wall_s: Optional[float],
             plots: bool, title: str, live_repeats: int = 1) -> dict:
    from kvrl.apps.outputs import atomic_write, write_json

    res: dict[str, Any] = {}
    recorder = _Recorder(max_wall_s)
    eng = _engine(ecfg, live, pcfg, slo)
    wall = time.perf_counter()
    with GcPauses() as pauses:
        eng.run(requests, callbacks=[recorder])
    if recorder.error:
        log.warning("%s: %s; pair skipped", title, recorder.error)
        res["error"] = recorder.error
    res["live_wall_s"] = time.perf_counter() - wall
    res["live_gc"] = pauses.summary()
    resolved = dict(ecfg, num_blocks=eng.config.num_blocks, num_cpu_blocks=eng.config.num_cpu_blocks,
                    max_model_len=eng.config.max_model_len)
    live_m = summarize(eng)
    (out / "live").mkdir(parents=True, exist_ok=True)
    write_json(out / "live" / "metrics.json", live_m)
    atomic_write(out / "live" / "steps.csv", eng.metrics.write_steps_csv)
    pricer = make_sim()
    pricer.allocate_kv(eng.config.num_blocks, eng.config.num_cpu_blocks, eng.config.block_size)
    replay = recorder.replay(pricer, live)
    recorder.batches.clear()
    with open(out / "replay.csv", "w", newline="") as f:
        w = csv.DictWriter(f, ["step", *(replay[0] if replay else ("live_s", "sim_s"))])
        w.writeheader()
        w.writerows({"step": i + 1, **row} for i, row in enumerate(replay))

    if "error" in res:
        res.update(live=live_m, sim={}, engine=resolved)
        return res
    repeats = []
    for _ in range(live_repeats - 1):   # the same live run again: how far live is from itself
        again, limit = _engine(ecfg, live, pcfg, slo, record_steps=False), _Recorder(max_wall_s)
        again.run(requests, callbacks=[limit])
        if limit.error:
            log.warning("%s: repeat: %s", title, limit.error)
        else:
            repeats.append(summarize(again))
    if repeats:
        res["live_again"], res["live_repeats"] = repeats[0], repeats
    sim = make_sim()
    seng = _engine(resolved, sim, pcfg, slo)
    wall = time.perf_counter()
    seng.run(requests)
    res["sim_wall_s"] = time.perf_counter() - wall
    sim_m = summarize(seng)
    (out / "sim").mkdir(parents=True, exist_ok=True)
    write_json(out / "sim" / "metrics.json", sim_m)
    atomic_write(out / "sim" / "steps.csv", seng.metrics.write_steps_csv)

    if replay:
        res["replay"] = replay_summary(replay)
    res.update(live=live_m, sim=sim_m, engine=resolved)
    if plots:
        live_t, sim_t = np.asarray([r["live_s"] for r in replay]), np.asarray([r["sim_s"] for r in replay])
        plot_pair(eng.metrics.steps, seng.metrics.steps, live_t, sim_t, out.parent.parent.parent /
                  f"steps_{out.parent.name}_{out.name}.png", title)
    return res


def plot_pair(live_steps, sim_steps, replay_live, replay_sim, path: Path, title: str) -> None:
    """Per-step time over engine time (live and sim, each on its own schedule) and the replay
    scatter. Skipped with a warning when matplotlib is missing (see :func:`replot`)."""
    try:
        import matplotlib
    except ImportError:
        log.warning("matplotlib is not installed: %s not written (re-plot later with kvrl.apps.fidelity.replot)",
                    path.name)
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from kvrl.apps.outputs import atomic_write

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
    GPU machine had none): ``python -c "from kvrl.apps.fidelity import replot; replot('DIR')"``."""
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


# --------------------------------------------------------------------------------- report
def _fmt(v: Any) -> str:
    if isinstance(v, float):
        if not math.isfinite(v):
            return "n/a" if math.isnan(v) else ("inf" if v > 0 else "-inf")
        return f"{v:.4g}"
    return str(v)


def _pct(v: float) -> str:
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
            cells.append(f"{_fmt(lv)} / {_fmt(sv)} ({_pct(e)})")
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
            lines.append(f"| {w} | {p} | " + " | ".join(_pct(rel_err(a, b)) for _, a, b in pairs) + " |")
            csv_rows += [[w, p, f"{k}_live_again", a, b, rel_err(a, b)] for k, a, b in pairs]
    lines += mean_section(results)
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
              "live GC pauses: n, total s, max s |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for (w, p), r in results.items():
        rp, g = r.get("replay"), r.get("live_gc")
        if rp:
            gc_cell = f"{g['collections']}, {g['total_s']:.3f}, {g['max_s']:.3f}" if g else "n/a"
            lines.append(f"| {w} | {p} | {rp['steps']} | {rp['median_abs_rel_err']:.1%} | {rp['p90_abs_rel_err']:.1%} | "
                         f"{_pct(rp['total_rel_err'])} | {r.get('live_wall_s', 0):.1f} | {r.get('sim_wall_s', 0):.2f} | "
                         f"{gc_cell} |")
    lines += ["", "### Replay by step kind (total seconds over the run; host = the engine's time between steps)", "",
              "| workload | policy | kind | steps | live s | sim s | total rel err | median abs rel err |",
              "|---|---|---|---:|---:|---:|---:|---:|"]
    for (w, p), r in results.items():
        for kind, k in (r.get("replay") or {}).get("by_kind", {}).items():
            med = k["median_abs_rel_err"]
            lines.append(f"| {w} | {p} | {kind} | {k['steps']} | {k['live_s']:.3f} | {k['sim_s']:.3f} | "
                         f"{_pct(rel_err(k['live_s'], k['sim_s']))} | {'' if math.isnan(med) else f'{med:.1%}'} |")
    return "\n".join(lines), csv_rows


def live_mean_and_spread(r: dict, key: str) -> tuple[float, float]:
    """Mean of a metric over all live runs of a pair and their spread (largest absolute
    relative deviation of one run from that mean)."""
    vals = [m.get(key, float("nan")) for m in [r["live"], *r.get("live_repeats", [])]]
    mean = float(np.mean(vals))
    spread = max(abs(rel_err(mean, v)) for v in vals) if mean else float("nan")
    return mean, spread


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
            cells.append(f"{_fmt(mean)} / {_fmt(r['sim'].get(k))} ({_pct(e)}; [{spread:.1%}])")
        every += hits == len(TARGETS)
        lines.append(f"| {w} | {p} | " + " | ".join(cells) + " |")
    lines.append("")
    for k, bound in TARGETS.items():
        lines.append(f"- {labels[k]} against the live mean: {within[k]} of {len(done)} pairs within {bound:.0%}.")
    lines.append(f"- every target at once: {every} of {len(done)} pairs.")
    return lines


def write_report(results: dict, out_dir: Path, header: list[str], final: bool) -> str:
    """Write fidelity.md / .csv / .json for the pairs done so far; returns the Markdown."""
    from kvrl.apps.outputs import atomic_write

    if not final:
        header = header + ["", "**Partial: the run is still going (or was stopped).**"]
    table, csv_rows = render(results, header)
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(out_dir / "fidelity.md", lambda f: f.write(table + "\n"))
    atomic_write(out_dir / "fidelity.csv", lambda f: csv.writer(f).writerows(csv_rows))
    atomic_write(out_dir / "fidelity.json", lambda f: json.dump(
        {f"{w}/{p}": r for (w, p), r in results.items()}, f, indent=1, default=lambda x: None))
    return table


# --------------------------------------------------------------------------------- main
def load_config(model: str) -> dict:
    """``conf/fidelity.yaml`` composed with ``conf/model/<model>.yaml``, resolved, without Hydra's
    own section: the configuration kvrl-fidelity runs with by default (for scripts)."""
    import importlib.resources

    from omegaconf import OmegaConf

    conf = importlib.resources.files("kvrl.conf")
    cfg = OmegaConf.load(str(conf.joinpath("fidelity.yaml")))
    cfg.pop("hydra")
    cfg.pop("defaults")
    cfg["model"] = OmegaConf.load(str(conf.joinpath("model", f"{model}.yaml")))
    return OmegaConf.to_container(cfg, resolve=True)


def shared_engine(cfg: dict, live) -> dict:
    """The engine keys every workload shares (``cfg["engine"]``), with ``num_blocks: 0`` resolved
    once: the pool that fits the live GPU's free memory, or ``cpu_device_num_blocks`` on CPU."""
    base = dict(cfg["engine"])
    cpu_blocks = int(base.pop("cpu_device_num_blocks", 2048))
    if not base.get("num_blocks"):
        base["num_blocks"] = (live.kv_capacity_blocks(base.get("block_size", 16), base.get("gpu_memory_utilization", 0.9))
                              if live.device.type == "cuda" else cpu_blocks)
    return base


def workload_engine(base: dict, w: dict) -> dict:
    """A workload's engine configuration: ``base`` with the workload's ``engine`` overrides (its
    ``num_blocks: 0`` meaning the shared pool)."""
    ecfg = {**base, **(w.get("engine") or {})}
    if ecfg.get("num_blocks", 0) == 0:
        ecfg["num_blocks"] = base["num_blocks"]
    return ecfg


def workload_requests(w: dict, max_requests: Optional[int], vocab_size: int, max_model_len: int) -> list:
    """The requests of workload entry ``w``, capped at ``max_requests`` when given."""
    from kvrl.workloads import build_workload

    wl = dict(w["workload"])
    if max_requests:
        wl["max_requests"] = min(int(max_requests), int(wl.get("max_requests") or 1 << 30))
    return build_workload(wl, vocab_size=vocab_size, max_model_len=max_model_len)


def main_impl(cfg: dict, out_dir: Path) -> dict:
    import torch

    from kvrl import plugins
    from kvrl.profiling.timing import configure_cpu, device_name
    from kvrl.executors.live_build import build_live
    from kvrl.executors.sim import SimExecutor

    plugins.load_entry_points()
    seed = int(cfg.get("seed", 0))
    live = build_live(cfg["model"], cfg["live"], seed=seed, weights=cfg.get("weights", "memory"))
    configure_cpu(live.device.type, int(cfg.get("cpu_threads", 1)), bool(cfg.get("flush_denormal", True)))
    shape, dev = live.cost_model.model, live.cost_model.device
    graphs = bool(live.use_cuda_graphs)
    first = SimExecutor(shape, dev, seed, profile=cfg.get("profile", "auto"), cuda_graphs=graphs)
    spec = first.profile if first.profile is not None else "none"
    make_sim = lambda: SimExecutor(shape, dev, seed, profile=spec, cuda_graphs=graphs)
    live.cost_model = make_sim()          # cost-aware policies see the same estimates live and in sim
    slo = dict(cfg.get("slo") or {})

    base = shared_engine(cfg, live)
    workloads = dict(cfg["workloads"])
    policies = dict(cfg["policies"])
    only_w, only_p = cfg.get("only_workloads"), cfg.get("only_policies")
    if only_w:
        unknown = sorted(set(only_w) - set(workloads))
        if unknown:
            raise ValueError(f"unknown workload(s) {unknown}; known: {sorted(workloads)}")
        workloads = {k: workloads[k] for k in only_w}
    if only_p:
        unknown = sorted(set(only_p) - set(policies))
        if unknown:
            raise ValueError(f"unknown policy(ies) {unknown}; known: {sorted(policies)}")
        policies = {k: policies[k] for k in only_p}
    if len(policies) < 1 or len(workloads) < 1:
        raise ValueError("need at least one workload and one policy")

    results: dict[tuple[str, str], dict] = {}
    warmed: Optional[tuple] = None
    t_all = time.perf_counter()
    gpu = device_name(live)
    try:
        import triton
        tv = triton.__version__
    except Exception:
        tv = "n/a"

    def header_lines() -> list[str]:
        import platform
        return [f"# kvrl-fidelity: sim vs live on {gpu}", "",
                f"model {cfg['model'].get('name')} ({shape.num_layers} layers, hidden {shape.hidden_size}, {live.dtype}); "
                f"CUDA graphs {graphs}; sim cost model: {first.cost_source}"
                + (f" ({first.profile.describe()})" if first.profile is not None else "") + ".",
                f"torch {torch.__version__}, triton {tv}; host {platform.node()}; {time.perf_counter() - t_all:.0f} s so far.",
                f"SLO: TTFT {slo.get('ttft_s')} s, TPOT {slo.get('tpot_s')} s. Workloads: "
                + "; ".join(f"{k}: {v.get('doc', v['workload'].get('name'))}" for k, v in workloads.items()) + "."]
    for wname, w in workloads.items():
        ecfg = workload_engine(base, w)
        requests = workload_requests(w, cfg.get("max_requests"), live.vocab_size,
                                     ecfg.get("max_model_len") or live.max_model_len)
        key = (ecfg["num_blocks"], ecfg.get("num_cpu_blocks"), ecfg.get("swap_space_gb"), ecfg["block_size"])
        if key != warmed:
            warmup(live, ecfg, int(cfg.get("warmup_requests", 0)), seed)
            warmed = key
        for pname, pcfg in policies.items():
            title = f"{wname} / {pname}: {len(requests)} requests, {ecfg['num_blocks']} blocks ({device_name(live)})"
            log.info("running %s", title)
            out = out_dir / "runs" / wname / pname
            res = run_pair(live, make_sim, requests, ecfg, pcfg, slo, out, cfg.get("max_live_wall_s"),
                           bool(cfg.get("plots", True)), title, int(cfg.get("live_repeats", 1)))
            results[(wname, pname)] = res
            write_report(results, out_dir, header_lines(), final=False)   # partial results survive a timeout
            if "error" not in res:
                lm, sm = res["live"], res["sim"]
                log.info("  live %.0f tok/s, sim %.0f tok/s (%s); replay median err %s", lm["throughput_tok_s"],
                         sm["throughput_tok_s"], _pct(rel_err(lm["throughput_tok_s"], sm["throughput_tok_s"])),
                         f"{res.get('replay', {}).get('median_abs_rel_err', float('nan')):.1%}")

    table = write_report(results, out_dir, header_lines(), final=True)
    print(table)
    return results


try:
    import hydra
    from omegaconf import DictConfig, OmegaConf

    @hydra.main(config_path="pkg://kvrl.conf", config_name="fidelity", version_base="1.3")
    def main(cfg: DictConfig) -> None:
        from hydra.core.hydra_config import HydraConfig

        out_dir = Path(HydraConfig.get().runtime.output_dir)
        if cfg.get("resim"):
            from kvrl.apps.resim import resim_impl
            resim_impl(OmegaConf.to_container(cfg, resolve=True), out_dir)
        else:
            main_impl(OmegaConf.to_container(cfg, resolve=True), out_dir)
except ImportError:       # pragma: no cover
    def main() -> None:
        raise SystemExit("kvrl-fidelity needs hydra-core")


if __name__ == "__main__":
    main()
