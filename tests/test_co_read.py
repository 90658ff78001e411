"""Fit version 12 (issue 16): a decode's prefix-cache tokens are priced as shared only where another
sequence holds the same blocks (``Sequence.co_read_prefix_tokens``, the ``dec_coread`` feature); a
block one decode reads alone costs what a private block costs. Older profiles price as before."""
from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest

from kvrl.executors import profile as P
from kvrl.executors.profile.features import CO_READ, batch_features, co_read_of
from kvrl.executors.hardware import DEVICES, MODEL_SHAPES
from tests.helpers import make_engine, make_request

SYSTEM = np.arange(100, 116, dtype=np.int32)        # four full blocks of 4 tokens


def _prompt(suffix: int) -> np.ndarray:
    return np.concatenate([SYSTEM, np.arange(500 + suffix, 506 + suffix, dtype=np.int32)])


def _seqs(engine) -> dict:
    return {g.seqs[0].request.request_id: g.seqs[0] for g in engine._groups.values()}


def test_a_sequence_admitted_onto_blocks_another_holds_co_reads_them():
    """``a`` is admitted first: its prompt is its own. ``b`` arrives while ``a`` decodes and hits the
    four system blocks ``a`` holds: shared and co-read. ``c`` arrives after both finished and hits the
    same blocks, now held by no one: shared, not co-read. A swap-out clears both counts."""
    engine = make_engine(num_blocks=64)
    engine.add_request(make_request("a", tokens=_prompt(0), output_len=30))
    engine.step()
    engine.add_request(make_request("b", tokens=_prompt(1), output_len=30, arrival_s=engine.now))
    engine.step()
    seqs = _seqs(engine)
    assert (seqs["a"].shared_prefix_tokens, seqs["a"].co_read_prefix_tokens) == (0, 0)
    assert (seqs["b"].shared_prefix_tokens, seqs["b"].co_read_prefix_tokens) == (16, 16)
    batch = engine.schedule()
    f = batch_features(batch)
    assert f["dec_shared"] == f[CO_READ] == 16 and batch.plain.shared == batch.plain.co_read == 16
    engine._execute(batch, engine._planned_aborts)
    while engine.has_unfinished:
        engine.step()
    engine.add_request(make_request("c", tokens=_prompt(2), output_len=30, arrival_s=engine.now))
    engine.step()
    c = _seqs(engine)["c"]
    assert (c.shared_prefix_tokens, c.co_read_prefix_tokens) == (16, 0)
    engine.step()
    batch = engine.schedule()
    assert batch.plain.shared == 16 and batch.plain.co_read == 0


def _engine(fit_version: int):
    """An engine whose sim prices by the shipped Qwen3-0.6B profile relabelled ``fit_version``."""
    engine = make_engine(num_blocks=256)
    shipped = engine.executor.profile
    model = P.StepModel.from_dict({**shipped.model.to_dict(), "fit_version": fit_version})
    engine.executor = type(engine.executor)(MODEL_SHAPES["qwen3-0.6b"], DEVICES["h200"],
                                            profile=dataclasses.replace(shipped, model=model))
    return engine


@pytest.mark.parametrize("fit_version", [11, 12])
def test_the_sim_prices_the_shared_tokens_its_profile_prices(fit_version):
    """One step of decodes: three on blocks another decode holds, one on cached blocks it reads
    alone (its prompt's prefix was served to the end before). Fit version 12 prices only the co-read
    tokens as shared, the others as private; fit 11 prices every prefix hit as shared. Either prices
    from the planner's summary exactly as item by item."""
    engine = _engine(fit_version)
    other_system = np.concatenate([SYSTEM + 1000, np.arange(9, 15, dtype=np.int32)])
    engine.add_request(make_request("x", tokens=other_system, output_len=3))
    while engine.has_unfinished:
        engine.step()
    engine.add_request(make_request("a", tokens=_prompt(0), output_len=40, arrival_s=engine.now))
    engine.step()
    for i in range(1, 4):      # b1..b3 read a's blocks; z reads x's cached ones alone
        engine.add_request(make_request(f"b{i}", tokens=_prompt(i), output_len=40, arrival_s=engine.now))
    engine.add_request(make_request("z", tokens=np.concatenate([other_system[:16], [7, 8, 9]]), output_len=40,
                                    arrival_s=engine.now))
    engine.step()
    engine.step()
    batch = engine.schedule()
    f = batch_features(batch)
    assert (f[CO_READ], f["dec_shared"]) == (3 * 16, 4 * 16)
    summed, itemwise = copy.deepcopy(engine.executor), copy.deepcopy(engine.executor)
    out = summed.execute(batch)
    ref = itemwise.execute(dataclasses.replace(batch, plain=None))
    assert out.elapsed_s == ref.elapsed_s
    model = engine.executor.profile.model
    assert model.forward_args(f)[8] == (f[CO_READ] if fit_version >= 12 else f["dec_shared"])
    fit11, fit12 = sorted([model, P.StepModel.from_dict({**model.to_dict(), "fit_version": 23 - fit_version})],
                          key=lambda m: m.fit_version)
    assert fit12.predict_features(f) == fit11.predict_features({**f, "dec_shared": f[CO_READ]}) \
        != fit11.predict_features(f)


def test_samples_recorded_before_fit_12_read_as_they_were_priced():
    """:func:`co_read_of`: a sample with ``dec_coread`` as it is; without it, the grid's one-prefix
    points count every decode but the first, and any other sample its ``dec_shared``."""
    assert co_read_of({"dec_shared": 512, CO_READ: 128, "n_dec": 4}) == 128
    assert co_read_of({"dec_shared": 64 * 512, "n_dec": 64, "group": "shared"}) == 63 * 512
    assert co_read_of({"dec_shared": 16 * 512, "n_dec": 16, "group": "shared_mixed"}) == 15 * 512
    assert co_read_of({"dec_shared": 700, "n_dec": 9, "group": "random"}) == 700
    assert co_read_of({"n_dec": 3}) == 0
