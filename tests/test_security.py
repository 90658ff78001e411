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
from kvrl.engine.request import SeqStatus
from tests.helpers import make_engine, make_request

logging.getLogger("kvrl").setLevel(logging.ERROR)


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
    assert attack.fisher_exact_p(table) == pytest.approx(expected, rel=1e-9)


def test_two_means_threshold_is_label_free_and_exact():
    x = np.array([1.0, 1.1, 0.9, 5.0, 5.2, 4.8, 1.05])
    thr = attack.two_means_threshold(x)
    assert 1.1 < thr < 4.8
    assert attack.two_means_threshold(np.full(5, 2.0)) == 2.0           # no spread: all "fast"
    score = attack.score_probes(np.array([1, 1, 1, 9, 9, 9.0]), np.array([1, 1, 1, 0, 0, 0], bool), resamples=200)
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


@pytest.mark.parametrize("contended_only,peak", [(True, 10), (False, 5)])
def test_tenant_quota_holds_back_only_under_contention_unless_strict(contended_only, peak):
    """Tenant b runs one long request (it is active but asks for nothing more); tenant a sends 10
    requests of 6 blocks. Fair share = 32 of 64 blocks: the hard quota admits 5 of a's at once,
    the default (contended_only) admits all 10 since nobody else is waiting."""
    engine = make_engine(num_blocks=64, block_size=4, watermark="tenant_quota",
                         watermark_params={"contended_only": contended_only})
    reqs = [make_request("b", 8, 120, tenant="b", seed=1)]
    reqs += [make_request(f"a{i}", 24, 12, arrival_s=0.001, tenant="a", seed=10 + i) for i in range(10)]
    seen = [0]
    engine._on_step_end.append(
        lambda: seen.__setitem__(0, max(seen[0], sum(s.request.tenant == "a" for s in engine.running))))
    assert engine.run(reqs)["finished"] == 11
    assert seen[0] == peak


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
