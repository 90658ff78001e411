"""The sim's prediction recorded beside every live run (kvrl/apps/sim_beside.py, issue 16)."""
from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from kvrl.apps import sim_beside


def test_compare_gives_the_sims_relative_error_per_metric():
    live = {"throughput_tok_s": 100.0, "goodput_tok_s": 50.0, "ttft_p50_s": 0.2, "ttft_p99_s": float("nan"),
            "tpot_p50_s": 0.01, "preemptions": 0}
    sim = {"throughput_tok_s": 110.0, "goodput_tok_s": 45.0, "ttft_p50_s": 0.1, "ttft_p99_s": 1.0,
           "tpot_p50_s": 0.01, "preemptions": 3}
    err = sim_beside.compare(live, sim)
    assert err["throughput_tok_s"] == pytest.approx(0.10) and err["goodput_tok_s"] == pytest.approx(-0.10)
    assert err["ttft_p50_s"] == pytest.approx(-0.5) and err["tpot_p50_s"] == 0.0
    assert math.isnan(err["ttft_p99_s"]) and err["preemptions"] == float("inf")
    assert sim_beside.describe(err).startswith("sim vs live: throughput +10.0%, goodput -10.0%")


def test_live_kvrl_run_records_the_sims_prediction_of_the_same_run(tmp_path):
    """A live run on CPU (tiny model) writes sim_prediction.json: the same requests served by the
    sim with the live run's resolved pool, and the error per metric; the summary prints it."""
    out = tmp_path / "live"
    proc = subprocess.run([sys.executable, "-m", "kvrl.apps.run", "backend=live", "model=tiny",
                           "engine.num_blocks=64", "engine.num_cpu_blocks=32", "workload=synthetic",
                           "workload.num_requests=6", "progress=false", "plots=false", f"hydra.run.dir={out}"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    predicted = json.loads((out / "sim_prediction.json").read_text())
    assert predicted["requests"] == metrics["requests"] == 6 and predicted["finished"] == 6
    assert predicted["output_tokens"] == metrics["output_tokens"]
    assert predicted["num_blocks"] == metrics["num_blocks"] == 64 if "num_blocks" in predicted else True
    assert set(sim_beside.METRICS) <= set(predicted["error"]) and metrics["sim_error"] == predicted["error"]
    # ... and the same run at the run's own host speed (the roofline's replay error on its steps), with its error
    assert set(sim_beside.METRICS) <= set(predicted["at_host_speed"]) <= set(predicted["error_at_host_speed"]) | {""}
    assert predicted["host_speed_scale"] > 0 and "at this run's host speed" in proc.stderr + proc.stdout
    assert "host_probe_ratio" in predicted         # NaN here: no shipped profile of the tiny model on CPU
    # no profile matches the tiny model on CPU, so the live steps choose nothing and auto (roofline) prices it
    assert predicted["profile_choice"] == "auto" and predicted["profile_replay_errors"] == {}
    assert predicted["error"]["throughput_tok_s"] == pytest.approx(
        (predicted["throughput_tok_s"] - metrics["throughput_tok_s"]) / metrics["throughput_tok_s"])
    assert "sim vs live:" in proc.stdout and predicted["cost_source"] in ("roofline",) or \
        predicted["cost_source"].startswith("profile:")


def test_the_sim_beside_a_live_run_models_its_executor_mode():
    """The sim beside a live run models the live executor's graphs (decode graphs, whole-step
    graphs), so ``profile: auto`` picks a profile of that mode."""
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from kvrl.apps.sim_beside import sim_config

    cfg = OmegaConf.create({"backend": {"name": "live"}, "engine": {"num_blocks": 0}, "seed": 0})
    for steps in (False, True):
        live = SimpleNamespace(executor=SimpleNamespace(use_cuda_graphs=True, use_step_graphs=steps),
                               config=SimpleNamespace(num_blocks=64, num_cpu_blocks=8, max_model_len=512))
        sim = sim_config(cfg, live)
        assert sim.backend.step_graphs is steps and sim.backend.cuda_graphs and sim.engine.num_blocks == 64


def test_the_sim_beside_a_live_run_is_given_the_live_hosts_cpu_count(monkeypatch):
    """``predict`` builds its sim with ``host_cpus`` = this host's CPU count, so ``profile: auto``
    prefers a profile of the live host's class (kvrl.executors.profile.resolve_profile)."""
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    built = {}

    class Sim:
        def __init__(self, model, device, **kw):
            built.update(kw, model=model, device=device)
            self.cost_source, self.profile_staleness, self.profile = "roofline", None, None

    class Engine:
        def __init__(self, executor):
            self.executor = executor

        def run(self, requests):
            return {"requests": len(requests)}

    monkeypatch.setattr("kvrl.executors.sim.SimExecutor", Sim)
    monkeypatch.setattr("kvrl.builder.build_engine", lambda cfg, executor, record_steps: Engine(executor))
    monkeypatch.setattr(sim_beside.os, "cpu_count", lambda: 64)
    cfg = OmegaConf.create({"backend": {"name": "live"}, "engine": {"num_blocks": 0}, "seed": 0})
    live = SimpleNamespace(executor=SimpleNamespace(use_cuda_graphs=True, use_step_graphs=True,
                                                    cost_model=SimpleNamespace(model="shape", device="gpu")),
                           config=SimpleNamespace(num_blocks=64, num_cpu_blocks=8, max_model_len=512))
    summary = sim_beside.predict(cfg, live, [object()])
    assert built["host_cpus"] == 64 and built["profile"] == "auto" and built["step_graphs"] is True
    assert (built["model"], built["device"]) == ("shape", "gpu") and summary["requests"] == 1


def _served_by(profile_path: str, steps) -> tuple:
    """A sim run of Qwen3-0.6B on an H200 priced by ``profile_path``, standing in for a live run:
    its executed steps (``steps``, a StepLog) took exactly what that profile prices them."""
    from hydra import compose, initialize_config_module

    from omegaconf import OmegaConf

    import kvrl.apps.run  # noqa: F401  (stores run_schema and the plugin options)
    from kvrl.builder import build_engine
    from kvrl.workloads.config import build_workload

    overrides = ["backend=sim", f"backend.profile={profile_path}", "model=qwen3-0.6b", "device=h200",
                 "engine.num_blocks=256", "engine.num_cpu_blocks=256", "workload=synthetic",
                 "workload.num_requests=60", "workload.arrival.rate=200", "progress=false"]
    with initialize_config_module("kvrl.conf", version_base="1.3"):
        cfg = compose("run", overrides=overrides)
    engine = build_engine(cfg)
    requests = build_workload(OmegaConf.to_container(cfg.workload, resolve=True), vocab_size=engine.executor.vocab_size,
                              max_model_len=engine.config.max_model_len)
    engine.run(list(requests), callbacks=[steps])
    live = engine.executor        # stands in for a live executor: its graph modes, its cost model's shape and device
    live.cost_model, live.use_cuda_graphs, live.use_step_graphs = live, True, True
    return cfg, engine, requests


@pytest.mark.parametrize("host_class", [False, True])
def test_select_profile_picks_the_profile_that_prices_the_runs_own_steps(host_class):
    """Of the matching profiles (shipped defaults and host-class ones), select_profile picks the one
    whose prices of the run's executed steps sum closest to their live time: here the profile that
    produced the steps (error 0), and every other candidate's error is recorded (non-zero)."""
    from kvrl.executors.hardware import DEVICES, MODEL_SHAPES
    from kvrl.executors.profile import PACKAGED_DIR, matching_profiles

    shape, dev = MODEL_SHAPES["qwen3-0.6b"], DEVICES["h200"]
    candidates = [p.path for p in matching_profiles(shape, dev)]
    want = str(PACKAGED_DIR / ("h200x4/" if host_class else "") / "h200_qwen3-0.6b_bfloat16_step_graphs.json")
    assert want in candidates and len(candidates) >= 2            # both host classes' step-graph profiles
    assert not any("/archive/" in p for p in candidates)
    steps = sim_beside.StepLog()
    _, engine, _ = _served_by(want, steps)
    assert steps.batches and len(steps.batches) == len(steps.elapsed)
    best, errors = sim_beside.select_profile(engine.executor, steps, engine.config, True, True)
    assert best.path == want and set(errors) == set(candidates)
    # re-priced after the run (the batches' sequences have moved on by then): within 0.1%, not exact
    assert abs(errors[want]) < 1e-3
    # the other host class's profile prices these steps measurably off (0.7% since session 32's fit-11 defaults)
    assert all(abs(e) > abs(errors[want]) + 0.003 for p, e in errors.items() if p != want), errors


def test_predict_prices_with_the_profile_the_live_steps_choose_or_the_one_given():
    """``predict`` with the run's StepLog reports ``profile_choice: replay`` and prices the run with
    the chosen profile (so a run served by that profile is predicted exactly); with ``profile=`` given
    it uses that one ("given": kvrl-eval keeps its first run's choice for every later run)."""
    from kvrl.executors.profile import PACKAGED_DIR

    x4 = str(PACKAGED_DIR / "h200x4" / "h200_qwen3-0.6b_bfloat16_step_graphs.json")
    shipped = str(PACKAGED_DIR / "h200_qwen3-0.6b_bfloat16_step_graphs.json")
    steps = sim_beside.StepLog()
    cfg, engine, requests = _served_by(x4, steps)
    served = engine.metrics.summary()
    chosen = sim_beside.predict(cfg, engine, requests, steps=steps)
    assert chosen["profile_choice"] == "replay" and chosen["cost_source"] == f"profile:{x4}"
    assert abs(chosen["profile_replay_errors"][x4]) < 1e-3
    given = sim_beside.predict(cfg, engine, requests, profile=shipped)
    assert given["profile_choice"] == "given" and given["cost_source"] == f"profile:{shipped}"
    assert given["profile_replay_errors"] == {} and given["throughput_tok_s"] != chosen["throughput_tok_s"]
    assert chosen["throughput_tok_s"] == pytest.approx(served["throughput_tok_s"])
    # the replay error of the cost model used, on the run's own steps: the chosen profile's is about 0;
    # given another profile with the steps, that profile's (the host-speed gap kvrl-eval records per run)
    assert chosen["replay_error"] == chosen["profile_replay_errors"][x4]
    other = sim_beside.predict(cfg, engine, requests, steps=steps, profile=shipped)
    assert other["replay_error"] == pytest.approx(chosen["profile_replay_errors"][shipped], rel=1e-9)
    assert math.isnan(given["replay_error"])            # no steps, no replay
    # at the run's own host speed (step_time_scale = 1 / (1 + replay_error)): the other profile, scaled to the speed
    # the run's steps show, lands closer to what was served than unscaled; without steps there is no such run
    assert other["host_speed_scale"] == pytest.approx(1.0 / (1.0 + other["replay_error"]))
    off = lambda pred: abs(pred["throughput_tok_s"] / served["throughput_tok_s"] - 1)
    assert off(other["at_host_speed"]) < off(other)
    assert chosen["at_host_speed"]["throughput_tok_s"] == pytest.approx(served["throughput_tok_s"], rel=2e-3)
    assert math.isnan(given["host_speed_scale"]) and all(math.isnan(v) for v in given["at_host_speed"].values())
    # calibrated on earlier runs of the host (their mean replay error; non-finite ones left out): at the same speed
    # as this run's own, the same prediction as at_host_speed; with no finite earlier error, none
    err = other["replay_error"]
    cal = sim_beside.predict(cfg, engine, requests, steps=steps, profile=shipped,
                             earlier_replay_errors=(err - 0.01, float("nan"), err + 0.01))
    assert cal["calibration_scale"] == pytest.approx(other["host_speed_scale"])
    assert cal["calibrated"] == pytest.approx(other["at_host_speed"])
    assert math.isnan(other["calibration_scale"]) and all(math.isnan(v) for v in other["calibrated"].values())


def test_matching_profiles_counts_a_directory_on_the_path_and_shipped_once(monkeypatch):
    """$KVRL_PROFILE_PATH naming the shipped h200x4/ directory adds no second copy of its profiles."""
    from kvrl.executors import profile as P
    from kvrl.executors.hardware import DEVICES, MODEL_SHAPES

    shape, dev = MODEL_SHAPES["qwen3-0.6b"], DEVICES["h200"]
    P.clear_cache()
    plain = [p.path for p in P.matching_profiles(shape, dev)]
    monkeypatch.setenv(P.ENV_PATH, str(P.PACKAGED_DIR / "h200x4"))
    P.clear_cache()
    try:
        again = [p.path for p in P.matching_profiles(shape, dev)]
    finally:
        P.clear_cache()
    assert len(again) == len(plain) == len(set(plain))
