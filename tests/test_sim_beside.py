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
    assert "host_probe_ratio" in predicted         # NaN here: no shipped profile of the tiny model on CPU
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
