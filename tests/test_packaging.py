"""Packaging: what ``import kvrl`` pulls in, and how the Gymnasium ids are found."""
from __future__ import annotations

import re
import subprocess
import sys


def _python(code: str) -> None:
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_import_kvrl_does_not_import_gymnasium():
    _python("import sys, kvrl; loaded = [m for m in ('gymnasium', 'kvrl.envs', 'torch') if m in sys.modules]; "
            "assert not loaded, loaded")


def test_gymnasium_ids_after_import_kvrl_envs_and_by_module_prefix():
    _python("import gymnasium, kvrl.envs; env = gymnasium.make('kvrl/Watermark-v0'); "
            "assert type(env.unwrapped).__name__ == 'WatermarkEnv'")
    # Gymnasium's "module:id" form imports kvrl.envs (which registers the ids) by itself
    _python("import sys, gymnasium; assert 'kvrl.envs' not in sys.modules; "
            "env = gymnasium.make('kvrl.envs:kvrl/Preemption-v0'); "
            "assert type(env.unwrapped).__name__ == 'PreemptionEnv'")


def test_bare_pytest_collects_tests_that_import_tests_helpers():
    """``pytest`` (the console script, whose sys.path does not hold the working directory) must
    find ``tests.helpers``, as ``python -m pytest`` does; pyproject's ``pythonpath`` provides it."""
    import os
    from pathlib import Path

    import pytest

    script = Path(sys.executable).parent / "pytest"
    if not script.exists():
        pytest.skip(f"no pytest console script next to {sys.executable}")
    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([str(script), "--collect-only", "-q", "-p", "no:cacheprovider", "tests/test_callbacks.py"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert re.search(r"^\d+ tests collected in", done.stdout, re.M), done.stdout[-2000:]
