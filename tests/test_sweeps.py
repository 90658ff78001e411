"""Sweeps: parallel multiruns (joblib, Ray, submitit/SLURM), kvrl-report, Optuna studies on shared
storage, tracking inside jobs (W&B, CSV), and config mistakes failing before work starts.

The launcher and sweeper plugins come with the ``sweep`` and ``ray`` extras; a test that needs one
skips only when it is not installed.
"""
from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kvrl.analysis import stats
from kvrl.apps import report, tracking
from kvrl.apps.schema import optuna_storage

# A small synthetic workload under memory pressure: 64 blocks for 60 requests arriving at 200/s,
# so watermark and eviction choices change preemptions and latency. Each job takes ~0.1 s.
PRESSURE = ["progress=false", "plots=false", "workload=synthetic", "workload.num_requests=60",
            "workload.arrival.rate=200", "workload.prompt_len.low=16", "workload.prompt_len.high=96",
            "workload.output_len.mean=64", "engine.num_blocks=64", "prefix_cache=none"]


def kvrl(module: str, *args: str, cwd: Path, env: dict | None = None, check: bool = True):
    """Run ``python -m <module> args`` in ``cwd``; with ``check``, fail on a non-zero exit."""
    proc = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=300,
                          cwd=cwd, env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0", **(env or {})})
    if check:
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc


def job_dirs(sweep: Path) -> list[Path]:
    return sorted((p.parent for p in sweep.glob("*/metrics.json")), key=lambda p: int(p.name))


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


