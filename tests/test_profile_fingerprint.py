"""The shipped default step-time profiles must describe this tree's live executor (issue 16)."""
from __future__ import annotations

import json

import pytest

from kvrl.executors import profile as P


@pytest.mark.parametrize("name", ["h200_qwen3-0.6b_bfloat16.json", "h200_llama-3-8b_bfloat16.json"])
def test_shipped_profile_measured_this_trees_timing_code(name):
    """The shipped default profiles must describe this tree's live executor: when kernels, model
    or executor code change, re-profile (benchmarks/calibrate.sh) or record in the profile's
    meta.fingerprint_accepted why timing is unaffected."""
    from kvrl.executors.fingerprint import staleness

    meta = json.loads((P.PACKAGED_DIR / name).read_text())["meta"]
    assert staleness(meta) is None, f"{name}: {staleness(meta)}"
