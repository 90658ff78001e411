"""Output-length hints (issue 17, task ``hinted``): a length predictor's estimate carried by each
request, the workload transform that synthesises it, the JSONL field, and the predictors that read it."""
from types import SimpleNamespace

import numpy as np
import pytest

from kvrl.engine.request import Request, RequestRejected


def _req(i, out, hint=None):
    return Request(f"r{i}", float(i), np.arange(4, dtype=np.int32), out, output_len_hint=hint)


def test_hints_are_seeded_lognormal_and_do_not_depend_on_the_window():
    from kvrl.workloads.config import build_workload

    cfg = {"name": "synthetic", "num_requests": 3000, "length_hint_sigma": 0.5, "seed": 3}
    whole = build_workload(cfg, vocab_size=100)
    again = build_workload(cfg, vocab_size=100)
    val = build_workload({**cfg, "split": "val"}, vocab_size=100)
    assert [r.output_len_hint for r in whole] == [r.output_len_hint for r in again]
    by_id = {r.request_id: r.output_len_hint for r in whole}
    assert all(by_id[r.request_id] == r.output_len_hint for r in val)          # same hint in any window
    err = np.log([r.output_len_hint / r.output_len for r in whole if r.output_len >= 20])
    assert abs(err.mean()) < 0.05 and err.std() == pytest.approx(0.5, abs=0.05)
    exact = build_workload({**cfg, "length_hint_sigma": 0.0}, vocab_size=100)
    assert all(r.output_len_hint == r.output_len for r in exact)
    assert all(r.output_len_hint is None for r in build_workload({**cfg, "length_hint_sigma": None}, vocab_size=100))
    with pytest.raises(ValueError, match="length_hint_sigma"):
        build_workload({**cfg, "length_hint_sigma": -1.0}, vocab_size=100)


@pytest.mark.parametrize("bad", [0, -3, 1.5, True, "12"])
def test_a_bad_hint_is_rejected_naming_the_field(bad):
    with pytest.raises(RequestRejected, match="output_len_hint"):
        _req(0, 10, bad).validate()


def test_jsonl_round_trips_the_hint_and_refuses_a_bad_one(tmp_path):
    from kvrl.workloads.errors import TraceFormatError
    from kvrl.workloads.jsonl import load_jsonl, write_jsonl

    path = tmp_path / "t.jsonl"
    write_jsonl([_req(0, 10, 12), _req(1, 20)], path)
    back = load_jsonl(path, vocab_size=100)
    assert [r.output_len_hint for r in back] == [12, None]
    path.write_text('{"arrival_s": 0, "prompt_len": 4, "output_len": 5, "output_len_hint": 0}\n')
    with pytest.raises(TraceFormatError, match="output_len_hint"):
        load_jsonl(path, vocab_size=100)


def _fin(out, hint=None, tenant="t"):
    return SimpleNamespace(num_output=out, output_len_hint=hint, tenant=tenant)


def test_remaining_output_scales_the_hint_by_the_learned_error():
    from kvrl.plugins.lengths import RemainingOutput

    pred = RemainingOutput("hint", min_class_history=3)
    for out, hint in ((50, 100), (100, 100), (200, 100)):     # ratios 0.5, 1, 2
        pred.add(_fin(out, hint))
    assert pred(0, hint=300) == pytest.approx(300 * 3.5 / 3)            # mean ratio 7/6 of the hint
    assert pred(60, hint=100) == pytest.approx(100 * 1.5 - 60)          # ratios above 0.6: 1 and 2
    assert pred(250, hint=100) == pytest.approx(250.0)                  # outlived every ratio: as unhinted
    assert pred(10, hint=None) == pytest.approx(350 / 3 - 10)           # no hint: the pooled lengths
    cold = RemainingOutput("hint", min_class_history=4)
    for out, hint in ((50, 100), (100, 100), (200, 100)):
        cold.add(_fin(out, hint))
    assert cold(0, hint=300) == pytest.approx(300.0)                    # too few hinted: the hint as told
    assert cold(310, hint=300) == pytest.approx(310.0)                  # past it: as unhinted (outlived all: as many again)


def test_past_future_hint_key_reserves_from_each_request_s_hint():
    from kvrl.plugins.registry import create

    pf = create("watermark", "past_future", key="hint", min_history=3, quantile=0.5)
    for out, hint in ((50, 100), (100, 100), (200, 100)):
        pf.on_finish(_fin(out, hint))
    running = [_fin(10, 1000), _fin(10, 20), _fin(10, None)]
    got = pf._predict_running(running, np.array([10, 10, 10]), np.array([4000, 4000, 4000]))
    # ratios above 10/1000: median ratio 1 -> 1000 - 10; above 10/20 = 0.5: {1, 2}, index 0 -> 20 - 10;
    # no hint: the median of the finished lengths above 10 (100) - 10
    assert list(got) == [990, 10, 90]


