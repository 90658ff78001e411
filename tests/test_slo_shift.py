"""scripts/rl_slo_shift.py: the phase clock the oracle schedule uses, the oracle itself, and the table."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


@pytest.fixture(scope="module")
def mod():
    sys.path.insert(0, str(SCRIPTS))          # as when run as a script: it imports rl_regime_headroom
    try:
        spec = importlib.util.spec_from_file_location("rl_slo_shift", SCRIPTS / "rl_slo_shift.py")
        m = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = m            # dataclasses look their module up
        spec.loader.exec_module(m)
        yield m
    finally:
        sys.path.remove(str(SCRIPTS))


def test_phase_clock_finds_the_busy_tenant_and_the_oracle_follows_it(mod):
    """The task's 20 s phases, compressed by the resample of 0.8 to 16 s, start with chat busy on
    the val split; a shifted workload shifts the fitted offset; the oracle holds busy_a in even
    phases of that clock and busy_b in odd ones."""
    run = mod._task(["workload.horizon_s=200"])
    assert mod.phase_clock(run, "val", 0) == (16.0, 0.0)
    swapped = mod._task(["workload.horizon_s=200", "workload.tenants.0.rate_phases=[0.2,1.8]",
                         "workload.tenants.1.rate_phases=[1.8,0.2]"])
    assert mod.phase_clock(swapped, "val", 0) == (16.0, 16.0)
    from kvrl import plugins
    oracle = plugins.create("watermark", "phase_oracle", busy_a=0.3, busy_b=0.01, phase_s=16.0, offset_s=4.0)
    view = SimpleNamespace(now=0.0, num_blocks=1000)
    oracle.bind(view)
    assert [oracle.reserved_blocks() for view.now in (5.0, 19.9, 20.0, 37.0)] == [300, 300, 10, 300]


def test_table_gains_are_paired_over_seeds(mod):
    """Regimes: chat alone prefers 0.3, batch alone 0.0; the mix: the best constant 0.0, an oracle
    schedule 10% above it on every seed and slo_mix 5% below."""
    rows = []
    for seed in (0, 1):
        k = 1 + seed / 10
        for c, chat, batch, mix in ((0.0, 50, 200, 100), (0.3, 80, 150, 90)):
            label = f"fixed(fraction={c})"
            rows += [{"measure": "regime:0", "policy": label, "kind": "fixed", "seed": seed, "goodput_tok_s": chat * k},
                     {"measure": "regime:1", "policy": label, "kind": "fixed", "seed": seed, "goodput_tok_s": batch * k},
                     {"measure": "mix", "policy": label, "kind": "fixed", "seed": seed, "goodput_tok_s": mix * k}]
        rows += [{"measure": "mix", "policy": "oracle", "kind": "phase_oracle", "seed": seed, "goodput_tok_s": 110 * k},
                 {"measure": "mix", "policy": "rule", "kind": "slo_mix", "seed": seed, "goodput_tok_s": 95 * k}]
    table = mod.summarise(rows)
    assert "| chat alone (tight TPOT) | fixed(fraction=0.3) (84) |" in table[2]
    assert "| batch alone (loose TPOT) | fixed(fraction=0.0) (210) |" in table[3]
    assert table[4].endswith("| +12.0% (+12.0 to +12.0) |"), table[4]     # (80 + 200) / (50 + 200)
    assert table[5].endswith("| +10.0% (+10.0 to +10.0) |") and "oracle (116)" in table[5]
    assert table[6].endswith("| -5.0% (-5.0 to -5.0) |")
