"""kvrl-train and kvrl-eval from the command line: a tiny training and evaluation end to end,
resume, the same leaderboard for the same seeds, and named errors."""
from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest

# A tiny scenario: the first 120 requests of each split, 20 s training windows, 2 seeds.
TINY = ["workload.max_requests=120", "env.episode.window_s=20", "seed=0"]
TRAIN = [*TINY, "progress=false", "train.total_timesteps=128", "train.n_envs=2", "train.vec_env=dummy", "train.eval_every=64",
         "train.checkpoint_every=64", "agent.kwargs.n_steps=32", "agent.kwargs.batch_size=32"]
EVAL = [*TINY, "seeds=[0,1]", "sweep=[0.0,0.3]", "baselines.watermark=[{name: fixed, fraction: 0.01},{name: opt_factor}]",
        "workers=1", "tune=null", "oracle=false"]     # val tuning and the oracle: tests/test_baselines.py


def app(name, *args, check=True):
    proc = subprocess.run([sys.executable, "-m", f"kvrl.apps.{name}", *args], capture_output=True, text=True,
                          timeout=300)
    if check:
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return proc


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("train") / "run"
    proc = app("train", f"hydra.run.dir={run_dir}", *TRAIN)
    return run_dir, proc


def test_train_writes_the_agent_checkpoints_and_log(trained):
    run_dir, proc = trained
    for name in ("model.zip", "best_model.zip", "agent.json", "progress.csv", "evaluations.npz", "config.yaml",
                 "summary.json", "checkpoints/agent_128_steps.zip"):
        assert (run_dir / name).stat().st_size > 0, name
    meta = json.loads((run_dir / "agent.json").read_text())
    assert meta["algo"] == "ppo" and meta["env_id"] == "kvrl/Watermark-v0"
    assert json.loads((run_dir / "summary.json").read_text())["timesteps"] == 128
    assert "kvrl-train" in proc.stdout


def test_eval_writes_the_leaderboard_and_is_reproducible(trained, tmp_path):
    run_dir, _ = trained
    tables = []
    for out in ("a", "b"):
        proc = app("eval", f"hydra.run.dir={tmp_path / out}", f"agents=[{run_dir}]", *EVAL)
        for name in ("leaderboard.csv", "leaderboard.md", "results.csv", "goodput.png", "traces.png"):
            assert (tmp_path / out / name).stat().st_size > 0, name
        assert "goodput_tok_s" in proc.stdout
        tables.append((tmp_path / out / "leaderboard.csv").read_text())
    assert tables[0] == tables[1]
    rows = list(csv.DictReader(tables[0].splitlines()))
    kinds = {r["kind"] for r in rows}
    assert kinds == {"heuristic", "val-best", "agent"} and len(rows) == 4
    assert all(r["runs"] == "2" for r in rows)
    markdown = (tmp_path / "a" / "leaderboard.md").read_text()
    assert "kvrl-eval" in markdown and "± " in markdown


def test_resume_continues_from_the_latest_checkpoint(trained, tmp_path):
    run_dir, _ = trained
    resumed = tmp_path / "resumed"
    subprocess.run(["cp", "-r", str(run_dir), str(resumed)], check=True)
    app("train", f"hydra.run.dir={resumed}", *TRAIN, "resume=true", "train.total_timesteps=192")
    summary = json.loads((resumed / "summary.json").read_text())
    assert summary["resumed_from"].endswith("agent_128_steps.zip") and summary["timesteps"] == 192


def test_eval_with_a_missing_agent_names_the_path(tmp_path):
    missing = tmp_path / "no_such_run"
    proc = app("eval", f"hydra.run.dir={tmp_path / 'e'}", f"agents=[{missing}]", *EVAL, check=False)
    assert proc.returncode != 0 and str(missing) in proc.stderr + proc.stdout


def test_incompatible_agent_fails_before_training(tmp_path):
    proc = app("train", f"hydra.run.dir={tmp_path / 't'}", *TRAIN, "agent=maskable_ppo", check=False)
    assert proc.returncode != 0 and "action masks" in proc.stderr + proc.stdout


def test_maskable_ppo_trains_on_the_preemption_task(tmp_path):
    small = ["workload=synthetic", "workload.num_requests=80", "workload.arrival.rate=30",
             "workload.output_len.mean=150", "engine.num_blocks=256", "env.episode.window_s=null"]
    app("train", f"hydra.run.dir={tmp_path / 'p'}", "env=preemption", "agent=maskable_ppo", "progress=false",
        *small, "env.episode.split=null", "train.total_timesteps=64", "train.n_envs=1", "train.eval_every=0",
        "train.checkpoint_every=64", "agent.kwargs.n_steps=32", "agent.kwargs.batch_size=32")
    assert json.loads((tmp_path / "p" / "agent.json").read_text())["algo"] == "maskable_ppo"


# Live backend on CPU (the tiny random model): six requests of the test split, one seed.
LIVE = ["backend=live", "model=tiny", "backend.device=cpu", "engine.num_blocks=256", "workload.max_requests=6",
        "seeds=[0]", "baselines.watermark=[{name: fixed, fraction: 0.01}]", "live_warmup=2", "plots=false",
        "workers=1", "seed=0"]


def test_live_eval_takes_the_val_pick_from_the_sim(trained, tmp_path):
    run_dir, _ = trained
    proc = app("eval", f"hydra.run.dir={tmp_path / 'live'}", f"agents=[{run_dir}]", *LIVE, "val_pick=sim",
               "sweep=[0.0,0.3]")
    rows = list(csv.DictReader((tmp_path / "live" / "results.csv").read_text().splitlines()))
    val = [r for r in rows if r["split"] == "val"]
    test = [r for r in rows if r["split"] == "test"]
    assert len(val) == 2 and {r["backend"] for r in val} == {"sim"}
    assert len(test) == 3 and {r["backend"] for r in test} == {"live"}
    assert {r["kind"] for r in test} == {"heuristic", "val-best", "agent"}
    assert all(int(r["requests"]) == 6 for r in test)
    markdown = (tmp_path / "live" / "leaderboard.md").read_text()
    assert "[val-best in sim]" in markdown
    assert "trained on the sim backend and runs here on the live backend" in markdown
    assert "differs in: backend" not in markdown
    assert "goodput_tok_s" in proc.stdout


def test_eval_with_a_given_best_fixed_watermark_runs_no_val_sweep(trained, tmp_path):
    run_dir, _ = trained
    app("eval", f"hydra.run.dir={tmp_path / 'given'}", f"agents=[{run_dir}]", *EVAL, "fixed_best=0.2", "plots=false")
    rows = list(csv.DictReader((tmp_path / "given" / "results.csv").read_text().splitlines()))
    assert {r["split"] for r in rows} == {"test"}
    assert "fixed(fraction=0.2) [val-best, given]" in {r["policy"] for r in rows}
