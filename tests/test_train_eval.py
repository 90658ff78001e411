"""kvrl-train and kvrl-eval from the command line: a tiny training and evaluation end to end,
resume, the same leaderboard for the same seeds, and named errors."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
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


def test_recurrent_ppo_trains_validates_and_is_evaluated(tmp_path):
    """agent=recurrent_ppo (an LSTM policy): validated during training with its state carried through each
    val episode, saved, and served by kvrl-eval through the agent plugin."""
    run = tmp_path / "r"
    app("train", f"hydra.run.dir={run}", *TRAIN, "agent=recurrent_ppo")
    assert json.loads((run / "agent.json").read_text())["algo"] == "recurrent_ppo"
    assert (run / "best_model.zip").exists() and len(np.load(run / "evaluations.npz")["results"]) >= 1
    out = tmp_path / "e"
    app("eval", f"hydra.run.dir={out}", *EVAL, f"agents=[{run}]", "seeds=[0]")
    rows = list(csv.DictReader(open(out / "leaderboard.csv")))
    agent = [r for r in rows if r["kind"] == "agent"]
    assert len(agent) == 1 and "recurrent_ppo" in agent[0]["policy"] and float(agent[0]["goodput_tok_s_mean"]) > 0

# Live backend on CPU (the tiny random model): six requests of the test split, one seed.
LIVE = ["backend=live", "model=tiny", "backend.device=cpu", "engine.num_blocks=256", "workload.max_requests=6",
        "seeds=[0]", "baselines.watermark=[{name: fixed, fraction: 0.01}]", "live_warmup=2", "plots=false",
        "workers=1", "seed=0", "oracle=false"]


def test_live_eval_takes_the_val_pick_from_the_sim(trained, tmp_path):
    run_dir, _ = trained
    proc = app("eval", f"hydra.run.dir={tmp_path / 'live'}", f"agents=[{run_dir}]", *LIVE, "val_pick=sim",
               "sweep=[0.0,0.3]")
    rows = list(csv.DictReader((tmp_path / "live" / "results.csv").read_text().splitlines()))
    assert not (tmp_path / "live" / "results.partial.csv").exists()     # the journal is gone once results.csv is
    val = [r for r in rows if r["split"] == "val"]
    test = [r for r in rows if r["split"] == "test"]
    assert len(val) == 2 and {r["backend"] for r in val} == {"sim"}
    assert len(test) == 3 and {r["backend"] for r in test} == {"live"}
    assert {r["kind"] for r in test} == {"heuristic", "val-best", "agent"}
    assert all(int(r["requests"]) == 6 for r in test)
    # every live run has the sim's prediction of the same requests beside it (issue 16)
    assert all(r["sim_throughput_tok_s"] and float(r["sim_throughput_tok_s"]) > 0 for r in test)
    assert all(not r.get("sim_throughput_tok_s") for r in val)
    # ... every one priced by the cost model the first live run chose (no profile of tiny on CPU: roofline)
    assert {r["sim_cost_source"] for r in test} == {"roofline"}
    # ... and how far that cost model prices each run's own executed steps from their live time
    assert all(float(r["sim_replay_error"]) > -1.0 for r in test)
    # ... and the same run in the sim at that run's own host speed
    assert all(float(r["sim_host_throughput_tok_s"]) > 0 for r in test)
    # ... and, a prediction, at the host speed of the process's earlier live jobs (none before the first)
    assert test[0]["sim_cal_throughput_tok_s"] in ("", "nan")
    assert all(float(r["sim_cal_throughput_tok_s"]) > 0 for r in test[1:])
    # the place of each test job among its seed's, in the order they ran (seed 0: as listed; job_order=auto)
    assert [int(r["seed_position"]) for r in test] == [0, 1, 2]
    assert all(r["seed_position"] == "" for r in val)
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


def test_eval_step_traces_all_keeps_every_test_jobs_steps(trained, tmp_path):
    """``step_traces=all``: step_traces.npz holds one whole per-step record per test run (the rows of
    results.csv on split=test, in the same policies and seeds), whose running counts of preemptions
    and finished requests end at that run's metrics; an unknown value is refused before any run."""
    from kvrl.apps.eval_files import read_step_traces

    run_dir, _ = trained
    out = tmp_path / "traces"
    app("eval", f"hydra.run.dir={out}", f"agents=[{run_dir}]", *EVAL, "fixed_best=0.2", "plots=false",
        "step_traces=all")
    rows = [r for r in csv.DictReader((out / "results.csv").read_text().splitlines()) if r["split"] == "test"]
    jobs = read_step_traces(out / "step_traces.npz")
    assert sorted((e["policy"], e["seed"]) for e, _ in jobs) == sorted((r["policy"], int(r["seed"])) for r in rows)
    by_job = {(r["policy"], int(r["seed"])): r for r in rows}
    for entry, steps in jobs:
        row = by_job[entry["policy"], entry["seed"]]
        assert len(steps["step"]) > 0
        assert steps["preemptions"][-1] == int(row["preemptions"]) and steps["finished"][-1] == int(row["finished"])
    bad = app("eval", f"hydra.run.dir={tmp_path / 'bad'}", f"agents=[{run_dir}]", *EVAL, "fixed_best=0.2",
              "step_traces=every", check=False)
    assert bad.returncode != 0 and "step_traces='every'" in bad.stderr


