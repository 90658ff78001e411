"""The one live warm-up (kvrl.builder.warm_up): it warms the executor's pool and leaves no other state."""
from __future__ import annotations

import numpy as np
import pytest

from kvrl.builder import build_engine, warm_up
from kvrl.engine.request import Request

ENGINE = {"num_blocks": 48, "block_size": 4, "num_cpu_blocks": 16, "max_num_seqs": 6, "max_num_batched_tokens": 64,
          "max_model_len": 256}
POLICIES = {"scheduler": {"name": "fcfs"}, "watermark": {"name": "fixed"}, "eviction": {"name": "lifo"},
            "prefix_cache": {"name": "hash_lru"}}


def _live(seed: int = 3):
    from kvrl.executors.live_build import build_live

    # sampled (not greedy), so that the executor's sampling state shows in the tokens
    return build_live({"name": "tiny"}, {"device": "cpu", "dtype": "float32", "temperature": 1.0, "top_k": 20},
                      seed=seed)


class _FirstGap:
    """Records the host gap the executor reported for each step."""

    def __init__(self) -> None:
        self.gaps: list = []

    def on_step(self, event) -> bool:
        self.gaps.append(event.output.host_gap_s)
        return True


def _serve(executor) -> tuple[list[list[int]], list]:
    rng = np.random.default_rng(0)
    requests = [Request(f"r{i}", 0.0, rng.integers(0, executor.vocab_size, 5 + 3 * i, dtype=np.int32), 6)
                for i in range(4)]
    engine = build_engine({"engine": ENGINE, **POLICIES}, executor=executor)
    gaps = _FirstGap()
    engine.run(requests, callbacks=[gaps])
    return [engine.sequences(r.request_id)[0].output_token_ids for r in requests], gaps.gaps


def test_a_warmed_executor_serves_as_a_fresh_one_on_the_pool_it_warmed():
    fresh_tokens, fresh_gaps = _serve(_live())
    live = _live()
    config = warm_up(live, ENGINE, 5, seed=1)
    assert config.num_blocks == ENGINE["num_blocks"] and config.max_model_len == ENGINE["max_model_len"]
    pool = live.kv.data_ptr()
    tokens, gaps = _serve(live)
    assert live.kv.data_ptr() == pool          # the measured engine reused the warmed pool
    assert tokens == fresh_tokens              # sampling restarted from the executor's seed
    assert gaps[0] is None and fresh_gaps[0] is None   # no host gap charged across the warm-up


def test_warm_up_needs_a_positive_request_count():
    with pytest.raises(ValueError, match="num_requests=0"):
        warm_up(_live(), ENGINE, 0)