def test_hinted_task_observes_the_hint_keyed_demand():
    import gymnasium as gym

    import kvrl.envs  # noqa: F401
    from kvrl.envs.config import load_task

    env_id, cfg = load_task("hinted", ["workload.num_requests=200", "env.episode.window_s=4.0"])
    assert cfg.features.length_key == "hint"
    env = gym.make(env_id, config=cfg).unwrapped
    assert all(r.output_len_hint for r in env.session.requests)
    obs, _ = env.reset(seed=0)
    for _ in range(3):
        obs, *_ = env.step(2)
    assert np.all(np.isfinite(obs)) and obs.shape == env.observation_space.shape


def _rl_cem():
    """scripts/rl_cem.py as a module (scripts/ is not a package)."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "rl_cem.py"
    spec = importlib.util.spec_from_file_location("rl_cem", path)
    cem = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cem)
    return cem


def test_policy_search_agent_acts_as_its_rounded_linear_score(tmp_path):
    """scripts/rl_cem.py saves its linear-rounded policy as an SB3 DQN (kvrl-eval and the agent
    plugin load it): the DQN's greedy action must be the rounded score, clipped to the bins."""
    from kvrl.envs.agent_io import load_agent

    cem = _rl_cem()
    rng = np.random.default_rng(0)
    params = rng.normal(0.0, 2.0, size=25)
    params[-1] = 2.2
    cem.save_agent(str(tmp_path), params, "hinted", ["workload.num_requests=200"], {})
    agent = load_agent(tmp_path)
    obs = rng.random((500, 24)).astype(np.float32)
    got = [int(agent.act(o)) for o in obs]
    want = [cem.act(params, o.astype(np.float64), 7) for o in obs]
    assert got == want
    assert {0, 6} <= set(got)            # both clips are reached


def test_policy_search_starts_at_a_given_linear_policy():
    """rl_cem.py --init: ``name=weight,...,bias=b`` sets the start's weights by observation name;
    a name the task lacks, one outside --features, or an item without ``=`` is a clear error."""
    cem = _rl_cem()
    names = ["running", "tight_running", "tight_waiting"]
    free = np.array([False, True, True, True])
    start = cem.parse_init("tight_running=25, bias=-5", names, free)
    assert list(start) == [0.0, 25.0, 0.0, -5.0]
    # the rule slo_mix(tight=0.3 -> bin 5, loose=0.0 -> bin 0, share=0.3) written as that score
    assert [cem.act(start, np.array([0.0, x, 0.0]), 6) for x in (0.0, 0.1, 0.4, 0.9)] == [0, 0, 5, 5]
    for bad, match in (("queue=1", "not among the task's observation"), ("running=1", "not among --features"),
                       ("tight_running", "is not name=value")):
        with pytest.raises(SystemExit, match=match):
            cem.parse_init(bad, names, free)


def test_policy_search_base_is_a_bin_or_a_rule_index():
    """rl_cem.py's base: ``--base`` names a bin of a fraction task; a task whose actions are rules
    (throttle_planner) needs ``--base-action``, which must be one of its actions."""
    from types import SimpleNamespace

    from gymnasium import spaces

    cem = _rl_cem()
    fractions = SimpleNamespace(rules=None, space=spaces.Discrete(3), config=SimpleNamespace(bins=[0.0, 0.01, 0.05]))
    assert cem.base_action(fractions, 0.05, None) == 2
    assert cem.base_action(fractions, None, 1) == 1
    with pytest.raises(SystemExit, match="not one of the task's bins"):
        cem.base_action(fractions, 0.02, None)
    rules = SimpleNamespace(rules=[{"name": "token_ratio"}, {"name": "fixed"}], space=spaces.Discrete(2),
                            config=SimpleNamespace(bins=[0.0, 0.01, 0.05]))
    assert cem.base_action(rules, None, 0) == 0
    with pytest.raises(SystemExit, match="give --base-action"):
        cem.base_action(rules, 0.0, None)          # 0.0 is a bin, but action 0 is the rule
    with pytest.raises(SystemExit, match="not an action of the task"):
        cem.base_action(rules, None, 2)


