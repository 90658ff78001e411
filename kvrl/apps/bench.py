"""``kvrl-bench``: end-to-end throughput of the live engine against Hugging Face transformers.

The workload of docs/design.md §11 (nano-vllm's benchmark): ``num_requests`` requests whose prompt and
output lengths are uniform in [``min_len``, ``max_len``], random prompt ids, seed 0, a random
Qwen3-0.6B-shaped bf16 checkpoint; all requests arrive at t=0; throughput = output tokens / wall
time. The same run measures transformers' continuous batching (``generate_batch`` machinery) and
static batching (``generate`` on the padded batch), and a device-to-device copy bandwidth from
which the memory-bandwidth floor of the workload is computed. Prints one table and writes
``bench.json`` and ``bench.md`` into the run directory.
"""
from __future__ import annotations

import json
import logging
import math
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import hydra
import numpy as np
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from kvrl.apps.live_schema import register_live_schemas, validate_bench
from kvrl.apps.outputs import atomic_write

log = logging.getLogger("kvrl.bench")


@dataclass
class BenchWorkload:
    prompts: list[np.ndarray]
    output_lens: list[int]

    @property
    def output_tokens(self) -> int:
        return int(sum(self.output_lens))


def make_workload(num_requests: int, min_len: int, max_len: int, seed: int, vocab: int = 10000) -> BenchWorkload:
    """nano-vllm's benchmark workload: lengths uniform in [min_len, max_len], ids in [0, vocab)."""
    rng = np.random.default_rng(seed)
    prompt_lens = rng.integers(min_len, max_len + 1, num_requests)
    output_lens = rng.integers(min_len, max_len + 1, num_requests)
    prompts = [rng.integers(0, vocab, int(n), dtype=np.int32) for n in prompt_lens]
    return BenchWorkload(prompts, [int(n) for n in output_lens])


def copy_bandwidth(device: torch.device, nbytes: int = 2 * 2**30) -> float:
    """Device-to-device copy bandwidth in B/s, counting bytes read plus written (median)."""
    import triton.testing

    n = nbytes // 2
    bufs = [torch.randn(n, dtype=torch.bfloat16, device=device) for _ in range(2)]
    dst = torch.empty_like(bufs[0])
    ms = triton.testing.do_bench(lambda: dst.copy_(bufs[0]), warmup=50, rep=300, return_mode="median")
    return 2 * nbytes / (ms * 1e-3)


