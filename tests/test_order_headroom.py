"""scripts/rl_order_headroom.py: the rollout planner over admission orders (docs/rl.md, "Choosing the admission order
while serving")."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))         # the script imports its sibling rl_rule_headroom
spec = importlib.util.spec_from_file_location("rl_order_headroom", ROOT / "scripts" / "rl_order_headroom.py")
O = importlib.util.module_from_spec(spec)
spec.loader.exec_module(O)

SHORT = ["workload.horizon_s=60"]     # a 6 s test window of the multi-tenant task


def test_the_base_is_kvrl_evals_lpm_job_and_the_planner_never_loses_to_it():
    """Under a switch holding lpm the loop serves kvrl-eval's lpm job bit for bit; the planner over lpm alone is
    lpm; over three orders, with the job's future in its copies, it is at least lpm; seeing only the present
    with guessed lengths it is a policy, free to lose, and chooses among the orders it has."""
    from kvrl.apps.eval import Job, Policy, run_job
    from kvrl.envs.config import load_task

    _, cfg = load_task("tenants", ["seed=2", "scheduler=lpm", *SHORT])
    theirs = run_job(dict(cfg.run), "watermark", Job(Policy("f", "heuristic", {"name": "fixed", "fraction": 0.01}),
                                                     "test", 2), 0.8)
    loop = lambda orders: O.switch_loop("tenants", orders, 0.01, "test", 2, 0.8, SHORT)
    base = O.finish_base(loop(["lpm", "fcfs", "sjf"]))
    assert base == pytest.approx(theirs["goodput_tok_s"], rel=1e-12)
    alone, chosen = O.plan(loop(["lpm"]), 1.0, 1.0)
    assert alone == pytest.approx(base, rel=1e-12) and set(chosen) == {0}
    best, chosen = O.plan(loop(["lpm", "fcfs", "sjf"]), 1.0, 1.0)
    assert best >= base - 1e-9 and set(chosen) <= {0, 1, 2}
    _, chosen = O.plan(loop(["lpm", "fcfs", "sjf"]), 1.0, 1.0, present=True, blind_seed=2, samples=2)
    assert chosen and set(chosen) <= {0, 1, 2}


def test_serve_configs_carry_their_watermark_and_the_table_renders_a_run(tmp_path):
    assert O.serve_config("b=scheduler=order_bandit scheduler.epoch_s=2 fraction=0.05") == \
        ("b", ["scheduler=order_bandit", "scheduler.epoch_s=2"], 0.05)
    assert O.serve_config("lpm=scheduler=lpm")[2] == 0.01
    rows = [{"task": "tenants", "split": "test", "seed": s, "orders": ["lpm", "fcfs", "sjf"], "fraction": 0.01,
             "epoch_s": 1.0, "hold_s": 1.0, "present": True, "blind": True, "samples": 4,
             "rule_goodput": 100.0 + s, "planner_goodput": 103.0 + s, "chosen": [0, 2, 2, 1]} for s in (1, 0)]
    out = tmp_path / "o.jsonl"
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = O.table(str(out))
    assert "the copies see the work already there, 4 guesses of the output lengths" in text
    assert "| 0 | 100.0 | 103.0 | +3.0% | 4 | 25% | 50% |" in text
    assert "planner - base = +3.0 ±" in text and "another order held at 75% of decisions" in text