# --- tooling that follows the scenario it is pointed at (issue 21) and resume (issue 15) ---

def tiny_azure_csv(path, n=100):
    """An Azure-format CSV trace of ``n`` requests one second apart (short prompts and outputs)."""
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for i in range(n):
        lines.append(f"2023-11-16 18:{i // 60:02d}:{i % 60:02d}.0000000,{64 + 37 * i % 400},{4 + 7 * i % 40}")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_select_scores_on_the_trace_it_is_pointed_at(trained, tmp_path):
    from kvrl.workloads import build_workload

    run_dir, _ = trained
    trace = tiny_azure_csv(tmp_path / "tiny.csv")
    out = tmp_path / "sel"
    proc = app("selection", f"hydra.run.dir={out}", f"agents=[{run_dir}/checkpoints/agent_*_steps.zip]",
               "workload=azure_csv", f"workload.path={trace}", "seed=0")
    rows = list(csv.DictReader((out / "selection.csv").read_text().splitlines()))
    assert len(rows) == 2 and {r["split"] for r in rows} == {"val"}
    assert all(r["workload"] == f"azure_csv (file {trace})" for r in rows)
    val = build_workload({"name": "azure_csv", "path": str(trace), "split": "val"}, vocab_size=1000)
    assert all(int(r["requests"]) == len(val) for r in rows)        # the CSV's val split, not the code trace's
    assert float(rows[0]["goodput_tok_s"]) >= float(rows[1]["goodput_tok_s"])
    assert "trained on another scenario" in proc.stderr + proc.stdout and "workload.name" in proc.stderr + proc.stdout


def test_eval_on_a_task_file_kept_outside_the_package(trained, tmp_path):
    """docs/rl.md, "On a trace of your own": a task file in the user's own folder, found with Hydra's
    ``--config-dir``, serves that folder's trace to the committed agents without touching the package."""
    run_dir, _ = trained
    trace = tiny_azure_csv(tmp_path / "mine.csv", n=200)
    task = Path(__file__).resolve().parents[1] / "conf" / "env" / "watermark.yaml"
    text = task.read_text().replace("  - override /device: h200", "  - override /device: h200\n  - override /workload: azure_csv")
    (tmp_path / "myconf" / "env").mkdir(parents=True)
    (tmp_path / "myconf" / "env" / "mine.yaml").write_text(text.replace("workload:\n", f"workload:\n  path: {trace}\n", 1))
    out = tmp_path / "eval"
    proc = app("eval", "--config-dir", str(tmp_path / "myconf"), "env=mine", f"hydra.run.dir={out}",
               f"agents=[{run_dir}]", *EVAL)
    assert f"azure_csv (file {trace})" in (out / "leaderboard.md").read_text()
    assert "trained on another scenario" in proc.stderr + proc.stdout and "workload.name" in proc.stderr + proc.stdout
    assert len(list(csv.DictReader((out / "leaderboard.csv").read_text().splitlines()))) == 4


