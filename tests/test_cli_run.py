"""kvrl-run from the command line: outputs, overrides, multirun, and config errors."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

METRIC_KEYS = {"requests", "finished", "output_tokens", "duration_s", "throughput_tok_s", "goodput_tok_s",
               "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "kv_utilization", "kv_occupancy",
               "preemptions", "swapped_out_blocks", "swapped_in_blocks", "recomputed_tokens", "prefix_hit_rate"}
SMALL = ["progress=false", "workload=synthetic", "workload.num_requests=40"]


def kvrl_run(*args, cwd=None, check=True):
    proc = subprocess.run([sys.executable, "-m", "kvrl.apps.run", *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd)
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_run_writes_metrics_steps_plot_and_config(tmp_path):
    out = tmp_path / "r"
    proc = kvrl_run(f"hydra.run.dir={out}", *SMALL, "scheduler=sjf", "watermark=opt_factor", "watermark.a=2.5",
                    "prefix_cache=radix_lru", "engine.block_size=16")
    metrics = json.loads((out / "metrics.json").read_text())
    assert METRIC_KEYS <= set(metrics) and metrics["finished"] == 40
    for name in ("steps.csv", "requests.csv", "kv_usage.png", "config.yaml"):
        assert (out / name).stat().st_size > 0
    assert "throughput_tok_s" in proc.stdout        # the summary table
    assert "a: 2.5" in (out / "config.yaml").read_text()


def test_default_output_directory_is_under_runs(tmp_path):
    kvrl_run(*SMALL, "plots=false", cwd=tmp_path)
    found = list((tmp_path / "runs" / "run").glob("*/*/metrics.json"))
    assert len(found) == 1


def test_multirun_sweeps_plugins_and_parameters(tmp_path):
    sweep = tmp_path / "sweep"
    kvrl_run("-m", f"hydra.sweep.dir={sweep}", *SMALL, "plots=false", "watermark.fraction=0.0,0.1",
             "eviction=lifo,most_blocks")
    jobs = sorted(p.parent.name for p in sweep.glob("*/metrics.json"))
    assert jobs == ["0", "1", "2", "3"]


@pytest.mark.parametrize("override,message", [
    ("engine.num_blockz=10", "num_blockz"),
    ("engine.block_size=abc", "engine.block_size"),
    ("watermark.fraction=1.5", "fraction must be < 1.0"),
    ("eviction=nonexistent", "lifo"),             # Hydra lists the known options of the group
    ("engine.allocator=pagd", "engine.allocator must be one of"),
])
def test_config_mistakes_fail_fast_naming_the_key(tmp_path, override, message):
    proc = kvrl_run(f"hydra.run.dir={tmp_path / 'x'}", *SMALL, override, check=False)
    assert proc.returncode != 0
    assert message in proc.stderr + proc.stdout
    assert not (tmp_path / "x" / "metrics.json").exists()


def test_live_backend_on_cpu_writes_the_same_metrics_as_sim(tmp_path):
    args = ["progress=false", "plots=false", "workload=synthetic", "workload.num_requests=6",
            "workload.output_len.mean=12", "engine.num_blocks=256"]
    live, sim = tmp_path / "live", tmp_path / "sim"
    kvrl_run(f"hydra.run.dir={live}", "backend=live", "model=tiny", *args, cwd=tmp_path)
    kvrl_run(f"hydra.run.dir={sim}", "backend=sim", "model=tiny", *args, cwd=tmp_path)
    live_m = json.loads((live / "metrics.json").read_text())
    sim_m = json.loads((sim / "metrics.json").read_text())
    assert set(live_m) == set(sim_m) and METRIC_KEYS <= set(live_m)
    assert live_m["finished"] == sim_m["finished"] == 6
    assert live_m["output_tokens"] == sim_m["output_tokens"]
