"""Fuzzing with hypothesis, end to end.

* trace rows (near-valid JSONL / Azure / BurstGPT rows, plus random common transform keys) through
  ``build_workload`` and then the engine: the only failure allowed is a ``ValueError`` naming the
  file or the workload key; whatever loads must be served (finished, or rejected with a reason);
* engine configs: every ``EngineConfig`` field with random values, both as Python arguments of
  the declared types and through OmegaConf's structured config (what the Hydra apps do): either a
  ``ValueError`` naming the key or an engine that serves a workload with its invariants intact;
* engine operations: random add / step / abort / external preempt with random policies of every
  kind (the defences included) and injected plugin crashes and garbage decisions: no exception
  escapes, ``check_invariants`` holds after every operation, no block is leaked at idle, and every
  request ends finished, aborted with a reason, or rejected with a reason;
* chaos policies (#15): every entry point of all four kinds, the prefix cache's included, raises
  or returns garbage (a victim that is no candidate, a reservation outside the pool, keys that do
  not compare, an evicted block still in use, a lookup naming a foreign block), with ``n`` > 1
  requests whose forks share blocks; the same operations also drive the live executor on CPU
  (a tiny random model, a few examples), where a sequence without blocks would crash the step.

``KVRL_FUZZ_SCALE=20 pytest tests/test_fuzz.py`` multiplies every example count (a deeper run).
Sizes are bounded (pools of at most a few hundred blocks, swap space under 1 GiB) so each
example runs in milliseconds; two engine gaps this file found (float sizes, unchunked requests
over the budget) are fixed and pinned by the last two tests.
"""
from __future__ import annotations

import csv
import dataclasses
import functools
import json
import logging
import math
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from kvrl import plugins
from kvrl.engine.config import EngineConfig
from kvrl.engine.engine import Engine
from kvrl.engine.request import SeqStatus
from kvrl.executors.hardware import DEVICES, MODEL_SHAPES
from kvrl.executors.sim import SimExecutor
from kvrl.plugins.base import EvictionDecision, PreemptionMode
from kvrl.workloads import build_workload
from tests.helpers import make_engine, make_request, quiet_kvrl_logs

_quiet_kvrl_logs = quiet_kvrl_logs(logging.CRITICAL)

SCALE = float(os.environ.get("KVRL_FUZZ_SCALE", "1"))
FUZZ = settings(max_examples=int(100 * SCALE), deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.filter_too_much])
VOCAB = 1000
MAX_LEN = 256


# ============================================================================ helpers
def assert_all_accounted(engine: Engine, expected: dict[str, tuple[int, int]]) -> None:
    """Every request id in ``expected`` (-> (output_len, n)) finished with all its tokens, was
    aborted with a reason, or was rejected with a reason; nothing is pending or leaked."""
    engine.check_invariants()
    assert not engine.has_unfinished
    alloc = engine.allocator
    assert alloc.num_used_blocks == 0 and alloc.num_free_blocks == alloc.num_blocks
    if hasattr(alloc, "num_cpu_blocks"):
        assert alloc.num_free_cpu_blocks == alloc.num_cpu_blocks
    rejected = {}
    for rid, reason in engine.metrics.rejected:
        assert reason, f"request {rid} rejected without a reason"
        rejected.setdefault(rid, reason)
    for rid, (olen, n) in expected.items():
        rec = engine.metrics.requests.get(rid)
        if rec is None:
            assert rid in rejected, f"request {rid} was lost (neither served nor rejected)"
            continue
        if rec.error:
            assert isinstance(rec.error, str) and rec.error.strip(), f"request {rid} aborted without a reason"
            continue
        seqs = engine.sequences(rid)
        assert rec.finish_s is not None, f"request {rid} never finished"
        assert len(seqs) == n and all(s.status is SeqStatus.FINISHED and s.num_output == olen
                                      for s in seqs), f"request {rid} finished short"
        assert rec.output_tokens == n * olen


def drain(engine: Engine, limit: int = 20000) -> None:
    steps = 0
    while engine.has_unfinished:
        engine.step()
        steps += 1
        assert steps < limit, "engine did not drain"