def test_select_over_several_seeds_scores_each_agent_by_its_mean(trained, tmp_path):
    from kvrl.workloads import build_workload

    run_dir, _ = trained
    trace = tiny_azure_csv(tmp_path / "tiny.csv")
    out = tmp_path / "sel"
    app("selection", f"hydra.run.dir={out}", f"agents=[{run_dir}/checkpoints/agent_*_steps.zip]",
        "workload=azure_csv", f"workload.path={trace}", "seeds=[0,1,2]", "resample=0.5")
    rows = list(csv.DictReader((out / "selection.csv").read_text().splitlines()))
    val = build_workload({"name": "azure_csv", "path": str(trace), "split": "val"}, vocab_size=1000)
    assert len(rows) == 2 and {r["seeds"] for r in rows} == {"3"}
    assert all(len(val) < int(r["requests"]) < 3 * len(val) for r in rows)      # three half-size jobs each
    for bad, named in (("resample=1.5", "resample"), ("seeds=[]", "seeds")):
        proc = app("selection", f"hydra.run.dir={tmp_path / bad[:4]}", "agents=[x]", bad, check=False)
        assert proc.returncode != 0 and named in proc.stderr + proc.stdout


@pytest.mark.parametrize("args, named", [(["bogus_key=1"], "bogus_key"), (["--task", "preemption"], "--task"),
                                         (["agents=[/no/such/dir/*.zip]"], "/no/such/dir/*.zip")])
def test_select_rejects_what_it_does_not_understand(tmp_path, args, named):
    base = [] if args[0].startswith("agents=") else ["agents=[x]"]
    proc = app("selection", f"hydra.run.dir={tmp_path / 's'}", *base, *args, check=False)
    assert proc.returncode != 0 and named in proc.stderr + proc.stdout


def test_relative_rate_scales_follow_workload_rate_scale():
    import gymnasium as gym
    import numpy as np

    import kvrl.envs  # noqa: F401
    from kvrl.envs.config import episode_rate_scales, load_task

    small = ["workload=synthetic", "workload.num_requests=40", "workload.arrival.rate=30", "engine.num_blocks=256",
             "env.episode.split=null", "env.episode.window_s=null", "env.episode.rate_scales=[0.5,1.0]"]
    _, cfg = load_task("watermark", [*small, "workload.rate_scale=4"])
    assert cfg.episode.rate_scales_relative and episode_rate_scales(cfg) == [2.0, 4.0]
    _, default = load_task("watermark")           # the packaged task: 5-20x at rate_scale 20
    assert episode_rate_scales(default) == pytest.approx([5, 7, 10, 14, 20])
    _, absolute = load_task("watermark", [*small, "workload.rate_scale=4", "env.episode.rate_scales_relative=false"])
    assert episode_rate_scales(absolute) == [0.5, 1.0]
    env = gym.make("kvrl/Watermark-v0", config=cfg).unwrapped
    whole = env.session.requests                  # at workload.rate_scale = 4
    span = whole[-1].arrival_s - whole[0].arrival_s
    spans = set()
    for seed in range(8):
        env.reset(seed=seed)
        served = env.driver.pending
        spans.add(round(served[-1].arrival_s - served[0].arrival_s, 9))
    assert spans == {round(span * 2, 9), round(span, 9)}       # 2x and 4x the trace's rate
    assert np.isfinite(span) and span > 0


def test_useful_bins_span_the_values_within_the_tolerance_of_the_best():
    from kvrl.apps.bins import useful_bins

    fractions = [0.0, 0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5]
    val = [186.3, 190.9, 185.8, 150.5, 143.0, 126.2, 109.8, 84.6]     # docs/rl.md's code-trace val row
    assert useful_bins(fractions, val, 0.35).bins == (0.0, 0.01, 0.05, 0.1, 0.2, 0.3)
    assert useful_bins(fractions, val, 0.05).bins == (0.0, 0.01, 0.05)
    assert useful_bins(fractions, val, 0.0).bins == (0.01,)
    # a value inside the range that loses more than the tolerance is kept: the bins span the range
    assert useful_bins([0.0, 0.1, 0.2], [100.0, 10.0, 95.0], 0.1).bins == (0.0, 0.1, 0.2)
    with pytest.raises(ValueError, match="tolerance"):
        useful_bins([0.0], [1.0], 1.5)


