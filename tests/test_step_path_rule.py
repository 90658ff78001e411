"""scripts/fidelity_step_path.py reads which graph a recorded step ran on from its features alone, through a
stand-in of :class:`~kvrl.executors.step_graph.StepGraphs` with the live executor's defaults. Its answer must be
the executor's own, with and without the split graphs (as session 38 had them: only where the eager path splits),
for steps of one prefill chunk beside decodes."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from kvrl.executors.piecewise import TOKEN_SIZES
from kvrl.executors.profile import batch_features
from kvrl.executors.step_graph import StepGraphs
from kvrl.model import load_model, make_random_checkpoint
from kvrl.profiling.batches import BatchFactory

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("fidelity_step_path", ROOT / "scripts" / "fidelity_step_path.py")
step_path = importlib.util.module_from_spec(spec)
spec.loader.exec_module(step_path)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3")
    make_random_checkpoint(path, family="qwen3", preset="tiny", seed=1)
    return load_model(path, dtype=torch.float32, device="cpu")[0]


@pytest.mark.parametrize("split_graphs", [False, True])
def test_the_stand_in_picks_the_executors_graph(model, split_graphs):
    cfg = model.config
    block_size, max_len = 16, 16384
    graphs = StepGraphs(model, [], block_size, max_len // block_size, TOKEN_SIZES, 2048,
                        decode_splits=8 if split_graphs else 1, split_where_pays=False, capture=False)
    factory = BatchFactory(80000, block_size, cfg.vocab_size, max_len, seed=0)
    kinds = set()
    for prefill in (64, 256, 600):
        for decodes in (4, 16, 64, 200):
            for long in (2048, 4608, 8192):
                batch = factory.batch(decode_lens=[long] + [1024] * (decodes - 1), prefills=[(prefill, 0)])
                order = [s for s in batch.seqs if not s.is_decode] + [s for s in batch.seqs if s.is_decode]
                want = graphs.bucket(order, 1)
                f = batch_features(batch)
                got = step_path._step_key(f, f["dec_max"], cfg.num_heads, cfg.num_kv_heads, split_graphs)
                assert got == want, (prefill, decodes, long, got, want)
                kinds.add("piecewise" if want is None else "split" if want.split else "whole-step")
    assert kinds == ({"piecewise", "split", "whole-step"} if split_graphs else {"piecewise", "whole-step"})