# ============================================================================ trace rows
ARRIVAL = st.one_of(st.floats(0, 50, allow_nan=False), st.integers(0, 50), st.just(-1.0), st.just(float("nan")),
                    st.just(1e300), st.text(max_size=3), st.none(), st.booleans())
TOKENS = st.lists(st.integers(-2, VOCAB + 5), min_size=0, max_size=24)
MUTATED_ROW = st.fixed_dictionaries(
    {"arrival_s": ARRIVAL,
     "output_len": st.one_of(st.integers(-1, 24), st.just(2.0), st.just(2.5), st.just("4"), st.just(10**12))},
    optional={
        "prompt_tokens": st.one_of(TOKENS, st.just([[1, 2]]), st.just(["a"]), st.just([1.5])),
        "prompt_len": st.one_of(st.integers(-1, 400), st.just(True)),
        "prefix_len": st.integers(-1, 40),
        "tenant": st.one_of(st.sampled_from(["a", "b", "attacker", ""]), st.integers(0, 3)),
        "priority": st.one_of(st.integers(-3, 3), st.just(2**40)),
        "n": st.integers(-1, 4),
        "prefix_group": st.one_of(st.none(), st.sampled_from(["g1", "g2"]), st.just(7)),
        "slo_ttft_s": st.one_of(st.none(), st.floats(-1, 5, allow_nan=False), st.just(float("inf"))),
        "slo_tpot_s": st.one_of(st.none(), st.floats(0, 1, allow_nan=False)),
        "cache_salt": st.one_of(st.none(), st.text(max_size=3)),
        "request_id": st.sampled_from(["x", "y", "z", ""]),
        "bogus_field": st.just(1),
    })
_VALID_OPTIONAL = {
    "prefix_group": st.sampled_from(["g1", "g2"]), "tenant": st.sampled_from(["a", "b", "attacker"]),
    "priority": st.integers(-3, 3), "n": st.integers(1, 3), "slo_ttft_s": st.floats(0.001, 5),
    "cache_salt": st.text(max_size=3)}
VALID_ROW = st.one_of(
    st.fixed_dictionaries({"arrival_s": st.floats(0, 20, allow_nan=False), "output_len": st.integers(1, 24),
                           "prompt_tokens": st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=300)},
                          optional=_VALID_OPTIONAL),
    st.fixed_dictionaries({"arrival_s": st.floats(0, 20, allow_nan=False), "output_len": st.integers(1, 24),
                           "prompt_len": st.integers(41, 400)}, optional={**_VALID_OPTIONAL, "prefix_len": st.integers(0, 40)}))


def with_mutations(valid, mutated, max_valid=8):
    """A list of mostly valid rows with at most two mutated rows at random positions."""
    return st.tuples(st.lists(valid, max_size=max_valid), st.lists(st.tuples(mutated, st.integers(0, 8)), max_size=2)) \
        .map(lambda t: _insert(*t))


def _insert(rows, extra):
    rows = list(rows)
    for row, pos in extra:
        rows.insert(pos % (len(rows) + 1), row)
    return rows


_VALID_COMMON = st.fixed_dictionaries({}, optional={
    "max_requests": st.integers(1, 6), "rate_scale": st.floats(0.5, 4), "offline": st.booleans(),
    "overlong": st.sampled_from(["clip", "drop"]), "skip_bad_rows": st.booleans(), "seed": st.integers(0, 3)})
COMMON = st.one_of(
    _VALID_COMMON, _VALID_COMMON, _VALID_COMMON,
    st.fixed_dictionaries({}, optional={
        "max_requests": st.one_of(st.none(), st.integers(-1, 6)),
        "rate_scale": st.one_of(st.floats(-1, 4, allow_nan=False), st.just(0.0)),
        "offline": st.one_of(st.booleans(), st.just("yes")),
        "overlong": st.sampled_from(["clip", "drop", "truncate"]),
        "slo_ttft_s": st.one_of(st.none(), st.floats(-1, 3, allow_nan=False)),
        "subsample": st.one_of(st.none(), st.floats(-0.5, 1.5, allow_nan=False)),
        "skip_bad_rows": st.booleans(),
        "seed": st.integers(0, 3),
    }))