def bandwidth_floor_s(wl: BenchWorkload, weight_bytes: int, kv_bytes_per_token: int, bw: float,
                      max_num_seqs: int) -> float:
    """Seconds to move the bytes decoding must move at least: the weights once per decode step and
    every sequence's K/V once per generated token, with up to ``max_num_seqs`` sequences sharing a
    step (all requests start at t=0, longest output first is the best packing for the bound)."""
    outs = sorted(wl.output_lens, reverse=True)
    steps = sum(outs[i] for i in range(0, len(outs), max_num_seqs))   # waves of max_num_seqs requests
    kv = sum(int(p.shape[0]) * o + o * (o - 1) // 2 for p, o in zip(wl.prompts, wl.output_lens))
    return (steps * weight_bytes + kv * kv_bytes_per_token) / bw


def timed(fn: Callable[[], int], device: torch.device) -> tuple[float, int]:
    torch.cuda.synchronize(device) if device.type == "cuda" else None
    start = time.perf_counter()
    tokens = fn()
    torch.cuda.synchronize(device) if device.type == "cuda" else None
    return time.perf_counter() - start, tokens


# ---------------------------------------------------------------------------------------- kvrl
def run_kvrl(cfg: DictConfig, checkpoint: str, wl: BenchWorkload) -> tuple[float, int, dict]:
    from kvrl.builder import build_engine, warm_up
    from kvrl.engine.engine import Engine
    from kvrl.engine.loop import collect_garbage
    from kvrl.engine.request import Request
    from kvrl.executors.live_build import build_live

    executor = build_live({"checkpoint": checkpoint},
                          {"device": cfg.torch_device, "dtype": cfg.dtype, "cuda_graphs": cfg.cuda_graphs,
                           "step_graphs": cfg.step_graphs})
    ecfg = dict(num_blocks=cfg.num_blocks, block_size=cfg.block_size, max_num_seqs=cfg.max_num_seqs,
                max_num_batched_tokens=cfg.max_num_batched_tokens,
                max_model_len=2 * cfg.max_len + 16, gpu_memory_utilization=cfg.gpu_memory_utilization)
    # compile kernels and capture the decode graphs for every batch size on the way down, with
    # prompts as long as the real ones (no kernel compiled inside the timed run); the timed
    # engines reuse the warmed pool and graphs (the pool size the warm-up resolved)
    ecfg["num_blocks"] = warm_up(executor, ecfg, cfg.max_num_seqs, seed=1, max_prompt_len=cfg.max_len).num_blocks

    def engine() -> Engine:
        return build_engine({"engine": ecfg, "scheduler": {"name": "fcfs"}, "watermark": {"name": "fixed"},
                             "eviction": {"name": "lifo"}, "prefix_cache": {"name": "none"}},
                            executor=executor, record_steps=False)

    reqs = [Request(f"b{i}", 0.0, p, o) for i, (p, o) in enumerate(zip(wl.prompts, wl.output_lens))]
    eng = engine()
    collect_garbage()        # the warm-up's garbage collected here, not by the timed run (loop._freeze_heap)
    if cfg.profile:
        import cProfile
        import pstats
        profiler = cProfile.Profile()
        profiler.enable()
    seconds, _ = timed(lambda: eng.run(reqs)["output_tokens"], executor.device)
    if cfg.profile:
        profiler.disable()
        with open(Path(HydraConfig.get().runtime.output_dir) / "profile.txt", "w") as f:
            pstats.Stats(profiler, stream=f).sort_stats("tottime").print_stats(40)
    summary = eng.metrics.summary()
    assert summary["finished"] == len(reqs), summary
    if cfg.trace_steps:
        trace_decode(engine(), reqs, cfg.trace_steps)
    info = {"num_blocks": eng.config.num_blocks, "preemptions": summary["preemptions"],
            "steps": eng.step_index}
    return seconds, summary["output_tokens"], info


def trace_decode(eng, reqs, steps: int) -> None:
    """Print where GPU time goes in ``steps`` engine steps taken once every request is admitted."""
    from torch.profiler import ProfilerActivity, profile

    for r in reqs:
        eng.submit(r)
    while eng.waiting or any(s.num_computed < s.prompt_len for s in eng.running):
        eng.step()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            eng.step()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25))


# ---------------------------------------------------------------------------------------- HF
def _hf_model(checkpoint: str, device: torch.device):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.bfloat16).to(device).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def run_hf_static(checkpoint: str, wl: BenchWorkload, device: torch.device) -> tuple[float, int]:
    """One padded batch through ``generate`` until the longest output; useful tokens counted."""
    model = _hf_model(checkpoint, device)
    width = max(p.shape[0] for p in wl.prompts)
    ids = torch.zeros((len(wl.prompts), width), dtype=torch.int64)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(wl.prompts):                 # left padding
        ids[i, width - p.shape[0]:] = torch.from_numpy(p.astype(np.int64))
        mask[i, width - p.shape[0]:] = 1
    ids, mask = ids.to(device), mask.to(device)
    with torch.inference_mode():
        model.generate(ids[:2, -16:], attention_mask=mask[:2, -16:], max_new_tokens=4, do_sample=False)  # warm-up
        seconds, _ = timed(lambda: model.generate(ids, attention_mask=mask, do_sample=False,
                                                  max_new_tokens=max(wl.output_lens)).shape[0], device)
    del model
    torch.cuda.empty_cache()
    return seconds, wl.output_tokens


def run_hf_continuous(checkpoint: str, wl: BenchWorkload, device: torch.device) -> tuple[float, int]:
    """transformers' continuous batching manager, one request per prompt with its own max_new_tokens."""
    from transformers import GenerationConfig

    model = _hf_model(checkpoint, device)
    gen_cfg = GenerationConfig(max_new_tokens=max(wl.output_lens), do_sample=False, eos_token_id=None,
                               pad_token_id=0)

    def go() -> int:
        produced = 0
        with model.continuous_batching_context_manager(generation_config=gen_cfg, block=True, timeout=5) as manager:
            for i, (p, o) in enumerate(zip(wl.prompts, wl.output_lens)):
                manager.add_request(p.tolist(), request_id=f"r{i}", max_new_tokens=o)
            done = 0
            while done < len(wl.prompts):
                result = manager.get_result(timeout=1)
                if result is not None and result.is_finished():
                    done += 1
                    produced += len(result.generated_tokens)
        return produced

    seconds, produced = timed(go, device)
    del model
    torch.cuda.empty_cache()
    return seconds, produced


