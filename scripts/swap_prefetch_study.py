"""The CPEN 511 swap-in prefetching question on kvrl's own swap traces (issue #20, docs/tiers.md).

1. ``traces``: swap-heavy sim workloads (swap preemption, a small pool) run with
   :class:`~kvrl.analysis.swap_trace.SwapTraceRecorder`; one CSV per (workload, seed).
2. ``predict``: the MLP and LSTM predictors of the next swapped-in sequence
   (:mod:`kvrl.analysis.swap_predict`: regression of its id, classification of its swap-out
   event in the history window) trained on the first seeds' traces and tested on the last's,
   for each history window; beside them the FIFO rule (the engine's own swap-in order) and LIFO.
3. ``plugin``: the proactive swap-in watermark (``watermark=swap_prefetch``, kvrl.plugins.swap_prefetch)
   with the FIFO rule, the LIFO rule and the MLP classifier (window ``--model-window``, trained on
   the ``--seeds`` traces, saved as TorchScript) against the fixed watermark it extends, paired
   over ``--plugin-seeds`` (other seeds than the training traces') with 95% CIs (kvrl.analysis.stats).

    python scripts/swap_prefetch_study.py --out runs/swap_prefetch [--seeds 0 1 2 3 4] [--windows 1 2 4 8 16]

Writes ``traces/*.csv``, ``predictors.md``/``.json`` and ``plugin.md``/``.json`` under ``--out``.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Optional

WORKLOADS = {
    # long lognormal answers at a rate the pool cannot hold: many swap preemptions
    "long_outputs": {"name": "synthetic", "num_requests": 300, "arrival": {"rate": 12.0},
                     "prompt_len": {"dist": "uniform", "low": 64, "high": 512},
                     "output_len": {"dist": "lognormal", "mean": 384.0, "cv": 1.0}},
    # bursty (gamma cv 4) arrivals of the same
    "bursty": {"name": "synthetic", "num_requests": 300, "arrival": {"process": "gamma", "rate": 6.0, "cv": 4.0},
               "prompt_len": {"dist": "uniform", "low": 64, "high": 512},
               "output_len": {"dist": "lognormal", "mean": 384.0, "cv": 1.0}},
}
ENGINE = {"num_blocks": 384, "block_size": 16, "num_cpu_blocks": 4096}


def build_engine(seed: int, eviction: str = "lifo", watermark: str = "fixed", **wm_params):
    from kvrl.builder import build_engine
    from kvrl.executors.hardware import DEVICES, MODEL_SHAPES
    from kvrl.executors.sim import SimExecutor
    ex = SimExecutor(MODEL_SHAPES["qwen3-0.6b"], DEVICES["h200"], seed=seed, profile="auto")
    return build_engine({"engine": {**ENGINE, "seed": seed, "prefix_hash_key": "seed"}, "scheduler": {"name": "fcfs"},
                         "watermark": {"name": watermark, **wm_params}, "eviction": {"name": eviction, "mode": "swap"},
                         "prefix_cache": {"name": "hash_lru"}}, executor=ex)


def requests(name: str, seed: int, engine):
    from kvrl.workloads import build_workload
    return list(build_workload({**WORKLOADS[name], "seed": seed}, vocab_size=engine.executor.vocab_size,
                               max_model_len=engine.config.max_model_len))


def run_traces(out: Path, seeds: list[int]) -> dict:
    from kvrl.analysis.swap_trace import SwapTraceRecorder, summary
    (out / "traces").mkdir(parents=True, exist_ok=True)
    info = {}
    for name in WORKLOADS:
        for seed in seeds:
            engine = build_engine(seed)
            rec = SwapTraceRecorder()
            s = engine.run(requests(name, seed, engine), callbacks=[rec])
            rec.write_csv(out / "traces" / f"{name}-{seed}.csv")
            info[f"{name}-{seed}"] = {**summary(rec.events), "preemptions": s["preemptions"], "finished": s["finished"]}
            print(f"trace {name} seed {seed}: {info[f'{name}-{seed}']}", flush=True)
    return info


def train_model(trace_dir: Path, workloads, seeds, window: int, path: Path) -> None:
    """The MLP classifier of kvrl.analysis.swap_predict at ``window``, trained on every workload's
    traces of ``seeds``, saved as TorchScript for ``watermark=swap_prefetch predictor=model``."""
    import torch
    from kvrl.analysis.swap_predict import _samples, fit
    train = _samples([trace_dir / f"{name}-{s}.csv" for name in workloads for s in seeds], window)
    torch.jit.script(fit("mlp", "classification", train)).save(str(path))


def plugin_study(build_engine, make_requests, workloads, seeds, fraction: float = 0.1,
                 model_path: Optional[Path] = None, window: int = 8) -> tuple[str, list[dict]]:
    """``swap_prefetch`` (fifo, lifo, and the learned model when ``model_path``) and ``fixed`` at
    ``fraction`` against ``fixed`` at the same fraction on every workload, paired over ``seeds``:
    TTFT p50/p99, TPOT p99, throughput and preemptions, with 95% CIs and verdicts
    (:func:`kvrl.analysis.stats.paired_compare`). Returns (markdown, rows)."""
    from kvrl.analysis.stats import paired_compare
    settings = {"fixed": ("fixed", {"fraction": fraction}),
                "swap_prefetch fifo": ("swap_prefetch", {"fraction": fraction, "predictor": "fifo"}),
                "swap_prefetch lifo": ("swap_prefetch", {"fraction": fraction, "predictor": "lifo"})}
    if model_path is not None:
        settings["swap_prefetch model"] = ("swap_prefetch", {"fraction": fraction, "predictor": "model",
                                                             "model_path": str(model_path), "window": window})
    metrics = ("ttft_p50_s", "ttft_p99_s", "tpot_p99_s", "throughput_tok_s", "preemptions")
    rows, lines = [], []
    for name in workloads:
        results = {s: {} for s in settings}
        for seed in seeds:
            for setting, (plugin, params) in settings.items():
                engine = build_engine(seed, watermark=plugin, **params)
                results[setting][seed] = engine.run(make_requests(name, seed, engine))
        lines += [f"**{name}** (fraction {fraction}, seeds {list(seeds)}; mean of fixed, then each setting's paired "
                  f"difference with its 95% CI, % change, p and verdict)", "",
                  "| setting | " + " | ".join(metrics) + " |", "|---|" + "---|" * len(metrics)]
        base = results["fixed"]
        lines.append("| fixed (mean) | " + " | ".join(
            f"{sum(base[s][m] for s in seeds) / len(seeds):.4g}" for m in metrics) + " |")
        for setting in list(settings)[1:]:
            cells = []
            for m in metrics:
                c = paired_compare({s: results[setting][s][m] for s in seeds}, {s: base[s][m] for s in seeds}, m)
                rows.append({"workload": name, "setting": setting, "metric": m, "delta": c.delta, "ci": c.delta_ci,
                             "pct": c.pct_change, "p": c.p_value, "verdict": c.verdict, "n": c.n})
                cells.append(f"{c.delta:+.3g} ± {c.delta_ci:.2g} ({c.pct_change:+.1f}%, p {c.p_value:.2g}, {c.verdict})")
            lines.append(f"| {setting} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines), rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--windows", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--stages", nargs="+", default=["traces", "predict", "plugin"])
    parser.add_argument("--plugin-seeds", type=int, nargs="+", default=[5, 6, 7, 8, 9],
                        help="seeds of the plugin comparison (the learned model is trained on --seeds' traces)")
    parser.add_argument("--model-window", type=int, default=8)
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    if "traces" in args.stages:
        info = run_traces(out, args.seeds)
        (out / "traces.json").write_text(json.dumps(info, indent=1))
    if "predict" in args.stages:
        from kvrl.analysis.swap_predict import accuracy_table, render
        rows = accuracy_table(out / "traces", list(WORKLOADS), args.seeds, args.windows)
        (out / "predictors.json").write_text(json.dumps(rows, indent=1))
        (out / "predictors.md").write_text(render(rows) + "\n")
        print(render(rows))
    if "plugin" in args.stages:
        model = out / f"mlp_w{args.model_window}.pt"
        train_model(out / "traces", list(WORKLOADS), args.seeds, args.model_window, model)
        text, rows = plugin_study(build_engine, requests, list(WORKLOADS), args.plugin_seeds, model_path=model,
                                  window=args.model_window)
        (out / "plugin.json").write_text(json.dumps(rows, indent=1))
        (out / "plugin.md").write_text(text + "\n")
        print(text)
    print(f"done in {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