def _serve_trace(cfg: dict, path: Path, policies: tuple) -> None:
    """Load through build_workload; a failure must be a ValueError naming the file or the key."""
    try:
        reqs = build_workload(cfg, vocab_size=VOCAB, max_model_len=MAX_LEN)
    except ValueError as exc:
        msg = str(exc)
        assert msg.strip() and (str(path) in msg or "workload" in msg), f"unclear error: {msg!r}"
        event(f"load error: {type(exc).__name__}" + (f" {msg[:60]}" if type(exc) is ValueError else ""))
        return
    event(f"loaded {min(len(reqs), 3)}+ requests")
    for r in reqs:
        r.validate()
    assert all(a.arrival_s <= b.arrival_s for a, b in zip(reqs, reqs[1:]))
    scheduler, watermark, eviction = policies
    engine = make_engine(num_blocks=96, block_size=4, num_cpu_blocks=32, max_model_len=MAX_LEN,
                         scheduler=scheduler, watermark=watermark, eviction=eviction, max_num_batched_tokens=64)
    engine.run(reqs)
    assert_all_accounted(engine, {r.request_id: (r.output_len, r.n) for r in reqs})


TRACE_POLICIES = st.tuples(st.sampled_from(["fcfs", "priority", "lpm"]),
                           st.sampled_from(["fixed", "tenant_quota", "thrash_guard"]),
                           st.sampled_from(["lifo", "capped", "tenant_fair"]))


@FUZZ
@given(rows=with_mutations(VALID_ROW, MUTATED_ROW), junk=st.lists(st.sampled_from(["", "{", "[]", "null", "{}"]), max_size=1),
       common=COMMON, policies=TRACE_POLICIES)
def test_fuzz_jsonl_rows_to_engine(tmp_path_factory, rows, junk, common, policies):
    path = tmp_path_factory.mktemp("fz") / "t.jsonl"
    lines = [json.dumps(r) for r in rows] + junk
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    _serve_trace({"name": "jsonl", "path": str(path), **common}, path, policies)


GOOD_COUNT = st.integers(0, 300).map(str)
COUNT = st.one_of(GOOD_COUNT, GOOD_COUNT, GOOD_COUNT, GOOD_COUNT, st.integers(-3, -1).map(str),
                  st.sampled_from(["", "1.5", "x", "1e3", " 7 ", "99999999999999999999"]))
AZURE_OK = st.tuples(st.builds(lambda s, f: f"2023-11-16 18:17:{s:02d}.{f:07d}", st.integers(0, 59),
                               st.integers(0, 10**7 - 1)), GOOD_COUNT, GOOD_COUNT)
AZURE_ROW = st.tuples(
    st.one_of(st.builds(lambda s, f: f"2023-11-16 18:17:{s:02d}.{f:07d}", st.integers(0, 59), st.integers(0, 10**7 - 1)),
              st.builds(lambda s, f: f"2023-11-16 18:17:{s:02d}.{f:07d}", st.integers(0, 59), st.integers(0, 10**7 - 1)),
              st.sampled_from(["2023-11-16 18:17:03", "2024-05-10 00:00:00.1+00:00", "yesterday", "", "2023-02-30 00:00:00"])),
    COUNT, COUNT)
BURST_OK = st.tuples(st.floats(0, 100, allow_nan=False).map(repr), st.sampled_from(["ChatGPT", "GPT-4"]), GOOD_COUNT,
                     GOOD_COUNT, GOOD_COUNT, st.sampled_from(["Conversation log", "API log"]))
BURST_ROW = st.tuples(st.one_of(st.floats(0, 100, allow_nan=False).map(repr), st.floats(0, 100, allow_nan=False).map(repr),
                                st.sampled_from(["-1", "nan", "", "t"])),
                      st.sampled_from(["ChatGPT", "GPT-4", ""]), COUNT, COUNT, COUNT,
                      st.sampled_from(["Conversation log", "API log", ""]))


def _write_csv(path: Path, header: tuple, rows) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)


@FUZZ
@given(rows=with_mutations(AZURE_OK, AZURE_ROW), common=COMMON, policies=TRACE_POLICIES)
def test_fuzz_azure_rows_to_engine(tmp_path_factory, rows, common, policies):
    path = tmp_path_factory.mktemp("fz") / "t.csv"
    _write_csv(path, ("TIMESTAMP", "ContextTokens", "GeneratedTokens"), rows)
    _serve_trace({"name": "azure_csv", "path": str(path), **common}, path, policies)


