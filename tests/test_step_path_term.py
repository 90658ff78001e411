"""Fit version 13 (issue 16): the step model knows which graph the live executor runs a mixed step on
(``StepRule``, recorded in the profile) and prices a step on a split whole-step graph by its longest
decode's longest piece and the ``split`` terms. The sim reads the same rule as the executor."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from kvrl.executors import profile as P
from kvrl.executors.hardware import DEVICES, MODEL_SHAPES
from kvrl.executors.profile.features import PRE_MAX_Q, batch_features
from kvrl.executors.sim import SimExecutor
from kvrl.executors.step_rule import StepRule
from kvrl.profiling.batches import BatchFactory

SIZES = (16, 32, 64, 128, 256, 512, 1024, 2048)
RULE = StepRule(SIZES, 16, 512, 16, 8, 4096, SIZES[:6], 128, 8)


def test_split_piece_is_the_rules_split_graph():
    """``split_piece`` is nonzero exactly where :meth:`StepRule.key` picks a split graph for a mixed step."""
    for n_dec in (1, 4, 16, 64, 128, 129):
        for dec_max in (100, 511, 512, 2047, 2048, 4096, 4097, 9000):
            for pre_tok in (16, 256, 600):
                key = RULE.key(pre_tok + n_dec, 1, pre_tok, pre_tok, n_dec, dec_max)
                piece = RULE.split_piece(pre_tok + n_dec, 1, pre_tok, pre_tok, n_dec, dec_max)
                assert (piece > 0) == (key is not None and key.split), (n_dec, dec_max, pre_tok)
                assert piece in (0, -(-dec_max // 8))
    assert RULE.split_piece(64, 0, 0, 0, 64, 8192) == 0          # decodes alone: the decode graphs
    assert StepRule.from_dict(RULE.to_dict()) == RULE


def _samples(rng, n: int, truth) -> list[dict]:
    """Eager samples (prefill chunks beside decodes, some alone) priced by ``truth(f, piece)``."""
    out = []
    for _ in range(n):
        n_dec = int(rng.choice([0, 1, 4, 16, 32, 64, 128, 256]))
        dec_max = int(rng.choice([256, 512, 1024, 2048, 4096, 8192]))
        q = int(rng.choice([16, 64, 256, 1024]))
        f = dict.fromkeys(P.FEATURES, 0)
        f.update(n_pre=1, pre_tok=q, pre_pairs=q * (q + 1) // 2, pre_ctx=q, pre_max_ctx=q, n_dec=n_dec,
                 dec_kv=n_dec * dec_max // 2 + dec_max // 2 if n_dec else 0, dec_max=dec_max if n_dec else 0,
                 rows=1 + n_dec)
        f[PRE_MAX_Q] = q
        piece = RULE.split_piece(q + n_dec, 1, q, q, n_dec, f["dec_max"])
        out.append({"group": "random", "graph": False, **f, "t": truth(f, piece)})
    return out


def _truth(f: dict, piece: int) -> float:
    """A step time with the model's own form: dense work, KV reads, the longest walk (its piece on a split
    graph) and a split graph's own constant and per-decode cost."""
    b = f["n_dec"]
    t = 1e-3 + 2e-6 * f["pre_tok"] + 1e-9 * f["dec_kv"] + 4e-10 * b * (piece or f["dec_max"]) + 5e-6 * b
    return t + (3e-4 + 2e-6 * b if piece else 0.0)


def test_the_path_term_is_fitted_where_the_rule_puts_samples_on_split_graphs():
    rng = np.random.default_rng(0)
    samples = _samples(rng, 400, _truth)
    assert sum(RULE.split_piece(s["pre_tok"] + s["n_dec"], 1, s["pre_tok"], s["pre_tok"], s["n_dec"], s["dec_max"]) > 0
               for s in samples) > 40
    with_rule = P.StepModel.fit(samples, token_sizes=SIZES, step_rule=RULE.to_dict())
    without = P.StepModel.fit(samples, token_sizes=SIZES)
    assert {"split", "split_dec"} <= set(with_rule.eager["coef"]) and "split" not in without.eager["coef"]
    held = _samples(np.random.default_rng(1), 200, _truth)
    err = lambda m: np.median([abs(m.predict_features(s, host=False) / s["t"] - 1) for s in held])
    assert err(with_rule) < 0.02 < err(without)
    again = P.StepModel.from_dict(with_rule.to_dict())      # the rule travels with the model
    assert again.step_rule == RULE.to_dict()
    assert [again.predict_features(s) for s in held] == [with_rule.predict_features(s) for s in held]


