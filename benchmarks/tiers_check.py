"""CUDA check of the KV tiers' block operations (issue #20), seconds on one GPU:

1. KV round trip: blocks offloaded to the pinned tier and loaded back into other GPU blocks equal
   the originals bit for bit (the swap-stream path of ``LiveExecutor._tier_ops``);
2. disk round trip: pinned tier blocks written to block files and read back into other tier
   blocks (one through a read-ahead staging buffer), then loaded to the GPU, equal the originals
   (``TieredAllocator._move_disk``);
3. greedy tokens on a tiny random fp32 model are identical without tiers, with a CPU tier, and
   with a small CPU tier over a disk tier, without and with disk read-ahead
   (``kvrl.engine.tier_read_ahead``), while the tiers serve reloads (the same requests).

    python benchmarks/tiers_check.py [cpu|cuda] [disk dir]   # one JSON line; exit 1 on a mismatch
"""
from __future__ import annotations

import json
import sys
import tempfile

import numpy as np
import torch

from kvrl.builder import build_engine
from kvrl.engine.batch import ScheduledBatch
from kvrl.engine.engine import Engine
from kvrl.engine.request import Request
from kvrl.executors.live import LiveExecutor
from kvrl.executors.live_build import build_live
from kvrl.model import make_random_checkpoint


DEVICE = sys.argv[1] if len(sys.argv) > 1 else "cuda"     # "cpu" for a smoke run
DISK_DIR = sys.argv[2] if len(sys.argv) > 2 else None      # None: a temporary directory


def executor(path: str) -> LiveExecutor:
    return build_live({"checkpoint": path}, {"device": DEVICE, "dtype": "float32"})


def engine(ex: LiveExecutor, tier_blocks: int, disk_blocks: int = 0, read_ahead: int = 0) -> Engine:
    cfg = dict(num_blocks=40, block_size=16, num_cpu_blocks=16, max_model_len=1024, max_num_batched_tokens=256,
               cpu_tier_blocks=tier_blocks, disk_tier_blocks=disk_blocks, disk_tier_dir=DISK_DIR,
               disk_tier_read_ahead_blocks=read_ahead)
    return build_engine({"engine": cfg, "scheduler": {"name": "fcfs"}, "watermark": {"name": "fixed"},
                         "eviction": {"name": "lifo", "mode": "recompute"}, "prefix_cache": {"name": "hash_lru"},
                         "tier": {"name": "offload_all"}}, executor=ex)


def main() -> int:
    path = tempfile.mkdtemp()
    make_random_checkpoint(path, family="qwen3", preset="tiny", seed=1)
    ex = executor(path)
    e = engine(ex, 8)
    ex.kv.normal_()
    before = ex.kv_by_block[[3, 5, 6]].clone()
    ex.execute(ScheduledBatch(tier_out=[(3, 2), (5, 0), (6, 1)]))
    ex.kv.zero_()
    ex.execute(ScheduledBatch(tier_in=[(0, 7), (2, 1), (1, 9)]))
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    kv_ok = bool(torch.equal(ex.kv_by_block[1], before[0]) and torch.equal(ex.kv_by_block[7], before[1])
                 and torch.equal(ex.kv_by_block[9], before[2]))
    dex = executor(path)
    d = engine(dex, 8, disk_blocks=8, read_ahead=2)
    dex.kv.normal_()
    before = dex.kv_by_block[[2, 4]].clone()
    dex.execute(ScheduledBatch(tier_out=[(2, 0), (4, 1)]))
    d.allocator._move_disk([(0, 5), (1, 2)], [])        # tier blocks 0, 1 -> disk blocks 5, 2
    dex.tier_pool.zero_()
    d.allocator.read_ahead.issue([(5, "a")])             # disk block 5 read ahead into a staging buffer
    d.allocator._move_disk([], [(5, 6, "a"), (2, 3, "b")])   # back into tier blocks 6 (staged), 3 (read now)
    dex.kv.zero_()
    dex.execute(ScheduledBatch(tier_in=[(6, 11), (3, 12)]))
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    disk_ok = bool(torch.equal(dex.kv_by_block[11], before[0]) and torch.equal(dex.kv_by_block[12], before[1]))
    rng = np.random.default_rng(0)
    system = rng.integers(0, 512, 200, dtype=np.int32)
    convs = [np.concatenate([system, rng.integers(0, 512, 60, dtype=np.int32)]) for _ in range(12)]
    reqs = lambda: [Request(f"r{round_}-{i}", round_ * 5.0 + 0.1 * i, p, 12)
                    for round_ in range(3) for i, p in enumerate(convs)]
    outs, summaries = [], []
    for blocks, disk, ahead in ((0, 0, 0), (256, 0, 0), (4, 256, 0), (4, 256, 16)):
        eng = engine(executor(path), blocks, disk, ahead)
        summaries.append(eng.run(reqs()))
        outs.append([eng.outputs(r.request_id) for r in reqs()])
    tokens_ok = outs[0] == outs[1] == outs[2] == outs[3]
    result = {"kv_round_trip_equal": kv_ok, "disk_round_trip_equal": disk_ok, "greedy_tokens_equal": tokens_ok,
              "tier_disk_loaded_blocks": summaries[2].get("tier_disk_loaded_blocks"),
              "tier_disk_load_s": summaries[2].get("tier_disk_load_s"),
              "read_ahead": {k: summaries[3].get(k) for k in ("tier_disk_loaded_blocks", "tier_disk_load_s",
                                                              "tier_disk_read_ahead_used_blocks",
                                                              "tier_disk_read_ahead_wait_s")},
              "tier_loaded_blocks": summaries[1].get("tier_loaded_blocks"),
              "tier_offloaded_blocks": summaries[1].get("tier_offloaded_blocks"),
              "tier_load_s": summaries[1].get("tier_load_s"), "tier_store_s": summaries[1].get("tier_store_s"),
              "prefix_hit_rate": [s["prefix_hit_rate"] for s in summaries],
              "device": torch.cuda.get_device_name() if DEVICE == "cuda" else DEVICE}
    print(json.dumps(result))
    return 0 if (kv_ok and disk_ok and tokens_ok and summaries[1].get("tier_loaded_blocks", 0) > 0
                 and summaries[2].get("tier_disk_loaded_blocks", 0) > 0
                 and summaries[3].get("tier_disk_read_ahead_used_blocks", 0) > 0) else 1


if __name__ == "__main__":
    sys.exit(main())
