"""The plugin registry: names, validation, entry-point discovery, command-line selection."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from kvrl import plugins
from kvrl.plugins.base import EvictionDecision, EvictionPolicy, PreemptionMode

BUILTINS = {
    "scheduler": {"fcfs", "priority", "sjf", "lpm"},
    "watermark": {"fixed", "opt_factor", "avg_block_len", "token_ratio", "past_future"},
    "eviction": {"lifo", "fewest_computed", "most_blocks", "priority", "cost_aware"},
    "prefix_cache": {"none", "hash_lru", "hash_lfu", "radix_lru"},
}


@pytest.mark.parametrize("kind", plugins.KINDS)
def test_builtins_are_registered_and_documented(kind):
    assert BUILTINS[kind] <= set(plugins.available(kind))
    for name in BUILTINS[kind]:
        cls = plugins.get_spec(kind, name).cls
        assert cls.__doc__ and len(cls.__doc__.split()) > 15, f"{kind}={name} needs a documentation paragraph"
        plugins.create(kind, name)   # default parameters are valid


def test_unknown_name_lists_known_names():
    with pytest.raises(plugins.UnknownPluginError) as err:
        plugins.create("eviction", "does_not_exist")
    assert "lifo" in str(err.value) and "cost_aware" in str(err.value)
    with pytest.raises(plugins.UnknownPluginError, match="known kinds"):
        plugins.available("bogus_kind")


def test_parameters_are_validated_with_the_key_named():
    with pytest.raises(ValueError, match="fraction must be < 1.0"):
        plugins.create("watermark", "fixed", fraction=1.5)
    with pytest.raises(ValueError, match=r"unknown parameter\(s\) \['fractoin'\]"):
        plugins.create("watermark", "fixed", fractoin=0.1)
    with pytest.raises(ValueError, match="mode must be one of"):
        plugins.create("eviction", "lifo", mode="teleport")


def test_registering_a_taken_name_with_another_class_fails():
    with pytest.raises(ValueError, match="already registered"):
        @plugins.register("eviction", "lifo")
        class Impostor(EvictionPolicy):
            pass


def test_register_decorator_makes_a_plugin_creatable():
    @plugins.register("eviction", "test_oldest_first")
    class OldestFirst(EvictionPolicy):
        """Evict the oldest admitted sequence (a test plugin)."""

        @dataclass
        class Params:
            mode: str = "recompute"

        def select(self, candidates):
            victim = min(candidates, key=lambda s: s.admit_order)
            return EvictionDecision(victim.seq_id, PreemptionMode(self.params.mode))

    policy = plugins.create("eviction", "test_oldest_first", mode="swap")
    assert isinstance(policy, OldestFirst) and policy.params.mode == "swap"
    assert "test_oldest_first" in plugins.available("eviction")


PLUGIN_MODULE = '''
"""A third-party eviction plugin shipped by a throwaway package."""
from dataclasses import dataclass

import kvrl.plugins as kp


@kp.register("eviction", "thirdparty_biggest")
class BiggestFirst(kp.EvictionPolicy):
    """Evicts the sequence holding the most blocks; records every call in a file for the test."""

    @dataclass
    class Params:
        mode: str = "recompute"
        log_path: str = ""

    def select(self, candidates):
        victim = max(candidates, key=lambda s: (s.num_blocks, s.admit_order))
        if self.params.log_path:
            with open(self.params.log_path, "a") as f:
                f.write(f"{victim.seq_id}\\n")
        return kp.EvictionDecision(victim.seq_id, kp.PreemptionMode(self.params.mode))
'''


def _throwaway_package(root: Path) -> Path:
    """A package + dist-info with a ``kvrl.plugins`` entry point, importable via PYTHONPATH."""
    root.mkdir(parents=True)
    (root / "kvrl_thirdparty_demo.py").write_text(PLUGIN_MODULE)
    info = root / "kvrl_thirdparty_demo-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kvrl-thirdparty-demo\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[kvrl.plugins]\nbiggest = kvrl_thirdparty_demo\n")
    return root


def test_entry_point_plugin_runs_by_name_from_the_command_line(tmp_path):
    pkg = _throwaway_package(tmp_path / "site")
    log = tmp_path / "calls.txt"
    env = dict(os.environ, PYTHONPATH=f"{pkg}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "kvrl.apps.run", f"hydra.run.dir={out}", "progress=false", "plots=false",
           "eviction=thirdparty_biggest", "eviction.mode=swap", f"eviction.log_path={log}",
           "workload=synthetic", "workload.num_requests=30", "workload.arrival.process=offline",
           "workload.output_len.dist=uniform", "workload.output_len.low=40", "workload.output_len.high=80",
           "workload.output_len.mean=null", "workload.output_len.cv=null",
           "engine.num_blocks=120", "watermark.fraction=0.0"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["finished"] == 30 and metrics["preemptions"] > 0 and metrics["swapped_out_blocks"] > 0
    assert log.exists() and len(log.read_text().split()) == metrics["preemptions"]


def test_entry_point_discovery_is_idempotent(tmp_path):
    pkg = _throwaway_package(tmp_path / "site")
    code = textwrap.dedent("""
        import kvrl.plugins as kp
        kp.load_entry_points(); kp.load_entry_points(force=True)
        print(sorted(n for n in kp.available("eviction") if n.startswith("thirdparty")))
    """)
    env = dict(os.environ, PYTHONPATH=str(pkg))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "['thirdparty_biggest']"


def test_plugin_reference_doc_is_current():
    from pathlib import Path

    from kvrl.plugins.docs import render

    doc = Path(__file__).resolve().parents[1] / "docs" / "plugins.md"
    assert doc.read_text().strip() == render().strip(), "regenerate: python -m kvrl.plugins.docs > docs/plugins.md"
