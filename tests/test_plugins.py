"""The plugin registry: names, validation, entry-point discovery, command-line selection."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from kvrl import plugins
from kvrl.plugins.base import EvictionDecision, EvictionPolicy, PreemptionMode

BUILTINS = {
    "scheduler": {"fcfs", "priority", "sjf", "lpm", "switch", "order_bandit"},
    "watermark": {"fixed", "opt_factor", "avg_block_len", "token_ratio", "past_future", "pi", "bandit", "slo_mix",
                  "ttft_slack"},
    "eviction": {"lifo", "fewest_computed", "most_blocks", "priority", "longest_remaining", "slo_slack", "cost_aware"},
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


# ---------------------------------------------------------------- adaptive watermark controllers
class _View:
    """The engine counters the controllers read, set by hand (engine seconds, counts)."""

    def __init__(self, ttft_slo=2.0, tpot_slo=0.005):
        self.now, self.step_index, self.num_blocks, self.block_size = 0.0, 0, 1000, 16
        self.num_arrived = self.num_accepted = self.arrived_prompt_tokens = 0
        self.num_preemptions = self.recomputed_tokens = 0
        self.slo_ttft_s, self.slo_tpot_s = ttft_slo, tpot_slo


class _Seq:
    def __init__(self, arrival_s, first_token_s, num_output, ttft_slo=2.0, tpot_slo=0.005):
        self.arrival_s, self.first_token_s, self.num_output = arrival_s, first_token_s, num_output
        self.slo_ttft_s, self.slo_tpot_s = ttft_slo, tpot_slo


def _advance(policy, view, seconds, dt=0.1, preemptions_per_step=0):
    """Run ``seconds`` of engine time in steps of ``dt``, with preemptions at a steady rate."""
    for _ in range(round(seconds / dt)):
        view.now += dt
        view.step_index += 1
        view.num_preemptions += preemptions_per_step
        policy.on_step_end()


def test_pi_raises_the_reserve_under_preemptions_and_lowers_it_when_they_stop():
    pi = plugins.create("watermark", "pi", signal="preemptions", kp=0.1, ki=0.05, low=0.0, high=0.4, init=0.0)
    view = _View()
    pi.bind(view)
    _advance(pi, view, 5.0)
    assert pi.fraction == 0.0 and pi.reserved_blocks() == 0           # no preemptions: stays at low
    _advance(pi, view, 10.0, preemptions_per_step=1)                   # 10 preemptions / s
    raised = pi.fraction
    assert raised > 0.2 and pi.reserved_blocks() == int(raised * 1000)
    _advance(pi, view, 60.0)                                           # the signal goes back
    assert pi.fraction == 0.0


def test_pi_anti_windup_leaves_saturation_quickly():
    pi = plugins.create("watermark", "pi", signal="preemptions", kp=0.0, ki=0.1, low=0.0, high=0.3, init=0.0,
                        tau_s=1.0)
    view = _View()
    pi.bind(view)
    _advance(pi, view, 200.0, preemptions_per_step=1)                  # saturated at high for a long time
    assert pi.fraction == 0.3
    assert pi.integral * pi.params.ki == pytest.approx(0.3)          # no wind-up past the bound
    stopped = view.now
    while pi.fraction == 0.3:                                          # preemptions stop
        _advance(pi, view, 0.5)
    assert view.now - stopped < 10.0     # leaves the bound once the preemption rate falls below target


def test_pi_slo_signal_throttles_when_tpot_is_the_tighter_objective():
    def run(ttft, tpot):
        pi = plugins.create("watermark", "pi", signal="slo", low=0.0, high=0.5, init=0.2)
        view = _View()
        pi.bind(view)
        for _ in range(100):
            view.now += 0.1
            pi.on_finish(_Seq(view.now - ttft - 100 * tpot, view.now - 100 * tpot, 101))
            _advance(pi, view, 0.1)
        return pi.fraction
    assert run(ttft=0.2, tpot=0.010) > 0.3      # TPOT at 2x its SLO, TTFT well inside: admit less
    assert run(ttft=6.0, tpot=0.002) < 0.1      # TTFT at 3x its SLO: admit more


def test_slo_mix_reserves_for_tight_tpot_traffic_by_its_share():
    """The reserve follows the share of running and waiting sequences whose TPOT objective is at
    most tight_tpot_s (their own, else the run's; none counts as loose); with nothing queued or
    running it is the loose one. Parameters are checked."""
    rule = plugins.create("watermark", "slo_mix", tight_tpot_s=0.005, share=0.5, tight=0.2, loose=0.01)
    view = _View()
    rule.bind(view)
    view.running, view.waiting = (), ()
    rule.on_step_end()
    assert rule.reserved_blocks() == 10 and rule.tight_share == 0.0
    tight, loose, none = _Seq(0, 0, 1, tpot_slo=0.003), _Seq(0, 0, 1, tpot_slo=0.02), _Seq(0, 0, 1, tpot_slo=None)
    view.running, view.waiting = (tight, loose), (tight,)
    rule.on_step_end()
    assert rule.tight_share == pytest.approx(2 / 3) and rule.reserved_blocks() == 200
    view.waiting = (none, loose)
    rule.on_step_end()
    assert rule.tight_share == pytest.approx(1 / 4) and rule.reserved_blocks() == 10
    view.running, view.waiting = (_Seq(0, 0, 1, tpot_slo=0.005),), (loose,)     # at the limit counts as tight
    rule.on_step_end()
    assert rule.reserved_blocks() == 200
    for bad in ({"share": 1.5}, {"tight": 1.0}, {"loose": -0.1}, {"tight_tpot_s": 0.0}):
        with pytest.raises(ValueError):
            plugins.create("watermark", "slo_mix", **bad)


def test_ttft_slack_throttles_until_a_waiting_first_token_is_at_risk():
    """High reserve while every waiting request without a first token has waited less than urgency
    x its TTFT objective (its own, else the run's); low as soon as one has. Preempted requests that
    already have their first token, and requests with no TTFT objective, never count. Parameters are
    checked."""
    rule = plugins.create("watermark", "ttft_slack", urgency=0.5, high=0.2, low=0.01)
    view = _View()
    rule.bind(view)
    view.now, view.waiting = 10.0, ()
    rule.on_step_end()
    assert rule.reserved_blocks() == 200 and not rule.urgent           # nothing waits: throttle
    view.waiting = (_Seq(9.2, None, 0),)                               # waited 0.8 s of a 2 s objective
    rule.on_step_end()
    assert rule.reserved_blocks() == 200
    view.waiting = (_Seq(9.2, None, 0), _Seq(9.0, None, 0))            # one has waited 1.0 s = 0.5 x 2 s
    rule.on_step_end()
    assert rule.reserved_blocks() == 10 and rule.urgent
    view.waiting = (_Seq(1.0, 2.0, 5), _Seq(1.0, None, 0, ttft_slo=None), _Seq(9.0, None, 0, ttft_slo=4.0))
    rule.on_step_end()                                                 # first token out, no objective, own 4 s objective
    assert rule.reserved_blocks() == 200
    for bad in ({"urgency": 1.5}, {"high": 1.0}, {"low": -0.1}):
        with pytest.raises(ValueError):
            plugins.create("watermark", "ttft_slack", **bad)
    for bad, named in (({"inner": "nope"}, "inner"), ({"inner_params": {"fraction": 0.1}}, "without inner"),
                       ({"inner": "fixed", "inner_params": {"nope": 1}}, "nope"), ({"inner": "agent"}, "policy_path")):
        with pytest.raises(ValueError, match=named):
            plugins.create("watermark", "ttft_slack", **bad)


def test_ttft_slack_hands_its_high_reserve_and_admit_answers_to_the_inner_policy():
    """With ``inner``, the inner policy answers while nothing waiting is urgent (its reserve and its vetoes) and
    sees every step; once a request is urgent the rule holds ``low`` and admits everything."""
    rule = plugins.create("watermark", "ttft_slack", urgency=0.5, low=0.01, inner="tenant_quota",
                          inner_params={"inner_fraction": 0.3})
    view = _View()
    rule.bind(view)
    view.now, view.waiting = 10.0, ()
    rule.on_step_end()
    assert rule.reserved_blocks() == 300 and rule.vetoes
    view.waiting = (_Seq(9.0, None, 0),)                               # waited 1.0 s = 0.5 x 2 s
    rule.on_step_end()
    assert rule.reserved_blocks() == 10 and not rule.vetoes and rule.admit(None, 1)


def test_bandit_converges_to_the_best_arm_on_a_stationary_reward():
    rng = np.random.default_rng(0)
    means = [300.0, 900.0, 600.0, 100.0]
    bandit = plugins.create("watermark", "bandit", fractions=[0.0, 0.1, 0.2, 0.3], discount=0.98, exploration=0.3)
    plays = []
    for _ in range(400):
        arm = bandit.choose()
        bandit.reward(arm, max(rng.normal(means[arm], 100.0), 0.0))
        plays.append(arm)
    assert plays[:4] == [0, 1, 2, 3]                        # each arm once, in order
    assert np.mean(np.asarray(plays[-200:]) == 1) > 0.8      # then mostly the best one


def test_bandit_follows_a_best_arm_that_changes():
    bandit = plugins.create("watermark", "bandit", fractions=[0.0, 0.3], discount=0.9, exploration=0.3)
    for t in range(300):
        arm = bandit.choose()
        best = 0 if t < 150 else 1
        bandit.reward(arm, 1000.0 if arm == best else 200.0)
    assert bandit.choose() == 1


def test_bandit_epoch_reward_counts_only_tokens_that_met_the_slo():
    bandit = plugins.create("watermark", "bandit", fractions=[0.0, 0.5], epoch_s=1.0)
    view = _View()
    bandit.bind(view)
    assert bandit.reserved_blocks() == 0
    bandit.on_finish(_Seq(arrival_s=0.0, first_token_s=0.5, num_output=101))        # TTFT 0.5 s, meets
    view.now = 1.0   # TPOT (1.0 - 0.5) / 100 = 5 ms: meets (<=)
    bandit.on_finish(_Seq(arrival_s=0.0, first_token_s=0.0, num_output=11))         # TPOT 0.1 s: misses
    bandit.on_finish(_Seq(arrival_s=-3.0, first_token_s=0.9, num_output=7))         # TTFT 3.9 s: misses
    bandit.on_step_end()
    assert bandit.sums[0] == 101.0 and bandit.counts[0] == 1.0
    assert bandit.reserved_blocks() == 500                          # next epoch: the untried arm


@pytest.mark.parametrize("name,params,key", [
    ("pi", {"high": 0.1, "low": 0.2}, "high"), ("pi", {"signal": "latency"}, "signal"),
    ("pi", {"init": 0.9}, "init"), ("pi", {"ki": -1.0}, "ki"), ("pi", {"interval_s": 0.0}, "interval_s"),
    ("bandit", {"fractions": []}, "fractions"), ("bandit", {"fractions": [0.1, 1.0]}, r"fractions\[1\]"),
    ("bandit", {"discount": 0.0}, "discount"), ("bandit", {"epoch_s": -1.0}, "epoch_s"),
])
def test_controller_parameters_are_validated(name, params, key):
    with pytest.raises(ValueError, match=key):
        plugins.create("watermark", name, **params)


@pytest.mark.parametrize("name", ["pi", "bandit"])
def test_controllers_serve_a_pressured_workload_deterministically(name):
    from tests.helpers import make_engine, make_request

    def serve():
        engine = make_engine(num_blocks=48, block_size=4, watermark=name,
                             watermark_params={"interval_s": 0.01} if name == "pi" else {"epoch_s": 0.01})
        reqs = [make_request(f"r{i}", prompt_len=12, output_len=40, arrival_s=0.002 * i, seed=i) for i in range(40)]
        return engine.run(reqs)
    first = serve()
    assert first["finished"] == 40 and first == serve()


@pytest.mark.parametrize("name,params", [("token_ratio", {}), ("past_future", {}), ("opt_factor", {"a": 1000.0})])
def test_reservations_beyond_the_pool_are_the_whole_pool_not_a_policy_error(name, params):
    """Defaults of token_ratio / past_future (a max_tokens-sized reservation per running request)
    and a large opt_factor ask for more than a small pool; that is the whole pool, and the engine's
    [0, num_blocks] contract holds (before, each such step was a policy error served at 0.01)."""
    from tests.helpers import make_engine, make_request

    engine = make_engine(num_blocks=32, block_size=4, watermark=name, watermark_params=params,
                         policy_errors="raise")
    metrics = engine.run([make_request(f"r{i}", prompt_len=8, output_len=6, arrival_s=0.001 * i, seed=i)
                          for i in range(12)])
    assert metrics["finished"] == 12 and metrics["policy_errors"] == 0


def test_sjf_predicts_lengths_unless_told_to_read_them():
    """By default ``sjf`` orders by the mean output of finished requests of the same prompt-length bucket
    (a server's guess); only ``oracle=true`` reads each request's exact output length."""
    from types import SimpleNamespace

    def seq(seq_id, prompt_len, output_len, num_output=0):
        return SimpleNamespace(seq_id=seq_id, prompt_len=prompt_len, output_len=output_len,
                               num_output=num_output, arrival_s=float(seq_id))

    predicted, oracle = plugins.create("scheduler", "sjf"), plugins.create("scheduler", "sjf", oracle=True)
    assert not predicted.params.oracle and predicted.static_key is False and oracle.static_key is True
    short_prompt_long_output, long_prompt_short_output = seq(0, 10, 900), seq(1, 1000, 20)
    for finished in (seq(9, 12, 30), seq(8, 900, 600)):          # short prompts have ended short so far
        predicted.on_finish(SimpleNamespace(prompt_len=finished.prompt_len, num_output=finished.output_len))
    order = lambda p: sorted([short_prompt_long_output, long_prompt_short_output], key=p.key)
    assert order(predicted) == [short_prompt_long_output, long_prompt_short_output]
    assert order(oracle) == [long_prompt_short_output, short_prompt_long_output]
    assert predicted.predict(seq(2, 5000, 1)) == pytest.approx((30 + 600) / 2)   # unseen bucket: the global mean
    assert plugins.create("scheduler", "sjf", default_len=77).predict(seq(3, 10, 1)) == 77
