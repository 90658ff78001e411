"""Serving with and without the split whole-step graphs, on one GPU, in one process (paired A/B).

A small prefill chunk beside decodes past 4,096 tokens wants key splits; it used to run piecewise,
and now runs on a whole-step graph whose decodes split their keys (kvrl.executors.step_graph). This
serves fidelity workloads that make such steps (default: ``tenants_pressure``, whose ``batch`` tenant
sends 2k-8k prompts, and ``blind_long_ctx``) with one live executor, switching the split graphs off
and on between runs (on: the executor's default; off: such steps run piecewise, as before), in
alternating order (off, on, on, off, ...), so both meet the same machine state. ``--off eager``
compares the executor's rule with session 38's instead (off: split graphs only where the eager path
splits, ``StepRule.split_where_pays`` false; on: also where few decodes read long contexts). Per run: wall
seconds, output tokens per second, mean TPOT and the steps the split graphs served.

    python benchmarks/split_graph_ab.py [--model qwen3-0.6b] [--rounds 3] [--off none|eager] [--out ab.json]   # GPU
    python benchmarks/split_graph_ab.py --table ab.json                                  # CPU: a Markdown table
    python benchmarks/split_graph_ab.py --model tiny --max-requests 6 --rounds 2         # CPU smoke run (no split steps)
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path


def _paired(ratio) -> str:
    """Mean of per-round ratios with its range and, from 3 rounds, the 95% interval (Student t)."""
    from kvrl.analysis.stats import mean_ci

    mean, half = mean_ci(ratio)
    return f"{mean:.3f} ({ratio.min():.3f}-{ratio.max():.3f})" + (f" ± {half:.3f}" if len(ratio) >= 3 else "")


def table(path: Path) -> str:
    """Per workload and policy: each side's mean throughput and TPOT over its runs, and the paired
    ratios (on / off, per round): mean (range) ± the 95% interval's half-width."""
    import numpy as np

    d = json.loads(path.read_text())
    off = {"none": "", "eager": "; off = split graphs only where the eager path splits (session 38's rule)"}[d.get("off", "none")]
    lines = [f"{d['model']}, {d['device']}, {d['rounds']} rounds (off and on in alternating order{off})", "",
             "| workload | policy | off: tok/s | on: tok/s | on / off, paired (min-max) ± 95% | off: TPOT mean ms | "
             "on: TPOT mean ms | on / off, paired (min-max) ± 95% | steps on split graphs (on) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for key in dict.fromkeys((r["workload"], r["policy"]) for r in d["runs"]):
        runs = [r for r in d["runs"] if (r["workload"], r["policy"]) == key]
        side = {s: [r for r in runs if r["split"] == s] for s in (False, True)}
        tput = {s: np.array([r["tok_s"] for r in sorted(side[s], key=lambda r: r["round"])]) for s in side}
        ratio = tput[True] / tput[False]
        tpot = {s: np.array([1e3 * r["tpot_mean_s"] for r in sorted(side[s], key=lambda r: r["round"])]) for s in side}
        tpot_ratio = tpot[True] / tpot[False]
        lines.append(f"| {key[0]} | {key[1]} | {tput[False].mean():,.0f} | {tput[True].mean():,.0f} | "
                     f"{_paired(ratio)} | {tpot[False].mean():.2f} | {tpot[True].mean():.2f} | {_paired(tpot_ratio)} | "
                     f"{np.mean([r['split_steps'] for r in side[True]]):,.0f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen3-0.6b")
    ap.add_argument("--workloads", default="tenants_pressure,blind_long_ctx")
    ap.add_argument("--policies", default="vllm,sjf_swap")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--off", choices=("none", "eager"), default="none",
                    help="the off side: no split graphs, or split graphs only where the eager path splits")
    ap.add_argument("--max-requests", type=int, default=None, help="serve only the first N of each workload")
    ap.add_argument("--out", default="")
    ap.add_argument("--table", type=Path, default=None, help="print a committed run's table (CPU) and stop")
    args = ap.parse_args()
    if args.table:
        print(table(args.table))
        return

    import torch

    from kvrl.apps.live_schema import compose_fidelity
    from kvrl.builder import warm_up
    from kvrl.engine.loop import ServingLoop
    from kvrl.executors.live_build import build_live
    from kvrl.fidelity.compare import summarize
    from kvrl.fidelity.pairs import pair_engine, shared_engine, workload_engine, workload_requests

    cfg = compose_fidelity([f"model={args.model}"] + ([f"max_requests={args.max_requests}"] if args.max_requests else []))
    live = build_live(cfg["model"], cfg["live"])
    base = shared_engine(cfg, live)
    workloads = {w: cfg["workloads"][w] for w in args.workloads.split(",")}
    policies = {p: cfg["policies"][p] for p in args.policies.split(",")}
    runs = []
    for wname, w in workloads.items():
        ecfg = workload_engine(base, w)
        warm_up(live, ecfg, cfg["warmup_requests"], seed=101)
        graphs = live._step_graphs           # built with the KV pool, for this workload's pool
        if graphs is None or not graphs.split_sizes:
            raise SystemExit("this executor has no split whole-step graphs (backend.step_graphs on, on CUDA)")
        rule = graphs.rule
        off_rule = dataclasses.replace(rule, **({"split_decodes": 0} if args.off == "none" else {"split_where_pays": False}))
        requests = workload_requests(w, cfg["max_requests"], live.vocab_size,
                                     ecfg.get("max_model_len") or live.max_model_len)
        for pname, pcfg in policies.items():
            for rnd in range(args.rounds):
                for split in ((False, True) if rnd % 2 == 0 else (True, False)):
                    graphs.rule = rule if split else off_rule   # off: bucket() sends such steps piecewise (or plain)
                    before = graphs.split_steps
                    eng = pair_engine(ecfg, live, pcfg, cfg["slo"], record_steps=False)
                    wall = time.perf_counter()
                    ServingLoop(eng, requests).run([])
                    wall = time.perf_counter() - wall
                    m = summarize(eng)
                    row = dict(workload=wname, policy=pname, round=rnd, split=split, wall_s=wall,
                               tok_s=m["throughput_tok_s"], tpot_mean_s=m["tpot_mean_s"],
                               split_steps=graphs.split_steps - before, finished=m["finished"])
                    runs.append(row)
                    print(json.dumps(row), flush=True)
        graphs.rule = rule
    device = torch.cuda.get_device_name(live.device) if live.device.type == "cuda" else "CPU"
    result = {"model": args.model, "device": device, "rounds": args.rounds, "off": args.off,
              "torch": torch.__version__, "runs": runs}
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