def test_bins_auto_takes_the_useful_range_of_a_val_sweep(tmp_path):
    from kvrl.apps.eval import Job, Policy, run_job
    from kvrl.envs.config import load_task

    sweep, tolerance = [0.0, 0.1, 0.3, 0.5], 0.2
    scenario = [*TINY, f"env.action.auto.sweep=[{','.join(map(str, sweep))}]", f"env.action.auto.tolerance={tolerance}"]
    run_dir = tmp_path / "auto"
    proc = app("train", f"hydra.run.dir={run_dir}", *scenario, "env.action.bins=auto", "progress=false",
               "train.total_timesteps=32", "train.n_envs=1", "train.vec_env=dummy", "train.eval_every=0",
               "train.checkpoint_every=32", "agent.kwargs.n_steps=32", "agent.kwargs.batch_size=32")
    # the val goodput of each fixed value, served here independently
    _, cfg = load_task("watermark", scenario)
    goodput = [run_job(cfg.run, "watermark", Job(Policy("f", "x", {"name": "fixed", "fraction": f}), "val", 0),
                       None)["goodput_tok_s"] for f in sweep]
    best = max(goodput)
    useful = [f for f, g in zip(sweep, goodput) if g >= (1 - tolerance) * best]
    expected = [f for f in sweep if min(useful) <= f <= max(useful)]
    recorded = json.loads((run_dir / "bins_sweep.json").read_text())
    assert recorded["val_goodput_tok_s"] == pytest.approx(goodput) and recorded["bins"] == expected
    assert json.loads((run_dir / "agent.json").read_text())["env"]["action"]["bins"] == expected
    assert "env.action.bins=auto" in proc.stderr + proc.stdout


def test_task_differences_ignore_keys_that_do_not_change_the_task(trained):
    import copy

    from kvrl.apps.scenario import task_differences
    from kvrl.envs.config import load_task

    run_dir, _ = trained
    saved = json.loads((run_dir / "agent.json").read_text())["env"]["run"]
    _, here = load_task("watermark", TINY)
    assert task_differences(saved, here.run, "watermark") == []
    older = copy.deepcopy(saved)
    del older["engine"]["pause_gc"]                   # saved before the key existed
    assert task_differences(older, here.run, "watermark") == []
    _, harness = load_task("watermark", [*TINY, "engine.pause_gc=false", "seed=3", "engine.policy_errors=raise"])
    assert task_differences(saved, harness.run, "watermark") == []
    _, other = load_task("watermark", [*TINY, "workload.rate_scale=10", "slo.tpot_s=0.01", "engine.num_blocks=512"])
    diff = {d.key: (d.trained, d.here) for d in task_differences(saved, other.run, "watermark")}
    assert diff == {"workload.rate_scale": (20.0, 10.0), "slo.tpot_s": (0.005, 0.01), "engine.num_blocks": (1024, 512)}
    from kvrl.apps.scenario import agent_differences

    meta = json.loads((run_dir / "agent.json").read_text())
    assert agent_differences(meta, here.run, "watermark") == []
    meta["env"]["episode"]["workloads"] = [{}, {"rate_scale": 5.0}]
    assert [str(d) for d in agent_differences(meta, here.run, "watermark")] == [
        'env.episode.workloads (trained [{}, {"rate_scale": 5.0}], here null)']


def test_eval_on_the_agents_own_scenario_gives_no_warning(trained, tmp_path):
    run_dir, _ = trained
    meta = json.loads((run_dir / "agent.json").read_text())
    del meta["env"]["run"]["engine"]["pause_gc"]      # as an agent saved before engine.pause_gc existed
    agents = []
    for name, rate in (("own", 20.0), ("other", 10.0)):
        meta["env"]["run"]["workload"]["rate_scale"] = rate
        (tmp_path / name).mkdir()
        (tmp_path / name / "agent.json").write_text(json.dumps(meta))
        (tmp_path / name / "model.zip").write_bytes((run_dir / "model.zip").read_bytes())
        agents.append(str(tmp_path / name))
    app("eval", f"hydra.run.dir={tmp_path / 'e'}", f"agents=[{','.join(agents)}]", *EVAL, "sweep=[]", "plots=false",
        "seeds=[0]", "baselines.watermark=[{name: fixed, fraction: 0.01}]")
    markdown = (tmp_path / "e" / "leaderboard.md").read_text()
    notes = [line for line in markdown.splitlines() if "another scenario" in line]
    assert len(notes) == 1 and "/other/model.zip" in notes[0] and "/own/" not in notes[0]
    assert "differs in: workload.rate_scale (trained 10.0, here 20.0)" in notes[0]


