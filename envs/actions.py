"""Action spaces and the checks that turn a raw agent action into a decision.

An action outside the action space (NaN, infinite, out of range, not an integer where one is
needed, the wrong shape) raises ``ValueError`` saying what was wrong and what is allowed, unless
``clip`` is set, in which case it is mapped to the nearest action in the space and reported as
clipped. NaN and a wrong shape always raise.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

from kvrl.envs.config import AUTO_BINS, PreemptionActionConfig, WatermarkActionConfig, WatermarkModeActionConfig
from kvrl.plugins.base import PreemptionMode

MODES = (PreemptionMode.RECOMPUTE, PreemptionMode.SWAP)   # mode index 0, 1


def _as_array(action: Any, what: str) -> np.ndarray:
    try:
        arr = np.asarray(action, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what}: action {action!r} is not numeric") from exc
    if np.isnan(arr).any():
        raise ValueError(f"{what}: action {action!r} contains NaN")
    return arr


def _one_value(action: Any, what: str) -> float:
    """``action`` as one number (any shape of size 1); ``ValueError`` naming ``what`` otherwise."""
    arr = _as_array(action, what)
    if arr.size != 1:
        raise ValueError(f"{what}: expected one action value, got shape {arr.shape}")
    return float(arr.reshape(()))


def _integer(value: float, lo: int, hi: int, clip: bool, what: str) -> tuple[int, bool]:
    """``value`` as an integer in ``[lo, hi]``; clipped (and flagged) or ``ValueError``."""
    if np.isfinite(value) and value == int(value) and lo <= value <= hi:
        return int(value), False
    if not clip:
        raise ValueError(f"{what}: action {value!r} is not an integer in [{lo}, {hi}] "
                         f"(set clip_actions=true to clip bad actions instead)")
    return int(np.clip(np.round(value) if np.isfinite(value) else value, lo, hi)), True


class WatermarkActions:
    """``discrete``: ``Discrete(len(bins))``, action ``i`` sets the watermark to ``bins[i]``;
    ``box``: ``Box(-1, 1, (1,))``, action ``a`` sets it to ``low + (a + 1) / 2 * (high - low)``;
    with ``rules``: ``Discrete(len(rules))``, action ``i`` hands the watermark to rule ``i``
    (:meth:`to_rule`)."""

    def __init__(self, config: WatermarkActionConfig) -> None:
        self.config = config
        self.rules = config.rules
        if self.rules is not None:
            self.space: spaces.Space = spaces.Discrete(len(self.rules))
            return
        if config.type == "discrete" and config.bins == AUTO_BINS:
            raise ValueError("env.action.bins=auto is resolved by kvrl-train (a validation sweep of fixed "
                             "watermarks, docs/rl.md); to build an environment directly, give the bins as a list")
        if config.type == "discrete":
            self.space = spaces.Discrete(len(config.bins))
        else:
            self.space = spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32)

    def to_rule(self, action: Any, clip: bool = False) -> tuple[int, bool]:
        """``(index into rules, clipped)`` for ``action`` (an action space with ``rules`` only)."""
        if self.rules is None:
            raise ValueError("watermark: this action space sets fractions (action.bins), not rules")
        return _integer(_one_value(action, "watermark"), 0, len(self.rules) - 1, clip, "watermark")

    def to_fraction(self, action: Any, clip: bool = False) -> tuple[float, bool]:
        """``(watermark fraction, clipped)`` for ``action`` (an action space without ``rules``)."""
        cfg = self.config
        if self.rules is not None:
            raise ValueError("watermark: this action space hands the watermark to rules (action.rules); use to_rule")
        value = _one_value(action, "watermark")
        if cfg.type == "discrete":
            i, clipped = _integer(value, 0, len(cfg.bins) - 1, clip, "watermark")
            return float(cfg.bins[i]), clipped
        clipped = not (-1.0 <= value <= 1.0)
        if clipped and not clip:
            raise ValueError(f"watermark: action {value!r} is outside the Box [-1, 1] "
                             f"(set clip_actions=true to clip bad actions instead)")
        value = float(np.clip(value, -1.0, 1.0))
        return cfg.low + (value + 1.0) / 2.0 * (cfg.high - cfg.low), clipped


class WatermarkModeActions:
    """The joint watermark and preemption-mode action (:class:`~kvrl.envs.config.WatermarkModeActionConfig`):
    ``discrete``: ``Discrete(2 * len(bins))``, index ``2 * bin + mode``; ``multidiscrete``:
    ``MultiDiscrete([len(bins), 2])``. Mode 0 = recompute, 1 = swap."""

    rules = None        # the joint actions set fractions, never rules (WatermarkActions.rules)

    def __init__(self, config: WatermarkModeActionConfig) -> None:
        self.config = config
        n = len(config.bins)
        if config.type == "discrete":
            self.space: spaces.Space = spaces.Discrete(2 * n)
        else:
            self.space = spaces.MultiDiscrete([n, 2])

    def decode(self, action: Any, clip: bool = False) -> tuple[float, PreemptionMode, bool]:
        """``(watermark fraction, mode, clipped)`` for ``action``."""
        bins = self.config.bins
        arr = _as_array(action, "watermark-mode").reshape(-1)
        if self.config.type == "discrete":
            if arr.size != 1:
                raise ValueError(f"watermark-mode: expected one action value, got shape {arr.shape}")
            index, clipped = _integer(float(arr[0]), 0, 2 * len(bins) - 1, clip, "watermark-mode")
            b, mode = divmod(index, 2)
        else:
            if arr.size != 2:
                raise ValueError(f"watermark-mode: expected [bin, mode], got shape {arr.shape}")
            b, c1 = _integer(float(arr[0]), 0, len(bins) - 1, clip, "watermark-mode bin")
            mode, c2 = _integer(float(arr[1]), 0, 1, clip, "watermark-mode mode")
            clipped = c1 or c2
        return bins[b], MODES[mode], clipped


class PreemptionActions:
    """``discrete``: ``Discrete(2 * top_k)``, index ``2 * slot + mode``; ``multidiscrete``:
    ``MultiDiscrete([top_k, 2])``. Mode 0 = recompute, 1 = swap. Masks follow sb3-contrib's
    convention: one flag per discrete action, or the concatenated per-dimension flags."""

    def __init__(self, config: PreemptionActionConfig, top_k: int) -> None:
        self.config = config
        self.top_k = top_k
        if config.type == "discrete":
            self.space: spaces.Space = spaces.Discrete(2 * top_k)
        else:
            self.space = spaces.MultiDiscrete([top_k, 2])

    def mask(self, num_slots: int, swap_ok: np.ndarray) -> np.ndarray:
        """Valid actions when ``num_slots`` slots hold candidates and ``swap_ok[slot]`` says whether
        that candidate may be swapped (CPU pool room)."""
        k = self.top_k
        valid = np.arange(k) < num_slots
        if self.config.type == "discrete":
            pairs = np.stack([valid, valid & swap_ok], axis=1)
            return pairs.reshape(-1)
        return np.concatenate([valid, [num_slots > 0, bool((valid & swap_ok).any())]])

    def decode(self, action: Any, mask: np.ndarray, clip: bool = False) -> tuple[int, PreemptionMode, bool, bool]:
        """``(slot, mode, clipped, masked)`` for ``action`` under ``mask``.

        An action outside the space raises ``ValueError`` (or, with ``clip``, is clipped into it).
        An action inside the space that ``mask`` rules out (an empty slot, a swap that does not
        fit) is no error, as the valid set changes with every shortage: it falls back to slot 0
        (the LIFO victim) and recompute for an invalid slot, to recompute for an invalid swap,
        and is flagged ``masked``."""
        k = self.top_k
        arr = _as_array(action, "preemption").reshape(-1)
        if self.config.type == "discrete":
            if arr.size != 1:
                raise ValueError(f"preemption: expected one action value, got shape {arr.shape}")
            index, clipped = _integer(float(arr[0]), 0, 2 * k - 1, clip, "preemption")
            slot, mode = divmod(index, 2)
            slot_ok, swap_ok = bool(mask[2 * slot]), bool(mask[2 * slot + 1])
        else:
            if arr.size != 2:
                raise ValueError(f"preemption: expected [slot, mode], got shape {arr.shape}")
            slot, c1 = _integer(float(arr[0]), 0, k - 1, clip, "preemption slot")
            mode, c2 = _integer(float(arr[1]), 0, 1, clip, "preemption mode")
            clipped = c1 or c2
            slot_ok, swap_ok = bool(mask[slot]), bool(mask[k + 1])
        masked = not slot_ok or (mode == 1 and not swap_ok)
        if not slot_ok:
            slot, mode = 0, 0
        elif masked:
            mode = 0
        return slot, MODES[mode], clipped, masked
