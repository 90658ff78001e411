"""Greedy output of the live engine on a GPU against Hugging Face transformers, token for token.

Scenarios: plain batch, preemption by swap, preemption by recompute, prefix-cache hits, n=2
copy-on-write forks, and tier reloads: the shared-prefix prompts served twice, with fillers between
the rounds that push their cached blocks out of a small GPU pool into a CPU tier (or through a small
CPU tier onto a disk tier), so that the second round's prefix hits are reloaded from the tier; a tier
scenario that reloads nothing fails. In fp32 every token must match. In bf16, a divergence is
*explained by a tie* when, at the first differing position, transformers' own top-2 logits are within ``tie_tol`` of
each other (bf16 rounding differences between two correct implementations then flip argmax);
those are counted and reported, any other divergence fails the run.

    python benchmarks/gpu_exactness.py --preset qwen3-0.6b --dtype bfloat16 --out exactness.md
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time

import numpy as np
import torch
import transformers

from kvrl.builder import build_engine
from kvrl.engine.request import Request
from kvrl.executors.live_build import random_checkpoint_for
from kvrl.executors.live_build import build_live


def hf_reference(path, prompts, max_new, dtype, device):
    """Greedy continuation and per-step top-2 logit gaps of each prompt (one prompt at a time)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    model.generation_config.eos_token_id = None
    outs, gaps = [], []
    for p in prompts:
        ids = torch.tensor([p.tolist()], device=device)
        with torch.inference_mode():
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new,
                                 pad_token_id=0, output_scores=True, return_dict_in_generate=True)
        outs.append(gen.sequences[0, len(p):].tolist())
        top2 = torch.stack([s[0].float().topk(2).values for s in gen.scores])
        gaps.append((top2[:, 0] - top2[:, 1]).tolist())
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return outs, gaps


def engine_for(executor, num_blocks, num_cpu_blocks, mode, prefix_cache, block_size=16, tier=None,
               max_model_len=4096, max_num_batched_tokens=2048, **tiers):
    """An fcfs / fixed 0 / lifo engine; ``tier`` (a tier plugin name) with ``tiers``: the
    :class:`~kvrl.engine.config.EngineConfig` tier fields (``cpu_tier_blocks``, ``disk_tier_*``)."""
    cfg = dict(num_blocks=num_blocks, block_size=block_size, num_cpu_blocks=num_cpu_blocks,
               max_model_len=max_model_len, max_num_batched_tokens=max_num_batched_tokens, **tiers)
    return build_engine({"engine": cfg, "scheduler": {"name": "fcfs"}, "watermark": {"name": "fixed", "fraction": 0.0},
                         "eviction": {"name": "lifo", "mode": mode}, "prefix_cache": {"name": prefix_cache},
                         "tier": {"name": tier or "none"}},
                        executor=executor)


def tier_round_trip(shared, plain, want_shared, want_plain, gaps_shared, gaps_plain):
    """The tier scenarios' requests: ``shared`` at t=0, ``plain`` as fillers at t=1 s, ``shared``
    again at t=10 s (the engine's clock jumps over idle time), with their references and gaps."""
    prompts = [*shared, *plain, *shared]
    arrivals = [0.0] * len(shared) + [1.0] * len(plain) + [10.0] * len(shared)
    return prompts, arrivals, [*want_shared, *want_plain, *want_shared], [*gaps_shared, *gaps_plain, *gaps_shared]


