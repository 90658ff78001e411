"""The ``scored`` admission order (kvrl/plugins/scored.py): at its defaults it is ``lpm`` run for run; its
features are what its docs say; a negative ``late`` weight puts requests past their TTFT objective last; the
learned orders committed under docs/results/agents/ load as plugins (scripts/order_search.py)."""
from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvrl import plugins
from kvrl.plugins.scored import FEATURES
from tests.helpers import make_engine, quiet_kvrl_logs
from tests.test_prefix_peek import _tenant_requests

_quiet = quiet_kvrl_logs(logging.ERROR)
ROOT = Path(__file__).resolve().parents[1]


def test_scored_at_its_defaults_is_lpm_run_for_run():
    lpm = make_engine(num_blocks=40, scheduler="lpm", watermark_params={"fraction": 0.01})
    scored = make_engine(num_blocks=40, scheduler="scored", watermark_params={"fraction": 0.01})
    assert scored.run(_tenant_requests(5, n=70)) == lpm.run(_tenant_requests(5, n=70))
    assert scored.metrics.steps == lpm.metrics.steps


def _scheduler(now: float, **weights):
    s = plugins.create("scheduler", "scored", **weights)
    s.bind(SimpleNamespace(now=now))
    return s


def _seq(seq_id, arrival_s, cached=0, num_tokens=100, slo=1.0):
    return SimpleNamespace(seq_id=seq_id, arrival_s=arrival_s, cached_prefix_tokens=cached, num_tokens=num_tokens,
                           num_output=0, tenant="t0", output_len_hint=None, slo_ttft_s=slo)


def test_the_features_are_the_documented_squashes():
    s = _scheduler(now=3.0, prefill=1.0, output=1.0, wait=1.0, late=1.0)
    cached, prefill, output, wait, late = s.features(_seq(1, arrival_s=1.0, cached=1024, num_tokens=1536, slo=1.0))
    assert cached == pytest.approx(0.5) and prefill == pytest.approx(0.5)      # 1,024 cached, 512 still to prefill
    assert output == pytest.approx(1 / 257)          # nothing finished yet: one more token predicted
    assert wait == pytest.approx(2 / 3) and late == 1.0                           # waited 2 s against a 1 s objective
    assert s.features(_seq(2, arrival_s=2.5, slo=1.0))[3:] == (pytest.approx(1 / 3), 0.0)
    assert s.features(_seq(3, arrival_s=0.0, slo=None))[3:] == (pytest.approx(0.75), 0.0)   # no objective: seconds
    assert FEATURES == ("cached", "prefill", "output", "wait", "late")


def test_a_negative_late_weight_puts_late_requests_last_whatever_their_prefix():
    s = _scheduler(now=5.0, late=-10.0)
    late_hit = _seq(1, arrival_s=1.0, cached=3000)            # waited 4 s against 1 s: its tokens cannot count
    fresh_miss = _seq(2, arrival_s=4.8, cached=0)
    fresh_hit = _seq(3, arrival_s=4.9, cached=512)
    assert [q.seq_id for q in s.order([late_hit, fresh_miss, fresh_hit])] == [3, 2, 1]
    assert [q.seq_id for q in _scheduler(now=5.0).order([late_hit, fresh_miss, fresh_hit])] == [1, 3, 2]   # lpm


def test_past_max_queue_it_admits_in_arrival_order():
    s = _scheduler(now=5.0, late=-10.0, max_queue=2)
    queue = [_seq(1, arrival_s=1.0, cached=3000), _seq(2, arrival_s=0.5), _seq(3, arrival_s=4.9, cached=512)]
    assert [q.seq_id for q in s.order(queue)] == [2, 1, 3]


@pytest.mark.parametrize("bad,match", [({"length_key": "hint"}, "length_key"), ({"late": "x"}, "late"),
                                       ({"max_queue": 0}, "max_queue")])
def test_bad_parameters_are_refused_by_name(bad, match):
    with pytest.raises(ValueError, match=match):
        plugins.create("scheduler", "scored", **bad)


def test_learned_orders_load_as_plugins_and_as_overrides():
    sys.path.insert(0, str(ROOT / "scripts"))
    from order_search import overrides_of, scheduler_config

    config = scheduler_config([0.6, -0.35, 0.25, 0.05, -0.65])
    assert overrides_of(config)[:2] == ["scheduler=scored", "scheduler.cached=0.6"]
    agents = sorted((ROOT / "docs/results/agents").glob("tenants-scored-seed*/scheduler.json"))
    assert agents
    for path in agents:
        params = json.loads(path.read_text())
        assert params.pop("name") == "scored"
        assert plugins.create("scheduler", "scored", **params).weights == tuple(params[f] for f in FEATURES)