def test_the_sim_prices_a_step_by_the_path_the_executor_takes():
    """The sim's item-by-item price of a mixed step equals the model's price of its features, and a step
    the rule sends to a split graph costs what the path term says: the same step with the rule's
    ``split_where_pays`` off (a plain graph) is priced without it."""
    shape = MODEL_SHAPES["qwen3-0.6b"]
    rule = dataclasses.replace(RULE, heads=shape.num_heads, kv_heads=shape.num_kv_heads)
    samples = _samples(np.random.default_rng(2), 400, _truth)
    model = P.StepModel.fit(samples, token_sizes=SIZES, step_rule=rule.to_dict())
    plain = P.StepModel.from_dict({**model.to_dict(), "step_rule": dataclasses.replace(rule, split_where_pays=False).to_dict()})
    factory = BatchFactory(4096, 16, shape.vocab_size, 9000)
    batch = factory.batch(decode_lens=[2048] + [512] * 3, prefills=[(64, 0)])
    f = batch_features(batch)
    assert f[PRE_MAX_Q] == 64 and rule.split_piece(68, 1, 64, 64, 4, 2048) == 256
    shipped = P.StepProfile.load(P.PACKAGED_DIR / "h200_qwen3-0.6b_bfloat16_step_graphs.json")
    sim = SimExecutor(shape, DEVICES["h200"], profile=dataclasses.replace(shipped, model=model))
    assert sim.execute(batch).elapsed_s == pytest.approx(model.predict_features(f, host=True), rel=1e-9)
    c = model.eager["coef"]
    gap = model.predict_features(f) - plain.predict_features(f)
    kvmax = model._e_kvmax(4) * 4 * (256 - 2048)
    assert gap == pytest.approx(model.engine_factor["eager"] * (c["split"] + 4 * c["split_dec"] + kvmax), rel=1e-9)


def test_kvrl_profile_records_the_executors_rule_and_fits_the_path_term(tmp_path):
    """A CPU profile of a live executor with whole-step graphs (their body run eagerly) over a small grid with
    split points: the profile records the executor's own rule, fits the split terms, and prices its samples
    the same after a save and load (up to the file's rounding)."""
    import torch

    from kvrl.executors.live import LiveExecutor
    from kvrl.model import load_model, make_random_checkpoint
    from kvrl.profiling.batches import GRIDS
    from kvrl.profiling.run import run_profile

    make_random_checkpoint(tmp_path / "ckpt", family="qwen3", preset="tiny", seed=1)
    model, config = load_model(tmp_path / "ckpt", dtype=torch.float32, device="cpu")
    ex = LiveExecutor(model, config, torch.device("cpu"), torch.float32, piecewise=True, step_graphs=True)
    small = dict(decode_batch=[1, 4], decode_ctx=[16, 128], ragged_batch=[4], ragged_ctx=[64], prefill_tokens=[8, 64],
                 prefill_seqs=[1], prefix_query=[8], prefix_cached=[64], mixed_batch=[4], mixed_ctx=[64],
                 mixed_prefill=[32], mixed_long_batch=[4], mixed_long_ctx=[256], mixed_long_prefill=[8],
                 mixed_long_cached=[0], split_batch=[2, 8, 32], split_ctx=[512, 1024], split_prefill=[8, 32],
                 scatter_batch=[], shared_batch=[], copies=[1], swaps=[1, 4], overlap_swap_in=[4], random=8, holdout=4,
                 host_requests=8, reps=3)
    prof = run_profile(ex, {**GRIDS["cpu"], **small}, block_size=16, num_blocks=512, model_name="tiny")
    assert prof.meta["step_rule"] == ex._step_graphs.rule.to_dict() == prof.model.step_rule
    assert {"split", "split_dec"} <= set(prof.model.eager["coef"])
    on_split = [s for s in prof.samples if s["group"] == "split_mixed"
                and ex._step_graphs.rule.split_piece(s["pre_tok"] + s["n_dec"], s["n_pre"], s["pre_max_q"],
                                                     s["pre_max_ctx"], s["n_dec"], s["dec_max"])]
    assert 0 < len(on_split) < len([s for s in prof.samples if s["group"] == "split_mixed"])   # 32 at 512: plain
    prof.save(tmp_path / "p.json")
    again = P.StepProfile.load(tmp_path / "p.json")          # coefficients saved to 6 significant digits
    assert again.model.step_rule == prof.model.step_rule
    assert [again.model.predict_features(s) for s in on_split] == pytest.approx(
        [prof.model.predict_features(s) for s in on_split], rel=1e-4)


def test_a_replay_keeps_the_longest_prefill_chunk_that_decides_the_path(tmp_path):
    """Two prefill chunks (192 and 100 tokens, one over an 8k context) beside 4 long decodes: by its longest
    chunk the eager path splits the prefill's keys, so the step runs piecewise, not on a split graph; taken as
    one chunk of all 292 tokens it would not. A replay.csv read back keeps ``pre_max_q``, so offline re-pricing
    (kvrl-fidelity resim, the residual scripts) prices the step as the sim did."""
    import csv

    from kvrl.fidelity.replay import read_replay_csv

    model = P.StepModel.fit(_samples(np.random.default_rng(3), 400, _truth), token_sizes=SIZES, step_rule=RULE.to_dict())
    batch = BatchFactory(4096, 16, 1000, 9000).batch(decode_lens=[2048] * 4, prefills=[(192, 8000), (100, 0)])
    f = batch_features(batch)
    assert f[PRE_MAX_Q] == 192 and RULE.split_piece(296, 2, 192, 8192, 4, 2048) == 0
    assert RULE.split_piece(296, 2, 292, 8192, 4, 2048) > 0                  # as one chunk: a split graph
    path = tmp_path / "replay.csv"
    row = {**f, "kind": "mixed", "live_s": 0.01, "live_execute_s": 0.009, "graph": 0}
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(row))
        w.writeheader()
        w.writerow(row)
    (read,) = read_replay_csv(path)
    assert read[PRE_MAX_Q] == 192
    assert model.forward_features(read) == model.forward_features(f) != model.forward_features({**f, PRE_MAX_Q: 292})
