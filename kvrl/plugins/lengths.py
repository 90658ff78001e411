"""Output-length prediction from finished requests, and the KV demand it implies, shared by the
eviction and watermark plugins and the environments' features (:mod:`kvrl.envs.features`)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import numpy as np

if TYPE_CHECKING:
    from kvrl.engine.views import SeqView

LENGTH_KEYS = ("none", "tenant", "hint")


class RemainingOutput:
    """Predicts a sequence's remaining output tokens from the lengths of finished requests: the
    mean length of those that outlived its output so far, minus it (with none: as many as it has
    generated, at least 1). With ``key="tenant"`` the finished requests of the sequence's tenant,
    once there are ``min_class_history`` of them (before that, all of them). With ``key="hint"``
    the sequence's ``output_len_hint`` (a length predictor's estimate) scaled by what finished
    hinted requests teach: a sequence with hint ``h`` that generated ``g`` is predicted to reach
    ``h`` times the mean ratio ``output / hint`` of the finished requests whose ratio exceeds
    ``g / h`` (the hint's error distribution, learned online, once ``min_class_history`` hinted
    requests finished; before that the hint as it is). A sequence without a hint, or past every
    prediction, is predicted as with ``key="none"``."""

    _RATIOS = "__hint_ratio__"   # table key of the finished hinted requests' output / hint ratios

    def __init__(self, key: str = "none", min_class_history: int = 8) -> None:
        if key not in LENGTH_KEYS:
            raise ValueError(f"length key must be one of {', '.join(LENGTH_KEYS)}, got {key!r}")
        self.key = key
        self.min_class_history = min_class_history
        self._lens: dict[Optional[str], list[float]] = {None: []}
        self._tables: dict[Optional[str], tuple[np.ndarray, np.ndarray]] = {}

    def add(self, seq: "SeqView") -> None:
        """Record a finished sequence's output length (and, with ``key="hint"``, its ratio to the hint)."""
        entries: list[tuple[Optional[str], float]] = [(None, seq.num_output)]
        if self.key == "tenant":
            entries.append((seq.tenant, seq.num_output))
        elif self.key == "hint" and seq.output_len_hint:
            entries.append((self._RATIOS, seq.num_output / seq.output_len_hint))
        for k, v in entries:
            self._lens.setdefault(k, []).append(v)
            self._tables.pop(k, None)

    def _table(self, k: Optional[str]) -> tuple[np.ndarray, np.ndarray]:
        table = self._tables.get(k)
        if table is None:
            lens = np.sort(np.asarray(self._lens[k], dtype=np.float64))
            table = self._tables[k] = (lens, np.concatenate([np.cumsum(lens[::-1])[::-1], [0.0]]))
        return table

    def _mean_beyond(self, k: Optional[str], x: float) -> Optional[float]:
        """Mean of table ``k``'s values above ``x`` (None when none is)."""
        lens, suffix_sums = self._table(k)
        i = int(np.searchsorted(lens, x, side="right"))
        return None if i == len(lens) else float(suffix_sums[i] / (len(lens) - i))

    def _enough(self, k: Optional[str]) -> bool:
        return len(self._lens.get(k, ())) >= self.min_class_history

    def of(self, seq: "SeqView") -> float:
        """Predicted remaining output tokens of the sequence ``seq`` (its hint is read only with
        ``key="hint"``)."""
        return self(seq.num_output, seq.tenant, seq.output_len_hint if self.key == "hint" else None)

    def __call__(self, generated: int, tenant: Optional[str] = None, hint: Optional[int] = None) -> float:
        """Predicted remaining output tokens of a sequence of ``tenant`` (and ``output_len_hint``
        ``hint``) that generated ``generated``."""
        if self.key == "hint" and hint:
            if not self._enough(self._RATIOS):          # no error model yet: the hint as told
                if generated < hint:
                    return float(hint - generated)
            else:
                ratio = self._mean_beyond(self._RATIOS, generated / hint)
                if ratio is not None:
                    return max(ratio * hint - generated, 1.0)
        k = tenant if self.key == "tenant" and self._enough(tenant) else None
        mean = self._mean_beyond(k, generated)
        return float(max(generated, 1)) if mean is None else mean - generated


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