@FUZZ
@given(rows=with_mutations(BURST_OK, BURST_ROW), common=COMMON, policies=TRACE_POLICIES,
       tenant_from=st.sampled_from(["none", "model", "log_type", "bogus"]), drop=st.booleans())
def test_fuzz_burstgpt_rows_to_engine(tmp_path_factory, rows, common, policies, tenant_from, drop):
    path = tmp_path_factory.mktemp("fz") / "t.csv"
    _write_csv(path, ("Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens", "Log Type"), rows)
    _serve_trace({"name": "burstgpt", "path": str(path), "tenant_from": tenant_from, "drop_failures": drop, **common},
                 path, policies)


# ============================================================================ engine configs
FIELDS = {f.name: f for f in dataclasses.fields(EngineConfig)}
TYPED = {   # values of each field's declared type, any range (sizes bounded: see the module docstring)
    "num_blocks": st.integers(-2, 300),
    "block_size": st.integers(-1, 40),
    "num_cpu_blocks": st.one_of(st.none(), st.integers(-1, 200)),
    "swap_space_gb": st.one_of(st.floats(-1, 0.25), st.just(float("nan"))),
    "gpu_memory_utilization": st.one_of(st.floats(-0.5, 1.5), st.just(float("inf"))),
    "max_num_batched_tokens": st.integers(-1, 200),
    "max_num_seqs": st.integers(-1, 12),
    "max_model_len": st.one_of(st.none(), st.integers(-1, 300)),
    "chunked_prefill": st.booleans(),
    "pause_gc": st.booleans(),
    "allocator": st.sampled_from(["paged", "contiguous", "Paged", ""]),
    "contiguous_reserve": st.sampled_from(["max", "pow2", "oracle", "exact"]),
    "prefix_cache_scope": st.sampled_from(["tenant", "global", "none"]),
    "policy_errors": st.sampled_from(["isolate", "raise", "ignore"]),
    "charge_policy_time": st.booleans(),
    "cpu_tier_blocks": st.integers(-1, 40),
    "disk_tier_blocks": st.integers(-1, 40),
    "disk_tier_dir": st.one_of(st.none(), st.just("/nonexistent/kvrl-fuzz-disk-tier")),
    "disk_tier_threads": st.integers(-1, 8),
    "disk_tier_read_ahead_blocks": st.integers(-1, 8),
    "prefix_hash": st.sampled_from(["blake2b", "sha256", "xxh3", "md5"]),
    "prefix_hash_key": st.sampled_from(["random", "seed", "fixed"]),
    "seed": st.integers(-5, 2**40),
}
assert set(TYPED) == set(FIELDS), "a new EngineConfig field needs a fuzz strategy"
ANY_VALUE = st.one_of(st.none(), st.booleans(), st.integers(-5, 500), st.floats(allow_nan=True),
                      st.sampled_from(["", "12", "abc", "paged", "yes", "1e3", "0.5"]))


def _config_workload(seed: int) -> list:
    rng = np.random.default_rng(seed)
    reqs = []
    for i in range(8):
        tokens = np.concatenate([np.arange(8, dtype=np.int32), rng.integers(0, 500, int(rng.integers(1, 30)),
                                                                             dtype=np.int32)])
        reqs.append(make_request(f"c{i}", tokens=tokens, output_len=int(rng.integers(1, 12)), n=1 + (i % 3 == 0),
                                 arrival_s=0.01 * i, tenant="ab"[i % 2]))
    return reqs


def _engine_or_clear_error(make, given_keys):
    """``make()`` must give an engine or raise a ValueError naming one of the given keys."""
    try:
        return make()
    except ValueError as exc:
        msg = str(exc)
        assert any(k in msg for k in given_keys) or "engine.num_blocks" in msg, f"unclear error: {msg!r}"
        event(f"config error: {type(exc).__name__}")
        return None


def _serve_config(engine: Engine, reqs: list) -> None:
    event("engine built and served")
    engine.run(reqs)
    assert_all_accounted(engine, {r.request_id: (r.output_len, r.n) for r in reqs})


