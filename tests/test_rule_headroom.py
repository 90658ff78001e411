"""scripts/rl_rule_headroom.py: the clairvoyant rollout planner whose base is a rule (issue 17)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from kvrl.envs import guess as G

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("rl_rule_headroom", ROOT / "scripts" / "rl_rule_headroom.py")
R = importlib.util.module_from_spec(spec)
spec.loader.exec_module(R)

RULE = "slo_mix:tight=0.3,loose=0.0,share=0.3"
SHORT = ["workload.horizon_s=25"]      # a 5 s test window: a few hundred requests


def test_parse_rule():
    assert R.parse_rule(RULE) == {"name": "slo_mix", "tight": 0.3, "loose": 0.0, "share": 0.3}
    assert R.parse_rule("fixed:fraction=0.01") == {"name": "fixed", "fraction": 0.01}
    assert R.parse_rule("token_ratio:clip_max_new_tokens=4096,min_ratio=0.05") == {
        "name": "token_ratio", "clip_max_new_tokens": 4096, "min_ratio": 0.05}
    assert type(R.parse_rule("token_ratio:clip_max_new_tokens=4096")["clip_max_new_tokens"]) is int


def test_the_rules_row_is_kvrl_evals_and_the_planner_never_loses_to_it():
    """The loop serves kvrl-eval's job bit for bit; the planner with only the rule as a candidate
    is the rule; with constants too it is at least the rule (deterministic sim, rollouts to the end)."""
    from kvrl.apps.eval import Job, Policy, run_job
    from kvrl.envs.config import load_task

    rule = R.parse_rule(RULE)
    _, cfg = load_task("slo_shift", ["seed=1", *SHORT])
    theirs = run_job(dict(cfg.run), "watermark", Job(Policy("rule", "heuristic", rule), "test", 1), 0.8)
    mine = R.finish(R.build_loop("slo_shift", SHORT, rule, "test", 1, 0.8))
    assert mine == pytest.approx(theirs["goodput_tok_s"], rel=1e-12)
    alone, chosen = R.plan(R.build_loop("slo_shift", SHORT, rule, "test", 1, 0.8), [None], 1.0, 1.0)
    assert alone == pytest.approx(mine, rel=1e-12) and chosen and set(chosen) == {None}
    best, chosen = R.plan(R.build_loop("slo_shift", SHORT, rule, "test", 1, 0.8), [None, 0.0, 0.3], 1.0, 1.0)
    assert best >= mine - 1e-9 and set(chosen) <= {None, 0.0, 0.3}


def test_table_renders_a_finished_run(tmp_path):
    import json

    out = tmp_path / "h.jsonl"
    rows = [{"seed": s, "rule_goodput": 100.0 + s, "planner_goodput": 102.0 + s + 0.1 * s, "chosen": [None, 0.2, 0.2, None]}
            for s in (1, 0, 2)]
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = R.table(str(out))
    assert text.splitlines()[2] == "| 0 | 100.0 | 102.0 | +2.0% | 4 | 50% | 0.2 x2 |"
    assert "rule 101.0, planner 103.1 goodput tok/s over 3 seeds; planner - rule = +2.1 ±" in text
    assert "a constant held at 50% of decisions." in text


def test_forecast_replays_the_last_window_into_the_future_and_the_rule_alone_is_still_the_rule():
    """--forecast: a copy's future is the last W seconds' arrivals again every W seconds, up to the job's
    last arrival (with --horizon H, up to H seconds ahead, past the job's end too), with new ids and shifted
    prompts; the planner with only the rule is still the rule."""
    import numpy as np

    rule = R.parse_rule(RULE)
    loop = R.build_loop("slo_shift", SHORT, rule, "test", 1, 0.8)
    R.serve_until(loop, loop.engine.now + 2.0)
    now, end = loop.engine.now, loop.pending[-1].arrival_s
    recent = [r for r in loop.pending[:loop.next_index] if r.arrival_s >= now - 1.0]
    future = R.forecast(loop, 1.0)
    assert recent and future and all(now <= r.arrival_s <= end for r in future)
    assert [r.arrival_s for r in future] == sorted(r.arrival_s for r in future)
    assert len({r.request_id for r in future}) == len(future) and all("~" in r.request_id for r in future)
    first = next(r for r in future if r.request_id == f"{recent[-1].request_id}~1")
    assert first.arrival_s == pytest.approx(recent[-1].arrival_s + 1.0)
    assert np.array_equal(first.prompt_token_ids, (recent[-1].prompt_token_ids + 1) % loop.engine.executor.vocab_size)
    beyond = R.forecast(loop, 1.0, horizon_s=end - now + 5.0)     # --horizon: past the job's end
    assert [r.request_id for r in beyond if r.arrival_s <= end] == [r.request_id for r in future]
    assert max(r.arrival_s for r in beyond) > end
    assert all(r.arrival_s <= end + 5.0 for r in beyond)
    assert max(r.arrival_s for r in R.forecast(loop, 1.0, horizon_s=1.5)) <= now + 1.5
    mine = R.finish(R.build_loop("slo_shift", SHORT, rule, "test", 1, 0.8))
    alone, chosen = R.plan(R.build_loop("slo_shift", SHORT, rule, "test", 1, 0.8), [None], 1.0, 1.0, forecast_s=2.0)
    assert alone == pytest.approx(mine, rel=1e-12) and set(chosen) == {None}


def test_sweep_serves_each_constant_as_the_rule():
    """--sweep: a constant's goodput on a job is the planner's base row for that fixed rule."""
    got = R.sweep("slo_shift", SHORT, "test", [1], 0.8, [0.0, 0.2])
    for c in (0.0, 0.2):
        assert got[c][1] == pytest.approx(R.finish(R.build_loop("slo_shift", SHORT, {"name": "fixed", "fraction": c},
                                                                "test", 1, 0.8)), rel=1e-12)
    assert got[0.0][1] != got[0.2][1]


def test_blind_copies_guess_output_lengths_from_finished_requests_and_the_rule_alone_is_still_the_rule():
    """--blind: every unfinished sequence's guessed length is a finished request's length above what it
    has generated (or one token more), forecast requests get finished lengths, a copy given the guesses
    serves to them, and the real job keeps its own lengths (the planner with only the rule is the rule)."""
    import copy

    import numpy as np

    rule = R.parse_rule(RULE)
    loop = R.build_loop("slo_shift", SHORT, rule, "test", 1, 0.8)
    R.serve_until(loop, loop.engine.now + 3.0)
    done = set(loop.engine.metrics.finished_output_lens)
    live = loop.engine.live_sequences()
    assert done and live
    lengths, future = G.guessed_lengths(loop, R.forecast(loop, 1.0), np.random.default_rng(0))
    assert set(lengths) == {s.seq_id for s in live}
    for s in live:
        made = len(s.output_token_ids)
        assert lengths[s.seq_id] > made and (lengths[s.seq_id] in done or lengths[s.seq_id] == made + 1)
    assert future and all(r.output_len in done for r in future)
    trial = copy.deepcopy(loop)
    R.set_lengths(trial.engine, lengths)
    assert {s.seq_id: s.request.output_len for s in trial.engine.live_sequences()} == lengths
    R.serve_until(trial, trial.engine.now + 1.0)
    for s in trial.engine.live_sequences():
        assert len(s.output_token_ids) < lengths.get(s.seq_id, s.request.output_len)
    mine = R.finish(R.build_loop("slo_shift", SHORT, rule, "test", 1, 0.8))
    for forecast_s in (0.0, 2.0):       # blind to the job's own arrivals' lengths, or the forecast's
        alone, chosen = R.plan(R.build_loop("slo_shift", SHORT, rule, "test", 1, 0.8), [None], 1.0, 1.0,
                               forecast_s=forecast_s, blind_seed=0)
        assert alone == pytest.approx(mine, rel=1e-12) and set(chosen) == {None}
    pending = loop.pending[loop.next_index:]
    _, guessed = G.guessed_lengths(loop, pending, np.random.default_rng(0))
    assert [r.request_id for r in guessed] == [r.request_id for r in pending]
    assert all(r.output_len in done for r in guessed)


def test_before_any_request_finished_guessed_lengths_reveal_no_true_length():
    """Before the first request finishes a server knows no output length: forecast requests (copies of
    real ones, for arrivals and for Poisson draws alike) and the live sequences get one token more than
    they have generated, never the true lengths their copies carry."""
    import numpy as np

    loop = R.build_loop("slo_shift", SHORT, R.parse_rule(RULE), "test", 1, 0.8)
    while not loop.engine.live_sequences():
        R.serve_until(loop, loop.engine.now + 0.002)
    assert not loop.engine.metrics.finished_output_lens and loop.engine.live_sequences()
    rng = np.random.default_rng(0)
    for future in (R.forecast(loop, 1.0), G.poisson_forecast(loop, 1.0, 5.0, rng)):
        assert future and any(r.output_len > 1 for r in future)       # the copies carry true lengths
        lengths, guessed = G.guessed_lengths(loop, future, rng)
        assert [r.request_id for r in guessed] == [r.request_id for r in future]
        assert all(r.output_len == 1 for r in guessed)
        assert lengths == {s.seq_id: len(s.output_token_ids) + 1 for s in loop.engine.live_sequences()}


def test_samples_average_several_guessed_futures_and_an_empty_forecast_reveals_no_arrival(monkeypatch):
    """--samples K: every decision draws K guessed futures and serves every candidate on each (the rule
    alone is still the rule); a forecast with nothing in its window stays empty instead of falling back
    to the job's own arrivals; K > 1 without blind guesses is refused."""
    rule = R.parse_rule(RULE)
    mine = R.finish(R.build_loop("slo_shift", SHORT, rule, "test", 1, 0.8))
    draws, real = [], G.guessed_lengths

    def counted(loop, future, rng, hints=False):
        draws.append((loop.engine.now, len(future)))
        return real(loop, future, rng, hints)

    monkeypatch.setattr(G, "guessed_lengths", counted)
    monkeypatch.setattr(G, "forecast", lambda loop, window_s, horizon_s=None: [])
    alone, chosen = R.plan(R.build_loop("slo_shift", SHORT, rule, "test", 1, 0.8), [None], 1.0, 1.0,
                           forecast_s=2.0, blind_seed=0, samples=3)
    assert alone == pytest.approx(mine, rel=1e-12) and set(chosen) == {None}
    assert len(draws) == 3 * len(chosen) and {n for _, n in draws} == {0}
    with pytest.raises(ValueError, match="samples > 1"):
        R.plan(R.build_loop("slo_shift", SHORT, rule, "test", 1, 0.8), [None], 1.0, 1.0, samples=2)


def test_hints_guesses_are_the_requests_own_length_hints():
    """--hints: the copies hold each request's output_len_hint (at least one token more than generated),
    the job's own arrivals to come too; without hints in the workload it says so; the hints do not change
    the rule's job (they are drawn from their own stream)."""
    import numpy as np

    rule = R.parse_rule(RULE)
    hinted = [*SHORT, "workload.length_hint_sigma=0.5"]
    loop = R.build_loop("slo_shift", hinted, rule, "test", 1, 0.8)
    R.serve_until(loop, loop.engine.now + 3.0)
    live = loop.engine.live_sequences()
    pending = loop.pending[loop.next_index:]
    lengths, future = G.guessed_lengths(loop, pending, np.random.default_rng(0), hints=True)
    assert live and pending
    assert lengths == {s.seq_id: max(s.request.output_len_hint, len(s.output_token_ids) + 1) for s in live}
    assert [r.output_len for r in future] == [r.output_len_hint for r in pending]
    assert any(r.output_len != p.output_len for r, p in zip(future, pending))
    assert R.finish(R.build_loop("slo_shift", hinted, rule, "test", 1, 0.8)) == pytest.approx(
        R.finish(R.build_loop("slo_shift", SHORT, rule, "test", 1, 0.8)), rel=1e-12)
    plain = R.build_loop("slo_shift", SHORT, rule, "test", 1, 0.8)
    R.serve_until(plain, plain.engine.now + 1.0)
    with pytest.raises(ValueError, match="length_hint_sigma"):
        G.guessed_lengths(plain, plain.pending[plain.next_index:], np.random.default_rng(0), hints=True)


def test_poisson_forecast_draws_arrivals_at_the_recent_rate_and_the_rule_alone_is_still_the_rule():
    """--poisson: a guessed future's arrivals are copies of the last window's requests, after now and
    within the horizon, in time order, about rate x horizon of them over many draws; the planner with
    only the rule is still the rule; without a horizon it is refused."""
    import numpy as np

    rule = R.parse_rule(RULE)
    loop = R.build_loop("slo_shift", SHORT, rule, "test", 1, 0.8)
    R.serve_until(loop, loop.engine.now + 2.0)
    now = loop.engine.now
    recent = {r.request_id: r for r in loop.pending[:loop.next_index] if r.arrival_s >= now - 1.0}
    rng = np.random.default_rng(0)
    draws = [G.poisson_forecast(loop, 1.0, 4.0, rng) for _ in range(200)]
    for future in draws[:20]:
        times = [r.arrival_s for r in future]
        assert times == sorted(times) and all(now < t <= now + 4.0 for t in times)
        assert len({r.request_id for r in future}) == len(future)
        for r in future:
            source = recent[r.request_id.split("~p")[0]]
            assert r.output_len == source.output_len and r.prompt_len == source.prompt_len
    assert np.mean([len(f) for f in draws]) == pytest.approx(4.0 * len(recent), rel=0.1)
    mine = R.finish(R.build_loop("slo_shift", SHORT, rule, "test", 1, 0.8))
    alone, chosen = R.plan(R.build_loop("slo_shift", SHORT, rule, "test", 1, 0.8), [None], 1.0, 1.0,
                           forecast_s=2.0, blind_seed=0, samples=2, horizon_s=5.0, poisson=True)
    assert alone == pytest.approx(mine, rel=1e-12) and set(chosen) == {None}
    with pytest.raises(ValueError, match="poisson needs"):
        R.plan(R.build_loop("slo_shift", SHORT, rule, "test", 1, 0.8), [None], 1.0, 1.0, forecast_s=2.0,
               blind_seed=0, poisson=True)


def test_guess_leak_reach_counts_decisions_before_the_first_finish_and_diffs_runs(tmp_path, monkeypatch):
    """scripts/guess_leak_reach.py: only the t = 0 decision precedes slo_shift's first finish; its guessed future
    is the job's own arrivals without a forecast and empty with one; diff names the seeds whose first decision
    or goodput differ."""
    import json

    monkeypatch.syspath_prepend(str(ROOT / "scripts"))      # the script imports rl_rule_headroom as run from scripts/
    reach = importlib.util.spec_from_file_location("guess_leak_reach", ROOT / "scripts" / "guess_leak_reach.py")
    L = importlib.util.module_from_spec(reach)
    reach.loader.exec_module(L)
    assert L.decisions("slo_shift", RULE, 1.0, 0.0, [1]) == [(1, 1, 1)]
    assert L.decisions("slo_shift", RULE, 1.0, 1.0, [1]) == [(1, 1, 0)]
    runs = {"old": [(0, [None, 0.3], 600.0), (1, [0.3], 500.0), (2, [0.1], 550.0)],
            "new": [(0, [0.3, 0.3], 600.0), (1, [0.3], 501.0), (2, [0.1], 550.0)]}
    for name, rows in runs.items():
        (tmp_path / name).write_text("".join(json.dumps({"seed": s, "chosen": c, "planner_goodput": g}) + "\n"
                                             for s, c, g in rows))
    assert L.diff(str(tmp_path / "old"), str(tmp_path / "new")) == {
        "seeds": [0, 1, 2], "first_decision_differs": [0], "goodput_differs": [1]}
