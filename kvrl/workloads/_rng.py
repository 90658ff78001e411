"""Seeded random streams: one independent numpy ``Generator`` per (seed, purpose)."""
from __future__ import annotations

import zlib

import numpy as np


def check_seed(seed) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    return int(seed)


def make_rng(seed: int, *purpose: str | int) -> np.random.Generator:
    """A Generator for ``seed`` and a purpose label (e.g. ``"tokens"``, ``"tenant", 2``).

    Different purposes give statistically independent streams, so that (say) changing how many
    requests are subsampled never changes the token ids drawn for the prompts.
    """
    key = tuple(zlib.crc32(p.encode()) if isinstance(p, str) else int(p) for p in purpose)
    return np.random.default_rng(np.random.SeedSequence(check_seed(seed), spawn_key=key))
