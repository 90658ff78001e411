"""The import contracts of pyproject.toml's ``[tool.importlinter]`` (layers that only point down)."""
from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("lint_imports", ROOT / "scripts" / "lint_imports.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_layers_contract_is_kept_over_every_module():
    if _script().lint_imports_command() is None:
        pytest.skip("lint-imports is not installed (pip install -e '.[test]' brings import-linter)")
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "lint_imports.py"), "--no-logo"],
                          capture_output=True, text=True, timeout=300)
    report = done.stdout + done.stderr
    assert done.returncode == 0, report[-4000:]
    assert "kvrl layers point down KEPT" in report, report[-4000:]
    # every module was seen, the package-dir mapped kvrl.envs and kvrl.kernels included
    mapped = {ROOT / "kvrl" / name for name in ("envs", "kernels", "conf")}   # device_env.sh may link these
    modules = [p for d in ("kvrl", "envs", "kernels") for p in (ROOT / d).rglob("*.py")
               if "__pycache__" not in p.parts and not any(m in p.parents for m in mapped)]
    analyzed = re.search(r"Analyzed (\d+) files", report)
    assert analyzed and int(analyzed.group(1)) == len(modules), report[-4000:]


def test_no_module_is_over_500_lines():
    """Issue #19: small modules with one job (kvrl/executors/live.py was 652 lines before its split)."""
    long = [f"{p.relative_to(ROOT)}: {n} lines" for d in ("kvrl", "envs", "kernels") for p in sorted((ROOT / d).rglob("*.py"))
            if "__pycache__" not in p.parts and (n := len(p.read_text().splitlines())) > 500]
    assert not long, "\n".join(long)
