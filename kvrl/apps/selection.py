"""``kvrl-select``: model selection on the validation split (``conf/select.yaml``).

Every saved agent of ``agents`` (kvrl-train run directories, model zips, or glob patterns such as
``runs/train/x/checkpoints/agent_*_steps.zip``) serves the whole ``split`` (``val``) of the
scenario once, with seed ``seed`` and no resample, through the same ``run_job`` as ``kvrl-eval``;
with ``seeds`` (and ``resample``, as in kvrl-eval) it serves one job per seed and is scored by the
mean over them, so that the pick among many checkpoints is not the luckiest of one job.
The scenario is composed exactly as in kvrl-train and kvrl-eval (``env=<task>`` plus any
overrides, e.g. ``workload=azure_csv workload.path=<file>``), so agents are scored on the
scenario the command names; an agent trained on another scenario is scored all the same, with a
warning naming the task keys that differ. Writes ``selection.csv`` (best first: goodput, SLO
attainment and p99 latencies, each the mean over the seeds; requests served over all of an agent's
jobs; path, split, seeds, workload) into the Hydra run directory
(``runs/select/<date>/<time>``) and prints the ranking.
"""
from __future__ import annotations

import csv
import glob
import logging
import statistics
from pathlib import Path
from typing import Sequence

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from kvrl.apps.eval import Job, Policy, agent_plugin, run_jobs
from kvrl.apps.outputs import atomic_write
from kvrl.apps.rl_schema import register_rl_schemas
from kvrl.apps.scenario import agent_differences, describe_differences
from kvrl.apps.schema import ConfigError, validate_config
from kvrl.envs.agent_io import META_NAME, ROLES, model_path, read_meta
from kvrl.envs.config import describe_workload, env_config_from_app

log = logging.getLogger("kvrl.select")

register_rl_schemas()

COLUMNS = ("goodput_tok_s", "slo_attainment", "ttft_p99_s", "tpot_p99_s", "requests", "path")
SCORES = COLUMNS[:-1]


def expand(specs: Sequence[str]) -> list[Path]:
    """The model zips ``specs`` name (paths or glob patterns; a directory is its best model),
    sorted and without repeats. A spec that matches nothing raises naming it."""
    paths = []
    for i, spec in enumerate(specs):
        matches = sorted(glob.glob(str(Path(spec).expanduser()))) if glob.has_magic(spec) else [spec]
        if not matches:
            raise FileNotFoundError(f"agents[{i}]={spec!r} matches no file")
        paths += [model_path(m) for m in matches]
    return sorted(set(paths))


def select(cfg: DictConfig, out_dir: Path) -> list[dict]:
    """Score every agent of ``cfg.agents`` on ``cfg.split`` of the scenario; rows best first."""
    env_id, env_cfg = env_config_from_app(cfg)
    role = ROLES[env_id]
    run = env_cfg.run
    paths = expand(list(cfg.agents))
    warned = set()
    for path in paths:
        meta = read_meta(path)
        if ROLES[meta["env_id"]] != role:
            raise ValueError(f"{path} is a {ROLES[meta['env_id']]} agent ({meta['env_id']}); env={env_id} "
                             f"needs a {role} agent")
        diff = agent_differences(meta, run, role)
        source = next(p for p in (path.parent / META_NAME, path.parent.parent / META_NAME) if p.is_file())
        if diff and source not in warned:
            warned.add(source)
            log.warning("%s was trained on another scenario (differs in: %s); scored on this one", source.parent,
                        describe_differences(diff))
    workload = describe_workload(run["workload"])
    seeds = [int(s) for s in cfg.seeds] if cfg.seeds else [int(cfg.seed)]
    log.info("scoring %d agent(s) on the %s split of %s, seeds %s, resample %s", len(paths), cfg.split, workload,
             seeds, cfg.resample)
    jobs = [Job(Policy(str(p), "agent", agent_plugin(role, p, run)), cfg.split, seed) for p in paths for seed in seeds]
    results = run_jobs(run, role, jobs, cfg.resample, int(cfg.workers))
    by_agent: dict[str, list[dict]] = {}
    for r in results:
        by_agent.setdefault(r["policy"], []).append(r)
    rows = sorted(({**{k: statistics.fmean(r[k] for r in runs) for k in SCORES if k != "requests"},
                    "requests": sum(r["requests"] for r in runs), "path": path, "split": cfg.split,
                    "seeds": len(runs), "workload": workload} for path, runs in by_agent.items()),
                  key=lambda r: -r["goodput_tok_s"])
    out_dir.mkdir(parents=True, exist_ok=True)

    def write(f):
        w = csv.DictWriter(f, [*COLUMNS, "split", "seeds", "workload"])
        w.writeheader()
        w.writerows(rows)
    atomic_write(out_dir / "selection.csv", write)
    return rows


@hydra.main(config_path="pkg://kvrl.conf", config_name="select", version_base="1.3")
def main(cfg: DictConfig) -> float:
    validate_config(cfg)
    if cfg.split not in ("train", "val", "test"):
        raise ConfigError(f"invalid config: split must be one of ['train', 'val', 'test'], got {cfg.split!r}")
    if cfg.seeds is not None and len(cfg.seeds) == 0:
        raise ConfigError("invalid config: seeds must list at least one seed (or be null)")
    if cfg.resample is not None and not 0.0 < cfg.resample <= 1.0:
        raise ConfigError(f"invalid config: resample must be in (0, 1], got {cfg.resample}")
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    rows = select(cfg, out_dir)
    env_id, env_cfg = env_config_from_app(cfg)
    print(f"kvrl-select: {env_id} on the whole {cfg.split} split of {describe_workload(env_cfg.run['workload'])} "
          f"(seeds {list(cfg.seeds) if cfg.seeds else [cfg.seed]}) -> {out_dir / 'selection.csv'}")
    print(f"{'goodput tok/s':>14}  {'SLO att.':>8}  path")
    for r in rows:
        print(f"{r['goodput_tok_s']:14.1f}  {r['slo_attainment']:8.3f}  {r['path']}")
    if len(rows) > cfg.top:
        print(f"\nbest {cfg.top}:")
        for r in rows[:cfg.top]:
            print(f"{r['goodput_tok_s']:14.1f}  {r['slo_attainment']:8.3f}  {r['path']}")
    return rows[0]["goodput_tok_s"]


if __name__ == "__main__":
    main()
