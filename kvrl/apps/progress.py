"""Progress of a multirun: one bar per sweep (jobs done / total) and one line per finished job,
whatever the launcher.

Hydra runs a sweep's jobs in the launching process (basic launcher) or in worker processes
(joblib, submitit, Ray), each with its own copy of the callbacks. So the :class:`SweepProgress`
callback records each finished job (``on_job_end``, in whichever process ran it) as one JSON line
appended to ``<sweep dir>/.kvrl_progress.jsonl``, and a thread of the launching process (started
by ``on_multirun_start``) follows that file and is the only writer to the terminal: a tqdm bar of
jobs done / total (total: the basic sweeper's job count; unknown for Optuna) and, per job, one
line on stderr ``[done/total] job <num> <status> in <s> s: <overrides> -> <job dir>``. Jobs of a multirun
run without their own progress bars (:func:`job_progress`), which would interleave.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

PROGRESS_FILE = ".kvrl_progress.jsonl"
_FOLLOWER: dict[str, Any] = {}          # this (launching) process's follower thread and its state


def in_multirun() -> bool:
    """Whether the running Hydra job is one job of a multirun."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def job_progress(requested: bool) -> bool:
    """Whether a job shows its own progress bar: as ``requested``, except in a multirun, where the
    sweep's bar (:class:`SweepProgress`) replaces the per-job bars."""
    return bool(requested) and not in_multirun()


def _total(config: DictConfig) -> Optional[int]:
    """The basic sweeper's job count (None for sweepers whose trials are asked for one by one)."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from kvrl.apps.schema import sweep_job_overrides

    try:
        jobs = sweep_job_overrides(config, OverridesParser.create(GlobalHydra.instance().config_loader()))
    except Exception:   # noqa: BLE001  (a count is a nicety: never fail a sweep over it)
        return None
    return len(jobs) or None


def format_line(record: dict, done: int, total: Optional[int]) -> str:
    """The line printed for one finished job."""
    value = record.get("value")
    shown = f" -> {value:.6g}" if isinstance(value, (int, float)) else ""
    return (f"[{done}/{total or '?'}] job {record['num']} {record['status']} in {record['seconds']:.1f} s{shown}: "
            f"{' '.join(record['overrides'])}\n    {record['dir']}")


def _follow(path: Path, total: Optional[int], stop: threading.Event) -> None:
    from tqdm.auto import tqdm

    bar = tqdm(total=total, unit="job", desc=f"sweep {path.parent.name}", disable=None, dynamic_ncols=True)
    offset, done = 0, 0
    try:
        while True:
            finished = stop.is_set()
            if path.is_file():
                with open(path) as f:
                    f.seek(offset)
                    for line in f:
                        if not line.endswith("\n"):
                            break                           # a record still being written
                        offset += len(line.encode())
                        done += 1
                        bar.write(format_line(json.loads(line), done, total), file=sys.stderr)
                        bar.update(1)
            if finished:
                break
            stop.wait(0.5)
    finally:
        bar.close()


class SweepProgress(Callback):
    """Hydra callback: the sweep's progress bar and per-job lines (see the module docs)."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        path = Path(str(config.hydra.sweep.dir)) / PROGRESS_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
        stop = threading.Event()
        thread = threading.Thread(target=_follow, args=(path, _total(config), stop), daemon=True)
        _FOLLOWER.update(stop=stop, thread=thread)
        thread.start()

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        _FOLLOWER["job_start"] = time.perf_counter()

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        if not in_multirun():
            return
        value = getattr(job_return, "_return_value", None)
        record = {"num": int(config.hydra.job.num), "status": getattr(job_return.status, "name", "?").lower(),
                  "seconds": time.perf_counter() - _FOLLOWER.pop("job_start", time.perf_counter()),
                  "overrides": list(job_return.overrides or []), "dir": str(config.hydra.runtime.output_dir),
                  "value": value if isinstance(value, (int, float)) and not isinstance(value, bool) else None}
        line = (json.dumps(record) + "\n").encode()
        fd = os.open(Path(str(config.hydra.sweep.dir)) / PROGRESS_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)              # one append per record: whole lines, whatever the process
        finally:
            os.close(fd)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if "thread" in _FOLLOWER:
            _FOLLOWER["stop"].set()
            _FOLLOWER.pop("thread").join(timeout=10)
