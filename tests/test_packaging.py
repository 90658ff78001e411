"""Packaging: what ``import kvrl`` pulls in, and how the Gymnasium ids are found."""
from __future__ import annotations

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
