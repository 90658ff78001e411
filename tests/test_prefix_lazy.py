"""Lazy registration of a plain hash_lru's blocks (issue #15; kvrl.engine.paged_allocator's module
doc): a block whose family has one owner is cached without an identity, and named when a lookup
reaches its family, when a second sequence registers in it, or when its owner registers an index
again. The answers must be eager registration's: the same run as hash_lru through the guard (which
registers every block eagerly), with the pool's invariants after every step."""
from __future__ import annotations

import logging

from kvrl import plugins
from kvrl.engine.callbacks import EngineCallback
from kvrl.engine.config import EngineConfig
from kvrl.engine.engine import Engine
from kvrl.executors.hardware import DEVICES, MODEL_SHAPES
from kvrl.executors.sim import SimExecutor
from kvrl.plugins.prefix_caches import HashLRU
from tests.helpers import make_request, quiet_kvrl_logs

_quiet = quiet_kvrl_logs(logging.ERROR)


class Eager(HashLRU):
    """hash_lru with one method overridden: the engine runs it through the guard, block by block
    and eagerly, as before lazy registration."""

    def on_hit(self, block_id, now):
        return super().on_hit(block_id, now)


def _engine(prefix_cache, num_blocks, mode="recompute", num_cpu_blocks=0):
    return Engine(EngineConfig(num_blocks=num_blocks, block_size=4, num_cpu_blocks=num_cpu_blocks,
                               max_model_len=4096, prefix_cache_scope="global"),
                  SimExecutor(MODEL_SHAPES["qwen3-0.6b"], DEVICES["h200"]), plugins.create("scheduler", "fcfs"),
                  plugins.create("watermark", "fixed", fraction=0.0), plugins.create("eviction", "lifo", mode=mode),
                  prefix_cache)


class _CheckEveryStep(EngineCallback):
    def __init__(self, engine) -> None:
        self.engine = engine

    def on_step(self, event) -> bool:
        self.engine.check_invariants()
        return True


def _run_checked(engine, requests):
    """Serve ``requests`` by arrival time, checking the pool after every step; returns the summary
    and each request's cached prompt tokens."""
    summary = engine.run(requests, callbacks=[_CheckEveryStep(engine)])
    cached = {r.request_id: [s.num_cached_prompt_tokens for s in engine.sequences(r.request_id)] for r in requests}
    return summary, cached


def test_distinct_prompts_are_cached_without_identities():
    """Prompts no one shares, one at a time (no preemption) in a pool that reclaims cached blocks:
    every full block is cached (and counted by num_cached) but none is hashed beyond each
    sequence's first block, and the identity maps stay empty."""
    policy = HashLRU(None)
    engine = _engine(policy, num_blocks=40)
    requests = [make_request(f"r{i}", prompt_len=13 + 5 * i, output_len=6 + i, seed=i, arrival_s=float(i))
                for i in range(8)]
    summary, _ = _run_checked(engine, requests)
    assert summary["finished"] == 8 and summary["preemptions"] == 0
    assert sum((r.prompt_len + r.output_len) // 4 for r in requests) > 40    # cached blocks were reclaimed
    cached = sum(engine.allocator._cached)
    assert cached > 8 and policy.num_cached == cached == engine.view.num_cached_blocks
    assert not policy._block_of and not policy._hash_of
    assert all(len(s.block_hashes) == 1 for r in requests for s in engine.sequences(r.request_id))


def test_lazy_registration_answers_as_eager_registration():
    """Hits on a finished owner's pending blocks (prompt and generated blocks), a repeated prompt
    registered twice in one step, recompute and swap preemption (an owner registering its indices
    again) and n > 1 forks (a second owner in the family): the same run, hits and counts as the
    eager guard, with the invariants after every step."""
    base = list(range(1, 30))
    probe = _engine(HashLRU(None), num_blocks=24)
    _run_checked(probe, [make_request("a", tokens=base, output_len=11)])
    generated = probe.sequences("a")[0].output_token_ids     # the sim's tokens for seq 0

    def requests():
        out = [make_request("a", tokens=base, output_len=11, arrival_s=0.0),
               make_request("twin1", tokens=base[:21], output_len=3, arrival_s=0.0),
               make_request("twin2", tokens=base[:21], output_len=3, arrival_s=0.0),
               make_request("fork", tokens=[7] * 18, output_len=6, arrival_s=0.0, n=2)]
        # after a finished: a's whole sequence (its prompt's blocks and two generated ones), and a's
        # prompt's first blocks with another tail; then enough load to preempt
        out += [make_request("again", tokens=base + generated, output_len=4, arrival_s=0.1),
                make_request("branch", tokens=base[:17] + [999] * 9, output_len=4, arrival_s=0.1)]
        out += [make_request(f"b{i}", prompt_len=20 + 3 * i, output_len=9, arrival_s=0.2 + 0.005 * i, seed=i)
                for i in range(10)]
        return out

    for mode, num_cpu_blocks in (("recompute", 0), ("swap", 64)):
        lazy, eager = HashLRU(None), Eager(None)
        runs = [_run_checked(_engine(policy, num_blocks=24, mode=mode, num_cpu_blocks=num_cpu_blocks), requests())
                for policy in (lazy, eager)]
        assert runs[0] == runs[1], mode
        summary = runs[0][0]
        assert summary["finished"] == 16 and summary["preemptions"] > 0, mode
        assert runs[0][1]["again"] == [36] and runs[0][1]["branch"] == [16], mode
        assert lazy.num_cached == eager.num_cached and lazy.num_evictable == eager.num_evictable, mode


def test_lazy_registration_answers_as_eager_registration_on_random_workloads():
    """Random workloads over three shared prefixes (cut anywhere, so families are shared or not),
    with forks, and preemption by recompute or swap in a small pool: the same summaries, hits and
    view counts as the eager guard, with the invariants after every step."""
    import numpy as np

    for trial in range(8):
        rng = np.random.default_rng(trial)
        prefixes = [rng.integers(0, 30, 64, dtype=np.int32) for _ in range(3)]

        def requests():
            draw = np.random.default_rng(1000 + trial)
            out = []
            for i in range(int(draw.integers(8, 25))):
                plen = int(draw.integers(1, 40))
                cut = int(draw.integers(0, plen + 1))
                tokens = np.concatenate([prefixes[int(draw.integers(0, 3))][:cut],
                                         draw.integers(0, 30, plen - cut, dtype=np.int32)])
                out.append(make_request(f"q{i}", tokens=tokens, output_len=int(draw.integers(1, 20)),
                                        n=int(draw.integers(1, 3)), arrival_s=0.01 * int(draw.integers(0, 5))))
            return out

        mode, num_blocks = ("recompute", "swap")[trial % 2], int(rng.integers(20, 60))
        runs = []
        for policy in (HashLRU(None), Eager(None)):
            engine = _engine(policy, num_blocks=num_blocks, mode=mode, num_cpu_blocks=64 if mode == "swap" else 0)
            runs.append((*_run_checked(engine, requests()), engine.view.num_cached_blocks,
                         engine.view.num_cached_free_blocks))
        assert runs[0] == runs[1], trial
