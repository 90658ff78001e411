"""``random_checkpoint_for``: written once, atomically, and shared by processes that race to write it."""
from __future__ import annotations

import os

import torch
from omegaconf import OmegaConf

import kvrl.model as kvrl_model
from kvrl.executors.live_build import random_checkpoint_for


def _tiny() -> dict:
    return OmegaConf.to_container(OmegaConf.load("conf/model/tiny.yaml"))


def test_written_once_and_reused(tmp_path):
    path = random_checkpoint_for(_tiny(), torch.float32, root=str(tmp_path))
    stamp = os.stat(os.path.join(path, "config.json")).st_mtime_ns
    assert random_checkpoint_for(_tiny(), torch.float32, root=str(tmp_path)) == path
    assert os.stat(os.path.join(path, "config.json")).st_mtime_ns == stamp
    assert sorted(os.listdir(tmp_path)) == [os.path.basename(path)]      # no private copy left behind


def test_a_process_that_loses_the_race_uses_the_winners_copy(tmp_path, monkeypatch):
    real = kvrl_model.make_random_checkpoint
    winner = {}

    def racing(path, **kw):
        """Another process finishes its copy while this one is writing."""
        final = str(path).rsplit(".tmp", 1)[0]
        real(final, **kw)
        winner["config"] = os.stat(os.path.join(final, "config.json")).st_mtime_ns
        return real(path, **kw)

    monkeypatch.setattr(kvrl_model, "make_random_checkpoint", racing)
    path = random_checkpoint_for(_tiny(), torch.float32, root=str(tmp_path))
    assert os.stat(os.path.join(path, "config.json")).st_mtime_ns == winner["config"]
    assert sorted(os.listdir(tmp_path)) == [os.path.basename(path)]
