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
    # live runs add the sim's prediction error of the same run (issue 16), the rest is shared
    assert set(live_m) - {"sim_error"} == set(sim_m) and "sim_error" in live_m and METRIC_KEYS <= set(live_m)
    assert live_m["finished"] == sim_m["finished"] == 6
    assert live_m["output_tokens"] == sim_m["output_tokens"]


def test_overlong_requests_are_counted_in_metrics_and_requests_csv(tmp_path):
    """engine.max_model_len=256 on azure_code: rejected with the reason by default, or clipped / dropped
    on request, and every changed request is counted and listed."""
    import csv
    base = ["progress=false", "plots=false", "workload.max_requests=40", "engine.max_model_len=256"]
    proc = kvrl_run("-m", f"hydra.sweep.dir={tmp_path}", *base, "workload.overlong=reject,clip,drop")
    counts, rows = {}, {}
    for job, mode in enumerate(("reject", "clip", "drop")):
        counts[mode] = json.loads((tmp_path / str(job) / "metrics.json").read_text())
        rows[mode] = list(csv.DictReader((tmp_path / str(job) / "requests.csv").read_text().splitlines()))
    log = proc.stdout + proc.stderr                                  # each logged with its count
    assert "requests exceed max_model_len=256" in log and "overlong=clip clipped" in log
    assert "overlong=drop dropped" in log
    n_long = counts["reject"]["rejected"]
    assert n_long > 0 and counts["reject"]["finished"] == 40 - n_long
    assert sum(r["error"].startswith("rejected: ") and "max_model_len=256" in r["error"] for r in rows["reject"]) == n_long
    assert counts["clip"]["clipped"] == n_long and counts["clip"]["finished"] == 40 and counts["clip"]["rejected"] == 0
    assert sum(bool(r["clipped"]) for r in rows["clip"]) == n_long
    assert all(r["clipped"].startswith("prompt ") for r in rows["clip"] if r["clipped"])
    assert counts["drop"]["dropped"] == n_long and counts["drop"]["requests"] == 40 - n_long
    assert sum(r["error"].startswith("dropped: ") for r in rows["drop"]) == n_long and len(rows["drop"]) == 40


def test_max_requests_caps_traces_not_generators_and_seed_draws_the_workload(tmp_path):
    """run.yaml's max_requests=2000 applies to trace workloads only (logged); a generator's own size
    wins; the top-level seed seeds the workload unless workload.seed is given."""
    sweep = tmp_path / "s"
    kvrl_run("-m", f"hydra.sweep.dir={sweep}", "progress=false", "plots=false", "workload=synthetic",
             "workload.num_requests=2100", "workload.arrival.process=offline", "workload.output_len.mean=8",
             "seed=0,1")
    m = [json.loads((sweep / str(i) / "metrics.json").read_text()) for i in (0, 1)]
    assert m[0]["requests"] == m[1]["requests"] == 2100
    assert m[0]["output_tokens"] != m[1]["output_tokens"]           # different draws per seed
    assert "seed: 1" in (sweep / "1" / "config.yaml").read_text().split("workload:")[1].split("\n\n")[0]
    out = tmp_path / "trace"
    proc = kvrl_run(f"hydra.run.dir={out}", "progress=false", "plots=false", "max_steps=1", "seed=3",
                    "workload.seed=5")
    assert "max_requests=2000 keeps the first 2000 of 8819 requests" in proc.stdout + proc.stderr
    from omegaconf import OmegaConf
    cfg = OmegaConf.load(out / "config.yaml")
    assert cfg.workload.max_requests == 2000 and cfg.workload.seed == 5 and cfg.seed == 3


def test_runs_started_together_get_distinct_directories_with_0644_files(tmp_path):
    import os
    old = os.umask(0o022)
    try:
        cmd = [sys.executable, "-m", "kvrl.apps.run", *SMALL, "plots=false"]
        procs = [subprocess.Popen([*cmd, f"workload.seed={i}"], cwd=tmp_path, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True) for i in range(2)]
        for p in procs:
            assert p.wait(timeout=300) == 0, p.stderr.read()[-2000:]
    finally:
        os.umask(old)
    dirs = sorted(p.parent for p in (tmp_path / "runs" / "run").glob("*/*/metrics.json"))
    assert len(dirs) == 2
    seeds = sorted(next(line for line in (d / ".hydra" / "overrides.yaml").read_text().splitlines()
                        if "workload.seed" in line) for d in dirs)
    assert seeds == ["- workload.seed=0", "- workload.seed=1"]         # each dir holds its own job
    for d in dirs:
        for name in ("metrics.json", "requests.csv", "steps.csv", "config.yaml"):
            assert (d / name).stat().st_mode & 0o777 == 0o644, name


def test_outputs_respect_the_umask_and_survive_a_lone_surrogate_id(tmp_path):
    import os
    from kvrl.apps.outputs import atomic_write
    old = os.umask(0o027)
    try:
        atomic_write(tmp_path / "r.csv", lambda f: f.write("id\nreq-\ud800\n"))
    finally:
        os.umask(old)
    assert (tmp_path / "r.csv").stat().st_mode & 0o777 == 0o640
    assert (tmp_path / "r.csv").read_text() == "id\nreq-\\ud800\n"
    assert [p.name for p in tmp_path.iterdir()] == ["r.csv"]


def test_every_app_composes_a_unique_run_directory():
    """Two launches in the same second (here: two resolutions a few ms apart) get different
    hydra.run.dir and hydra.sweep.dir in every app config; ${now:%H-%M-%S} alone gave both the same."""
    from hydra.core.utils import setup_globals
    from omegaconf import OmegaConf
    import kvrl.apps  # noqa: F401  (registers ${kvrl.stamp:})
    setup_globals()                                   # Hydra's ${now:}
    conf = Path(__file__).resolve().parents[1] / "conf"
    apps = sorted(p for p in conf.glob("*.yaml") if "hydra" in OmegaConf.load(p))
    assert {p.stem for p in apps} >= {"run", "train", "eval", "attack", "bench", "fidelity", "profile"}
    for path in apps:
        hydra_node = OmegaConf.to_container(OmegaConf.load(path).hydra, resolve=False)
        for key in ("run", "sweep"):
            pattern = hydra_node[key]["dir"]          # set by every app (Hydra's own default is per second)
            a, b = (OmegaConf.create({"command": "x", "d": pattern}).d for _ in range(2))
            assert a != b, f"{path.name}: hydra.{key}.dir={pattern} repeats within a second"