def _prefix_cache_for(kw) -> str:
    return "none" if kw.get("allocator") == "contiguous" else "hash_lru"


@FUZZ
@given(kw=st.fixed_dictionaries({}, optional=TYPED), seed=st.integers(0, 10))
def test_fuzz_engine_config_typed_values(kw, seed):
    reqs = _config_workload(seed)
    keys = [f"engine.{k}" for k in kw]
    cfg = _engine_or_clear_error(lambda: EngineConfig(**kw), keys)
    if cfg is None:
        return
    engine = _engine_or_clear_error(
        lambda: Engine(cfg, SimExecutor(MODEL_SHAPES["qwen3-0.6b"], DEVICES["h200"]), plugins.create("scheduler", "fcfs"),
                       plugins.create("watermark", "tenant_quota"), plugins.create("eviction", "capped"),
                       plugins.create("prefix_cache", _prefix_cache_for(kw))), keys + ["engine.allocator"])
    if engine is not None:
        _serve_config(engine, reqs)


def _hydra_cfg(engine_node):
    from omegaconf import OmegaConf
    conf = Path(__file__).resolve().parents[1] / "conf"
    return OmegaConf.create({
        "backend": {"name": "sim"}, "model": OmegaConf.load(conf / "model" / "qwen3-0.6b.yaml"),
        "device": OmegaConf.load(conf / "device" / "h200.yaml"), "seed": 0,
        "scheduler": {"name": "fcfs"}, "watermark": {"name": "thrash_guard"}, "eviction": {"name": "tenant_fair"},
        "prefix_cache": {"name": "none" if engine_node.allocator == "contiguous" else "radix_lru"},
        "engine": engine_node, "slo": {"ttft_s": 2.0, "tpot_s": 0.1}})


@FUZZ
@given(kw=st.dictionaries(st.sampled_from(sorted(FIELDS)), ANY_VALUE, max_size=4), seed=st.integers(0, 10))
def test_fuzz_engine_config_through_omegaconf(kw, seed):
    """The Hydra path: OmegaConf's structured EngineConfig types the values, then the builder."""
    from omegaconf import OmegaConf
    from kvrl.builder import build_engine

    # sizes bounded as above (a pool of 10**300 blocks is a memory error, not a config check)
    for k, v in kw.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and abs(v) > 500:
            kw[k] = 500 if v > 0 else -500
    if "swap_space_gb" in kw and isinstance(kw["swap_space_gb"], (int, float)) and kw["swap_space_gb"] > 0.25:
        kw["swap_space_gb"] = 0.25
    reqs = _config_workload(seed)
    keys = list(kw)

    def make():
        node = OmegaConf.merge(OmegaConf.structured(EngineConfig), kw)
        return build_engine(_hydra_cfg(node), record_steps=False)

    engine = _engine_or_clear_error(make, keys)
    if engine is None:
        return
    cfg = engine.config
    assume(cfg.chunked_prefill or cfg.max_num_batched_tokens >= max(r.prompt_len + r.output_len for r in reqs))
    _serve_config(engine, reqs)


# ============================================================================ engine operations
SCHEDULERS = [("fcfs", {}), ("priority", {}), ("sjf", {}), ("sjf", {"oracle": True}), ("lpm", {"max_queue": 4})]
WATERMARKS = [("fixed", {}), ("fixed", {"fraction": 0.0}), ("opt_factor", {"a": 4.0}), ("avg_block_len", {"t": 3.0}),
              ("token_ratio", {"decay_steps": 5}), ("past_future", {"min_history": 2}), ("past_future", {"min_history": 2, "key": "tenant"}),
              ("tenant_quota", {}), ("tenant_quota", {"share": 0.3, "burst": 1.5, "inner": "thrash_guard"}),
              ("thrash_guard", {"threshold": 1, "window_s": 5.0, "step_fraction": 0.3, "half_life_s": 0.01}),
              ("thrash_guard", {"inner": "past_future", "inner_params": {"min_history": 2}})]
