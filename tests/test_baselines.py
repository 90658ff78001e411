"""kvrl-eval's baselines beyond the given heuristics (kvrl/apps/baselines.py): grids tuned on val,
the hindsight-best constant on test (oracle), the agent's strongest competitor."""
from __future__ import annotations

import csv
import subprocess
import sys

import numpy as np
import pytest

from kvrl.apps.baselines import (grid_points, label_of, oracle_on_test, strongest_competitor, tune_on_val,
                                 tuning_grids)


def fake_runner(goodput, seeds=(0, 1)):
    """A runner whose goodput is ``goodput(plugin, split, seed)``; records what it ran."""
    calls = []

    def run(entries, split, kind):
        calls.append((split, kind, [label for label, _ in entries]))
        return [{"policy": label, "kind": kind, "split": split, "seed": s, "goodput_tok_s": goodput(p, split, s)}
                for s in seeds for label, p in entries]
    run.calls = calls
    return run


def test_grid_points_are_the_product_over_the_baselines_params():
    points = grid_points("watermark", {"name": "token_ratio", "init_ratio": 0.5},
                         {"clip_max_new_tokens": [64, 256], "min_ratio": [0.05, 0.2]}, "tune.watermark.token_ratio")
    assert points == [{"name": "token_ratio", "init_ratio": 0.5, "clip_max_new_tokens": c, "min_ratio": m}
                      for c in (64, 256) for m in (0.05, 0.2)]


@pytest.mark.parametrize("grid,named", [
    ({"a": []}, r"tune\.watermark\.opt_factor\.a"), ({"a": 2.0}, r"tune\.watermark\.opt_factor\.a"),
    ({"b": [1.0]}, r"tune\.watermark\.opt_factor.*unknown parameter.*b"),
    ({"a": [1.0, -1.0]}, r"tune\.watermark\.opt_factor.*a"),
    ([1.0], r"tune\.watermark\.opt_factor"),
])
def test_bad_grids_are_rejected_naming_the_key(grid, named):
    with pytest.raises(ValueError, match=named):
        grid_points("watermark", {"name": "opt_factor"}, grid, "tune.watermark.opt_factor")


def test_tuning_grids_skip_absent_baselines_and_reject_unknown_or_ambiguous_names():
    baselines = [{"name": "fixed", "fraction": 0.01}, {"name": "opt_factor"}]
    grids = tuning_grids("watermark", baselines, {"opt_factor": {"a": [1.0, 2.0]}, "pi": {"ki": [0.1]}})
    assert list(grids) == ["opt_factor"] and len(grids["opt_factor"]) == 2
    with pytest.raises(ValueError, match=r"tune\.watermark\.opt_factr"):
        tuning_grids("watermark", baselines, {"opt_factr": {"a": [1.0]}})
    with pytest.raises(ValueError, match=r"tune\.watermark\.fixed.*2 entries"):
        tuning_grids("watermark", [*baselines, {"name": "fixed", "fraction": 0.3}], {"fixed": {"fraction": [0.1]}})


def test_tune_on_val_picks_the_best_mean_val_point_per_plugin():
    # val goodput peaks at a=4 for opt_factor and at ki=0.05 for pi; test would prefer others
    def goodput(p, split, seed):
        if split != "val":
            raise AssertionError("tuning must run on val only")
        if p["name"] == "opt_factor":
            return 100.0 - (p["a"] - 4.0) ** 2 + seed
        return 50.0 - 1000 * abs(p["ki"] - 0.05) + (5.0 if seed == 1 and p["ki"] == 0.2 else 0.0)
    runner = fake_runner(goodput)
    baselines = [{"name": "opt_factor"}, {"name": "pi", "signal": "slo"}]
    tuned, results = tune_on_val("watermark", baselines, {"opt_factor": {"a": [0.0, 2.0, 4.0, 8.0]},
                                                          "pi": {"ki": [0.02, 0.05, 0.2]}}, runner)
    assert tuned == [("opt_factor(a=4.0) [val-tuned]", {"name": "opt_factor", "a": 4.0}),
                     ("pi(signal=slo, ki=0.05) [val-tuned]", {"name": "pi", "signal": "slo", "ki": 0.05})]
    assert len(runner.calls) == 1 and runner.calls[0][:2] == ("val", "tuning")      # one batch
    assert len(results) == 2 * 7 and {r["split"] for r in results} == {"val"}


