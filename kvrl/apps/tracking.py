"""Experiment tracking for every kvrl Hydra app: ``logger=none|csv|wandb`` (``conf/logger``).

Contract:

* Call :func:`start_run` inside the job, i.e. in the Hydra task function, never in a launcher's
  parent process: each job of a multirun (joblib worker, SLURM task, Ray worker, Optuna trial)
  then owns exactly one tracked run, in its own output directory.
* The run is always finished: with exit code 0 when the ``with`` block completes, 1 when it
  raises (the exception propagates).
* The tracked run carries the resolved config, the Hydra group choices (plugins, backend,
  workload, ...) and the job's overrides; the jobs of one multirun share a W&B group (the sweep
  directory unless ``logger.group`` is set).

Usage inside a task function::

    with start_run(cfg, out_dir, app="run") as tracker:
        metrics = ...
        tracker.log(metrics, images={"kv_usage": out_dir / "kv_usage.png"})
"""
from __future__ import annotations

import csv
import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional, Protocol

from omegaconf import DictConfig, OmegaConf

from kvrl.apps.outputs import atomic_write

WANDB_NAME_MAX = 128   # W&B's limit on group and run names


@dataclass
class JobInfo:
    """What Hydra knows about the running job (defaults outside a Hydra job)."""

    app: str
    choices: dict[str, str] = field(default_factory=dict)   # config group -> option, hydra/* left out
    overrides: list[str] = field(default_factory=list)      # the job's task overrides
    sweep_dir: Optional[str] = None                         # set in multiruns only
    job_num: Optional[int] = None
    override_dirname: str = ""

    @classmethod
    def current(cls, app: str) -> "JobInfo":
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        if not HydraConfig.initialized():
            return cls(app)
        hc = HydraConfig.get()
        multirun = hc.mode == RunMode.MULTIRUN
        return cls(app=app,
                   choices={k: str(v) for k, v in hc.runtime.choices.items() if not k.startswith("hydra/")},
                   overrides=list(hc.overrides.task),
                   sweep_dir=str(hc.sweep.dir) if multirun else None,
                   job_num=int(hc.job.num) if multirun else None,
                   override_dirname=str(hc.job.override_dirname))

    @property
    def group(self) -> Optional[str]:
        """The sweep directory (relative to the working directory when inside it), or None."""
        if self.sweep_dir is None:
            return None
        path = Path(self.sweep_dir).absolute()
        try:
            path = path.relative_to(Path.cwd())
        except ValueError:
            pass
        return str(path)[-WANDB_NAME_MAX:]

    @property
    def name(self) -> Optional[str]:
        """``<job num>:<overrides>`` in a multirun; None (the tracker's default) otherwise."""
        if self.job_num is None:
            return None
        return f"{self.job_num}:{self.override_dirname}"[:WANDB_NAME_MAX]


class Tracker(Protocol):
    def log(self, metrics: Mapping[str, Any], step: Optional[int] = None,
            images: Optional[Mapping[str, os.PathLike]] = None) -> None:
        """Record one row of metrics (and images: name -> PNG path; missing files are skipped)."""

    def finish(self, exit_code: int) -> None:
        """Close the run; ``exit_code`` 1 marks it failed."""


class NullTracker:
    """``logger=none``: the job's own files are the record."""

    def __init__(self, cfg: DictConfig, out_dir: Path, info: JobInfo) -> None:
        pass

    def log(self, metrics, step=None, images=None) -> None:
        pass

    def finish(self, exit_code: int) -> None:
        pass


class CSVTracker:
    """``logger=csv``: each :meth:`log` appends a row (``step`` + metrics) to ``log.csv`` in the
    job directory; a row with new keys rewrites the file with the widened header. Images stay
    where the job wrote them."""

    def __init__(self, cfg: DictConfig, out_dir: Path, info: JobInfo) -> None:
        self.path = Path(out_dir) / "log.csv"
        self.fields: list[str] = ["step"]
        self.rows: list[dict[str, Any]] = []

    def log(self, metrics, step=None, images=None) -> None:
        row = {"step": len(self.rows) if step is None else step, **metrics}
        self.rows.append(row)
        new = [k for k in row if k not in self.fields]
        if new or len(self.rows) == 1:
            self.fields += new
            atomic_write(self.path, self._write_all)
        else:
            with open(self.path, "a", newline="") as f:
                csv.DictWriter(f, self.fields).writerow(row)

    def _write_all(self, f) -> None:
        writer = csv.DictWriter(f, self.fields)
        writer.writeheader()
        writer.writerows(self.rows)

    def finish(self, exit_code: int) -> None:
        pass


class WandbTracker:
    """``logger=wandb``: one W&B run per job, written under ``<job dir>/wandb``."""

    def __init__(self, cfg: DictConfig, out_dir: Path, info: JobInfo) -> None:
        import wandb

        lg = cfg.logger
        config = OmegaConf.to_container(cfg, resolve=True)
        config.update(choices=info.choices, overrides=info.overrides)
        self._wandb = wandb
        self.run = wandb.init(project=lg.project, entity=lg.entity, mode=lg.mode, dir=str(out_dir),
                              group=lg.group or info.group, job_type=info.app, name=info.name,
                              tags=list(lg.tags), config=config)

    def log(self, metrics, step=None, images=None) -> None:
        row = dict(metrics)
        for key, path in (images or {}).items():
            if Path(path).is_file():
                row[key] = self._wandb.Image(str(path))
        self.run.log(row, step=step)

    def finish(self, exit_code: int) -> None:
        self.run.finish(exit_code=exit_code)


TRACKERS = {"none": NullTracker, "csv": CSVTracker, "wandb": WandbTracker}


@contextmanager
def start_run(cfg: DictConfig, out_dir: os.PathLike, app: str) -> Iterator[Tracker]:
    """Open the tracker ``cfg.logger.name`` for this job (see the module contract); ``app``
    names the kvrl app (W&B job type). A config without ``logger`` is not tracked."""
    name = cfg.logger.name if "logger" in cfg else "none"
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tracker = TRACKERS[name](cfg, out_dir, JobInfo.current(app))
    try:
        yield tracker
    except BaseException:
        tracker.finish(exit_code=1)
        raise
    tracker.finish(exit_code=0)