def test_latest_is_the_newest_agent_of_the_same_scenario(trained, tmp_path):
    import os

    from kvrl.apps.scenario import newest_agent
    from kvrl.envs.config import load_task

    run_dir, _ = trained
    _, here = load_task("watermark", TINY)
    meta = json.loads((run_dir / "agent.json").read_text())
    runs = tmp_path / "runs"
    for name, rate, mtime, families in (("same", 20.0, 1000, None), ("other", 10.0, 2000, None),
                                        ("mixture", 20.0, 3000, [{}, {"rate_scale": 5.0}])):   # newer in turn
        (runs / name).mkdir(parents=True)
        meta["env"]["run"]["workload"]["rate_scale"] = rate
        meta["env"]["episode"]["workloads"] = families
        (runs / name / "agent.json").write_text(json.dumps(meta))
        (runs / name / "model.zip").write_bytes(b"zip")
        os.utime(runs / name / "model.zip", (mtime, mtime))
    # an agent trained on a mixture that holds this scenario is not one trained on it alone
    assert newest_agent("kvrl/Watermark-v0", here.run, runs, "watermark") == runs / "same" / "model.zip"
    (runs / "mixture" / "agent.json").unlink()
    (runs / "same" / "agent.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"no agent trained on kvrl/Watermark-v0 in this scenario.*"
                                                r"workload.rate_scale \(trained 10.0, here 20.0\)"):
        newest_agent("kvrl/Watermark-v0", here.run, runs, "watermark")


def test_outputs_name_the_workload_by_what_was_loaded(tmp_path):
    from kvrl.envs.config import describe_workload, load_task

    trace = tiny_azure_csv(tmp_path / "t.csv")
    _, cfg = load_task("watermark", [f"workload.path={trace}"])       # no workload=azure_csv
    assert describe_workload(cfg.run["workload"]) == f"azure_code (file {trace})"
    _, packaged = load_task("watermark")
    assert describe_workload(packaged.run["workload"]) == "azure_code (packaged trace)"


def test_eval_reports_each_job_as_it_finishes_with_two_workers(caplog):
    import logging

    from kvrl.apps.eval import Job, Policy, run_jobs
    from kvrl.envs.config import load_task

    _, cfg = load_task("watermark", ["workload=synthetic", "workload.num_requests=30", "workload.rate_scale=1.0",
                                     "engine.num_blocks=256"])
    jobs = [Job(Policy(f"fixed {f}", "x", {"name": "fixed", "fraction": f}), split, 0)
            for f in (0.0, 0.2) for split in ("val", "test")][:3]
    with caplog.at_level(logging.INFO, logger="kvrl.eval"):
        results = run_jobs(cfg.run, "watermark", jobs, None, workers=2, chunk=2)
    assert [(r["policy"], r["split"]) for r in results] == [(j.policy.label, j.split) for j in jobs]
    done = [r.getMessage() for r in caplog.records if r.getMessage().startswith("[")]
    assert [m.split("]")[0] for m in done] == ["[1/3", "[2/3", "[3/3"]
    assert sorted(m.split("] ")[1].split(":")[0] for m in done) == sorted(
        f"{j.policy.label} on {j.split}, seed 0" for j in jobs)


DQN = [*TINY, "agent=dqn", "progress=false", "train.n_envs=1", "train.vec_env=dummy", "train.eval_every=16",
       "train.checkpoint_every=16", "agent.kwargs.learning_starts=4", "agent.kwargs.batch_size=4",
       "agent.kwargs.buffer_size=100"]


def test_resume_of_a_dqn_run_continues_it(tmp_path):
    import numpy as np

    run = tmp_path / "dqn"
    app("train", f"hydra.run.dir={run}", *DQN, "train.total_timesteps=32")
    first_rows = (run / "progress.csv").read_text().splitlines()
    # an interrupted run: no final model yet, and its newest checkpoint truncated
    (run / "model.zip").unlink()
    (run / "summary.json").unlink()
    newest = run / "checkpoints" / "agent_32_steps.zip"
    newest.write_bytes(newest.read_bytes()[:100])
    # as the README writes it: no agent=dqn on the command line
    proc = app("train", f"hydra.run.dir={run}", "resume=true", "train.total_timesteps=48")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["algo"] == "dqn" and summary["timesteps"] == 48
    assert summary["resumed_from"].endswith("agent_16_steps.zip")
    assert str(newest) in summary["unreadable_checkpoints"][0] and str(newest) in proc.stderr + proc.stdout
    assert json.loads((run / "agent.json").read_text())["algo"] == "dqn"
    assert "name: dqn" in (run / "config.yaml").read_text()
    with np.load(run / "evaluations.npz") as ev:
        assert list(ev["timesteps"]) == [16, 32, 48]            # the first segment's evaluation at 16 kept
    rows = (run / "progress.csv").read_text().splitlines()
    assert rows[0] == first_rows[0] and rows[1] == first_rows[1] and len(rows) > len(first_rows) - 1
    # a finished run is not restarted
    stamp = (run / "model.zip").stat().st_mtime_ns
    again = app("train", f"hydra.run.dir={run}", "resume=true", "train.total_timesteps=48")
    assert "is finished" in again.stdout and (run / "model.zip").stat().st_mtime_ns == stamp
    # a resume cannot change the run's agent or scenario
    changed = app("train", f"hydra.run.dir={run}", "resume=true", "agent=ppo", "train.total_timesteps=64", check=False)
    assert changed.returncode != 0 and "agent" in changed.stderr and "dqn" in changed.stderr


