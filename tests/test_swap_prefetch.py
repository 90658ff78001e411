"""The CPEN 511 swap-in prefetching study (issue #20): swap traces recorded by an engine callback,
the predictors' samples and training, and the proactive swap-in watermark."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from kvrl import plugins
from kvrl.analysis.swap_trace import SwapEvent, SwapTraceRecorder, next_swap_in_samples, read_csv, summary
from kvrl.engine.config import EngineConfig
from kvrl.engine.engine import Engine
from kvrl.executors.hardware import DEVICES, MODEL_SHAPES
from kvrl.executors.sim import SimExecutor
from tests.helpers import make_request


def _engine(watermark="fixed", **params):
    cfg = EngineConfig(num_blocks=40, block_size=4, num_cpu_blocks=400, max_model_len=512, max_num_batched_tokens=64)
    return Engine(cfg, SimExecutor(MODEL_SHAPES["qwen3-0.6b"], DEVICES["h200"], profile="none"),
                  plugins.create("scheduler", "fcfs"), plugins.create("watermark", watermark, **params),
                  plugins.create("eviction", "lifo", mode="swap"), plugins.create("prefix_cache", "none"))


def _requests(seed=0, n=16):
    rng = np.random.default_rng(seed)
    return [make_request(f"r{i}", tokens=rng.integers(0, 100, int(rng.integers(8, 24)), dtype=np.int32),
                         output_len=int(rng.integers(20, 60)), arrival_s=0.002 * i) for i in range(n)]


def test_the_recorder_sees_every_swap_in_fifo_order_without_changing_the_run(tmp_path):
    plain = _engine().run(_requests())
    engine = _engine()
    rec = SwapTraceRecorder()
    traced = engine.run(_requests(), callbacks=[rec])
    assert traced == plain                                        # an observer only
    s = summary(rec.events)
    assert s["swap_out"] == s["swap_in"] == traced["preemptions"] > 3
    assert sum(e.num_blocks for e in rec.events if e.kind == "out") == traced["swapped_out_blocks"]
    assert s["fifo_share"] == 1.0                                 # the engine swaps in in swap-out order
    rec.write_csv(tmp_path / "t.csv")
    assert read_csv(tmp_path / "t.csv") == rec.events


def test_samples_name_the_swapped_in_sequence_and_the_rules():
    ev = lambda i, kind, seq: SwapEvent(i, 0.1 * i, kind, seq, f"r{seq}", 2)
    events = [ev(0, "out", 5), ev(1, "out", 7), ev(2, "out", 9), ev(3, "in", 5), ev(4, "in", 7)]
    s = next_swap_in_samples(events, window=2)
    assert list(s.target_seq) == [5, 7]
    assert list(s.fifo) == [5, 7] and list(s.lifo) == [9, 9]
    assert list(s.offset) == [5 - 9, 7 - 5]
    assert list(s.label) == [2, 2]          # 5's swap-out is outside the 2-event window; 7's too (window: 9-out, 5-in)
    wide = next_swap_in_samples(events, window=4)
    assert list(wide.label) == [1, 1]       # padded windows: [pad, 5-out, 7-out, 9-out] and [5-out, 7-out, 9-out, 5-in]
    assert wide.x.shape == (2, 4, 5) and (wide.x[0, 0] == 0).all()
    with pytest.raises(ValueError, match="window"):
        next_swap_in_samples(events, 0)


def test_a_classifier_learns_the_oldest_outstanding_swap_out():
    """On a synthetic FIFO trace with one or two sequences swapped out at a time, the MLP
    classifier names the swap-out event of the next swapped-in sequence."""
    from kvrl.analysis.swap_predict import accuracy, fit
    rng = np.random.default_rng(0)
    events, t, seq, out = [], 0.0, 0, []
    for i in range(400):
        if len(out) < 2 and (not out or rng.random() < 0.5):
            events.append(SwapEvent(i, t, "out", seq, f"r{seq}", int(rng.integers(1, 9))))
            out.append(seq)
            seq += 1
        else:
            events.append(SwapEvent(i, t, "in", out.pop(0), "x", 1))
        t += float(rng.random())
    samples = next_swap_in_samples(events, 4)
    half = len(samples.label) // 2
    cut = lambda a, sl: a[sl]
    train = type(samples)(*(cut(getattr(samples, f), slice(0, half)) for f in ("x", "offset", "label", "target_seq",
                                                                                  "fifo", "lifo")), 4)
    test = type(samples)(*(cut(getattr(samples, f), slice(half, None)) for f in ("x", "offset", "label", "target_seq",
                                                                                   "fifo", "lifo")), 4)
    net = fit("mlp", "classification", train, epochs=300)
    assert accuracy(net, "classification", test) > 0.9


def _view(free, swapped_blocks, num_blocks=100):
    return SimpleNamespace(num_blocks=num_blocks, num_free_blocks=free, num_swapped=len(swapped_blocks),
                           swapped=tuple(SimpleNamespace(num_cpu_blocks=b) for b in swapped_blocks))


@pytest.mark.parametrize("predictor,free,swapped,expected", [
    ("fifo", 30, [], 10),            # nothing swapped: the fixed reservation
    ("fifo", 30, [25, 4], 5),        # the head fits: reserve only what leaves room for it
    ("fifo", 30, [40, 4], 10),       # the head does not fit: fixed
    ("lifo", 30, [25, 4], 10),       # the newest (4 blocks) fits with room: min(10, 26)
    ("lifo", 12, [25, 4], 8),
    ("none", 30, [25, 4], 10),
])
def test_swap_prefetch_reserves_room_for_the_predicted_sequence(predictor, free, swapped, expected):
    policy = plugins.create("watermark", "swap_prefetch", fraction=0.1, predictor=predictor)
    policy.bind(_view(free, swapped))
    assert policy.reserved_blocks() == expected


def test_swap_prefetch_fifo_brings_swapped_sequences_back_sooner():
    """Against the fixed watermark at the same fraction, the proactive swap-in shortens the time
    sequences spend swapped out (same requests)."""
    def swapped_time(watermark, **params):
        engine = _engine(watermark, **params)
        rec = SwapTraceRecorder()
        engine.run(_requests(3, 24), callbacks=[rec])
        out = {e.seq_id: e.time_s for e in rec.events if e.kind == "out"}
        return sum(e.time_s - out[e.seq_id] for e in rec.events if e.kind == "in")
    assert swapped_time("swap_prefetch", fraction=0.3, predictor="none") == swapped_time("fixed", fraction=0.3)
    assert swapped_time("swap_prefetch", fraction=0.3, predictor="fifo") < swapped_time("fixed", fraction=0.3)


def test_swap_prefetch_model_predictor_follows_the_classifier(tmp_path):
    """predictor=model: a TorchScript classifier naming the last event of the window (here a
    swap-out of sequence 9) makes the plugin make room for sequence 9; naming 'not in the window'
    leaves the fixed reservation; a missing model_path is an error naming the key."""
    torch = pytest.importorskip("torch")
    window = 4

    def scripted(best):
        net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(window * 5, window + 1))
        with torch.no_grad():
            net[1].weight.zero_()
            net[1].bias.zero_()
            net[1].bias[best] = 1.0
        path = tmp_path / f"m{best}.pt"
        torch.jit.script(net).save(str(path))
        return str(path)

    for best, expected in ((window - 1, 12 - 6), (window, 10)):
        policy = plugins.create("watermark", "swap_prefetch", fraction=0.1, predictor="model",
                                model_path=scripted(best), window=window)
        view = SimpleNamespace(num_blocks=100, num_free_blocks=12, now=1.0, num_swapped=2,
                               swapped=(SimpleNamespace(seq_id=5, num_cpu_blocks=25),
                                        SimpleNamespace(seq_id=9, num_cpu_blocks=6)))
        policy.bind(view)
        policy.on_step_end()                        # records the swap-outs of 5 and 9 (in queue order)
        assert [e[:2] for e in policy._history] == [("out", 5), ("out", 9)]
        assert policy.reserved_blocks() == expected     # fifo would keep 10: the head (25 blocks) does not fit
    with pytest.raises(ValueError, match="watermark.model_path"):
        plugins.create("watermark", "swap_prefetch", predictor="model")