EVICTIONS = [("lifo", {"mode": "auto"}), ("fewest_computed", {"mode": "swap"}), ("most_blocks", {}),
             ("priority", {"mode": "swap"}), ("longest_remaining", {"key": "tenant", "mode": "auto"}), ("slo_slack", {"key": "tenant", "mode": "swap"}), ("cost_aware", {}), ("tenant_fair", {"mode": "auto"}),
             ("capped", {"max_preemptions": 0}), ("capped", {"max_preemptions": 1, "inner": "tenant_fair", "inner_mode": "swap"}),
             ("capped", {"inner": "cost_aware"})]
PREFIX_CACHES = ["none", "hash_lru", "hash_lfu", "radix_lru"]
FAULTS = ("reserved_blocks", "admit", "select", "order", "key", "hooks", "garbage_reserved", "garbage_select",
          "garbage_key", "prefix_raise", "prefix_garbage")
PREFIX_CALLS = ("lookup", "insert", "on_hit", "on_release", "on_acquire", "evict", "insert_blocks",
                "on_release_blocks", "evict_blocks")

ADD = st.tuples(st.just("add"), st.integers(1, 40), st.integers(1, 16), st.integers(1, 3), st.integers(0, 3),
                st.integers(0, 2))
OPS = st.lists(st.one_of(
    ADD, ADD, ADD,
    st.tuples(st.just("step"), st.integers(1, 5)),
    st.tuples(st.just("preempt"), st.sampled_from(["swap", "recompute"]), st.integers(0, 10)),
    st.tuples(st.just("abort"), st.integers(0, 50)),
    st.tuples(st.just("fault"), st.sampled_from(FAULTS), st.integers(1, 3)),
), min_size=8, max_size=50)


class Faults:
    """Installs wrappers on every policy entry point (the defences' inner policies included) that
    raise, or return garbage, while a budget for that entry point is left."""

    GARBAGE_RESERVED = (float("nan"), -7, "many", None, 10**9, True)

    def __init__(self, engine: Engine):
        self.budget = {f: 0 for f in FAULTS}
        self.n = 0
        for policy in (engine.scheduler, engine.watermark, engine.eviction):
            while policy is not None:
                self._wrap(policy)
                policy = getattr(policy, "inner", None)
        self.alloc = engine.allocator
        for name in PREFIX_CALLS:
            setattr(engine.prefix_cache, name, self._prefix(name, getattr(engine.prefix_cache, name)))
        engine._on_step_end = [self._hook(h) for h in engine._on_step_end]
        engine._on_finish = [self._hook(h) for h in engine._on_finish]
        engine._on_preempt = [self._hook(h) for h in engine._on_preempt]

    def _take(self, name):
        if self.budget[name] > 0:
            self.budget[name] -= 1
            return True
        return False

    def _wrap(self, policy):
        for name in ("reserved_blocks", "admit", "select", "order", "key"):
            fn = getattr(policy, name, None)
            if fn is None or name in vars(policy):
                continue
            setattr(policy, name, self._wrapped(name, fn))

    def _wrapped(self, name, fn):
        def call(*args):
            if self._take(name):
                raise RuntimeError(f"injected crash in {name}")
            if name == "reserved_blocks" and self._take("garbage_reserved"):
                self.n += 1
                return self.GARBAGE_RESERVED[self.n % len(self.GARBAGE_RESERVED)]
            if name == "select" and self._take("garbage_select"):
                return EvictionDecision(-1, PreemptionMode.SWAP)
            if name == "key" and self._take("garbage_key"):
                self.n += 1
                return [None, "x", {1}][self.n % 3]      # does not compare with the other keys
            return fn(*args)
        return call

    def _prefix(self, name, fn):
        """Prefix-cache entry points: raise, or (lookup / evict / evict_blocks) name a block that is
        in use, not cached or not a block at all, or (insert_blocks) answer once too often."""
        def call(*args):
            if self._take("prefix_raise"):
                raise RuntimeError(f"injected crash in prefix_cache.{name}")
            if name in ("lookup", "evict", "evict_blocks") and self._take("prefix_garbage"):
                used = [b for b, rc in enumerate(self.alloc.ref_counts) if rc > 0]
                self.n += 1
                garbage = [used[0] if used else 0, -3, "block", 10**6][self.n % 4]
                return [garbage] * args[0] if name == "evict_blocks" else garbage
            if name == "insert_blocks" and self._take("prefix_garbage"):
                return [True] * (len(args[0]) + 1)      # one answer too many
            return fn(*args)
        return call

    def _hook(self, fn):
        def call(*args):
            if self._take("hooks"):
                raise RuntimeError("injected crash in a hook")
            return fn(*args)
        return call


