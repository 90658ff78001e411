"""Resuming a ``kvrl-train`` run directory: its own config, its newest readable checkpoint, and
its history (``progress.csv``, ``evaluations.npz``) kept and appended to.

``kvrl-train resume=true hydra.run.dir=<run>``:

* the config is the run's ``config.yaml``; the command line may change only
  :data:`RESUMABLE_KEYS` (e.g. a larger ``train.total_timesteps`` to continue a finished run,
  ``logger``, ``progress``); any other override that disagrees with the run's config (the agent,
  the scenario, ``train.n_envs``) is an error naming the key;
* a run whose ``summary.json`` already reaches ``train.total_timesteps`` is finished: nothing
  is trained or written, and the app says so;
* the model is the newest readable of ``checkpoints/agent_<N>_steps.zip`` and, after a finished
  run, ``model.zip``; an unreadable one (truncated, corrupt) is named in a warning and the next
  older one is tried; none readable is an error naming them all;
* ``progress.csv`` and ``evaluations.npz`` keep their rows up to the resumed model's timesteps
  (rows written after it, by the interrupted segment that is redone, are dropped, and counted in
  the log) and the resumed training appends to them.
"""
from __future__ import annotations

import csv
import io
import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
from omegaconf import DictConfig, OmegaConf

log = logging.getLogger("kvrl.train")

CHECKPOINT_PREFIX = "agent"
RESUMABLE_KEYS = ("train.total_timesteps", "train.eval_every", "train.checkpoint_every", "train.vec_env",
                  "train.torch_threads", "progress", "logger", "resume")     # what a resume may change
STEPS_COLUMN = "time/total_timesteps"


class ResumeError(ValueError):
    """A resume that cannot continue the run as asked; the message names the key or file."""


def checkpoints(run_dir: Path) -> list[tuple[int, Path]]:
    """``(timesteps, zip)`` of every ``checkpoints/agent_<N>_steps.zip``, newest first."""
    found = []
    for path in (run_dir / "checkpoints").glob(f"{CHECKPOINT_PREFIX}_*_steps.zip"):
        m = re.fullmatch(rf"{CHECKPOINT_PREFIX}_(\d+)_steps\.zip", path.name)
        if m:
            found.append((int(m.group(1)), path))
    return sorted(found, reverse=True)


def replay_buffer_of(checkpoint: Path, steps: int) -> Path:
    return checkpoint.with_name(f"{CHECKPOINT_PREFIX}_replay_buffer_{steps}_steps.pkl")


def read_summary(run_dir: Path) -> Optional[dict]:
    path = run_dir / "summary.json"
    try:
        return json.loads(path.read_text()) if path.is_file() else None
    except ValueError as exc:
        raise ResumeError(f"{path} is not valid JSON ({exc})") from None


def finished_timesteps(run_dir: Path, total_timesteps: int) -> Optional[int]:
    """The timesteps of a finished run that already reaches ``total_timesteps``, else None."""
    summary = read_summary(run_dir)
    if summary and (run_dir / "model.zip").is_file() and int(summary["timesteps"]) >= total_timesteps:
        return int(summary["timesteps"])
    return None


def _plain(node: Any) -> Any:
    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node


def restore_config(cfg: DictConfig, run_dir: Path, overrides: Sequence[str]) -> Optional[DictConfig]:
    """The run's ``config.yaml`` with the command line's overrides of :data:`RESUMABLE_KEYS`
    applied (their values taken from ``cfg``, the composed command line); None when the run has no
    ``config.yaml``. ``overrides`` are the command line's (Hydra's ``overrides.task``): one that
    sets another key to a value the run did not have raises :class:`ResumeError`."""
    path = run_dir / "config.yaml"
    if not path.is_file():
        return None
    saved = OmegaConf.load(path)
    episode = OmegaConf.select(saved, "env.episode")
    if episode is not None and "rate_scales_relative" not in episode:
        episode.rate_scales_relative = False          # saved before the key existed: absolute rate scales
    sweep = run_dir / "bins_sweep.json"
    given = cfg.copy()
    if OmegaConf.select(given, "env.action.bins") == "auto" and sweep.is_file():
        given.env.action.bins = json.loads(sweep.read_text())["bins"]     # resolved when the run started
    conflicts, changes = [], []
    for override in overrides:
        key = override.split("=", 1)[0].lstrip("+~")
        if key.startswith("hydra."):
            continue
        if any(key == k or key.startswith(k + ".") for k in RESUMABLE_KEYS):
            changes.append(key)
            continue
        was, now = _plain(OmegaConf.select(saved, key)), _plain(OmegaConf.select(given, key))
        if was != now:
            conflicts.append(f"{key} (the run has {json.dumps(was, default=str)}, the command line "
                             f"{json.dumps(now, default=str)})")
    if conflicts:
        raise ResumeError(f"resume=true continues {run_dir} with its own config ({path}); the command line changes "
                          f"{'; '.join(conflicts)}. Only {', '.join(RESUMABLE_KEYS[:-1])} may change on "
                          f"resume; train another run (a new hydra.run.dir) to change the rest")
    restored = saved.copy()
    for key in changes:
        OmegaConf.update(restored, key, OmegaConf.select(cfg, key), merge=False, force_add=True)
    restored.resume = True
    return restored


