"""The pool's kept prefix peeks (``PrefixIdentityMixin.peek_cached_tokens``): a prefix-aware scheduler asks
for every waiting request's cached prefix at every step, and the pool answers from the blocks it found at
the request's last peek while none of them has been reclaimed. The answer must be the whole match's, step
by step, through registrations, reclaims, preemptions, tiers and the reclaim log's trimming, and a run
must be the one the whole match gives."""
from __future__ import annotations

import logging

import numpy as np
import pytest

from kvrl.engine.callbacks import EngineCallback
from kvrl.engine.prefix_identity import PrefixIdentityMixin
from tests.helpers import make_engine, make_request, quiet_kvrl_logs

_quiet = quiet_kvrl_logs(logging.ERROR)


def _tenant_requests(seed: int, n: int = 60, tenants: int = 4) -> list:
    """Requests of ``tenants`` tenants, each behind its own system prompt of 6-14 blocks of 4 tokens, with
    private tails and outputs, arriving in bursts: a pool of a few dozen blocks keeps some prompts cached
    and reclaims the others as running requests need blocks."""
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, 1000, 4 * int(rng.integers(6, 15)), dtype=np.int32) for _ in range(tenants)]
    out, t = [], 0.0
    for i in range(n):
        k = int(rng.integers(tenants))
        tail = rng.integers(0, 1000, int(rng.integers(1, 30)), dtype=np.int32)
        t += float(rng.exponential(0.004)) if rng.random() < 0.8 else float(rng.exponential(0.05))
        out.append(make_request(f"r{i}", tokens=np.concatenate([prompts[k], tail]), output_len=int(rng.integers(2, 40)),
                                arrival_s=t, tenant=f"t{k}"))
    return out


class _PeekCheck(EngineCallback):
    """After every step, every waiting and preempted request's peek against the whole match."""

    def __init__(self, engine) -> None:
        self.engine, self.checked, self.hits, self.kept = engine, 0, 0, 0

    def on_step(self, event) -> bool:
        pool = self.engine.allocator
        for seq in [*self.engine.preempted, *self.engine.waiting]:
            kept = seq.prefix_peek is not None
            peek = pool.peek_cached_tokens(seq)
            assert peek == pool.match_prefix(seq).num_tokens(pool.block_size), f"step {event.step_index}, seq {seq.seq_id}"
            self.checked += 1
            self.hits += peek > 0
            self.kept += kept
        return True


@pytest.mark.parametrize("seed,engine_kw", [
    (0, {}),
    (1, {"prefix_hash": "xxh3"}),                        # unchecked identities
    (2, {"prefix_cache_scope": "global"}),
])
def test_a_kept_peek_is_the_whole_match_at_every_step(seed, engine_kw):
    engine = make_engine(num_blocks=40, num_cpu_blocks=64, scheduler="lpm", watermark_params={"fraction": 0.0},
                         **engine_kw)
    check = _PeekCheck(engine)
    engine.run(_tenant_requests(seed), callbacks=[check])
    assert engine.metrics.num_finished == 60
    assert check.checked > 200 and check.hits > 50 and check.kept > 20      # kept peeks were asked and found blocks
    assert engine.allocator._reclaim_log.base > 0      # the reclaim log was trimmed (4 x 40 blocks) and peeks went on


def test_a_tiered_pool_peeks_with_whole_matches():
    """With a CPU tier a match goes on into the tier's blocks, which the kept GPU blocks do not cover: the
    tiered pool matches at every peek."""
    engine = make_engine(num_blocks=40, num_cpu_blocks=64, scheduler="lpm", watermark_params={"fraction": 0.0},
                         cpu_tier_blocks=32)
    check = _PeekCheck(engine)
    engine.run(_tenant_requests(3), callbacks=[check])
    assert check.hits > 50 and check.kept == 0


def _whole_match(self, seq):
    return self.match_prefix(seq).num_tokens(self.block_size)


@pytest.mark.parametrize("seed", [4, 5])
def test_a_run_with_kept_peeks_is_the_run_with_whole_matches(seed, monkeypatch):
    """The same lpm run, step by step, whether the pool keeps its peeks or matches every time."""
    def run():
        engine = make_engine(num_blocks=40, scheduler="lpm", watermark_params={"fraction": 0.01})
        summary = engine.run(_tenant_requests(seed, n=80))
        return summary, engine.metrics.steps
    kept = run()
    monkeypatch.setattr(PrefixIdentityMixin, "peek_cached_tokens", _whole_match)
    assert run() == kept


def test_a_reclaimed_block_ends_a_kept_peek():
    """A request's peek finds its prompt's cached blocks; once one of them is reclaimed for another request,
    the next peek is a whole match again (fewer blocks), not the kept count."""
    engine = make_engine(num_blocks=12, scheduler="lpm", watermark_params={"fraction": 0.0})
    shared = list(range(1, 17))                                   # 4 blocks of 4
    engine.run([make_request("a", tokens=shared + [50, 51], output_len=2)])
    pool = engine.allocator
    waiting = make_request("b", tokens=shared + [60, 61], output_len=2)
    engine.submit(waiting)
    (seq,) = engine.waiting
    assert pool.peek_cached_tokens(seq) == 16 and len(seq.prefix_peek[2]) == 4
    table: list[int] = []
    pool._take(table, 12 - pool.num_used_blocks)                 # every free block, then reclaims cached ones
    assert pool._reclaim_log and set(pool._reclaim_log) & seq.prefix_peek[2]
    assert pool.peek_cached_tokens(seq) == pool.match_prefix(seq).num_tokens(4) < 16


def test_the_reclaim_log_is_bounded_and_says_when_it_dropped_what_a_peek_needs():
    import copy

    from kvrl.engine.prefix_identity import ReclaimLog

    log = ReclaimLog(cap=8)
    log.append(1)
    mark = log.end
    log += [2, 3, 4]
    assert log.since(mark) == [2, 3, 4] and log.since(0) == [1, 2, 3, 4]
    log += list(range(5, 10))                      # 9 entries > 8: the older half goes
    assert len(log) <= 8 and log.base == 4 and log.end == 9 and log.since(mark) is None
    twin = copy.deepcopy(log)
    assert (list(twin), twin.base, twin.cap, twin.end) == (list(log), 4, 8, 9)
