"""scripts/rl_obs_shift.py's measures: nearest-neighbour distance and windowed spread."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("rl_obs_shift", ROOT / "scripts" / "rl_obs_shift.py")
obs_shift = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = obs_shift
spec.loader.exec_module(obs_shift)


def test_knn_distance_is_the_mean_over_the_five_nearest_and_leaves_a_point_out_of_its_own():
    train = np.array([[float(i), 0.0] for i in range(10)])
    # a point at x = 20: its 5 nearest are 9, 8, 7, 6, 5 -> distances 11..15
    assert obs_shift.knn_distance(np.array([[20.0, 0.0]]), train)[0] == pytest.approx(13.0)
    # each training point against the others: never itself (distance 0)
    own = obs_shift.knn_distance(train, train, leave_one_out=True)
    assert own.min() > 0 and own[0] == pytest.approx(3.0)          # 1, 2, 3, 4, 5 away
    assert obs_shift.knn_distance(train, train)[0] == pytest.approx(2.0)   # with itself: 0, 1, 2, 3, 4


def test_rolling_sd_covers_each_full_window_once():
    values = np.array([0.0, 0.0, 1.0, 1.0, 1.0])
    assert obs_shift.rolling_sd(values, 2) == pytest.approx([0.0, 0.5, 0.0, 0.0])
    assert obs_shift.rolling_sd(values, 5) == pytest.approx([np.std(values)])
    assert obs_shift.rolling_sd(values, 6).size == 0