def test_oracle_is_the_best_mean_on_test_and_no_competitor():
    runner = fake_runner(lambda p, split, seed: {0.0: 10.0, 0.1: 30.0, 0.3: 20.0}[p["fraction"]] + seed)
    label, oracle, sweep = oracle_on_test([0.0, 0.1, 0.3], runner)
    assert label == "fixed(fraction=0.1) [oracle: best constant on test]"
    assert [r["goodput_tok_s"] for r in oracle] == [30.0, 31.0] and {r["kind"] for r in oracle} == {"oracle"}
    assert len(sweep) == 6 and runner.calls[0][0] == "test"
    runs = oracle + [{"policy": "fixed(fraction=0.01)", "kind": "heuristic", "goodput_tok_s": g} for g in (25.0, 26.0)]
    runs += [{"policy": "agent", "kind": "agent", "goodput_tok_s": g} for g in (90.0, 91.0)]
    runs += [{"policy": "pi [val-tuned]", "kind": "val-tuned", "goodput_tok_s": g} for g in (27.0, 27.0)]
    assert strongest_competitor(runs) == "pi [val-tuned]"


def test_eval_tunes_on_val_adds_the_oracle_and_compares_with_the_strongest(tmp_path):
    """kvrl-eval end to end on a tiny scenario: the val-tuned point is the val argmax of the
    grid (from results.csv), the oracle is the test argmax of the sweep, and the leaderboard has
    a paired Δ column against the strongest competitor and against the oracle."""
    out = tmp_path / "eval"
    args = ["workload.max_requests=60", "agents=[]", "seeds=[0,1]", "tune_seeds=[0,1]", "sweep=[0.0,0.3]",
            "baselines.watermark=[{name: fixed, fraction: 0.01},{name: opt_factor}]",
            "tune.watermark={opt_factor: {a: [0.0, 200.0]}}", "workers=1", "plots=false", f"hydra.run.dir={out}"]
    proc = subprocess.run([sys.executable, "-m", "kvrl.apps.eval", *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    results = list(csv.DictReader((out / "results.csv").read_text().splitlines()))

    def mean(policy, split):
        return np.mean([float(r["goodput_tok_s"]) for r in results if r["policy"] == policy and r["split"] == split])
    val = {a: mean(f"opt_factor(a={a})", "val") for a in (0.0, 200.0)}
    assert all(np.isfinite(list(val.values()))) and val[0.0] != val[200.0]
    best_a = max(val, key=val.get)
    test = {f: mean(f"fixed(fraction={f})", "test") for f in (0.0, 0.3)}
    best_f = max(test, key=test.get)
    rows = list(csv.DictReader((out / "leaderboard.csv").read_text().splitlines()))
    kinds = {r["policy"]: r["kind"] for r in rows}
    assert kinds[f"opt_factor(a={best_a}) [val-tuned]"] == "val-tuned"
    assert kinds[f"fixed(fraction={best_f}) [oracle: best constant on test]"] == "oracle"
    competitors = [r for r in rows if r["kind"] in ("heuristic", "val-best", "val-tuned")]
    strongest = max(competitors, key=lambda r: float(r["goodput_tok_s_mean"]))["policy"]
    columns = list(rows[0])
    assert f"Δgoodput_tok_s vs {strongest}_mean" in columns
    assert f"Δgoodput_tok_s vs fixed(fraction={best_f}) [oracle: best constant on test]_mean" in columns



def test_live_eval_tunes_in_the_sim_with_val_pick_sim(tmp_path):
    """backend=live with val_pick=sim: the tuning grid runs on val in the sim (no accelerator
    time), labelled [val-tuned in sim]; the tuned policy runs live on test."""
    out = tmp_path / "live"
    args = ["backend=live", "model=tiny", "backend.device=cpu", "engine.num_blocks=256", "workload.max_requests=4",
            "seeds=[0]", "tune_seeds=[0]", "agents=[]", "live_warmup=1", "plots=false", "workers=1", "seed=0",
            "val_pick=sim", "fixed_best=0.0", "oracle=false", "baselines.watermark=[{name: opt_factor}]",
            "tune.watermark={opt_factor: {a: [0.0, 200.0]}}", f"hydra.run.dir={out}"]
    proc = subprocess.run([sys.executable, "-m", "kvrl.apps.eval", *args], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    rows = list(csv.DictReader((out / "results.csv").read_text().splitlines()))
    val = [r for r in rows if r["split"] == "val"]
    assert {r["backend"] for r in val} == {"sim"} and {r["policy"] for r in val} == {"opt_factor(a=0.0)",
                                                                                    "opt_factor(a=200.0)"}
    test = [r for r in rows if r["split"] == "test"]
    assert {r["backend"] for r in test} == {"live"}
    assert sum(r["policy"].endswith("[val-tuned in sim]") for r in test) == 1


def test_tune_loads_training_picks_and_tunes_on_the_mean_over_the_training_loads(tmp_path):
    """tune_loads=training: the val sweep and every tuning point serve val once at each training load
    (env.episode.rate_scales x workload.rate_scale, tagged val_rate_scale in results.csv), and the picks
    are the argmax of the mean over loads and seeds; test runs stay at the scenario's rate. A task
    without training loads is refused by name."""
    out = tmp_path / "eval"
    args = ["workload.max_requests=60", "agents=[]", "seeds=[0]", "tune_seeds=[0]", "sweep=[0.0,0.3]",
            "baselines.watermark=[{name: opt_factor}]", "tune.watermark={opt_factor: {a: [0.0, 200.0]}}",
            "env.episode.rate_scales=[0.5,2.0]", "tune_loads=training", "oracle=false", "workers=1", "plots=false",
            f"hydra.run.dir={out}"]
    proc = subprocess.run([sys.executable, "-m", "kvrl.apps.eval", *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    results = list(csv.DictReader((out / "results.csv").read_text().splitlines()))
    val = [r for r in results if r["split"] == "val"]
    scale = 20.0     # conf/env/watermark.yaml's workload.rate_scale
    assert {float(r["val_rate_scale"]) for r in val} == {0.5 * scale, 2.0 * scale}
    assert all(r["val_rate_scale"] == "" for r in results if r["split"] == "test")
    assert len(val) == 2 * (2 + 2)              # (2 constants + 2 grid points) x 2 loads x 1 seed

    def mean(policy):
        return np.mean([float(r["goodput_tok_s"]) for r in val if r["policy"] == policy])
    by_load = {(r["policy"], r["val_rate_scale"]): float(r["goodput_tok_s"]) for r in val}
    assert len(set(by_load.values())) > 2                             # the loads served differ
    best_f = max((0.0, 0.3), key=lambda f: mean(f"fixed(fraction={f})"))
    best_a = max((0.0, 200.0), key=lambda a: mean(f"opt_factor(a={a})"))
    kinds = {r["policy"]: r["kind"] for r in csv.DictReader((out / "leaderboard.csv").read_text().splitlines())}
    assert kinds[f"fixed(fraction={best_f}) [val-best]"] == "val-best"
    assert kinds[f"opt_factor(a={best_a}) [val-tuned]"] == "val-tuned"
    assert "tune_loads=training" in (out / "leaderboard.md").read_text()
    bad_args = [a if not a.startswith("env.episode.rate_scales=") else "env.episode.rate_scales=null" for a in args[:-1]]
    bad = subprocess.run([sys.executable, "-m", "kvrl.apps.eval", *bad_args, f"hydra.run.dir={tmp_path / 'bad'}"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "tune_loads=training" in bad.stderr


def test_at_loads_serves_every_load_in_one_worker_pool(monkeypatch):
    """at_loads hands the jobs of every load to one run_jobs call: one worker pool, not one per load.
    The results come load by load in the order of the jobs, each tagged with its val_rate_scale and
    equal to its job served alone at that load (the run's workload.rate_scale set to it)."""
    import kvrl.apps.eval as E
    from kvrl.envs.config import load_task

    _, cfg = load_task("watermark", ["workload=synthetic", "workload.num_requests=30", "workload.rate_scale=1.0",
                                     "engine.num_blocks=256"])
    pools = []

    class CountedPool(E.ProcessPoolExecutor):
        def __init__(self, *args, **kwargs):
            pools.append(kwargs.get("max_workers"))
            super().__init__(*args, **kwargs)
    monkeypatch.setattr(E, "ProcessPoolExecutor", CountedPool)
    jobs = [E.Job(E.Policy(f"fixed {f}", "sweep", {"name": "fixed", "fraction": f}), "val", seed)
            for seed in (0, 1) for f in (0.0, 0.2)]
    loads = (0.5, 4.0)
    results = E.at_loads(cfg.run, "watermark", jobs, loads, None, workers=2, chunk=2)
    assert pools == [2]
    assert [(r["policy"], r["seed"], r["val_rate_scale"]) for r in results] == [
        (j.policy.label, j.seed, scale) for scale in loads for j in jobs]
    alone = [r for scale in loads for r in E.run_jobs(
        {**cfg.run, "workload": {**cfg.run["workload"], "rate_scale": scale}}, "watermark", jobs, None, workers=1)]
    np.testing.assert_equal([{k: v for k, v in r.items() if k != "val_rate_scale"} for r in results], alone)  # NaN: equal
    low, high = results[:len(jobs)], results[len(jobs):]
    assert all(a["duration_s"] > b["duration_s"] for a, b in zip(low, high))     # 8x the rate: a shorter run
    np.testing.assert_equal(E.at_loads(cfg.run, "watermark", jobs[:1], None, None, workers=1, chunk=1),
                            E.run_jobs(cfg.run, "watermark", jobs[:1], None, workers=1))