def test_a_mixture_is_validated_on_every_familys_val_split(tmp_path):
    import numpy as np

    run = tmp_path / "mix"
    proc = app("train", f"hydra.run.dir={run}", *DQN, "train.total_timesteps=16",
               "+env.episode.workloads=[{},{max_requests: 60, rate_scale: 2.0}]")
    assert "a mixture of 2 families" in proc.stderr + proc.stdout
    with np.load(run / "evaluations.npz") as ev:
        assert ev["results"].shape == (1, 2)                      # one whole val split per family
        assert ev["results"][0, 0] != ev["results"][0, 1]
    meta = json.loads((run / "agent.json").read_text())
    assert meta["env"]["episode"]["workloads"][1]["max_requests"] == 60


def test_validation_at_the_training_loads_serves_the_val_split_at_each(tmp_path):
    import numpy as np

    run = tmp_path / "loads"
    app("train", f"hydra.run.dir={run}", *DQN, "train.total_timesteps=16", "train.val_loads=training",
        "env.episode.rate_scales=[0.5,2.0]")
    with np.load(run / "evaluations.npz") as ev:
        assert ev["results"].shape == (1, 2)                      # the whole val split once per training load
        assert ev["results"][0, 0] != ev["results"][0, 1]
    assert "val_loads: training" in (run / "config.yaml").read_text()
    bad = app("train", f"hydra.run.dir={tmp_path / 'bad'}", *DQN, "train.val_loads=test", check=False)
    assert bad.returncode != 0 and "train.val_loads" in bad.stderr


@pytest.mark.parametrize("steps", [0, -5])
def test_train_rejects_a_non_positive_total_timesteps(tmp_path, steps):
    proc = app("train", f"hydra.run.dir={tmp_path / 't'}", *TRAIN, f"train.total_timesteps={steps}", check=False)
    assert proc.returncode != 0 and "train.total_timesteps" in proc.stderr
    assert not (tmp_path / "t" / "model.zip").exists()


def test_an_action_prior_is_the_untrained_policy_and_is_checked():
    import gymnasium as gym
    import torch
    from stable_baselines3 import DQN, PPO

    from kvrl.apps.schema import ConfigError
    from kvrl.apps.train import apply_action_prior

    env = gym.make("CartPole-v1")
    model = PPO("MlpPolicy", env, seed=0, device="cpu", n_steps=32, batch_size=32)
    obs = torch.as_tensor(np.random.default_rng(0).normal(size=(64, 4)), dtype=torch.float32)
    before = model.policy.get_distribution(obs).distribution.probs[:, 1]
    assert before.min() < 0.6                              # SB3's near-zero head: about uniform
    apply_action_prior(model, {1: 6.0})
    assert model.policy.get_distribution(obs).distribution.probs[:, 1].min() > 0.99
    with pytest.raises(ConfigError, match=r"train.init_logits.2"):
        apply_action_prior(model, {2: 1.0})
    with pytest.raises(ConfigError, match="train.init_logits"):
        apply_action_prior(DQN("MlpPolicy", env, seed=0, device="cpu", learning_starts=0), {1: 1.0})


def test_train_rejects_a_bad_action_prior_naming_the_key(tmp_path):
    proc = app("train", f"hydra.run.dir={tmp_path / 't'}", *TRAIN, "train.init_logits={1: nan}", check=False)
    assert proc.returncode != 0 and "train.init_logits.1" in proc.stderr