# ---------------------------------------------------------------------------------------- table
def render(rows: list[dict], header: str) -> str:
    lines = [header, "", "| system | output tokens | wall s | output tok/s | vs transformers (best) | of bandwidth floor |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        ratio = f"{r['ratio']:.1f}x" if math.isfinite(r.get("ratio", math.nan)) else "n/a (transformers not run)"
        lines.append(f"| {r['system']} | {r['tokens']} | {r['seconds']:.2f} | {r['tok_s']:.0f} | "
                     f"{ratio} | {r['floor_frac']:.1%} |" if r.get("tok_s") else
                     f"| {r['system']} | - | - | {r.get('error', 'n/a')} | - | - |")
    return "\n".join(lines)


register_live_schemas()      # bench_schema in Hydra's ConfigStore before Hydra composes


@hydra.main(config_path="pkg://kvrl.conf", config_name="bench", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from kvrl.executors.live_build import random_checkpoint_for, resolve_device
    from kvrl.model import ModelConfig

    validate_bench(cfg)                     # every key checked before any model is built
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    device = resolve_device(cfg.torch_device)
    checkpoint = cfg.checkpoint or random_checkpoint_for(
        {"name": cfg.preset, "family": "qwen3"}, torch.bfloat16, root=cfg.checkpoint_root)
    mcfg = ModelConfig.from_pretrained(checkpoint)
    wl = make_workload(cfg.num_requests, cfg.min_len, cfg.max_len, cfg.seed, vocab=min(10000, mcfg.vocab_size))
    bw = copy_bandwidth(device) if device.type == "cuda" else float("nan")
    floor = bandwidth_floor_s(wl, mcfg.num_params() * 2, mcfg.kv_bytes_per_token(torch.bfloat16), bw,
                              cfg.max_num_seqs)
    results: list[dict] = []
    runners: dict[str, Callable[[], tuple]] = {
        "kvrl": lambda: run_kvrl(cfg, checkpoint, wl),
        "transformers (continuous batching)": lambda: run_hf_continuous(checkpoint, wl, device),
        "transformers (static batch)": lambda: run_hf_static(checkpoint, wl, device),
    }
    for name in cfg.systems:
        key = {"kvrl": "kvrl", "hf_cb": "transformers (continuous batching)",
               "hf_static": "transformers (static batch)"}[name]
        log.info("running %s", key)
        try:
            out = runners[key]()
            seconds, tokens = out[0], out[1]
            row = {"system": key, "seconds": seconds, "tokens": int(tokens), "tok_s": tokens / seconds}
            if len(out) > 2:
                row.update(out[2])
        except Exception as exc:   # report, don't lose the other systems' numbers
            log.exception("%s failed", key)
            row = {"system": key, "error": f"failed: {type(exc).__name__}: {exc}"[:200]}
        results.append(row)
    hf_best = max((r["tok_s"] for r in results if r.get("tok_s") and r["system"].startswith("transformers")),
                  default=float("nan"))
    for r in results:
        if r.get("tok_s"):
            r["ratio"] = r["tok_s"] / hf_best
            r["floor_frac"] = r["tok_s"] * floor / wl.output_tokens
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
    import transformers
    import triton
    header = (f"kvrl-bench on {gpu}: {cfg.num_requests} requests, lengths U[{cfg.min_len}, {cfg.max_len}], seed "
              f"{cfg.seed}, random {cfg.preset} bf16; copy bandwidth {bw / 1e12:.2f} TB/s; bandwidth floor "
              f"{floor:.1f} s = {wl.output_tokens / floor:.0f} tok/s. torch {torch.__version__}, triton "
              f"{triton.__version__}, transformers {transformers.__version__}.")
    table = render(results, header)
    print(table)
    atomic_write(out_dir / "bench.md", lambda f: f.write(table + "\n"))
    payload = {"results": results, "copy_bw_Bps": bw, "floor_s": floor, "output_tokens": wl.output_tokens,
               "config": OmegaConf.to_container(cfg, resolve=True), "device": gpu}
    atomic_write(out_dir / "bench.json", lambda f: json.dump(payload, f, indent=2, default=str))


if __name__ == "__main__":
    main()
