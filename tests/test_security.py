"""Isolation and robustness: the prefix-probing timing attack against the cache scopes, the
fill-and-squeeze defences (kvrl/plugins/defences.py), and plugin crashes in the defences.

The experiments run on the sim backend (deterministic); docs/security.md has the full-size tables.
"""
from __future__ import annotations

import json
import logging
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from kvrl import plugins
from kvrl.apps import attack
from kvrl.attacks import scoring
from kvrl.engine.callbacks import EngineCallback
from kvrl.engine.request import SeqStatus
from tests.helpers import make_engine, make_request, quiet_kvrl_logs

_quiet_kvrl_logs = quiet_kvrl_logs(logging.ERROR)


def attack_cfg(command: str, *overrides: str):
    """The composed ``conf/attack.yaml`` for ``command`` (what ``kvrl-attack <command>`` runs)."""
    from hydra import compose, initialize_config_module
    from kvrl.apps.schema import register_schemas

    plugins.available("scheduler")
    register_schemas()
    attack.register_attack_schema()
    with initialize_config_module("kvrl.conf", version_base="1.3"):
        return compose("attack", overrides=[f"command={command}", f"workload={attack.DEFAULT_WORKLOAD[command]}",
                                            *overrides])


# ============================================================================ statistics
@pytest.mark.parametrize("table,expected", [   # reference values: scipy.stats.fisher_exact (two-sided)
    ([[8, 2], [1, 5]], 0.034965034965034975), ([[3, 1], [1, 3]], 0.48571428571428565),
    ([[10, 0], [0, 10]], 1.082508822446903e-05), ([[5, 5], [5, 5]], 1.0), ([[0, 7], [4, 2]], 0.02097902097902098)])
def test_fisher_exact_matches_reference(table, expected):
    assert scoring.fisher_exact_p(table) == pytest.approx(expected, rel=1e-9)


def test_two_means_threshold_is_label_free_and_exact():
    x = np.array([1.0, 1.1, 0.9, 5.0, 5.2, 4.8, 1.05])
    thr = scoring.two_means_threshold(x)
    assert 1.1 < thr < 4.8
    assert scoring.two_means_threshold(np.full(5, 2.0)) == 2.0           # no spread: all "fast"
    score = scoring.score_probes(np.array([1, 1, 1, 9, 9, 9.0]), np.array([1, 1, 1, 0, 0, 0], bool), resamples=200)
    assert score["accuracy"] == 1.0 and score["auc"] == 1.0 and score["gap_s"] == 8.0


# ============================================================================ prefix probing
@pytest.fixture(scope="module")
def probe_result(tmp_path_factory):
    cfg = attack_cfg("prefix_probe", "attack.resamples=1000")
    return attack.run(cfg, tmp_path_factory.mktemp("probe"))


def test_prefix_probe_tenant_scope_attacker_is_at_chance(probe_result):
    """Scoped cache (default): the attacker's prediction is independent of the truth (Fisher's
    exact test of predicted vs true label does not reject at 5%; the 95% Wilson interval of the
    accuracy contains 0.5) and there is no TTFT gap (its bootstrap 95% interval contains 0, the
    permutation test does not reject, and it is under a tenth of the gap that sharing opens)."""
    rows = {r["scope"]: r for r in probe_result["rows"]}
    tenant, shared = rows["tenant"], rows["global"]
    assert tenant["probes"] == 200 and tenant["probes_lost"] == 0
    assert tenant["fisher_p"] > 0.05
    assert tenant["accuracy_ci"][0] <= 0.5 <= tenant["accuracy_ci"][1]
    assert tenant["gap_ci_s"][0] <= 0.0 <= tenant["gap_ci_s"][1] and tenant["gap_perm_p"] > 0.05
    assert abs(tenant["gap_s"]) < 0.1 * shared["gap_s"]
    assert 0.35 < tenant["auc"] < 0.65


def test_prefix_probe_global_scope_attack_succeeds(probe_result):
    """Shared cache (explicit opt-in): the same harness reconstructs the labels (measured
    accuracy 0.95 on the sim; asserted >= 0.9) and the hit/miss gap is present."""
    shared = {r["scope"]: r for r in probe_result["rows"]}["global"]
    assert shared["accuracy"] >= 0.9 and shared["fisher_p"] < 1e-20
    assert shared["gap_ci_s"][0] > 0 and shared["gap_perm_p"] < 0.01 and shared["auc"] > 0.9
    assert shared["ttft_correct_mean_s"] < shared["ttft_wrong_mean_s"]


