"""Check kvrl's import contracts (``[tool.importlinter]`` in pyproject.toml) with ``lint-imports``.

``kvrl.envs`` and ``kvrl.kernels`` are mapped from ``envs/`` and ``kernels/`` (setuptools
``package-dir``), so a scan of ``kvrl/`` alone would not see them. This script builds a temporary
tree in the installed layout (``kvrl/`` with ``envs`` and ``kernels`` beside its own entries, all
symlinks to the checkout), runs ``lint-imports`` there with the repository's config, and exits
with its status (0: every contract kept).

    python scripts/lint_imports.py [extra lint-imports arguments]
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAPPED = {"envs": ROOT / "envs", "kernels": ROOT / "kernels"}   # package-dir entries outside kvrl/


def lint_imports_command() -> str | None:
    """The ``lint-imports`` executable beside this Python, else on PATH (None if missing)."""
    beside = Path(sys.executable).parent / "lint-imports"
    return str(beside) if beside.exists() else shutil.which("lint-imports")


def main(argv: list[str]) -> int:
    command = lint_imports_command()
    if command is None:
        print("lint-imports not found: pip install import-linter (in kvrl's test extra)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="kvrl-layers-") as tmp:
        package = Path(tmp) / "kvrl"
        package.mkdir()
        for entry in (ROOT / "kvrl").iterdir():
            if entry.name not in MAPPED and entry.name != "__pycache__":
                (package / entry.name).symlink_to(entry)
        for name, target in MAPPED.items():
            (package / name).symlink_to(target)
        env = {**os.environ, "PYTHONPATH": tmp}     # lint-imports also puts its working directory first
        return subprocess.run([command, "--config", str(ROOT / "pyproject.toml"), "--no-cache", *argv],
                              cwd=tmp, env=env).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