def test_the_same_seed_trains_the_same_agent(trained, tmp_path):
    """kvrl-train is reproducible: the same command (seed included) gives the same policy weights,
    so a committed leaderboard can be rebuilt from its documented training command."""
    import torch
    from stable_baselines3 import PPO

    again = tmp_path / "again"
    app("train", f"hydra.run.dir={again}", *TRAIN)
    first = PPO.load(str(trained[0] / "model.zip"), device="cpu").policy.state_dict()
    second = PPO.load(str(again / "model.zip"), device="cpu").policy.state_dict()
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)


def test_init_agent_starts_training_from_the_saved_agent(trained, tmp_path):
    """``train.init_agent`` continues a saved agent: with a zero learning rate and another seed, the
    result has the saved agent's weights exactly (a new policy of seed 1 would not)."""
    import torch
    from stable_baselines3 import PPO

    run_dir = tmp_path / "warm"
    app("train", f"hydra.run.dir={run_dir}", *[a for a in TRAIN if a != "seed=0"], "seed=1",
        f"train.init_agent={trained[0]}", "agent.kwargs.learning_rate=0.0", "train.total_timesteps=32",
        "agent.kwargs.n_steps=16", "agent.kwargs.batch_size=16", "train.eval_every=0")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["init_agent"].endswith("best_model.zip") and summary["init_agent_timesteps"] > 0
    assert summary["timesteps"] == 32                    # the fine-tuning decisions, counted from 0
    source = PPO.load(str(trained[0] / "best_model.zip"), device="cpu").policy.state_dict()
    tuned = PPO.load(str(run_dir / "model.zip"), device="cpu").policy.state_dict()
    assert all(torch.equal(source[k], tuned[k]) for k in source)


def test_init_agent_must_fit_the_task(trained, tmp_path):
    """An agent trained with other observation features, or by another algorithm, is refused by
    name (the zip alone would load: the shapes can match)."""
    from kvrl.apps.schema import ConfigError
    from kvrl.apps.warm_start import load_warm_start

    proc = app("train", f"hydra.run.dir={tmp_path / 'w'}", *TRAIN, f"train.init_agent={trained[0]}",
               "env.features.latency_alpha=0.5", check=False)
    assert proc.returncode != 0 and "env.features.latency_alpha: agent 0.05, here 0.5" in proc.stderr
    with pytest.raises(ConfigError, match="agent=ppo"):
        load_warm_start(trained[0], "dqn", "kvrl/Watermark-v0", None, None, {})
    with pytest.raises(ConfigError, match="train.init_agent: no saved agent"):
        load_warm_start(tmp_path, "ppo", "kvrl/Watermark-v0", None, None, {})


def test_max_wall_s_bounds_training(tmp_path):
    run_dir = tmp_path / "bounded"
    app("train", f"hydra.run.dir={run_dir}", *TRAIN, "train.total_timesteps=100000", "train.max_wall_s=0.001",
        "train.eval_every=0")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stopped_by_max_wall_s"] and summary["timesteps"] < 100000
    assert (run_dir / "model.zip").is_file()


def test_sequential_jobs_journal_each_finished_run_before_a_failure():
    """kvrl-eval's journal (results.partial.csv): with jobs run one by one, as on the live backend,
    every finished run is handed on before a later one fails (or a time limit stops the app)."""
    from kvrl.apps.eval import Job, Policy, run_jobs
    from kvrl.envs.config import load_task

    _, cfg = load_task("watermark", ["workload=synthetic", "workload.num_requests=30", "workload.rate_scale=1.0",
                                     "engine.num_blocks=256"])
    jobs = [Job(Policy("ok", "x", {"name": "fixed", "fraction": 0.0}), "test", 0),
            Job(Policy("bad", "x", {"name": "fixed", "fraction": 7.0}), "test", 0)]
    seen = []
    with pytest.raises(Exception, match="fraction"):
        run_jobs(cfg.run, "watermark", jobs, None, workers=1, on_result=lambda done: seen.append([r["policy"] for r in done]))
    assert seen == [["ok"]]


def test_train_settings_for_a_warm_start_are_checked_by_name():
    from omegaconf import OmegaConf

    from kvrl.apps.rl_schema import TrainSettings, validate_train
    from kvrl.apps.schema import ConfigError

    both = OmegaConf.create({"train": OmegaConf.structured(TrainSettings(init_agent="a", init_logits={1: 1.0}))})
    with pytest.raises(ConfigError, match="train.init_agent and train.init_logits"):
        validate_train(both)
    with pytest.raises(ConfigError, match="train.max_wall_s"):
        validate_train(OmegaConf.create({"train": OmegaConf.structured(TrainSettings(max_wall_s=0.0))}))
    validate_train(OmegaConf.create({"train": OmegaConf.structured(TrainSettings(init_agent="a", max_wall_s=60.0))}))


