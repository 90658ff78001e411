"""The host's speed (kvrl/executors/host_speed.py): the probe's ratio, the sim's ``host_speed``
factor on a profile's host terms, and the probes a profile's engine runs take."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from kvrl.executors.hardware import DEVICES, MODEL_SHAPES
from kvrl.executors.host_speed import PLAUSIBLE, host_probe_s, host_speed_factor, host_speed_ratio, probe_stats
from kvrl.executors.sim import SimExecutor
from kvrl.fidelity.pairs import pair_host_speed
from kvrl.profiling.host import StepTimer
from tests.helpers import make_request


def _stats(median: float, contention: float | None = None) -> dict:
    st = {"mean_s": median, "median_s": median, "p10_s": median, "p90_s": median, "n": 10}
    if contention is not None:
        st.update(cpu_s=1.0, wait_s=contention - 1.0, contention=contention)
    return st


def test_probe_stats_and_the_factor_of_live_over_profile_which_refuses_what_it_cannot_compare():
    st = probe_stats([3.0, 1.0, 2.0, math.nan, -1.0, 6.0])
    assert st == {"mean_s": 3.0, "median_s": 2.5, "p10_s": 1.0, "p90_s": 6.0, "n": 4}
    assert probe_stats([1.0], sched=(2.0, 0.5))["contention"] == pytest.approx(1.25)
    assert "contention" not in probe_stats([1.0], sched=(0.0, 0.0))     # schedstats off: nothing counted
    assert probe_stats([]) is None and probe_stats([math.nan]) is None
    # more work takes longer (minima over repetitions: a loaded machine deschedules single probes)
    assert 0 < min(host_probe_s(200) for _ in range(5)) < min(host_probe_s(200_000) for _ in range(3))
    # the median probes' ratio, times the contention ratio where both sides measured it
    assert host_speed_ratio(_stats(150e-6), _stats(100e-6)) == (
        pytest.approx(1.5), "median probe 150 us live / 100 us profiled")
    speed, why = host_speed_ratio(_stats(150e-6, 1.6), _stats(100e-6, 1.2))
    assert speed == pytest.approx(2.0) and "contention x1.60 live / x1.20 profiled" in why
    assert host_speed_ratio(_stats(150e-6, 1.6), _stats(100e-6))[0] == pytest.approx(1.5)
    assert host_speed_factor(_stats(150e-6, 1.6), _stats(100e-6, 1.2)) == pytest.approx(2.0)
    assert math.isnan(host_speed_factor(None, _stats(1e-4)))
    for live, prof, why in ((_stats(1e-4), None, "profile recorded no host probe"),
                            (None, _stats(1e-4), "live run recorded no host probe"),
                            (_stats(1e-4 * (PLAUSIBLE[1] + 0.1)), _stats(1e-4), "outside"),
                            (_stats(1e-4 * PLAUSIBLE[0] * 0.9), _stats(1e-4), "outside")):
        speed, note = host_speed_ratio(live, prof)
        assert speed == 1.0 and why in note


def test_host_meter_sums_the_threads_scheduler_times_over_runs_and_pools(monkeypatch):
    import kvrl.executors.host_speed as H

    sched = iter([(1.0, 0.1), (3.0, 0.6), (5.0, 0.6), (6.0, 1.1)])
    monkeypatch.setattr(H, "thread_sched_s", lambda: next(sched))
    monkeypatch.setattr(H, "host_probe_s", lambda: 2e-4)
    a = H.HostMeter()
    a.start(); a.probe(); a.stop()          # 2.0 s on a CPU, 0.5 s waiting
    a.start(); a.probe(); a.stop()          # 1.0 s, 0.5 s
    assert a.sched == (pytest.approx(3.0), pytest.approx(1.0)) and a.probes == [2e-4, 2e-4]
    b = H.HostMeter()
    b.probes = [4e-4]
    a.merge(b)                              # no scheduler times on b's side: a's kept
    st = a.stats()
    assert st["n"] == 3 and st["median_s"] == 2e-4 and st["contention"] == pytest.approx(4 / 3)
    monkeypatch.setattr(H, "thread_sched_s", lambda: None)
    c = H.HostMeter()
    c.start(); c.probe(); c.stop()
    assert c.sched is None and "contention" not in c.stats()


def test_pair_host_speed_reads_the_profile_probe_and_keeps_the_measured_ratio_when_not_applied():
    prof = SimpleNamespace(meta={"host_probe": _stats(1e-4)})
    got = pair_host_speed("probe", _stats(1.3e-4), prof)
    assert got["host_speed"] == pytest.approx(1.3) and got["host_probe_ratio"] == pytest.approx(1.3)
    fixed = pair_host_speed(1.0, _stats(1.3e-4), prof)
    assert fixed["host_speed"] == 1.0 and fixed["host_probe_ratio"] == pytest.approx(1.3)
    assert "as configured" in fixed["host_speed_note"]
    old = pair_host_speed("probe", _stats(1.3e-4), SimpleNamespace(meta={}))   # a profile from before session 20
    assert old["host_speed"] == 1.0 and math.isnan(old["host_probe_ratio"])
    assert pair_host_speed("probe", _stats(1.3e-4), None)["host_speed"] == 1.0   # roofline: no host terms


def _served(**sim_kw) -> tuple[list[float], SimExecutor]:
    """Per-step durations of a small run on the shipped H200 Qwen3-0.6B profile, and its sim."""
    from kvrl import plugins
    from kvrl.engine.config import EngineConfig
    from kvrl.engine.engine import Engine
    from kvrl.engine.metrics import STEP_COLUMNS

    sim = SimExecutor(MODEL_SHAPES["qwen3-0.6b"], DEVICES["h200"], profile="auto", **sim_kw)
    assert sim.profile is not None
    eng = Engine(EngineConfig(num_blocks=64, block_size=16, num_cpu_blocks=64, max_model_len=4096), sim,
                 plugins.create("scheduler", "fcfs"), plugins.create("watermark", "fixed"),
                 plugins.create("eviction", "lifo"), plugins.create("prefix_cache", "hash_lru"), record_steps=True)
    eng.run([make_request(f"r{i}", 200 + 50 * i, 40, arrival_s=0.01 * i, seed=i) for i in range(12)])
    return [row[STEP_COLUMNS.index("duration_s")] for row in eng.metrics.steps], sim


def test_sim_host_speed_scales_only_the_host_terms_and_is_exact_at_one():
    base, sim = _served(host_speed=1.0)
    assert base == _served()[0]                  # bit for bit what a sim without the argument serves
    slow, _ = _served(host_speed=1.5)
    # the same schedule (time does not enter this workload's decisions), every step longer by half
    # its host terms: at least half the base term, and a small part of a step on this profile
    assert len(slow) == len(base)
    h0 = sim.profile.model.host["base"]
    assert all(s - b >= 0.5 * h0 * (1 - 1e-9) for s, b in zip(slow, base) if b > 0)
    assert 0 < sum(slow) - sum(base) < 0.5 * sum(base)
    with pytest.raises(ValueError, match="host_speed=0"):
        SimExecutor(MODEL_SHAPES["qwen3-0.6b"], DEVICES["h200"], host_speed=0)


def test_model_host_scale_multiplies_exactly_the_host_part():
    from tests.helpers import known_eager_model, step_features

    m = known_eager_model(host={"per_admit": 2e-5, "per_wait": 1e-6})
    f = {**step_features([300, 40], pre=[(64, 0)]), "n_admit": 1, "n_wait": 5}
    fwd, with_host = m.predict_features(f, host=False), m.predict_features(f, host=True)
    assert m.predict_features(f, host=True, host_scale=1.0) == with_host
    assert m.predict_features(f, host=True, host_scale=3.0) == pytest.approx(fwd + 3 * (with_host - fwd), rel=1e-12)
    assert m.predict_features(f, host=False, host_scale=3.0) == fwd


def test_step_timer_probes_every_n_steps_and_keeps_the_probe_out_of_the_next_gap(monkeypatch):
    import kvrl.executors.host_speed as HS
    import kvrl.profiling.host as H

    clock = {"t": 0.0}

    def probe() -> float:
        clock["t"] += 0.5            # the probe takes half a second of wall time
        return 1e-4

    monkeypatch.setattr(HS, "host_probe_s", probe)
    monkeypatch.setattr(H.time, "perf_counter", lambda: clock["t"])
    timer = StepTimer(probe_every=2)
    ev = lambda el: SimpleNamespace(batch=None, execute_wall_s=0.001, output=SimpleNamespace(elapsed_s=el))
    for el in (0.01, 0.02, 0.53, 0.04, 0.55):
        timer.on_step(ev(el))
    assert timer.meter.probes == [1e-4, 1e-4]
    assert [round(el, 6) for _, _, el in timer.rows] == [0.01, 0.02, 0.03, 0.04, 0.05]


def test_host_speed_table_reads_a_run_and_its_probe_resim(tmp_path):
    """scripts/host_speed_table.py: per pair, the host total of the replay live, at the profile's
    host speed (the run's sim, undone to 1.0) and with the probe ratio (the resim's)."""
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location("host_speed_table", "scripts/host_speed_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    host = lambda live, sim: {"replay": {"by_kind": {"host": {"live_s": live, "sim_s": sim}}}}
    run, probe = tmp_path / "run", tmp_path / "probe"
    for d in (run, probe):
        d.mkdir()
    (run / "fidelity.json").write_text(json.dumps({
        "w/p": {**host(2.0, 1.0), "host_speed": 1.0, "live_host_probe": _stats(2e-4, 1.5)},
        "w/bad": {"error": "live run exceeded max_live_wall_s=1"}}))
    (probe / "fidelity.json").write_text(json.dumps({"w/p": {**host(2.0, 1.8), "host_speed": 1.8}}))
    rows = mod.rows("loaded", run, probe)
    assert len(rows) == 1 and rows[0]["err_flat"] == pytest.approx(-0.5) and rows[0]["err_probe"] == pytest.approx(-0.1)
    text = mod.table(rows, 3)
    assert "| loaded | w/p | 10, 200, 200 | x1.500 | x1.80 | 2.000 | -50.0% | -10.0% |" in text
    assert "50.0% at the profile's host speed, 10.0% with the probe ratio (1 pairs); 3 busy processes" in text


def test_host_probes_callback_and_the_ratio_recorded_beside_a_live_run(monkeypatch):
    """kvrl-run/kvrl-eval live: HostProbes probes every n-th step and meters the run;
    sim_beside.probe_ratio is the factor of that against the profile's (NaN without either)."""
    import kvrl.executors.host_speed as H
    from kvrl.apps.sim_beside import probe_ratio

    monkeypatch.setattr(H, "host_probe_s", lambda: 3e-4)
    sched = iter([(0.0, 0.0), (2.0, 0.4)])
    monkeypatch.setattr(H, "thread_sched_s", lambda: next(sched))
    cb = H.HostProbes(every=3)
    cb.on_run_start(None)
    assert all(cb.on_step(None) for _ in range(10)) and cb.meter.probes == [3e-4] * 3
    cb.on_run_end(None)
    live = cb.meter.stats()
    assert live["contention"] == pytest.approx(1.2)
    assert probe_ratio(live, SimpleNamespace(meta={"host_probe": _stats(2e-4, 1.0)})) == pytest.approx(1.8)
    assert math.isnan(probe_ratio(None, SimpleNamespace(meta={"host_probe": _stats(2e-4)})))
    assert math.isnan(probe_ratio(live, SimpleNamespace(meta={}))) and math.isnan(probe_ratio(live, None))
    with pytest.raises(ValueError, match="every=0"):
        H.HostProbes(every=0)
