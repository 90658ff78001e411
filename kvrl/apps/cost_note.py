"""The line of a sim leaderboard that names the cost model it ran on (kvrl-eval's ``leaderboard.md``)."""
from __future__ import annotations

import hashlib
from pathlib import Path

from omegaconf import OmegaConf


def sim_cost_note(run: dict) -> str:
    """The leaderboard line naming what priced a sim evaluation's steps: the profile file the sim resolves
    for ``run`` (its path, the first 12 hex digits of the file's SHA-256 and its model's fit version) or the
    roofline, so that a result says which cost model it stands on after the shipped profile changes."""
    from kvrl.builder import build_executor
    sim = build_executor(OmegaConf.create({**run, "seed": 0}))
    if sim.profile is None or not sim.profile.path:
        return f"Sim cost model: {sim.cost_source}"
    path = Path(sim.profile.path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    fit = sim.profile.model.fit_version
    try:
        shown = path.resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        shown = path
    return f"Sim cost model: profile {shown} (sha256 {digest}, fit version {fit})"
