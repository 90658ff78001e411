"""Whole-step graphs against piecewise graphs on the same batches (kvrl.executors.step_graph).

For each batch shape, executes it through the whole-step graph and through the piecewise path
(the executor's step graphs set aside), alternating the two every repetition so that a slow window
of the host hits both alike, and reports the median wall time of ``execute`` per path, their ratio,
and the host time to issue one forward pass with the GPU parked (what a slow vCPU stretches). It
also compares the two paths' logits on each batch (the same kernels except for key splits), and
says which path the executor serves the batch by (long contexts that want key splits go piecewise).

    python benchmarks/step_graph_ab.py --model qwen3-0.6b --reps 30 --out step_graph_ab.md
"""
from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np
import torch
from omegaconf import OmegaConf

from kvrl.executors.live_build import build_live
from kvrl.profiling.batches import BatchFactory

#: (name, BatchFactory.batch keywords): mixed steps of serving, prefill-only steps, and the cases
#: where one key split costs the step graph most (a short query or few decodes over long contexts)
SHAPES = [
    ("prefill 177 + 1 decode @512", dict(decode_lens=[512], prefills=[(177, 0)])),
    ("prefill 64 + 32 decodes @1024", dict(decode_lens=[1024] * 32, prefills=[(64, 0)])),
    ("prefill 256 + 64 decodes @1024", dict(decode_lens=[1024] * 64, prefills=[(256, 0)])),
    ("prefill 512 + 128 decodes @768", dict(decode_lens=[768] * 128, prefills=[(512, 0)])),
    ("prefill 1024 + 64 decodes @2048", dict(decode_lens=[2048] * 64, prefills=[(1024, 0)])),
    ("3 prefills x 100 + 16 decodes @1500", dict(decode_lens=[1500] * 16, prefills=[(100, 0)] * 3)),
    ("prefill 512", dict(prefills=[(512, 0)])),
    ("prefill 2000", dict(prefills=[(2000, 0)])),
    ("prefill 64 over 4096 cached", dict(prefills=[(64, 4096)])),
    ("prefill 64 + 4 decodes @8192", dict(decode_lens=[8192] * 4, prefills=[(64, 0)])),
]


def issue_s(ex, batch) -> float:
    """Host seconds to issue one forward pass while the GPU is parked on a long kernel."""
    torch.cuda.synchronize()
    torch.cuda._sleep(100_000_000)
    t0 = time.perf_counter()
    with torch.inference_mode():
        ex._forward(batch)
    t = time.perf_counter() - t0
    torch.cuda.synchronize()
    return t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen3-0.6b")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--out", default="step_graph_ab.md")
    args = ap.parse_args()
    model = OmegaConf.to_container(OmegaConf.load(f"conf/model/{args.model}.yaml"), resolve=True)
    ex = build_live(model, {"device": "cuda", "dtype": "auto", "cuda_graphs": True, "step_graphs": True})
    ex.allocate_kv(4096, 0, 16)
    factory = BatchFactory(4096, 16, ex.vocab_size, 12000)
    steps = ex._step_graphs
    lines = [f"# Whole-step vs piecewise graphs: {args.model} on {torch.cuda.get_device_name()}", "",
             f"torch {torch.__version__}; step graphs: {len(steps.sizes)} token sizes up to {steps.sizes[-1]}, "
             f"captured in {steps.capture_s:.1f} s; piecewise captured in {ex._piecewise.capture_s:.1f} s; "
             f"{args.reps} alternating repetitions per path", "",
             "| batch | step graph ms | piecewise ms | piecewise / step | issue ms: step / piecewise "
             "| logits max abs diff | argmax equal | served by |", "|---|---:|---:|---:|---:|---:|---:|---|"]
    for name, spec in SHAPES:
        batch = factory.batch(**spec)
        order = [s for s in batch.seqs if not s.is_decode] + [s for s in batch.seqs if s.is_decode]
        n_pre = sum(not s.is_decode for s in batch.seqs)
        served = "step graph" if steps.bucket(order, n_pre) else "piecewise"   # what the executor does
        rule, steps.rule = steps.rule, dataclasses.replace(steps.rule, split_context=1 << 30)   # time the step graph even where it is not used
        if steps.bucket(order, n_pre) is None:
            steps.rule = rule
            lines.append(f"| {name} | (too large for a step graph) | | | | | | |")
            continue
        times = {"step": [], "piecewise": []}
        issues = {"step": [], "piecewise": []}
        logits = {}
        for r in range(args.reps + 3):
            for path in ("step", "piecewise"):
                ex._step_graphs = steps if path == "step" else None
                t0 = time.perf_counter()
                ex.execute(batch)
                if r >= 3:
                    times[path].append(time.perf_counter() - t0)
                if r == 3:
                    issues[path].append(issue_s(ex, batch))
                    with torch.inference_mode():
                        logits[path] = ex._forward(batch)[0].float().clone()
        ex._step_graphs = steps
        steps.rule = rule
        a, b = logits["step"], logits["piecewise"]
        ms = {k: float(np.median(v)) * 1e3 for k, v in times.items()}
        lines.append(f"| {name} | {ms['step']:.2f} | {ms['piecewise']:.2f} | {ms['piecewise'] / ms['step']:.2f} "
                     f"| {issues['step'][0] * 1e3:.2f} / {issues['piecewise'][0] * 1e3:.2f} "
                     f"| {float((a - b).abs().max()):.3g} | {int((a.argmax(-1) == b.argmax(-1)).sum())}/{a.shape[0]} | {served} |")
        print(lines[-1], flush=True)
    open(args.out, "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