def compare(got, want, gaps, tie_tol):
    """(exact, tie_explained, unexplained) for one output."""
    for t, (a, b) in enumerate(zip(got, want)):
        if a != b:
            return (0, 1, 0) if gaps[t] <= tie_tol else (0, 0, 1)
    return (1, 0, 0) if len(got) == len(want) else (0, 0, 1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="qwen3-0.6b")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--num-prompts", type=int, default=24)
    ap.add_argument("--max-new", type=int, default=48)
    ap.add_argument("--num-long", type=int, default=4, help="prompts of 4,300-5,200 tokens (the last scenario)")
    ap.add_argument("--tie-tol", type=float, default=0.0625, help="logit gap below which bf16 may flip argmax")
    ap.add_argument("--out", default=None)
    ap.add_argument("--step-graphs", action="store_true", help="whole-step graphs (backend.step_graphs=true)")
    ap.add_argument("--device", default="cuda", help="cpu: the torch reference path (a smoke run; slow)")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    path = random_checkpoint_for({"name": args.preset, "family": "qwen3"}, dtype, root="runs/.checkpoints")
    rng = np.random.default_rng(0)
    system = rng.integers(0, 10000, 200, dtype=np.int32)
    plain = [rng.integers(0, 10000, int(n), dtype=np.int32) for n in rng.integers(20, 400, args.num_prompts)]
    shared = [np.concatenate([system, rng.integers(0, 10000, int(n), dtype=np.int32)])
              for n in rng.integers(1, 60, args.num_prompts // 2)]
    # a few prompts past 4,096 tokens at t=0, the plain ones behind them; a 256-token budget, so the plain
    # prompts' chunks run beside the long ones' decodes as small steps (whole-step graphs with decode key splits)
    long_ctx = [rng.integers(0, 10000, int(n), dtype=np.int32) for n in rng.integers(4300, 5200, args.num_long)]
    t0 = time.time()
    want_all, gaps_all = hf_reference(path, [*plain, *shared, *long_ctx], args.max_new, dtype, device)   # one load
    hf_s = time.time() - t0
    a, b = len(plain), len(plain) + len(shared)
    want_plain, want_shared, want_long = want_all[:a], want_all[a:b], want_all[b:]
    gaps_plain, gaps_shared, gaps_long = gaps_all[:a], gaps_all[a:b], gaps_all[b:]
    executor = build_live({"checkpoint": path}, {"device": str(device), "dtype": args.dtype,
                                                 "step_graphs": args.step_graphs})
    need = sum(-(-(len(p) + args.max_new) // 16) for p in plain)
    tier_prompts, tier_arrivals, tier_want, tier_gaps = tier_round_trip(shared, plain, want_shared, want_plain,
                                                                        gaps_shared, gaps_plain)
    disk_dir = tempfile.TemporaryDirectory(prefix="kvrl-exactness-disk-")
    burst, staggered = None, [0.002 * i for i in range(len(shared))]     # None: every request at t=0
    beside_long = [0.0] * len(long_ctx) + [0.005 * i for i in range(len(plain))]
    need_long = sum(-(-(len(p) + args.max_new) // 16) for p in [*long_ctx, *plain])
    scenarios = [   # name, prompts, their references and gaps, arrivals, engine, n
        ("plain batch", plain, want_plain, gaps_plain, burst,
         dict(num_blocks=need + 64, num_cpu_blocks=0, mode="recompute", prefix_cache="none"), 1),
        ("preemption by swap", plain, want_plain, gaps_plain, burst,
         dict(num_blocks=need // 3, num_cpu_blocks=need, mode="swap", prefix_cache="none"), 1),
        ("preemption by recompute", plain, want_plain, gaps_plain, burst,
         dict(num_blocks=need // 3, num_cpu_blocks=0, mode="recompute", prefix_cache="none"), 1),
        ("prefix-cache hits", shared, want_shared, gaps_shared, staggered,
         dict(num_blocks=need, num_cpu_blocks=0, mode="recompute", prefix_cache="hash_lru"), 1),
        ("n=2 copy-on-write forks", plain, want_plain, gaps_plain, burst,
         dict(num_blocks=2 * need, num_cpu_blocks=0, mode="recompute", prefix_cache="none"), 2),
        ("tier reloads (CPU tier)", tier_prompts, tier_want, tier_gaps, tier_arrivals,
         dict(num_blocks=need // 3, num_cpu_blocks=0, mode="recompute", prefix_cache="hash_lru", tier="offload_all",
              cpu_tier_blocks=need), 1),
        ("tier reloads (CPU and disk tiers)", tier_prompts, tier_want, tier_gaps, tier_arrivals,
         dict(num_blocks=need // 3, num_cpu_blocks=0, mode="recompute", prefix_cache="hash_lru", tier="offload_all",
              cpu_tier_blocks=16, disk_tier_blocks=need, disk_tier_dir=disk_dir.name), 1),
        ("prefills beside decodes past 4,096 tokens", [*long_ctx, *plain], [*want_long, *want_plain],
         [*gaps_long, *gaps_plain], beside_long,
         dict(num_blocks=need_long + 64, num_cpu_blocks=0, mode="recompute", prefix_cache="none", max_model_len=8192,
              max_num_batched_tokens=256), 1),
    ]
    rows, failed = [], False
    for name, prompts, want, gaps, arrivals, kw, n in scenarios:
        eng = engine_for(executor, **kw)
        step_graphs = executor._step_graphs     # built with this engine's KV pool (None: no whole-step graphs)
        split_before = step_graphs.split_steps if step_graphs else 0
        arrivals = arrivals or [0.0] * len(prompts)
        reqs = [Request(f"{i}", a, p, args.max_new, n=n) for i, (p, a) in enumerate(zip(prompts, arrivals))]
        summary = eng.run(reqs)
        counts = np.zeros(3, dtype=int)
        for r, w, g in zip(reqs, want, gaps):
            for got in eng.outputs(r.request_id):
                counts += compare(got, w, g, args.tie_tol if dtype != torch.float32 else -1.0)
        failed |= counts[2] > 0 or summary["finished"] != len(reqs)
        reloaded = summary.get("tier_loaded_blocks", 0)
        failed |= "tier" in kw and not reloaded      # a tier scenario must reload something
        split = step_graphs.split_steps - split_before if step_graphs else 0
        long_contexts = kw.get("max_model_len", 4096) > step_graphs.rule.split_context if step_graphs else False
        failed |= bool(long_contexts and step_graphs.split_sizes and not split)   # it must take the split graphs
        rows.append((name, int(counts.sum()), *counts.tolist(), summary["preemptions"], summary["swapped_out_blocks"],
                     summary["recomputed_tokens"], round(summary["prefix_hit_rate"], 3), reloaded,
                     summary.get("tier_disk_loaded_blocks", 0), split))
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    lines = [f"Exactness on {device_name}: {args.preset} random weights, {args.dtype}, "
             f"{args.num_prompts} prompts x {args.max_new} greedy tokens; tie tolerance {args.tie_tol} "
             f"(HF reference took {hf_s:.0f} s). torch {torch.__version__}, transformers {transformers.__version__}.",
             "", "| scenario | outputs | exact | diverged at a bf16 tie | diverged otherwise | preemptions | "
             "swapped-out blocks | recomputed tokens | prefix hit rate | tier-loaded blocks | of them from disk | "
             "steps on a split whole-step graph |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    lines += ["| " + " | ".join(str(x) for x in row) + " |" for row in rows]
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