def test_policy_search_val_gain_averages_a_seeds_families():
    """--val-families: a val seed's gain is the mean of its families' paired gains (jobs seed-major)."""
    cem = _rl_cem()
    cells = [(0, None, None), (1, None, None), (2, None, None)]
    tasks = cem.val_tasks(np.zeros(2), [7, 8], 0.8, cells)
    assert [(t[2], t[4][0]) for t in tasks] == [(7, 0), (7, 1), (7, 2), (8, 0), (8, 1), (8, 2)]
    base = np.array([100.0, 200.0, 50.0, 100.0, 100.0, 100.0])
    scores = np.array([110.0, 180.0, 50.0, 103.0, 100.0, 97.0])
    assert np.allclose(cem.val_gain_per_seed(scores, base, 3), [0.0, 0.0])
    assert np.allclose(cem.val_gain_per_seed(scores[:2], base[:2], 1), [10.0, -10.0])


def test_policy_search_val_loads_serve_each_family_at_its_training_loads():
    """--val-loads: each family is served at every rate scale its training episodes draw (relative scales times
    the family's own rate_scale), the job keeps kvrl-eval's resample (the rate divided by the kept share);
    the history averages the cells per family and per training load; a task without rate_scales is a clear error."""
    from types import SimpleNamespace

    cem = _rl_cem()
    episode = SimpleNamespace(rate_scales=[0.5, 1.0], rate_scales_relative=True)
    session = SimpleNamespace(config=SimpleNamespace(episode=episode, run={}),
                              families=[{"name": "azure_code", "rate_scale": 20.0}, {"name": "synthetic", "rate_scale": 1.0}])
    cells = cem.val_cells(session, [0, 1], loads=True)
    assert cells == [(0, 10.0, 0), (0, 20.0, 1), (1, 0.5, 0), (1, 1.0, 1)]
    assert cem.val_cells(session, [0, 1], loads=False) == [(0, None, None), (1, None, None)]
    job = cem.val_workload(session, 3, 0.8, (0, 10.0, 0))
    assert job == {"name": "azure_code", "rate_scale": 12.5, "split": "val", "seed": 3, "subsample": 0.8}
    assert cem.val_workload(session, 3, 0.8, (1, None, None))["rate_scale"] == 1.25
    assert session.families[0]["rate_scale"] == 20.0                     # the family's config is not changed
    assert cem.gain_by(cells, np.array([1.0, 3.0, -2.0, 4.0]), 0) == [2.0, 1.0]
    assert cem.gain_by(cells, np.array([1.0, 3.0, -2.0, 4.0]), 2) == [-0.5, 3.5]      # per training load
    episode.rate_scales = None
    with pytest.raises(SystemExit, match="no env.episode.rate_scales"):
        cem.val_cells(session, [0], loads=True)


def test_policy_search_reference_policies_are_constants():
    """--references: each reference is the linear-rounded policy that holds one action everywhere, and an
    action outside the task is a clear error."""
    cem = _rl_cem()
    ref = cem.constant_policy(4, 3, 7)
    rng = np.random.default_rng(1)
    assert {cem.act(ref, o, 7) for o in rng.random((50, 4))} == {3}
    with pytest.raises(SystemExit, match="not an action of the task"):
        cem.constant_policy(4, 7, 7)


def test_past_future_overcommit_lets_the_predicted_peak_exceed_the_pool():
    from kvrl.plugins.registry import create

    def reserved(overcommit):
        pf = create("watermark", "past_future", key="hint", min_history=1, quantile=0.5, overcommit=overcommit)
        pf.on_finish(_fin(100, 100))                       # ratio 1: hints are taken as exact
        running = [SimpleNamespace(num_tokens=16, num_output=0, max_tokens=4000, output_len_hint=320, tenant="t")
                   for _ in range(4)]
        pf.bind(SimpleNamespace(running=running, block_size=16, num_blocks=100, num_used_blocks=4))
        return pf.reserved_blocks()

    # each grows from 16 to 336 tokens: 21 blocks + 1 partial each at the peak = 88 blocks, 4 in use
    assert reserved(0.0) == 84
    assert reserved(0.5) == 34                              # 50 of the 100 blocks may be overcommitted
    assert reserved(1.0) == 0
    cold = create("watermark", "past_future", key="hint", min_history=5, quantile=0.5)
    running = [_fin(10, 100), _fin(120, 100)]
    got = cold._predict_running(running, np.array([10, 120]), np.array([4000, 4000]))
    assert list(got) == [90, 3880]       # no error model yet: the hint as told; past it, max_tokens (no history)
    with pytest.raises(ValueError, match="overcommit"):
        create("watermark", "past_future", overcommit=-0.1)