def _shared_prompt(rng, group, length):
    base = np.random.default_rng(group).integers(0, 50, 64, dtype=np.int32)
    tail = rng.integers(0, 50, 64, dtype=np.int32)
    return np.concatenate([base[: length // 2], tail[: length - length // 2]])


def _preempt_running(engine: Engine, mode: str, index: int) -> None:
    """Force a preemption from outside the scheduler, through the engine's own path."""
    if engine.running:
        engine.preempt(engine.running[index % len(engine.running)].seq_id, mode)


@settings(max_examples=int(500 * SCALE), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS, scheduler=st.sampled_from(SCHEDULERS), watermark=st.sampled_from(WATERMARKS),
       eviction=st.sampled_from(EVICTIONS), prefix_cache=st.sampled_from(PREFIX_CACHES),
       scope=st.sampled_from(["tenant", "global"]), seed=st.integers(0, 2**16))
def test_fuzz_engine_operations_with_every_policy_and_faults(ops, scheduler, watermark, eviction, prefix_cache,
                                                              scope, seed):
    engine = Engine(EngineConfig(num_blocks=40, block_size=4, num_cpu_blocks=24, max_model_len=4096,
                                 max_num_batched_tokens=32, prefix_cache_scope=scope),
                    SimExecutor(MODEL_SHAPES["qwen3-0.6b"], DEVICES["h200"]),
                    plugins.create("scheduler", scheduler[0], **scheduler[1]),
                    plugins.create("watermark", watermark[0], **watermark[1]),
                    plugins.create("eviction", eviction[0], **eviction[1]),
                    plugins.create("prefix_cache", prefix_cache))
    _drive(engine, ops, seed)


def _drive(engine: Engine, ops, seed: int) -> None:
    """Apply ``ops`` with every fault injector installed; check the invariants after each one,
    then drain and check that every request is accounted for and every block is free."""
    faults = Faults(engine)
    rng = np.random.default_rng(seed)
    added: dict[str, tuple[int, int]] = {}
    for op in ops:
        if op[0] == "add":
            _, plen, olen, n, group, tenant = op
            rid = f"r{len(added)}"
            engine.submit(make_request(rid, tokens=_shared_prompt(rng, group, plen), output_len=olen, n=n,
                                       arrival_s=engine.now, priority=int(rng.integers(0, 3)), tenant=f"t{tenant}"))
            added[rid] = (olen, n)
        elif op[0] == "step":
            for _ in range(op[1]):
                if engine.has_unfinished:
                    engine.step()
        elif op[0] == "preempt":
            _preempt_running(engine, op[1], op[2])
        elif op[0] == "abort" and added:
            rid = list(added)[op[1] % len(added)]
            if engine.is_open(rid):
                engine.abort(rid, "aborted by test")
        elif op[0] == "fault":
            faults.budget[op[1]] += op[2]
        engine.check_invariants()
    drain(engine)
    assert_all_accounted(engine, added)
    m = engine.metrics
    event(f"policy errors: {min(m.policy_errors, 3)}+, preemptions: {min(m.preemptions, 3)}+, "
          f"aborted: {sum(1 for r in m.requests.values() if r.error) > 0}")


# ============================================================================ the live executor on CPU
@functools.lru_cache(maxsize=1)
def _tiny_model():
    import tempfile

    import torch

    from kvrl.model import load_model, make_random_checkpoint
    path = Path(tempfile.mkdtemp(prefix="kvrl-fuzz-")) / "tiny"
    make_random_checkpoint(path, family="qwen3", preset="tiny", seed=1)
    return load_model(path, dtype=torch.float32, device="cpu")


def _live_engine(eviction=("lifo", {"mode": "auto"}), prefix_cache="hash_lru", num_blocks=40, scheduler=("fcfs", {}),
                 watermark=("fixed", {"fraction": 0.0})) -> Engine:
    import torch

    from kvrl.executors.live import LiveExecutor
    model, config = _tiny_model()
    executor = LiveExecutor(model, config, torch.device("cpu"), torch.float32, piecewise=False)
    return Engine(EngineConfig(num_blocks=num_blocks, block_size=4, num_cpu_blocks=24, max_model_len=256,
                               max_num_batched_tokens=32),
                  executor, plugins.create("scheduler", scheduler[0], **scheduler[1]),
                  plugins.create("watermark", watermark[0], **watermark[1]),
                  plugins.create("eviction", eviction[0], **eviction[1]), plugins.create("prefix_cache", prefix_cache))


def test_live_eviction_failure_on_a_fork_aborts_only_its_request():
    """On 87fbe4f the failing eviction aborted request A while A's first sample sat in the step's
    batch with its blocks freed, and the live executor died with IndexError in _prepare."""
    engine = _live_engine(num_blocks=4, prefix_cache="none", eviction=("lifo", {}))
    calls = []

    def failing_select(candidates):
        calls.append(len(candidates))
        raise RuntimeError("injected eviction crash")

    engine.eviction.select = failing_select
    summary = engine.run([make_request("A", tokens=list(range(1, 9)), output_len=4, n=2),
                          make_request("B", tokens=[11, 12], output_len=3)])
    assert calls and summary["aborted"] == 1 and summary["finished"] == 1
    assert "injected eviction crash" in engine.metrics.requests["A"].error
    assert len(engine.outputs("B")[0]) == 3
    assert_all_accounted(engine, {"A": (4, 2), "B": (3, 1)})


LIVE_OPS = st.lists(st.one_of(ADD, ADD, st.tuples(st.just("step"), st.integers(1, 3)),
                              st.tuples(st.just("preempt"), st.sampled_from(["swap", "recompute"]), st.integers(0, 10)),
                              st.tuples(st.just("abort"), st.integers(0, 50)),
                              st.tuples(st.just("fault"), st.sampled_from(FAULTS), st.integers(1, 3))),
                    min_size=6, max_size=20)


def test_live_executor_counts_every_host_gap():
    """Host time between live steps: all of it in host_gap_s; a gap over 50 ms (here a slow
    on_step_end hook) is counted in long_host_gaps, and left out of the step durations."""
    import time
    engine = _live_engine()
    slow = {"left": 1}

    def hook():
        if slow["left"]:
            slow["left"] -= 1
            time.sleep(0.08)

    engine._on_step_end.append(hook)
    summary = engine.run([make_request(f"g{i}", tokens=[(7 * i + j) % 500 for j in range(6 + i)], output_len=5)
                          for i in range(3)])
    assert summary["finished"] == 3
    wall = engine.metrics.wall_clock()
    assert wall["long_host_gaps"] == 1 and wall["host_gap_s"] >= 0.08
    assert wall["uncounted_host_gap_s"] >= 0.08 and wall["policy_time_s"] >= 0.08


@settings(max_examples=int(5 * SCALE), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=LIVE_OPS, eviction=st.sampled_from(EVICTIONS[:5]), prefix_cache=st.sampled_from(PREFIX_CACHES),
       scheduler=st.sampled_from(SCHEDULERS), seed=st.integers(0, 2**16))
def test_fuzz_live_executor_with_chaos_policies(ops, eviction, prefix_cache, scheduler, seed):
    """The chaos operations on the real model (CPU): no step crashes, invariants hold, all blocks free."""
    _drive(_live_engine(eviction=eviction, prefix_cache=prefix_cache, scheduler=scheduler), ops, seed)


# ============================================================================ known gaps (engine changes proposed)
def test_float_for_an_integer_field_is_a_config_error():
    with pytest.raises(ValueError, match="engine.block_size"):
        engine = make_engine(num_blocks=64, block_size=2.5)
        engine.run([make_request("a", 20, 4)])


def test_unchunked_request_longer_than_the_budget_is_rejected():
    engine = make_engine(num_blocks=64, block_size=4, chunked_prefill=False, max_num_batched_tokens=8)
    summary = engine.run([make_request("long", 20, 4), make_request("ok", 4, 2)])
    assert summary["finished"] == 1 and summary["rejected"] == 1
    assert "max_num_batched_tokens" in engine.metrics.rejected[0][1]