@dataclass
class Resumed:
    """The model to continue: loaded from ``path`` at ``timesteps``; ``unreadable`` names each
    newer file that could not be read (``path: error``)."""

    model: Any
    path: Path
    timesteps: int
    unreadable: list[str] = field(default_factory=list)


def load_newest(cls: type, run_dir: Path, env: Any, off_policy: bool) -> Optional[Resumed]:
    """The newest readable model of ``run_dir`` (module docs), loaded with ``env``; None when the
    run has none. Off-policy checkpoints get their replay buffer (a missing or unreadable one is
    named in a warning: training goes on with an empty buffer)."""
    candidates = [(steps, 1, path) for steps, path in checkpoints(run_dir)]
    summary = read_summary(run_dir)
    if summary and (run_dir / "model.zip").is_file():
        candidates.append((int(summary["timesteps"]), 0, run_dir / "model.zip"))   # a checkpoint of equal steps first
    unreadable = []
    for steps, is_checkpoint, path in sorted(candidates, reverse=True):
        try:
            model = cls.load(str(path), env=env, device="cpu")
        except Exception as exc:        # noqa: BLE001  (any failure to read makes the file unusable: say which)
            unreadable.append(f"{path}: {type(exc).__name__}: {exc}")
            log.warning("resume: cannot read %s (%s: %s); trying the next older checkpoint", path,
                        type(exc).__name__, exc)
            continue
        if off_policy:
            buffer = replay_buffer_of(path, steps) if is_checkpoint else None
            try:
                if buffer is None or not buffer.is_file():
                    raise FileNotFoundError(f"no replay buffer {buffer.name if buffer else 'saved with model.zip'}")
                model.load_replay_buffer(str(buffer))
            except Exception as exc:    # noqa: BLE001
                log.warning("resume: %s's replay buffer cannot be used (%s: %s); continuing with an empty buffer",
                            path, type(exc).__name__, exc)
        return Resumed(model, path, int(model.num_timesteps), unreadable)
    if unreadable:
        raise ResumeError(f"resume: no readable checkpoint in {run_dir}: " + "; ".join(unreadable))
    return None


def keep_history(run_dir: Path, timesteps: int) -> tuple[str, Optional[dict]]:
    """The run's history up to ``timesteps``: ``progress.csv``'s text (header + rows) and
    ``evaluations.npz``'s arrays (None if absent). Later rows are dropped and counted in the log."""
    text = ""
    progress = run_dir / "progress.csv"
    if progress.is_file() and progress.stat().st_size > 0:
        rows = list(csv.DictReader(io.StringIO(progress.read_text())))
        header = progress.read_text().splitlines()[0].split(",")
        kept = [r for r in rows if not r.get(STEPS_COLUMN) or float(r[STEPS_COLUMN]) <= timesteps]
        out = io.StringIO()
        writer = csv.DictWriter(out, header, lineterminator="\n")
        writer.writeheader()
        writer.writerows(kept)
        text = out.getvalue()
        if len(kept) < len(rows):
            log.info("resume: dropped %d row(s) of %s logged after %d timesteps (the segment redone now)",
                     len(rows) - len(kept), progress, timesteps)
    evaluations = None
    path = run_dir / "evaluations.npz"
    if path.is_file():
        with np.load(path) as data:
            arrays = {k: data[k] for k in data.files}
        keep = arrays["timesteps"] <= timesteps
        if not keep.all():
            log.info("resume: dropped %d evaluation(s) of %s after %d timesteps", int((~keep).sum()), path, timesteps)
        evaluations = {k: v[keep] for k, v in arrays.items()}
    return text, evaluations


def appending_csv(filename: Path, history: str):
    """SB3's CSV writer that starts from ``history`` (a header and rows) and appends to it."""
    from stable_baselines3.common.logger import CSVOutputFormat

    writer = CSVOutputFormat(str(filename))
    if history:
        writer.file.write(history)
        writer.file.flush()
        writer.keys = history.splitlines()[0].split(",")
    return writer


def restore_evaluations(evaluator: Any, evaluations: Optional[dict]) -> None:
    """Give an ``EvalCallback`` the run's earlier evaluations, so that it appends to them and the
    best model so far stays the one to beat."""
    if not evaluations or len(evaluations["timesteps"]) == 0:
        return
    evaluator.evaluations_timesteps = [int(t) for t in evaluations["timesteps"]]
    evaluator.evaluations_results = [list(r) for r in evaluations["results"]]
    evaluator.evaluations_length = [list(r) for r in evaluations["ep_lengths"]]
    if "successes" in evaluations:
        evaluator.evaluations_successes = [list(r) for r in evaluations["successes"]]
    evaluator.best_mean_reward = float(np.mean(evaluations["results"], axis=1).max())