def test_an_optuna_study_tunes_dqn_on_the_val_return(tmp_path):
    """``hydra/sweeper=tune_dqn``: each trial is a kvrl-train run whose value is its best mean return on
    split=val (summary.json); scripts/optuna_trials.py lists the study's trials best first."""
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    optuna = pytest.importorskip("optuna")
    url = f"sqlite:///{tmp_path / 'study.db'}"
    sweep = tmp_path / "sweep"
    proc = subprocess.run([sys.executable, "-m", "kvrl.apps.train", "-m", "agent=dqn", "hydra/sweeper=tune_dqn",
                           "hydra.sweeper.n_trials=2", "hydra.sweeper.n_jobs=1", f"hydra.sweep.dir={sweep}",
                           *TINY, "progress=false", "train.total_timesteps=96", "train.n_envs=1", "train.vec_env=dummy",
                           "train.eval_every=48", "train.checkpoint_every=48", "agent.kwargs.learning_starts=32"],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "KVRL_OPTUNA_STORAGE": url})
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    trials = optuna.load_study(study_name="kvrl-dqn", storage=url).trials
    assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE] * 2
    values = sorted(json.loads((d / "summary.json").read_text())["best_val_reward"] for d in sweep.iterdir()
                    if (d / "summary.json").is_file())
    assert sorted(t.value for t in trials) == pytest.approx(values)
    assert all(1e-4 <= t.params["agent.kwargs.learning_rate"] <= 3e-3 for t in trials)
    out = tmp_path / "trials.csv"
    subprocess.run([sys.executable, "scripts/optuna_trials.py", url, "kvrl-dqn", "--out", str(out)], check=True,
                   cwd=Path(__file__).resolve().parents[1])
    rows = list(csv.DictReader(out.read_text().splitlines()))
    assert [float(r["value"]) for r in rows] == pytest.approx(sorted(values, reverse=True))
    assert rows[0]["state"] == "COMPLETE" and "agent.kwargs.gamma" in rows[0]


def test_live_jobs_rotate_the_policy_order_by_seed():
    """``job_order=auto``: live, seed i's policies run rotated by i, so every policy runs in every position of
    a seed's jobs equally often (the host's speed drifts between jobs); in the sim they run as listed."""
    from kvrl.apps.job_order import job_order

    policies = ["fixed", "agent1", "agent2"]
    live = [job_order(policies, i, "auto", "live") for i in range(3)]
    assert live == [["fixed", "agent1", "agent2"], ["agent1", "agent2", "fixed"], ["agent2", "fixed", "agent1"]]
    assert all(sorted(order) == sorted(policies) for order in live)
    assert [order.index("fixed") for order in live] == [0, 2, 1]
    assert job_order(policies, 1, "auto", "sim") == policies == job_order(policies, 1, "listed", "live")
    assert job_order(policies, 4, "rotate", "sim") == ["agent1", "agent2", "fixed"]
    assert job_order([], 3, "rotate", "live") == []


def test_sim_leaderboards_name_their_cost_model():
    """kvrl-eval's leaderboard.md names the profile a sim evaluation ran on (path, SHA-256 prefix, fit version),
    so a result says which cost model it stands on after the shipped profile changes."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    import kvrl.apps.run  # noqa: F401  (stores run_schema and the plugin options)
    from kvrl.apps.cost_note import sim_cost_note

    with initialize_config_module("kvrl.conf", version_base="1.3"):
        cfg = compose("run", overrides=["backend=sim", "model=qwen3-0.6b", "device=h200"])
    run = OmegaConf.to_container(cfg, resolve=True)
    note = sim_cost_note(run)
    assert note.startswith("Sim cost model: profile ") and "h200_qwen3-0.6b_bfloat16_step_graphs.json" in note
    assert "fit version 13" in note and "sha256 " in note
    run["backend"]["profile"] = "archive/h200_qwen3-0.6b_bfloat16_step_graphs_fit11.json"
    assert "fit version 11" in sim_cost_note(run)
    run["backend"]["profile"] = "archive/h200_qwen3-0.6b_bfloat16_step_graphs_fit10.json"
    assert "fit version 10" in sim_cost_note(run)
    run["backend"]["profile"] = "none"
    assert sim_cost_note(run) == "Sim cost model: roofline"
