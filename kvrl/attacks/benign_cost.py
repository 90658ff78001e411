"""``kvrl-attack benign-cost``: what each defence costs on a workload without an attacker
(goodput, throughput, p99 TTFT and preemptions relative to the undefended engine).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from kvrl.attacks.common import cost_note, fmt, plain, serve, write_result
from kvrl.attacks.config import policy_label, preset_config, selected_defences, with_policy


def run_benign_cost(cfg: Any, out_dir: Path) -> dict:
    """Every defence on a workload without an attacker, relative to the baseline defence."""
    from kvrl.builder import build_executor
    from kvrl.workloads import build_workload

    opts = cfg.attack
    cfg = preset_config(cfg, "benign_cost")
    wl = plain(cfg.workload)
    executor = build_executor(cfg)
    requests = build_workload(wl, vocab_size=executor.vocab_size,
                              max_model_len=cfg.engine.max_model_len or executor.max_model_len)
    rows = []
    for name, overrides in selected_defences(cfg).items():
        run_cfg = with_policy(cfg, overrides)
        engine, wall = serve(run_cfg, requests, executor)
        s = engine.metrics.summary()
        recs = list(engine.metrics.requests.values())
        per_tenant = {}
        for t in sorted({r.tenant for r in recs}):
            tt = [r.ttft_s for r in recs if r.tenant == t and r.ttft_s is not None]
            per_tenant[t] = float(np.percentile(tt, 99)) if tt else float("nan")
        rows.append({"defence": name, "policies": policy_label(run_cfg), "wall_s": wall,
                     "ttft_p99_by_tenant_s": per_tenant,
                     **{k: s[k] for k in ("finished", "aborted", "rejected", "goodput_tok_s", "throughput_tok_s",
                                          "slo_attainment", "ttft_p99_s", "tpot_p99_s", "preemptions",
                                          "policy_errors")},
                     "max_preemptions": max((r.num_preemptions for r in recs), default=0)})
    ref = next(r for r in rows if r["defence"] == opts.baseline)
    for r in rows:
        r["goodput_vs_baseline"] = r["goodput_tok_s"] / ref["goodput_tok_s"] - 1 if ref["goodput_tok_s"] else float("nan")
        r["throughput_vs_baseline"] = (r["throughput_tok_s"] / ref["throughput_tok_s"] - 1
                                       if ref["throughput_tok_s"] else float("nan"))
    result = {"command": "benign_cost", "backend": cfg.backend.name, "model": cfg.model.name,
              "cost_model": getattr(executor, "cost_source", executor.name),
              "device": cfg.device.name, "engine": plain(cfg.engine), "slo": plain(cfg.slo), "workload": wl,
              "baseline": opts.baseline, "rows": rows}
    write_result(out_dir, "benign_cost", result, benign_cost_markdown(result))
    return result


def benign_cost_markdown(result: dict) -> str:
    wl, eng = result["workload"], result["engine"]
    device = f"{result['device']}, " if result["backend"] == "sim" else ""
    lines = [f"Benign cost ({result['backend']}, {result['model']}, {device}workload {wl['name']}, "
             f"{eng['num_blocks']} blocks of {eng['block_size']}): change relative to `{result['baseline']}`.", "",
             "| defence | watermark / eviction | goodput (tok/s) | vs baseline | throughput (tok/s) | vs baseline | "
             "SLO attainment | TTFT p99 (s) | TTFT p99 by tenant (s) | preemptions (max per request) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        by_tenant = ", ".join(f"{t} {fmt(v, 2)}" for t, v in r["ttft_p99_by_tenant_s"].items())
        lines.append(f"| {r['defence']} | `{r['policies']}` | {r['goodput_tok_s']:.0f} | "
                     f"{100 * r['goodput_vs_baseline']:+.1f}% | {r['throughput_tok_s']:.0f} | "
                     f"{100 * r['throughput_vs_baseline']:+.1f}% | {r['slo_attainment']:.3f} | "
                     f"{fmt(r['ttft_p99_s'])} | {by_tenant} | {r['preemptions']} ({r['max_preemptions']}) |")
    return "\n".join(lines) + cost_note(result)