# ------------------------------------------------------------------------------ joblib + report
def test_joblib_sweep_and_report_match_the_job_files(tmp_path):
    sweep = tmp_path / "sweep"
    proc = kvrl("kvrl.apps.run", "-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", f"hydra.sweep.dir={sweep}",
                "hydra.job_logging.formatters.simple.format='%(process)d|%(message)s'",   # each job logs its process
                *PRESSURE, "watermark.fraction=0.0,0.1,0.2", "eviction=lifo,most_blocks", "workload.seed=0,1",
                cwd=tmp_path)
    jobs = job_dirs(sweep)
    assert len(jobs) == 12
    # one line per finished job, counted over the whole sweep, each naming its whole job directory
    done = [line for line in proc.stderr.splitlines() if line.startswith("[") and "] job " in line]
    assert [line.split("]")[0] for line in done] == [f"[{i}/12" for i in range(1, 13)]
    assert sorted(line.split(" job ")[1].split()[0] for line in done) == sorted(str(i) for i in range(12))
    assert all(f"    {sweep / str(i)}" in proc.stderr.splitlines() for i in range(12))
    # parallel: the jobs ran in the launcher's two worker processes
    pids = {line.split("|")[0] for job in jobs for line in (job / "run.log").read_text().splitlines()}
    assert len(pids) == 2

    kvrl("kvrl.apps.report", str(sweep), cwd=tmp_path)
    out = sweep / "report"
    rows = read_csv(out / "jobs.csv")
    assert len(rows) == 12
    assert list(rows[0])[:4] == ["job", "watermark.fraction", "eviction", "workload.seed"]
    for row in rows:
        job = sweep / row["job"]
        config = yaml.safe_load((job / "config.yaml").read_text())
        metrics = json.loads((job / "metrics.json").read_text())
        assert float(row["watermark.fraction"]) == config["watermark"]["fraction"]
        assert row["eviction"] == config["eviction"]["name"]
        assert int(row["workload.seed"]) == config["workload"]["seed"]
        for key, value in metrics.items():
            assert (float(row[key]) if row[key] else None) == value, key
    assert len({(r["watermark.fraction"], r["eviction"], r["workload.seed"]) for r in rows}) == 12

    summary = read_csv(out / "summary.csv")
    assert len(summary) == 6 and {s["n"] for s in summary} == {"2"}
    for s in summary:
        seeds = [float(r["goodput_tok_s"]) for r in rows
                 if (r["watermark.fraction"], r["eviction"]) == (s["watermark.fraction"], s["eviction"])]
        mean, ci = report.mean_ci(seeds)
        assert float(s["goodput_tok_s_mean"]) == pytest.approx(mean)
        assert float(s["goodput_tok_s_ci95"]) == pytest.approx(ci)

    pq = pytest.importorskip("pyarrow.parquet")
    table = pq.read_table(out / "jobs.parquet").to_pylist()
    assert [t["job"] for t in table] == [r["job"] for r in rows]
    assert [t["goodput_tok_s"] for t in table] == [float(r["goodput_tok_s"]) for r in rows]
    for name in ("vs_watermark.fraction.png", "pareto.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = (out / "report.md").read_text()
    assert "seeds over `workload.seed`" in text and "Pareto front" in text


def _fake_job(root: Path, name: str, overrides: list[str], config: dict, metrics: dict | None) -> None:
    job = root / name
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    (job / "config.yaml").write_text(yaml.safe_dump(config))
    if metrics is not None:
        (job / "metrics.json").write_text(json.dumps(metrics))


def test_report_orders_jobs_skips_unfinished_ones_and_falls_back_to_jsonl(tmp_path, monkeypatch):
    sweep = tmp_path / "sweep"
    values = {"0": (0.0, 0, 100.0, 1.0), "1": (0.0, 1, 110.0, 0.9), "2": (0.5, 0, 90.0, 0.5),
              "10": (0.5, 1, 96.0, 0.7)}
    for name, (a, seed, tput, ttft) in values.items():
        _fake_job(sweep, name, ["watermark=opt_factor", f"watermark.a={a}", f"seed={seed}"],
                  {"watermark": {"name": "opt_factor", "a": a}, "seed": seed},
                  {"throughput_tok_s": tput, "ttft_p99_s": ttft, "ttft_p50_s": None})
    _fake_job(sweep, "3", ["watermark=opt_factor", "watermark.a=1.0", "seed=0"], {}, None)   # failed job
    decoy = sweep / "0" / "wandb" / "run-x" / "files"                                         # not a job
    decoy.mkdir(parents=True)
    (decoy / "config.yaml").write_text("a: 1\n")
    monkeypatch.setitem(sys.modules, "pyarrow", None)   # as if pyarrow were not installed

    files = report.report(sweep, plot_metrics=("throughput_tok_s", "ttft_p99_s"))
    rows = read_csv(files["jobs.csv"])
    assert [r["job"] for r in rows] == ["0", "1", "2", "10"]
    assert list(rows[0]) == ["job", "watermark.a", "seed", "invalid", "throughput_tok_s", "ttft_p50_s", "ttft_p99_s"]
    assert rows[0]["ttft_p50_s"] == ""
    assert "jobs.parquet" not in files
    assert [json.loads(line)["job"] for line in files["jobs.jsonl"].read_text().splitlines()] == ["0", "1", "2", "10"]
    summary = {float(s["watermark.a"]): s for s in read_csv(files["summary.csv"])}
    assert float(summary[0.5]["throughput_tok_s_mean"]) == pytest.approx(93.0)
    assert float(summary[0.5]["throughput_tok_s_ci95"]) == pytest.approx(stats.t_quantile(1) * 3.0)
    text = files["report.md"].read_text()
    assert "`3`: no metrics.json" in text and "`watermark=opt_factor`" in text
    assert set(files) >= {"vs_watermark.a.png", "pareto.png"}


def test_report_plots_categorical_sweeps_as_bars(tmp_path):
    for num, (eviction, cache, seed) in enumerate((e, c, s) for e in ("lifo", "most_blocks")
                                                  for c in ("none", "hash_lru") for s in (0, 1)):
        _fake_job(tmp_path, str(num), [f"eviction={eviction}", f"prefix_cache={cache}", f"seed={seed}"],
                  {"eviction": {"name": eviction}, "prefix_cache": {"name": cache}, "seed": seed},
                  {"throughput_tok_s": 100.0 + num, "ttft_p99_s": 1.0 / (1 + num), "goodput_tok_s": 90.0 + seed})
    files = report.report(tmp_path)
    assert "bars.png" in files and not any(name.startswith("vs_") for name in files)
    summary = read_csv(files["summary.csv"])
    assert [(s["eviction"], s["prefix_cache"], s["n"]) for s in summary] == [
        ("lifo", "none", "2"), ("lifo", "hash_lru", "2"), ("most_blocks", "none", "2"), ("most_blocks", "hash_lru", "2")]
    assert "| most_blocks | hash_lru | 106.5 | 0.1339 |" in files["report.md"].read_text()   # the Pareto front


def test_report_statistics_and_pareto_front():
    assert math.isnan(report.mean_ci([3.0])[1])
    assert report.pareto_front([(1.0, 1.0), (2.0, 2.0), (1.5, 3.0), (2.0, 1.5), (0.5, 0.5)]) == [0, 3, 4]


def test_report_cli_fails_without_jobs(tmp_path, capsys):
    assert report.main([str(tmp_path)]) == 1
    assert "no job with a readable metrics.json" in capsys.readouterr().err


# ----------------------------------------------------------------------------- Ray, submitit
def test_ray_launcher_runs_a_sweep_on_a_local_ray_instance(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_ray_launcher")
    sweep = tmp_path / "sweep"
    kvrl("kvrl.apps.run", "-m", "hydra/launcher=ray_local", "hydra.launcher.ray.init.num_cpus=2",
         f"hydra.sweep.dir={sweep}", *PRESSURE, "watermark.fraction=0.0,0.2", "eviction=lifo,most_blocks",
         cwd=tmp_path)
    assert [j.name for j in job_dirs(sweep)] == ["0", "1", "2", "3"]
    files = report.report(sweep)
    assert len(read_csv(files["jobs.csv"])) == 4


def test_submitit_local_executor_runs_a_sweep(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    sweep = tmp_path / "sweep"
    kvrl("kvrl.apps.run", "-m", "hydra/launcher=submitit_local", "hydra.launcher.timeout_min=5",
         f"hydra.sweep.dir={sweep}", *PRESSURE, "watermark.fraction=0.0,0.2", cwd=tmp_path)
    assert [j.name for j in job_dirs(sweep)] == ["0", "1"]
    assert list((sweep / ".submitit").glob("*/*_result.pkl"))


def test_slurm_launcher_config_renders_the_sbatch_script(tmp_path):
    """The real SlurmLauncher against stand-ins for srun and sbatch: submitit validates the
    parameters and writes the array job's script, which the fake sbatch keeps and refuses."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 1\n")
    (bin_dir / "sbatch").write_text('#!/bin/sh\ncp "$1" "$SBATCH_COPY"\necho "fake sbatch: refused" >&2\nexit 1\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    script = tmp_path / "sbatch.sh"
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "SBATCH_COPY": str(script),
           "KVRL_SLURM_ACCOUNT": "acct"}
    proc = kvrl("kvrl.apps.run", "-m", "hydra/launcher=slurm", "hydra.launcher.partition=cpu",
                f"hydra.sweep.dir={tmp_path / 'sweep'}", *PRESSURE, "watermark.fraction=0.0,0.2",
                cwd=tmp_path, env=env, check=False)
    assert proc.returncode != 0 and "fake sbatch: refused" in proc.stderr
    lines = set(script.read_text().splitlines())
    assert {"#SBATCH --partition=cpu", "#SBATCH --account=acct", "#SBATCH --array=0-1%2", "#SBATCH --time=60",
            "#SBATCH --cpus-per-task=1", "#SBATCH --mem=4GB"} <= lines

    typo = kvrl("kvrl.apps.run", "-m", "hydra/launcher=slurm", "hydra.launcher.partitin=cpu", *PRESSURE,
                cwd=tmp_path, env=env, check=False)
    assert typo.returncode != 0 and "partitin" in typo.stderr


# ------------------------------------------------------------------------------------- Optuna
def test_optuna_study_is_shared_through_its_storage(tmp_path):
    """Two sweeps (two machines, in effect) add their trials to one study in shared storage;
    each trial's value is the goodput its job wrote."""
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    optuna = pytest.importorskip("optuna")
    url = f"sqlite:///{tmp_path / 'study.db'}"
    for name in ("a", "b"):
        kvrl("kvrl.apps.run", "-m", "hydra/sweeper=tune_fixed", "hydra.sweeper.n_trials=2", "hydra.sweeper.n_jobs=1",
             f"hydra.sweep.dir={tmp_path / name}", *PRESSURE, cwd=tmp_path, env={"KVRL_OPTUNA_STORAGE": url})
    study = optuna.load_study(study_name="kvrl-watermark-fixed", storage=url)
    trials = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(trials) == 4
    goodput = {}
    for job in job_dirs(tmp_path / "a") + job_dirs(tmp_path / "b"):
        fraction = yaml.safe_load((job / "config.yaml").read_text())["watermark"]["fraction"]
        goodput[fraction] = json.loads((job / "metrics.json").read_text())["goodput_tok_s"]
    assert {t.params["watermark.fraction"]: t.value for t in trials} == pytest.approx(goodput)
    assert all(0.0 <= fraction <= 0.3 for fraction in goodput)


def test_optuna_storage_defaults_to_sqlite_under_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KVRL_OPTUNA_STORAGE", raising=False)
    assert optuna_storage("runs/optuna.db") == f"sqlite:///{tmp_path / 'runs' / 'optuna.db'}"
    assert (tmp_path / "runs").is_dir()
    monkeypatch.setenv("KVRL_OPTUNA_STORAGE", "postgresql://host/db")
    assert optuna_storage("runs/optuna.db") == "postgresql://host/db"


# ------------------------------------------------------------------------------------ tracking
def _wandb_records(path: Path):
    """The protobuf records of an offline W&B run file (LevelDB log format: 32 KiB blocks of
    records with a 7-byte header: crc32c, length, type; after a 7-byte file header)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, chunk, block = path.read_bytes(), 7, b"", 32768
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        chunk += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):   # FULL or LAST
            record = pb.Record()
            record.ParseFromString(chunk)
            yield record
            chunk = b""


def test_wandb_runs_inside_each_job_grouped_by_sweep_and_finished_on_failure(tmp_path):
    sweep = tmp_path / "sweep"
    proc = kvrl("kvrl.apps.run", "-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", f"hydra.sweep.dir={sweep}",
                *[o for o in PRESSURE if o != "plots=false"], "logger=wandb",
                "model.num_heads=16,3",   # 3 heads (8 KV heads): the second job fails after W&B starts
                cwd=tmp_path, env={"WANDB_MODE": "offline"}, check=False)
    assert proc.returncode != 0 and "model.num_heads (3)" in proc.stderr
    run_files = sorted(tmp_path.rglob("offline-run-*/run-*.wandb"))
    assert [f.relative_to(sweep).parts[:2] for f in run_files] == [("0", "wandb"), ("1", "wandb")]   # one per job
    runs = []
    for f in run_files:
        records = list(_wandb_records(f))
        run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
        config = {item.key: json.loads(item.value_json) for item in run.config.update}
        logged = {item.key or item.nested_key[0] for r in records if r.WhichOneof("record_type") == "history"
                  for item in r.history.item}
        exit_code = next(r.exit.exit_code for r in records if r.WhichOneof("record_type") == "exit")
        runs.append((run.run_group, run.job_type, config, logged, exit_code))
    assert {r[0] for r in runs} == {"sweep"} and {r[1] for r in runs} == {"run"}
    (_, _, ok_config, ok_logged, ok_exit), (_, _, bad_config, _, bad_exit) = runs
    assert (ok_exit, bad_exit) == (0, 1)
    assert ok_config["choices"]["watermark"] == "fixed" and ok_config["choices"]["eviction"] == "lifo"
    assert ok_config["engine"]["num_blocks"] == 64 and "model.num_heads=16" in ok_config["overrides"]
    assert bad_config["model"]["num_heads"] == 3
    assert {"goodput_tok_s", "ttft_p99_s", "kv_usage"} <= ok_logged


def test_csv_logger_writes_the_metrics_row(tmp_path):
    out = tmp_path / "r"
    kvrl("kvrl.apps.run", f"hydra.run.dir={out}", *PRESSURE, "logger=csv", cwd=tmp_path)
    (row,) = read_csv(out / "log.csv")
    metrics = json.loads((out / "metrics.json").read_text())
    assert float(row["goodput_tok_s"]) == metrics["goodput_tok_s"] and row["step"] == "0"


def test_csv_tracker_widens_its_header_and_tracking_finishes_on_failure(tmp_path):
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"logger": {"name": "csv"}})
    with tracking.start_run(cfg, tmp_path, app="test") as tracker:
        tracker.log({"a": 1})
        tracker.log({"a": 2})
        tracker.log({"a": 3, "b": 4}, step=10)
    assert read_csv(tmp_path / "log.csv") == [{"step": "0", "a": "1", "b": ""}, {"step": "1", "a": "2", "b": ""},
                                              {"step": "10", "a": "3", "b": "4"}]
    finished = []

    class Recorder(tracking.NullTracker):
        def finish(self, exit_code):
            finished.append(exit_code)

    tracking.TRACKERS["recorder"] = Recorder
    try:
        with pytest.raises(RuntimeError):
            with tracking.start_run(OmegaConf.create({"logger": {"name": "recorder"}}), tmp_path, app="test"):
                raise RuntimeError("job failed")
    finally:
        del tracking.TRACKERS["recorder"]
    assert finished == [1]


# ----------------------------------------------------------------------------- config mistakes
@pytest.mark.parametrize("override,message", [
    ("logger.projcet=x", "logger.projcet"),                       # unknown key
    ("slo.ttft_s=abc", "slo.ttft_s"),                             # wrong type
    ("watermark.fraction=1.5", "fraction must be < 1.0"),         # out of range
    ("slo.ttft_s=-1", "slo.ttft_s must be > 0 or null, got -1"),
    ("max_steps=0", "max_steps must be >= 1"),
    ("logger.mode=onlin", "logger.mode must be one of"),
    ("logger=wandbb", "csv"),                                     # Hydra lists the known loggers
])
def test_config_mistakes_fail_before_work_naming_the_key(tmp_path, override, message):
    proc = kvrl("kvrl.apps.run", f"hydra.run.dir={tmp_path / 'x'}", *PRESSURE, override, cwd=tmp_path, check=False)
    assert proc.returncode != 0
    assert message in proc.stderr + proc.stdout
    assert not (tmp_path / "x" / "metrics.json").exists()


def test_a_bad_value_anywhere_in_a_sweep_fails_it_before_the_first_job(tmp_path):
    sweep = tmp_path / "sweep"
    proc = kvrl("kvrl.apps.run", "-m", f"hydra.sweep.dir={sweep}", *PRESSURE, "watermark.fraction=0.1,1.5",
                "eviction=lifo,most_blocks", cwd=tmp_path, check=False)
    assert proc.returncode != 0
    assert "sweep job #2" in proc.stderr and "watermark.fraction=1.5" in proc.stderr
    assert "fraction must be < 1.0" in proc.stderr
    assert not list(sweep.glob("*/.hydra"))


# --------------------------------------------------------------- kvrl-report: validity, verdicts
def _seeded_sweep(root: Path, goodput: dict[str, list[float]], extra: dict[str, dict] | None = None,
                  key: str = "eviction") -> None:
    """Fake jobs: one per (setting, seed) with the given goodput per seed (TTFT falls with it)."""
    num = 0
    for setting, values in goodput.items():
        for seed, g in enumerate(values):
            metrics = {"goodput_tok_s": g, "throughput_tok_s": g * 1.1, "ttft_p99_s": 100.0 / g, "aborted": 0,
                       "wall_s": 0.1 * num, **(extra or {}).get(setting, {})}
            _fake_job(root, str(num), [f"{key}={setting}", f"seed={seed}"],
                      {key.split(".")[0]: {"name": setting}, "seed": seed, "workload": {"name": "synthetic"}}, metrics)
            num += 1


def test_report_ranks_an_aborting_plugin_last_and_flags_it(tmp_path, capsys):
    _seeded_sweep(tmp_path, {"lifo": [100, 120, 90], "broken": [160, 170, 150], "most_blocks": [105, 126, 94]},
                  extra={"broken": {"aborted": 169, "policy_errors": 3}})
    files = report.report(tmp_path, plot_metrics=("goodput_tok_s",))
    summary = {s["eviction"]: s for s in read_csv(files["summary.csv"])}
    assert summary["broken"]["rank"] == "3" and summary["broken"]["invalid_jobs"] == "3"
    assert summary["most_blocks"]["rank"] == "1"
    jobs = {r["job"]: r for r in read_csv(files["jobs.csv"])}
    assert jobs["3"]["invalid"] == "aborted=169; policy_errors=3" and jobs["0"]["invalid"] == ""
    text = files["report.md"].read_text()
    assert "3 of 9 jobs are invalid" in text and "3 of 9 jobs are invalid" in capsys.readouterr().err
    ranked = text.split("## Mean")[1]
    assert ranked.index("most_blocks") < ranked.index("lifo") < ranked.index("broken")
    front = text.split("## Pareto front")[1].split("##")[0]
    assert "broken" not in front and "most_blocks" in front


def test_report_skips_an_unreadable_metrics_json_naming_it(tmp_path, capsys):
    _seeded_sweep(tmp_path, {"lifo": [100, 120], "most_blocks": [105, 126]})
    (tmp_path / "2" / "metrics.json").write_text('{"goodput_tok_s": 1')       # truncated
    (tmp_path / "3" / "metrics.json").write_text('[1, 2]')                      # not an object
    files = report.report(tmp_path)
    assert [r["job"] for r in read_csv(files["jobs.csv"])] == ["0", "1"]
    text = files["report.md"].read_text()
    assert f"unreadable {tmp_path / '2' / 'metrics.json'}: JSONDecodeError" in text
    assert "expected a JSON object, got list" in text
    assert str(tmp_path / "2" / "metrics.json") in capsys.readouterr().err


def test_report_warns_on_identical_seeds_and_identical_settings(tmp_path):
    _seeded_sweep(tmp_path, {"lifo": [100, 100, 100], "most_blocks": [100, 100, 100]})   # wall_s differs
    files = report.report(tmp_path)
    text = files["report.md"].read_text()
    assert "the seeds over `seed` gave identical jobs in 2 of 2 settings" in text
    assert "all 2 settings gave identical metrics" in text
    assert "± 0" not in text and "100 (identical seeds)" in text
    assert {s["goodput_tok_s_ci95"] for s in read_csv(files["summary.csv"])} == {""}


def test_report_paired_comparison_against_a_baseline(tmp_path, capsys):
    # seeds vary a lot (unpaired intervals overlap) but most_blocks is 5% above lifo on every seed
    base = [100.0, 130.0, 90.0, 115.0]
    _seeded_sweep(tmp_path, {"lifo": base, "most_blocks": [v * 1.05 for v in base],
                             "fewest_computed": [v + d for v, d in zip(base, (3, -2, 1, -2.5))]},
                  key="eviction")
    assert report.main([str(tmp_path), "baseline=eviction=lifo", "holm=true"]) == 0
    out = capsys.readouterr().out
    assert "Paired differences vs eviction=lifo" in out and "+5.0%" in out and "better" in out
    summary = {s["eviction"]: s for s in read_csv(tmp_path / "report" / "summary.csv")}
    mb = summary["most_blocks"]
    assert mb["goodput_tok_s_verdict"] == "better" and float(mb["goodput_tok_s_pct_change"]) == pytest.approx(5.0)
    assert mb["ttft_p99_s_verdict"] == "better"                   # lower TTFT is better
    assert summary["fewest_computed"]["goodput_tok_s_verdict"] == "no significant difference"
    assert summary["lifo"]["goodput_tok_s_verdict"] == ""         # the baseline itself
    assert float(mb["goodput_tok_s_p_holm"]) >= float(mb["goodput_tok_s_p"])
    # a bare value with one swept parameter; an unknown one lists the settings
    assert report.main([str(tmp_path), "--baseline", "most_blocks"]) == 0
    assert report.main([str(tmp_path), "baseline=eviction=fifo"]) == 1
    assert "eviction=lifo; eviction=most_blocks; eviction=fewest_computed" in capsys.readouterr().err


def test_report_figures_are_vector_too_with_units_and_caption(tmp_path):
    _seeded_sweep(tmp_path, {"0.0": [100, 120], "0.1": [90, 100]}, key="watermark.fraction")
    files = report.report(tmp_path)
    for name in ("pareto", "vs_watermark.fraction"):
        assert files[f"{name}.pdf"].read_bytes()[:4] == b"%PDF" and files[f"{name}.png"].is_file()
    text = files["report.md"].read_text()
    assert "Workload synthetic" in text and "2 seeds (seed = 0, 1)" in text
