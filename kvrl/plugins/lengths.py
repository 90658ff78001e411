"""Output-length prediction from finished requests, and the KV demand it implies, shared by the
eviction and watermark plugins and the environments' features (:mod:`kvrl.envs.features`)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import numpy as np

if TYPE_CHECKING:
    from kvrl.engine.views import SeqView

LENGTH_KEYS = ("none", "tenant")


class RemainingOutput:
    """Predicts a sequence's remaining output tokens from the lengths of finished requests: the
    mean length of those that outlived its output so far, minus it (with none: as many as it has
    generated, at least 1). With ``key="tenant"`` the finished requests of the sequence's tenant,
    once there are ``min_class_history`` of them (before that, all of them)."""

    def __init__(self, key: str = "none", min_class_history: int = 8) -> None:
        if key not in LENGTH_KEYS:
            raise ValueError(f"length key must be one of {', '.join(LENGTH_KEYS)}, got {key!r}")
        self.key = key
        self.min_class_history = min_class_history
        self._lens: dict[Optional[str], list[int]] = {None: []}
        self._tables: dict[Optional[str], tuple[np.ndarray, np.ndarray]] = {}

    def add(self, seq: "SeqView") -> None:
        """Record a finished sequence's output length."""
        keys = (None, seq.tenant) if self.key == "tenant" else (None,)
        for k in keys:
            self._lens.setdefault(k, []).append(seq.num_output)
            self._tables.pop(k, None)

    def _table(self, tenant: Optional[str]) -> tuple[np.ndarray, np.ndarray]:
        k = tenant if self.key == "tenant" and len(self._lens.get(tenant, ())) >= self.min_class_history else None
        table = self._tables.get(k)
        if table is None:
            lens = np.sort(np.asarray(self._lens[k], dtype=np.float64))
            table = self._tables[k] = (lens, np.concatenate([np.cumsum(lens[::-1])[::-1], [0.0]]))
        return table

    def __call__(self, generated: int, tenant: Optional[str] = None) -> float:
        """Predicted remaining output tokens of a sequence of ``tenant`` that generated ``generated``."""
        lens, suffix_sums = self._table(tenant)
        i = int(np.searchsorted(lens, generated, side="right"))
        if i == len(lens):
            return float(max(generated, 1))
        return float(suffix_sums[i] / (len(lens) - i) - generated)


def completion_demand(tokens: np.ndarray, remaining: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A batch's KV demand at each predicted completion, if nothing else is admitted: sequences
    ordered by ``remaining`` (predicted output tokens still to come), at the ``i``-th completion the
    tokens of those still running plus their growth until then (tokens), and how many are running
    (``alive``). Its maximum is the batch's peak demand (independent of the order among equal
    ``remaining``: within a tie the first position is the largest)."""
    order = np.argsort(remaining, kind="stable")
    tokens, remaining = tokens[order], remaining[order]
    alive = len(tokens) - np.arange(len(tokens))
    return np.cumsum(tokens[::-1])[::-1] + alive * remaining, alive