def test_single_account_sees_its_own_probes_not_the_victim(tmp_path):
    """With one attacker account, correct probes hit the attacker's *own* earlier correct probes
    even with a tenant-scoped cache: the gap measured is self-inflicted (no victim involved),
    which is why the harness defaults to one account per probe."""
    cfg = attack_cfg("prefix_probe", "attack.accounts=single", "attack.scopes=[tenant]", "attack.resamples=200",
                     "workload.victim.arrival.rate=0.001")
    row = attack.run(cfg, tmp_path)["rows"][0]
    assert row["victim_requests"] <= 1 and row["gap_s"] > 0 and row["accuracy"] > 0.8


def test_kvrl_attack_cli_writes_tables(tmp_path):
    out = tmp_path / "pp"
    proc = subprocess.run([sys.executable, "-m", "kvrl.apps.attack", "prefix-probe", f"hydra.run.dir={out}",
                           "workload.num_probes=40", "attack.resamples=200"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "prefix_probe.json").read_text())
    assert [r["scope"] for r in result["rows"]] == ["tenant", "global"] and result["rows"][0]["probes"] == 40
    assert "| tenant | per_probe |" in (out / "prefix_probe.md").read_text() and "| global |" in proc.stdout
    assert (out / "probes.csv").read_text().count("\n") == 81
    bad = subprocess.run([sys.executable, "-m", "kvrl.apps.attack", "no-such-command"], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and "prefix-probe" in bad.stderr


def test_prefix_probe_live_backend_on_cpu(tmp_path):
    """The same harness on the live executor (tiny random model on CPU). Its TTFTs are wall-clock
    and a shared CI machine makes them noisy, so this checks the mechanism, not the timing: every
    probe is scored in both scopes, and only the global scope lets probes hit the victim's blocks.
    (Timing on a GPU: docs/security.md.)"""
    pytest.importorskip("torch")
    cfg = attack_cfg("prefix_probe", "backend=live", "model=tiny", "engine.num_blocks=256", "attack.resamples=100",
                     "attack.prefix_probe.workload.num_probes=10", "attack.prefix_probe.workload.horizon_s=12",
                     "workload.attack_start_s=6", "workload.victim.arrival.rate=0.3", "workload.victim.output_len.mean=2",
                     "workload.victim.prompt_len.mean=16", "workload.victim.system_prompt_len=256")
    rows = {r["scope"]: r for r in attack.run(cfg, tmp_path)["rows"]}
    assert all(r["probes"] == 10 and r["probes_lost"] == 0 and r["ttft_correct_mean_s"] > 0 for r in rows.values())
    assert rows["global"]["prefix_hit_rate"] > rows["tenant"]["prefix_hit_rate"]


# ============================================================================ block identity (issue #14)
def _old_salt_rule(scope, tenant, salt):
    """The pre-#14 rule: an explicit cache_salt *replaced* the tenant."""
    if salt is not None:
        return salt.encode()
    return tenant.encode() if scope == "tenant" else b""


def test_xxh3_model_matches_xxhash_and_a_forged_block_hits_its_target():
    import xxhash
    from kvrl.attacks.forge import forge_block, xxh3_block_hash
    rng = np.random.default_rng(3)
    blocks = rng.integers(0, 151_936, (20, 16))
    for seed in (0, 2**64 - 5):
        assert [int(h) for h in xxh3_block_hash(blocks, seed)] == [
            xxhash.xxh3_64_intdigest(b.astype("<i8").tobytes(), seed=seed) for b in blocks]
    target = xxhash.xxh3_64_intdigest(blocks[0].astype("<i8").tobytes(), seed=11)
    forged = forge_block(target, seed=99, vocab_size=151_936, rng=rng)
    assert forged.min() >= 0 and forged.max() < 151_936 and not np.array_equal(forged, blocks[0])
    assert xxhash.xxh3_64_intdigest(forged.astype("<i8").tobytes(), seed=99) == target


def test_cache_salt_is_unambiguous_and_an_explicit_salt_only_narrows():
    from kvrl.engine.allocators import cache_salt
    assert cache_salt("tenant", "a", "bc") != cache_salt("tenant", "ab", "c")
    assert cache_salt("tenant", "b", "a") != cache_salt("tenant", "a", None)     # naming a tenant is no key
    assert cache_salt("tenant", "a", None) != cache_salt("tenant", "a", "")
    assert cache_salt("global", None, None) == cache_salt("global", "x", None)    # global ignores the tenant
    assert cache_salt("global", "x", "s") != cache_salt("global", "x", None)
    with pytest.raises(ValueError, match="engine.prefix_cache_scope"):
        cache_salt("none", "a", None)
    # the engine: same tenant and salt share, a different salt does not, the victim's name as salt does not
    prompt = np.arange(48, dtype=np.int32)
    for salt_b, tenant_b, hit in ((None, "a", True), ("s", "a", False), ("a", "b", False)):
        engine = make_engine(num_blocks=64, block_size=16)
        engine.run([make_request("first", tokens=prompt, tenant="a"),
                    make_request("second", tokens=prompt, arrival_s=1.0, tenant=tenant_b, cache_salt=salt_b)])
        assert engine.metrics.prompt_tokens_hit == (32 if hit else 0), (salt_b, tenant_b)


def test_engine_prefix_hash_is_validated_naming_the_key():
    from kvrl.engine.config import EngineConfig
    with pytest.raises(ValueError, match="engine.prefix_hash must be one of"):
        EngineConfig(prefix_hash="md5")
    with pytest.raises(ValueError, match="engine.prefix_hash_key must be one of"):
        EngineConfig(prefix_hash_key="fixed")


def _victim_then_forger(victim_tokens, forged_block):
    """The victim caches a 48-token prompt; 1 s later tenant 'mallory' sends the forged first
    block followed by the victim's blocks 2 and 3 (and one token of its own)."""
    forger = np.concatenate([forged_block, victim_tokens[16:48], [7]]).astype(np.int32)
    return [make_request("victim", tokens=victim_tokens, tenant="victim", output_len=2),
            make_request("forger", tokens=forger, arrival_s=1.0, tenant="mallory", output_len=2)]


@pytest.mark.parametrize("cache", ["hash_lru", "hash_lfu", "radix_lru"])
def test_a_forged_block_with_an_equal_xxh3_identity_is_not_reused_under_the_default(monkeypatch, cache):
    """A real forgery: mallory's first block differs from the victim's but has the victim's xxh3
    identity (chained from mallory's own tenant salt). With prefix_hash=xxh3 it is reused (all 48
    of the victim's tokens are a hit for mallory). Under the default, even with the hash made to
    collide exactly as xxh3 does (monkeypatched), the hit check sees other tokens and refuses:
    no reuse, one failure counted, and the victim's cached blocks are left in place. In each of
    the three prefix caches: the check is the allocator's, not the policy's."""
    from kvrl.attacks.forge import forge_prefix
    from kvrl.engine.allocators import cache_salt
    from kvrl.engine.hashing import TOKEN_WIDTH, BlockHasher
    victim = np.random.default_rng(5).integers(0, 1000, 48).astype(np.int32)
    forged = forge_prefix(victim[:16], cache_salt("tenant", "victim", None), cache_salt("tenant", "mallory", None),
                          vocab_size=1000, seed=1)
    assert not np.array_equal(forged, victim[:16])
    xxh3 = make_engine(num_blocks=64, block_size=16, prefix_hash="xxh3", prefix_cache=cache)
    xxh3.run(_victim_then_forger(victim, forged))
    assert xxh3.metrics.prompt_tokens_hit == 48                    # the forgery works against xxh3
    default = make_engine(num_blocks=64, block_size=16, prefix_cache=cache)
    assert default.config.prefix_hash == "blake2b"
    default.run(_victim_then_forger(victim, forged))
    assert default.metrics.prompt_tokens_hit == 0
    as_xxh3, root, extend, chain = BlockHasher("xxh3"), BlockHasher.root, BlockHasher.extend, BlockHasher.chain
    monkeypatch.setitem(TOKEN_WIDTH, "blake2b", TOKEN_WIDTH["xxh3"])     # the bytes xxh3 hashes (int64 ids)
    monkeypatch.setattr(BlockHasher, "root", lambda self, salt: root(as_xxh3, salt))
    monkeypatch.setattr(BlockHasher, "extend", lambda self, *a, **kw: extend(as_xxh3, *a, **kw))
    monkeypatch.setattr(BlockHasher, "chain", lambda self, *a: chain(as_xxh3, *a))
    colliding = make_engine(num_blocks=64, block_size=16, prefix_cache=cache)
    assert colliding.allocator._hasher.checked
    summary = colliding.run(_victim_then_forger(victim, forged))
    assert colliding.metrics.prompt_tokens_hit == 0 and summary["prefix_check_failures"] == 1
    victim_ids: list = []                      # the victim's first block is still cached, with its own tokens
    as_xxh3.extend(victim_ids, victim, 16, 1, cache_salt("tenant", "victim", None))
    block = colliding.allocator.prefix_cache.lookup(victim_ids[0])
    assert colliding.allocator._registered_identity(block)[1] == victim[:16].astype("<i8").tobytes()
    assert summary["finished"] == 2
    colliding.check_invariants()


@pytest.mark.parametrize("name", ["blake2b", "sha256", "xxh3"])
def test_a_hasher_copies_and_pickles_to_the_same_identities(name):
    """An engine is deep-copied by the rollout planner and pickled to workers: the hasher (whose
    blake2b and sha256 states cannot be pickled) copies as itself and pickles from its name and key."""
    import copy
    import pickle

    from kvrl.engine.hashing import make_hasher

    hasher = make_hasher(name, "seed", 3)
    data = bytes(range(64))
    want = hasher.chain(hasher.root(b"salt"), data)
    assert copy.deepcopy(hasher) is hasher
    again = pickle.loads(pickle.dumps(hasher))
    assert again.chain(again.root(b"salt"), data) == want and again.checked == hasher.checked


def test_results_do_not_depend_on_the_block_identity_hash_or_its_key():
    """Identities are internal: with every hash (and two random keys) the same workload with
    shared prefixes gives bit-for-bit the same summary and per-request records."""
    def run(**kw):
        rng = np.random.default_rng(0)
        system = rng.integers(0, 1000, 64)
        reqs = [make_request(f"r{i}", tokens=np.concatenate([system, rng.integers(0, 1000, int(rng.integers(1, 40)))]),
                             output_len=int(rng.integers(1, 30)), arrival_s=0.01 * i, tenant=f"t{i % 3}",
                             n=1 + (i % 4 == 0)) for i in range(60)]
        engine = make_engine(num_blocks=48, block_size=8, **kw)
        summary = engine.run(reqs)
        engine.check_invariants()
        return summary, [(r.request_id, r.ttft_s, r.finish_s, r.num_preemptions) for r in engine.metrics.requests.values()]
    base = run()
    assert base[0]["prefix_hit_rate"] > 0.3 and base[0]["preemptions"] > 0
    for kw in ({}, {"prefix_hash": "sha256"}, {"prefix_hash": "xxh3"}, {"prefix_hash_key": "seed"}):
        assert run(**kw) == base, kw


PROBE_ATTACKS = ["attack.scopes=[tenant]", "attack.probers=[forge,salt_spoof]", "attack.prefix_hashes=[blake2b,xxh3]",
                 "attack.resamples=500"]


def _at_chance(row):
    return (row["fisher_p"] > 0.05 and row["gap_ci_s"][0] <= 0.0 <= row["gap_ci_s"][1]
            and row["accuracy_ci"][0] <= 0.5 <= row["accuracy_ci"][1])


def _succeeds(row):
    return row["accuracy"] >= 0.85 and row["fisher_p"] < 1e-6 and row["gap_ci_s"][0] > 0


def test_forging_and_salt_spoofing_attackers_are_at_chance_with_the_defaults(tmp_path):
    """kvrl-attack prefix-probe with the two new attackers, one account per probe, tenant scope,
    the preset's 200 probes over 60 s. The forger (a Wagner 8-list collision against xxh3 per
    attacker account) reconstructs the labels against prefix_hash=xxh3 (measured with the
    whole-step graph profile shipped in session 17: accuracy 0.955, Fisher p < 1e-20); against the
    default keyed blake2b, and the salt spoofer against either hash, sit at chance (Fisher's test
    does not reject, the TTFT gap's 95% interval contains 0; measured: accuracy 0.515, p = 0.71,
    gap CI -0.15 to 0.21 ms). Fewer probes make the gap fragile: the TTFT of an unqueued probe is
    one of two step times, so a few probes queued behind the victim's traffic decide the mean. With
    80 probes, 8 of the 40 wrong and 2 of the 40 correct ones were queued, a chance split (Fisher
    p 0.09) that put the gap's bootstrap interval at 0.03-0.55 ms."""
    rows = {r["run"]: r for r in attack.run(attack_cfg("prefix_probe", *PROBE_ATTACKS), tmp_path)["rows"]}
    assert sorted(rows) == ["tenant/blake2b/forge", "tenant/blake2b/salt_spoof", "tenant/xxh3/forge",
                            "tenant/xxh3/salt_spoof"]
    assert all(r["probes"] == 200 and r["probes_lost"] == 0 for r in rows.values())
    assert _succeeds(rows["tenant/xxh3/forge"]), rows["tenant/xxh3/forge"]
    for run in ("tenant/blake2b/forge", "tenant/blake2b/salt_spoof", "tenant/xxh3/salt_spoof"):
        assert _at_chance(rows[run]), rows[run]
    assert "| tenant/xxh3/forge | per_probe | forge | xxh3 |" in (tmp_path / "prefix_probe.md").read_text()


def test_salt_spoofing_succeeds_under_the_old_salt_rule(tmp_path, monkeypatch):
    """The same salt spoofer against the pre-#14 rule (cache_salt replaced the tenant), rebuilt
    here: it shares the victim's cache and reads the labels."""
    from kvrl.engine import allocators
    monkeypatch.setattr(allocators, "cache_salt", _old_salt_rule)
    cfg = attack_cfg("prefix_probe", "attack.scopes=[tenant]", "attack.probers=[salt_spoof]", "attack.resamples=500",
                     "attack.prefix_probe.workload.num_probes=80", "attack.prefix_probe.workload.horizon_s=25")
    row = attack.run(cfg, tmp_path)["rows"][0]
    assert row["prober"] == "salt_spoof" and _succeeds(row), row


# ============================================================================ defences: unit behaviour
def _view(seq_id, admit_order, num_preemptions=0, tenant="a", num_blocks=1):
    return SimpleNamespace(seq_id=seq_id, admit_order=admit_order, num_preemptions=num_preemptions, tenant=tenant,
                           num_blocks=num_blocks, num_computed=0, priority=0)


def test_capped_never_picks_a_capped_victim_unless_all_are():
    policy = plugins.create("eviction", "capped", max_preemptions=2)
    cands = [_view(0, 0), _view(1, 5, num_preemptions=2), _view(2, 3, num_preemptions=1)]
    assert policy.select(cands).seq_id == 2          # lifo would pick seq 1 (newest), which is capped
    assert policy.select([_view(1, 5, 2), _view(3, 7, 3)]).seq_id == 3   # all capped: the inner rule decides
    assert plugins.create("eviction", "capped", inner_mode="swap").select(cands).mode.value == "swap"


def test_tenant_fair_evicts_from_the_biggest_tenant():
    policy = plugins.create("eviction", "tenant_fair")
    running = [_view(0, 0, tenant="hog", num_blocks=30), _view(1, 1, tenant="small", num_blocks=4),
               _view(2, 2, tenant="hog", num_blocks=30), _view(3, 3, tenant="small", num_blocks=4)]
    policy.bind(SimpleNamespace(running=tuple(running), num_free_cpu_blocks=0))
    assert policy.select(running).seq_id == 2        # newest of the hog, not the newest overall (3)
    assert policy.select(running[1:2] + running[3:]).seq_id == 3


def test_thrash_guard_raises_the_reservation_and_decays_back():
    policy = plugins.create("watermark", "thrash_guard", threshold=2, window_s=1.0, step_fraction=0.1,
                            half_life_s=2.0, inner_fraction=0.0)
    engine = SimpleNamespace(now=0.0, num_blocks=1000)
    policy.bind(engine)
    seqs = [SimpleNamespace(seq_id=i, status=SeqStatus.WAITING) for i in range(2)]
    for s in seqs:
        policy.on_preempt(s, "recompute")
    engine.now = 0.5
    for s in seqs:
        s.status = SeqStatus.RUNNING                   # both readmitted within the window: 2 cycles
    policy.on_step_end()
    assert policy.num_cycles == 2 and policy.reserved_blocks() == 100
    engine.now = 2.5
    policy.on_step_end()
    assert policy.reserved_blocks() == 50            # one half-life later
    engine.now = 60.0
    policy.on_step_end()
    assert policy.reserved_blocks() == 0


def test_defence_parameters_are_validated_naming_the_key():
    with pytest.raises(ValueError, match="unknown watermark plugin 'nope'"):
        plugins.create("watermark", "tenant_quota", inner="nope")
    with pytest.raises(ValueError, match="fraction must be < 1.0"):
        plugins.create("watermark", "thrash_guard", inner_fraction=1.5)
    with pytest.raises(ValueError, match="inner_fraction applies to inner=fixed only"):
        plugins.create("watermark", "tenant_quota", inner="opt_factor", inner_fraction=0.1)
    with pytest.raises(ValueError, match="max_preemptions must be >= 0"):
        plugins.create("eviction", "capped", max_preemptions=-1)
    with pytest.raises(ValueError, match="unknown parameter"):
        plugins.create("eviction", "capped", inner="cost_aware", inner_params={"mode": "swap"})
    nested = plugins.create("watermark", "tenant_quota", inner="thrash_guard",
                            inner_params={"inner": "opt_factor", "inner_params": {"a": 3.0}})
    assert nested.inner.inner.params.a == 3.0


def _hog_and_newcomer():
    """Tenant 'hog' queues 12 long requests at t=0; tenant 'new' sends one small request right after."""
    reqs = [make_request(f"hog{i}", 36, 40, tenant="hog", seed=i) for i in range(12)]
    return reqs + [make_request("new", 8, 4, arrival_s=0.001, tenant="new", seed=99)]


def test_tenant_quota_lets_a_newcomer_pass_the_hogs_queue():
    ttft = {}
    for watermark in ("fixed", "tenant_quota"):
        engine = make_engine(num_blocks=64, block_size=4, watermark=watermark)
        summary = engine.run(_hog_and_newcomer())
        assert summary["finished"] == 13
        ttft[watermark] = engine.metrics.requests["new"].ttft_s
        engine.check_invariants()
    assert ttft["tenant_quota"] < ttft["fixed"] / 5


class _PeakRunning(EngineCallback):
    """Most running sequences of ``tenant`` seen after any step."""

    def __init__(self, engine, tenant: str) -> None:
        self.engine, self.tenant, self.peak = engine, tenant, 0

    def on_step(self, event) -> bool:
        self.peak = max(self.peak, sum(s.request.tenant == self.tenant for s in self.engine.running))
        return True


@pytest.mark.parametrize("contended_only,peak", [(True, 10), (False, 5)])
def test_tenant_quota_holds_back_only_under_contention_unless_strict(contended_only, peak):
    """Tenant b runs one long request (it is active but asks for nothing more); tenant a sends 10
    requests of 6 blocks. Fair share = 32 of 64 blocks: the hard quota admits 5 of a's at once,
    the default (contended_only) admits all 10 since nobody else is waiting."""
    engine = make_engine(num_blocks=64, block_size=4, watermark="tenant_quota",
                         watermark_params={"contended_only": contended_only})
    reqs = [make_request("b", 8, 120, tenant="b", seed=1)]
    reqs += [make_request(f"a{i}", 24, 12, arrival_s=0.001, tenant="a", seed=10 + i) for i in range(10)]
    peak_a = _PeakRunning(engine, "a")
    assert engine.run(reqs, callbacks=[peak_a])["finished"] == 11
    assert peak_a.peak == peak


def test_tenant_quota_is_a_no_op_for_a_single_tenant():
    reqs = [r for r in _hog_and_newcomer() if r.tenant == "hog"]
    a = make_engine(num_blocks=64, block_size=4, watermark="fixed").run(reqs)
    b = make_engine(num_blocks=64, block_size=4, watermark="tenant_quota").run(reqs)
    assert a == b


# ============================================================================ fill and squeeze
SMALL_FILL_SQUEEZE = [
    "attack.only=[undefended,recommended,all]", "attack.fill_squeeze.workload.horizon_s=20",
    "attack.fill_squeeze.workload.attack_start_s=2", "+attack.fill_squeeze.workload.probe_count=0",
    "attack.fill_squeeze.workload.flood_count=40", "attack.fill_squeeze.workload.squeeze_count=60"]


def test_fill_and_squeeze_defences_keep_benign_goodput(tmp_path):
    """Small version of the docs/security.md experiment (20 s of benign traffic, 40 max-length
    flood requests, 2048 blocks; sim with the shipped H200 profile). Measured: the undefended engine
    keeps 0.201 of the no-attack benign goodput; recommended (tenant_quota / capped(tenant_fair))
    keeps 0.996 and all (the same + thrash_guard) 1.000, with at most 1 preemption per benign
    request. Asserted:
    defended >= 0.9 of the baseline, undefended < 0.5, at most 2 preemptions per benign request
    (the cap) with the defences, and no cost without the attack."""
    result = attack.run(attack_cfg("fill_squeeze", *SMALL_FILL_SQUEEZE), tmp_path)
    rows = {r["defence"]: r for r in result["rows"]}
    undefended = rows["undefended"]
    assert undefended["attack_fraction_of_baseline"] < 0.5
    for name in ("recommended", "all"):
        defended = rows[name]
        assert defended["attack_fraction_of_baseline"] >= 0.9
        assert defended["attack_fraction_of_baseline"] > undefended["attack_fraction_of_baseline"] + 0.4
        assert defended["attack"]["benign_max_preemptions"] <= 2
        assert defended["benign_cost"] == 0.0        # no attack, one benign tenant: the defences cost nothing
    for r in rows.values():
        assert r["attack"]["aborted"] == r["attack"]["policy_errors"] == 0
        assert r["attack"]["attacker_finished"] == r["attack"]["attacker_requests"]   # delayed, not denied
    assert (tmp_path / "fill_squeeze.png").stat().st_size > 10_000
    assert "| recommended |" in (tmp_path / "fill_squeeze.md").read_text()


# ============================================================================ crashes in the defences
class _Flaky:
    """Wraps a policy method to raise on selected calls."""

    def __init__(self, fn, fail_on):
        self.fn, self.fail_on, self.calls = fn, set(fail_on), 0

    def __call__(self, *args):
        self.calls += 1
        if self.calls in self.fail_on:
            raise RuntimeError("injected plugin crash")
        return self.fn(*args)


def _two_tenant_pressure(seed=0, n=24):
    rng = np.random.default_rng(seed)
    return [make_request(f"q{i}", int(rng.integers(8, 40)), int(rng.integers(20, 60)), seed=i,
                         tenant="hog" if i % 3 else "small", arrival_s=0.002 * i) for i in range(n)]


def _defended_engine(**kw):
    return make_engine(num_blocks=40, block_size=4, num_cpu_blocks=0, watermark="tenant_quota",
                       watermark_params={"inner": "thrash_guard", "inner_params": {"inner_fraction": 0.0}},
                       eviction="capped", eviction_params={"inner": "tenant_fair"}, **kw)


def _assert_accounted(engine, reqs):
    engine.check_invariants()
    assert engine.allocator.num_used_blocks == 0 and not engine.has_unfinished
    for r in reqs:
        rec = engine.metrics.requests[r.request_id]
        assert (rec.finish_s is not None and not rec.error and rec.output_tokens == r.output_len) or rec.error


def test_crash_in_capped_inner_victim_rule_aborts_only_the_affected_request():
    engine = _defended_engine()
    engine.eviction.inner.select = _Flaky(engine.eviction.inner.select, fail_on={2})
    reqs = _two_tenant_pressure()
    summary = engine.run(reqs)
    assert summary["preemptions"] > 0 and summary["policy_errors"] == 1 and summary["aborted"] == 1
    assert summary["finished"] == len(reqs) - 1
    aborted = [r for r in engine.metrics.requests.values() if r.error]
    assert "eviction policy failed: RuntimeError: injected plugin crash" in aborted[0].error
    _assert_accounted(engine, reqs)


def test_crashes_in_quota_and_thrash_guard_fall_back_and_lose_nothing():
    engine = _defended_engine()
    wm = engine.watermark
    wm.admit = _Flaky(wm.admit, fail_on={1, 3})                                  # veto: admits
    wm.inner.inner.reserved_blocks = _Flaky(wm.inner.inner.reserved_blocks, fail_on={2, 7})   # -> 0.01 fallback
    engine._on_step_end = [_Flaky(h, fail_on={5}) for h in engine._on_step_end]  # thrash_guard bookkeeping
    reqs = _two_tenant_pressure(seed=1)
    summary = engine.run(reqs)
    assert summary["finished"] == len(reqs) and summary["aborted"] == 0
    assert summary["policy_errors"] == 2 + 2 + len(engine._on_step_end)
    _assert_accounted(engine, reqs)
