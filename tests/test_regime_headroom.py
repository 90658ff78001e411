"""scripts/rl_regime_headroom.py: the mixture constant and the regime oracle gain."""
from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "rl_regime_headroom.py"


def _module():
    spec = importlib.util.spec_from_file_location("rl_regime_headroom", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_regime_oracle_gain_over_the_mixture_constant():
    """Regime 1x: 0.0 serves 100, 0.2 serves 50; regime 2x: 80 and 100. The mixture constant is 0.0
    (90% of each regime's best on average, against 75%); knowing the regime gains (0 + 25%) / 2."""
    goodput = {(1.0, 0.0): 100.0, (1.0, 0.2): 50.0, (2.0, 0.0): 80.0, (2.0, 0.2): 100.0}
    rows = [{"task": "t", "axis": "rate", "scale": x, "constant": c, "seed": s, "goodput_tok_s": g * (1 + s / 10)}
            for (x, c), g in goodput.items() for s in (0, 1)]
    table = _module().summarise(rows)
    assert table[2].split(" | ")[3:] == ["0", "+12.5% (+12.5 to +12.5) |"], table[2]
    assert "1x: 0 (105)" in table[2] and "2x: 0.2 (105)" in table[2]
