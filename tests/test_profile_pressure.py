"""Fit version 9's pressure terms (issue 16): host time for the previous step's prefill tokens and
for swaps, the extra cost of decodes beside a prefill (``mixed_dec``), their fit from profiler
samples and from recorded live steps (kvrl/fidelity/live_fit.py), and old profiles pricing as before."""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from kvrl.executors import profile as P
from kvrl.executors.hardware import DeviceSpec, ModelShape
from kvrl.executors.sim import SimExecutor
from tests.helpers import known_eager_model, step_features

TINY = ModelShape(name="tiny", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16,
                  intermediate_size=128, vocab_size=512, max_model_len=2048, dtype_bytes=4)
CPU = DeviceSpec(name="cpu", memory_bytes=16e9, hbm_bw=20e9, matmul_flops=2e11, pcie_bw=20e9)
SHIPPED = P.PACKAGED_DIR / "h200_qwen3-0.6b_bfloat16.json"
RAW_KEY = {"device": "cpu", **{f: getattr(TINY, f) for f in P.SHAPE_FIELDS}}


def _truth(mixed_dec: float = 0.0, **host) -> P.StepModel:
    """A small known model (eager only, no graphs) with ``mixed_dec`` and host terms ``host``."""
    return known_eager_model({"mixed_dec": mixed_dec}, host)


# ------------------------------------------------------------------------------ old profiles
def test_a_fit_version_8_profile_prices_exactly_as_before():
    """The shipped fit-version-8 profile prices steps exactly as the code before fit version 9 did
    (values computed with that code, commit e39c46a), whatever the new host-work counters say:
    it has no mixed_dec, previous-prefill or swap host terms, so they price as zero."""
    prof = P.StepProfile.load(SHIPPED)
    assert prof.model.to_dict()["eager"]["coef"].get("mixed_dec") is None
    m = prof.model
    cases = [step_features([2100] + [1204] * 23),
             step_features([2100] + [1204] * 23, pre=[(120, 900)]),
             step_features(pre=[(1500, 0), (1500, 0)]),
             step_features([4000] + [996] * 299, copies=3, swap_out=12, swap_in=40)]
    cases[0]["dec_kv"], cases[1]["dec_kv"], cases[3]["dec_kv"], cases[3]["dec_shared"] = 30000, 30000, 300000, 20000
    cases[1]["rows"] = 25
    old = [(0.0024789655587524797, 0.00272323275875248, 0.0002442672),
           (0.0049870641705468035, 0.0054005960245468035, 0.000413531854),
           (0.008126964168341157, 0.008800280168341158, 0.000673316),
           (0.01415357639924944, 0.01540542299924944, 0.0012518466)]
    for f, (fwd, with_host, host) in zip(cases, old):
        f.update(n_admit=2, n_preempt=1, n_finish=3, n_wait=40, pre_tok_prev=5000, swap_blocks=77, swap_step=1)
        assert m.predict_features(f, True, host=False) == pytest.approx(fwd, rel=1e-12)
        assert m.predict_features(f, True, host=True) == pytest.approx(with_host, rel=1e-12)
        assert m.host_s(f["n_pre"] + f["n_dec"], f["n_pre"], *(f[k] for k in P.HOST_WORK)) == pytest.approx(host, rel=1e-12)


# ------------------------------------------------------------------------------ fitting the new terms
def test_fit_host_recovers_the_previous_prefill_and_swap_terms():
    rng = np.random.default_rng(1)
    truth = {"base": 40e-6, "per_seq": 2e-6, "per_prefill": 5e-6, "per_admit": 30e-6, "per_preempt": 80e-6,
             "per_finish": 10e-6, "per_waiting": 0.5e-6, "per_prefill_token": 0.05e-6,
             "per_prev_prefill_token": 0.08e-6, "per_swap_block": 0.6e-6, "per_swap_step": 90e-6}
    rows = []
    for _ in range(500):
        s, p, a, e, f, w, t, tp, sb = (int(rng.integers(0, hi)) for hi in (256, 8, 6, 4, 10, 300, 4000, 4000, 300))
        sb *= int(rng.random() < 0.3)     # a third of the steps swap (on nearly all, swap_step is base)
        ss = int(sb > 0)
        counts = [a, e, f, w, t, tp, sb, ss]
        gap = truth["base"] + truth["per_seq"] * s + truth["per_prefill"] * p + sum(
            truth[k] * c for k, c in zip(P.HOST_WORK_TERMS, counts))
        rows.append([s, p, gap, *counts])
    fitted = P.fit_host(rows)
    for k, v in truth.items():
        assert fitted[k] == pytest.approx(v, rel=1e-6, abs=1e-12), k
    v8 = P.fit_host([r[:8] for r in rows])        # rows of a fit-version-8 profile: the new terms fit as zero
    assert all(v8[k] == 0.0 for k in ("per_prev_prefill_token", "per_swap_block", "per_swap_step"))


def test_fit_host_tells_a_per_step_queue_cost_from_a_per_request_one():
    """Fit version 11: the engine's admission pass scans the queue only to the first request that
    does not fit, so a queue costs a constant per step (``per_wait_step``) whatever its length. Rows
    with queues of 0-400 and that cost recover it, with ``per_waiting`` 0; rows with a genuine
    per-request cost recover that instead. Fit version 10 had no step term: on the first rows the
    per-request term then prices a 300-long queue at many times the step constant."""
    def rows_with(step_s, per_request_s, seed=4):
        rng = np.random.default_rng(seed)
        rows = []
        for _ in range(600):
            s, p, a = int(rng.integers(1, 128)), int(rng.integers(0, 3)), int(rng.integers(0, 3))
            w = int(rng.integers(0, 400)) * int(rng.random() < 0.6)
            gap = 45e-6 + 3e-6 * s + 20e-6 * p + 50e-6 * a + step_s * (w > 0) + per_request_s * w
            rows.append([s, p, gap + rng.normal(0, 2e-6), a, 0, 0, w, 0, 0, 0, 0])
        return rows

    h = P.fit_host(rows_with(30e-6, 0.0))
    assert h["per_wait_step"] == pytest.approx(30e-6, rel=0.05) and h["per_waiting"] < 0.005e-6
    m = _truth(**h)
    empty, queued = (m.host_s(64, 0, 0, 0, 0, w, 0, 0, 0, 0) for w in (0, 300))
    assert queued - empty == pytest.approx(30e-6, rel=0.1)
    h = P.fit_host(rows_with(0.0, 0.4e-6))
    assert h["per_waiting"] == pytest.approx(0.4e-6, rel=0.05) and h["per_wait_step"] < 1e-6
    # excluded (fit version 10's model), the per-request term takes the step's cost, and prices a long queue high
    v10 = P.fit_host(rows_with(30e-6, 0.0), exclude=("per_wait_step",))
    assert v10["per_wait_step"] == 0.0 and v10["per_waiting"] > 0.05e-6
    with pytest.raises(ValueError, match="per_wait_stepp"):
        P.fit_host(rows_with(30e-6, 0.0), exclude=("per_wait_stepp",))
    # rows of a stored profile carry no step column: it is derived from n_wait
    A, _ = P.fit.host_design(rows_with(30e-6, 0.0)[:5])
    assert list(A[:, P.HOST_TERMS.index("per_wait_step")]) == [float(r[6] > 0) for r in rows_with(30e-6, 0.0)[:5]]


def test_a_profile_without_the_queue_step_term_prices_as_before():
    """A fit-version-10 model (the shipped profiles before fit version 11, archived since session 32) has no
    ``per_wait_step``: a queued step's host time is its per-request terms alone, as before."""
    prof = P.StepProfile.load(P.PACKAGED_DIR / "archive" / "h200_qwen3-0.6b_bfloat16_step_graphs_fit10.json")
    m = prof.model
    assert P.QUEUE_STEP_TERM not in m.host
    h = m.host
    expect = h["base"] + 64 * h["per_seq"] + 300 * h["per_waiting"]
    assert m.host_s(64, 0, 0, 0, 0, 300, 0, 0, 0, 0) == pytest.approx(expect, rel=1e-12)


FIT9_HOST_ROWS = Path(__file__).parent / "data" / "h200_qwen3-0.6b_fit9_host_rows.csv"


def _engine_run_rows(rng, n=400):
    """Host rows as a profile's engine runs record them when the pool never runs short: every
    waiting request is admitted the step it is seen, as a prefill (n_wait == n_admit == n_pre)."""
    rows = []
    for _ in range(n):
        s = int(rng.integers(1, 66))
        p = int(rng.random() < 0.2) * int(rng.integers(1, 4))
        f = int(rng.random() < 0.15) * int(rng.integers(1, 3))
        t, tp = p * int(rng.integers(32, 1024)), int(rng.integers(0, 2000)) * int(rng.random() < 0.2)
        gap = 35e-6 + 2.6e-6 * s + 160e-6 * p + 40e-6 * f + 0.07e-6 * t + 0.09e-6 * tp + rng.normal(0, 5e-6)
        rows.append([s, p, max(gap, 1e-6), p, 0, f, p, t, tp, 0, 0])
    return rows


def test_fit_host_gives_a_group_of_terms_that_move_together_to_its_first():
    """Counts that are equal on every fitted row (admissions, queue length and prefills of an
    unpressured engine run) cannot be told apart: their weight goes to the first term
    (per_prefill), the others are 0 and listed as unidentified, so a step under pressure (300
    waiting, none admitted) is not priced by a coefficient the data never separated."""
    rows = _engine_run_rows(np.random.default_rng(2))
    h = P.fit_host(rows)
    assert h["per_prefill"] == pytest.approx(160e-6, rel=0.05)
    assert h["per_admit"] == 0.0 and h["per_waiting"] == 0.0
    assert P.unidentified_host_terms(rows) == ["per_admit", "per_preempt", "per_waiting", "per_swap_block",
                                               "per_swap_step"]
    m = _truth(**h)
    queued = m.host_s(64, 0, 0, 0, 0, 300, 0, 0, 0, 0)
    assert queued == pytest.approx(h["base"] + 64 * h["per_seq"], rel=1e-12)
    # once the rows separate them, each term is fitted again
    rng = np.random.default_rng(3)
    for r in rows:
        r[6] += int(rng.integers(0, 40))
        r[2] += 0.5e-6 * r[6]
    assert P.fit_host(rows)["per_waiting"] == pytest.approx(0.5e-6, rel=0.2)
    assert "per_waiting" not in P.unidentified_host_terms(rows)


def test_refit_of_the_fit9_h200_engine_runs_prices_a_long_queue_sanely():
    """The host rows stored in the fit-version-9 Qwen3-0.6B H200 profile of session 9 (run 21;
    the four engine runs never queued a request past the step it arrived in): fitted as they were,
    per_waiting came out at 160-185 us, so a pressured step with 300 waiting cost ~50 ms of host
    time; now it costs what the same step with an empty queue costs (< 1 ms)."""
    with open(FIT9_HOST_ROWS) as f:
        rows = [[float(v) for v in r] for r in list(csv.reader(f))[1:]]
    h = P.fit_host(rows)
    assert h["per_waiting"] == 0.0
    assert 100e-6 < h["per_prefill"] < 300e-6      # the admission/prefill cost the runs do show
    m = _truth(**h)
    assert m.host_s(64, 0, 0, 0, 0, 300, 0, 0, 0, 0) < 1e-3


def test_the_profiles_pressure_runs_preempt_queue_and_identify_the_host_terms():
    """kvrl-profile's engine runs under pressure, served by the sim priced like the H200 (the
    shipped profile's grid, half its requests): their pool, half the unpressured run's peak use,
    makes each run preempt and leave requests waiting (the worst-case-demand sizing of run 21 was
    larger than that peak: nothing preempted), the last run's queue starts nearly all requests
    long, and the runs identify the queue (per step and per request), admission, preemption and
    swap-block terms of the host model."""
    from kvrl.apps.resim import sim_target
    from kvrl.profiling.host import host_run
    from kvrl.profiling.run import PRESSURE_RUNS, pressure_pool, run_work

    prof = P.StepProfile.load(SHIPPED)
    g = {**prof.meta["grid"], "host_requests": 96, "host_pressure_fraction": 0.5}   # the presets' value
    shape, device = sim_target(prof)
    ex = SimExecutor(shape, device, 0, profile=prof, cuda_graphs=True)
    first = host_run(ex, g, 67600, 1025, 16, 0)
    assert run_work(first.steps)["preemptions"] == 0
    tight = pressure_pool(first.peak_blocks, g, 16)
    worst_case_quarter = g["host_requests"] * (g["host_prompt"][1] + g["host_output"][1]) // 16 // 4
    assert first.peak_blocks < worst_case_quarter and tight == first.peak_blocks // 2
    steps = list(first.steps)
    for i, (label, sched, evict, burst) in enumerate(PRESSURE_RUNS):
        run = host_run(ex, g, tight, 1025, 16, 1 + i, evict, sched, burst)
        work = run_work(run.steps)
        assert work["preemptions"] > 0 and work["queued_steps"] > 0, (label, work)
        if burst:    # every request at once: the queue starts all but the first pool-full long
            assert work["max_waiting"] > 0.6 * g["host_requests"], (label, work)
        steps += run.steps
    rows = [(f["n_pre"] + f["n_dec"], f["n_pre"], max(el - inner, 0.0), *(f[k] for k in P.HOST_WORK))
            for f, inner, el in steps]
    missing = set(P.unidentified_host_terms(rows))
    assert not missing & {"per_admit", "per_preempt", "per_wait_step", "per_waiting", "per_swap_block"}, missing


@pytest.mark.parametrize("fraction, blocks", [(0.5, 3164), (0.25, 1582), (0.01, 160)])
def test_the_pressure_pool_is_the_configured_fraction_of_the_peak_and_fits_the_largest_request(fraction, blocks):
    """``grid.host_pressure_fraction`` sizes the pressured runs' pool (Llama-3-8B's peak of run 29:
    6,329 blocks), never below twice the largest request (1,024 + 256 tokens: 80 blocks of 16)."""
    from kvrl.profiling.batches import GRIDS
    from kvrl.profiling.run import pressure_pool

    assert pressure_pool(6329, {**GRIDS["gpu"], "host_pressure_fraction": fraction}, 16) == blocks


@pytest.mark.parametrize("fraction", [0.0, -0.5, 1.5])
def test_a_pressure_fraction_outside_0_1_is_refused_naming_the_key(fraction):
    from kvrl.profiling.batches import GRIDS
    from kvrl.profiling.run import pressure_pool

    with pytest.raises(ValueError, match="grid.host_pressure_fraction"):
        pressure_pool(6329, {**GRIDS["gpu"], "host_pressure_fraction": fraction}, 16)


def test_the_engine_runs_draw_uniform_lengths_as_before_or_lognormal_within_the_range():
    """``grid.host_lengths``: ``uniform`` draws exactly what the engine runs drew before the key
    existed (``rng.integers(lo, hi + 1)``); ``lognormal`` stays in [lo, hi], has its median near
    sqrt(lo * hi) and a mean above it (most requests short, a few long)."""
    from kvrl.profiling.host import engine_run_lengths

    a, b = np.random.default_rng(7), np.random.default_rng(7)
    uniform = engine_run_lengths("uniform", 32, 1024)
    assert [int(uniform.sample(1, a)[0]) for _ in range(200)] == [int(b.integers(32, 1025)) for _ in range(200)]
    rng = np.random.default_rng(0)
    draws = engine_run_lengths("lognormal", 16, 1024).sample(4000, rng)
    assert draws.min() >= 16 and draws.max() <= 1024
    assert abs(np.median(draws) / 128 - 1) < 0.1 and draws.mean() > 1.15 * np.median(draws)
    assert int(engine_run_lengths("lognormal", 64, 64).sample(1, rng)[0]) == 64


def test_kv_fill_zeroes_or_draws_seeded_unit_normal_values_in_place():
    """``grid.kv_fill``: ``zeros`` clears the pool, ``random`` fills it in place with N(0, 1)
    values drawn from the seed (the same seed, the same pool), and an unknown fill is refused."""
    import torch
    from types import SimpleNamespace

    from kvrl.profiling.timing import fill_kv

    pool = SimpleNamespace(kv=torch.full((2, 2, 64, 16, 2, 8), float("nan"), dtype=torch.bfloat16))
    data = pool.kv.data_ptr()
    fill_kv(pool, "random", seed=3)
    values = pool.kv.float()
    assert pool.kv.data_ptr() == data and torch.isfinite(values).all()
    assert abs(values.mean().item()) < 0.02 and abs(values.std().item() - 1) < 0.02
    again = SimpleNamespace(kv=torch.empty_like(pool.kv))
    fill_kv(again, "random", seed=3)
    assert torch.equal(again.kv, pool.kv)
    fill_kv(again, "random", seed=4)
    assert not torch.equal(again.kv, pool.kv)
    fill_kv(pool, "zeros")
    assert not pool.kv.any()
    with pytest.raises(ValueError, match="kv fill"):
        fill_kv(pool, "ones")


def test_fit_recovers_the_extra_cost_of_decodes_beside_a_prefill():
    """Steps generated by a known model whose decodes cost 20 us more each when a prefill runs in the
    same step: the fit (decode-only, prefill-only and mixed samples, as kvrl-profile's grid) recovers
    that coefficient and prices a mixed step as the truth does."""
    truth = _truth(mixed_dec=2e-5)
    samples = []
    add = lambda f: samples.append({**f, "graph": False, "group": "g", "t": truth.predict_features(f, False)})
    for L in (64, 512, 2048):
        for b in (1, 8, 64, 256, 1024):
            add(step_features([L] * b))
        for tokens in (256, 1024):      # mixed steps of the same padded size with more or fewer decodes
            for b in (8, 64, 192):
                add(step_features([L] * b, pre=[(tokens - b, 0)]))
                add(step_features([L] * b, pre=[(tokens - b, 1024)]))
    for n in (64, 256, 1024):
        add(step_features(pre=[(n, 0)]))
        add(step_features(pre=[(n, 0), (n, 512)]))
    fit = P.StepModel.fit(samples, [])
    assert fit.eager["coef"]["mixed_dec"] == pytest.approx(2e-5, rel=0.02)
    f = step_features([700] * 40, pre=[(200, 300)])
    assert fit.predict_features(f, False) == pytest.approx(truth.predict_features(f, False), rel=0.01)


def test_sim_prices_the_previous_steps_prefill_and_swaps_in_host_time(tmp_path):
    """A decode step costs ``per_prev_prefill_token`` x the previous step's prefill tokens more
    after a prefill step than after a decode step; a step that swaps ``per_swap_step`` +
    ``per_swap_block`` x blocks more (fit version 9)."""
    from kvrl.profiling.batches import BatchFactory

    model = _truth(per_prev_prefill_token=1e-7, per_swap_block=1e-6, per_swap_step=5e-5)
    prof = P.StepProfile(P.ProfileKey.of(TINY, CPU), model, {}, [], [], {}, RAW_KEY)
    factory = BatchFactory(4096, 16, TINY.vocab_size, TINY.max_model_len)

    def run(*batches):
        sim = SimExecutor(TINY, CPU, seed=0, profile=prof)
        sim.allocate_kv(4096, 64, 16)
        return [sim.execute(factory.batch(**kw)).elapsed_s for kw in batches]

    dec = {"decode_lens": [100, 300]}
    _, after_decode = run(dec, dec)
    _, after_prefill = run({"prefills": [(500, 0)]}, dec)
    assert after_prefill - after_decode == pytest.approx(500 * 1e-7, rel=1e-9)
    plain, = run(dec)
    swapping, = run({**dec, "swap_out": 7})
    assert swapping - plain == pytest.approx(5e-5 + 7e-6 + model.swap_out_xfer(7) * 0, abs=1e-12)


# ------------------------------------------------------------------------------ fitting from live steps
def _write_replay(path: Path, steps: list[dict]) -> None:
    """A replay.csv as kvrl-fidelity wrote it before fit version 9 (no pre_tok_prev / swap counters)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    cols = ["live_s", "kind", "live_execute_s", *P.FEATURES, "n_admit", "n_preempt", "n_finish", "n_wait", "graph"]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        w.writerows(steps)


def test_live_fit_recovers_host_and_mixed_terms_from_the_fit_workloads_only(tmp_path):
    """Live steps generated from a known truth (host gaps with previous-prefill and swap terms;
    mixed steps 30 us slower per decode than the profile) fit those terms back; a held-out
    workload's (wildly different) steps do not enter the fit; the profile records what fitted what."""
    from kvrl.fidelity.live_fit import LiveFitError, fit_live_terms

    base = _truth()
    host_truth = {"base": 60e-6, "per_seq": 2e-6, "per_prefill": 0.0, "per_admit": 70e-6, "per_preempt": 10e-6,
                  "per_finish": 35e-6, "per_waiting": 0.3e-6, "per_prefill_token": 0.1e-6,
                  "per_prev_prefill_token": 0.08e-6, "per_swap_block": 0.5e-6, "per_swap_step": 90e-6}
    live = _truth(mixed_dec=3e-5, **host_truth)
    rng = np.random.default_rng(0)

    def steps(scale: float, n: int = 600) -> list[dict]:
        out, prev = [], 0
        for _ in range(n):
            b = int(rng.integers(1, 64))
            pre = [(int(rng.integers(16, 1024)), int(rng.choice([0, 512])))] if rng.random() < 0.3 else []
            swaps = int(rng.integers(1, 40)) if rng.random() < 0.2 else 0
            f = step_features(list(rng.integers(32, 2048, b)), pre, swap_out=swaps)
            f.update(n_admit=int(rng.integers(0, 3)), n_preempt=int(rng.integers(0, 2)),
                     n_finish=int(rng.integers(0, 3)), n_wait=int(rng.integers(0, 100)))
            work = {**f, "pre_tok_prev": prev, "swap_blocks": swaps, "swap_step": int(swaps > 0)}
            inside = scale * live.predict_features(f, False)
            gap = scale * live.host_s(f["n_pre"] + f["n_dec"], f["n_pre"], *(work[k] for k in P.HOST_WORK))
            kind = "swap" if swaps else ("mixed" if pre else "decode")
            out.append({**f, "kind": kind, "live_execute_s": inside, "live_s": inside + gap, "graph": 0})
            prev = f["pre_tok"]
        return out

    run = tmp_path / "run"
    for pol in ("vllm", "sjf_swap"):
        _write_replay(run / "runs" / "fitme" / pol / "replay.csv", steps(1.0))
        _write_replay(run / "runs" / "heldout" / pol / "replay.csv", steps(3.0))   # would wreck any fit
    prof = P.StepProfile(P.ProfileKey.of(TINY, CPU), base, {}, [], [], {}, RAW_KEY, path="base.json")
    fitted = fit_live_terms(prof, run, ["fitme"])
    for k, v in host_truth.items():
        assert fitted.model.host[k] == pytest.approx(v, rel=1e-4, abs=1e-10), k
    assert fitted.model.eager["coef"]["mixed_dec"] == pytest.approx(3e-5, rel=1e-4)
    assert base.eager["coef"]["mixed_dec"] == 0.0 and base.host["base"] == 5e-5     # input unchanged
    rec = fitted.meta["live_fit"]
    assert rec["workloads"] == ["fitme"] and rec["pairs"] == ["fitme/sjf_swap", "fitme/vllm"]
    assert rec["host"]["after"] == fitted.model.host and rec["mixed_dec"]["before"] == 0.0
    saved = tmp_path / "fitted.json"
    fitted.save(saved)
    again = P.StepProfile.load(saved)
    assert again.model.to_dict()["fit_version"] == P.FIT_VERSION
    assert again.model.eager["coef"]["mixed_dec"] == pytest.approx(3e-5, rel=1e-5)
    with pytest.raises(LiveFitError, match="nowhere"):
        fit_live_terms(prof, run, ["fitme", "nowhere"])


def test_scattered_kv_points_are_measured_beside_their_twins_and_never_fitted():
    """kvrl-profile's diagnostic ``scatter`` points are decode batches of the same features as their
    ``scatter_ref`` twins, on blocks spread over the pool; the fit ignores them (a scattered step 10x
    slower changes nothing) and the report gives their time over the twin's."""
    from kvrl.profiling.batches import GRIDS, BatchFactory, grid_points
    from kvrl.profiling.run import scatter_ratios

    pts = grid_points(GRIDS["gpu"], True, 40960)
    scat = [kw for g, _, kw in pts if g == "scatter"]
    assert len(scat) == 4 and all(kw["scatter"] for kw in scat)
    assert len([1 for g, _, _ in pts if g == "mixed_long"]) == 24
    factory = BatchFactory(4096, 16, TINY.vocab_size, TINY.max_model_len)
    a, b = factory.batch(decode_lens=[300] * 4, scatter=True), factory.batch(decode_lens=[300] * 4)
    assert P.batch_features(a) == P.batch_features(b)
    tables_a = [x for it in a.seqs for x in it.seq.block_table]
    tables_b = [x for it in b.seqs for x in it.seq.block_table]
    assert tables_b == list(range(len(tables_b))) and len(set(tables_a)) == len(tables_a) != 0
    assert sum(1 for x, y in zip(tables_a, tables_a[1:]) if y != x + 1) > len(tables_a) // 2

    truth = _truth()
    samples = [{**step_features([L] * n), "graph": False, "group": "g"} for n in (1, 8, 64) for L in (64, 512, 2048)]
    samples += [{**step_features(pre=[(n, c)]), "graph": False, "group": "g"} for n in (64, 512) for c in (0, 512)]
    for s in samples:
        s["t"] = truth.predict_features(s, False)
    odd = {**step_features([512] * 8), "graph": False, "group": "scatter", "diagnostic": True}
    odd["t"] = 10 * truth.predict_features(odd, False)
    plain, with_odd = P.StepModel.fit(samples, []), P.StepModel.fit(samples + [odd], [])
    assert plain.to_dict() == with_odd.to_dict()
    ref = {**odd, "group": "scatter_ref", "t": odd["t"] / 10}
    assert scatter_ratios([odd, ref]) == {"points": [[8, 512, pytest.approx(10.0)]], "median_ratio": pytest.approx(10.0)}


def test_resim_reprices_recorded_steps_as_the_sim_priced_them_swap_stream_included(tmp_path):
    """kvrl-fidelity resim's replay of a replay.csv equals what the sim's executor returned for the
    same batches in order: host work of the previous step's prefill, swap waits included (before fit
    version 9 resim priced every step alone, without the swap stream)."""
    from kvrl.apps.resim import reprice
    from kvrl.profiling.batches import BatchFactory

    model = _truth(per_prev_prefill_token=1e-7, per_swap_step=5e-5)
    model.ops = {"copy": [0.0, 0.0], "swap_out": [1e-5, 1e-7], "swap_in": [1e-5, 1e-7],
                 "swap_out_xfer": [1e-4, 4e-5], "swap_in_xfer": [1e-4, 1e-4]}
    model.rebuild()
    prof = P.StepProfile(P.ProfileKey.of(TINY, CPU), model, {}, [], [], {}, RAW_KEY)
    factory = BatchFactory(4096, 16, TINY.vocab_size, TINY.max_model_len)
    kws = [{"prefills": [(300, 0)]}, {"decode_lens": [300, 40], "swap_in": 64}, {"decode_lens": [301, 41]},
           {"decode_lens": [302, 42], "swap_out": 128}, {"decode_lens": [303]}, {"decode_lens": [304]},
           {"decode_lens": [305], "prefills": [(64, 128)]}, {"decode_lens": [306]}]
    batches = [factory.batch(**kw) for kw in kws]
    sim = SimExecutor(TINY, CPU, seed=0, profile=prof)
    sim.allocate_kv(4096, 256, 16)
    rows = []
    for b, work in zip(batches, P.host_work_rows(batches)):
        rows.append({**P.batch_features(b), **work, "kind": "decode", "live_s": 0.01, "live_execute_s": 0.009,
                     "graph": 0, "sim": sim.execute(b).elapsed_s})
    path = tmp_path / "replay.csv"
    _write_replay(path, rows)
    got = [r["sim_s"] for r in reprice(path, model, True)]
    assert got == pytest.approx([r["sim"] for r in rows], rel=1e-12)
    alone = [model.predict_features(r, True, host=True) for r in rows]
    assert got[2] > alone[2] + 1e-4      # the step after the swap-in waited for its transfer


def test_cpu_sampler_turns_counters_into_per_step_window_shares(monkeypatch):
    """Samples every 2 steps (after steps 0, 2, 4); the steps of each window get its shares of
    run-queue wait (of wall time) and of stolen / busy CPU time (of all CPU time), and the larger of
    its two host probes over the run's fastest tenth; steps outside any window are NaN; without
    /proc the counters are NaN and the probe is still recorded."""
    import kvrl.executors.host_speed as HS
    import kvrl.fidelity.cpu as C

    seq = iter([(0.0, 0.0, 0.0, 0.0, 10.0), (0.5, 1.0, 2.0, 4.0, 11.0), (0.6, 1.0, 3.0, 8.0, 13.0)])
    probes = iter([1e-4, 1e-4, 2e-4, 1e-4, 1e-4, 1.7e-4])
    cur = {}

    def counters():
        wait, steal, busy, total, wall = next(seq)
        cur["wall"] = wall
        return wait, steal, busy, total

    monkeypatch.setattr(C, "cpu_counters", counters)
    monkeypatch.setattr(HS, "host_probe_s", lambda: next(probes))
    monkeypatch.setattr(C.time, "perf_counter", lambda: cur["wall"])
    s = C.CpuSampler(every=2)
    for i in range(6):
        s.on_step(i)
    cols = s.columns(6)
    assert all(np.isnan(cols[i]["cpu_wait"]) and np.isnan(cols[i]["host_slow"]) for i in (0, 5))
    assert cols[1] == cols[2] == {"cpu_wait": 0.5, "cpu_steal": 0.25, "cpu_busy": 0.5, "host_slow": 1.0}
    assert cols[3] == cols[4] == {"cpu_wait": pytest.approx(0.05), "cpu_steal": 0.0, "cpu_busy": 0.25,
                                  "host_slow": pytest.approx(2.0)}
    monkeypatch.setattr(C, "cpu_counters", lambda: None)
    none = C.CpuSampler(every=1)
    for i in range(3):
        none.on_step(i)
    cols = none.columns(3)
    assert all(np.isnan(r["cpu_busy"]) for r in cols)
    assert cols[1]["host_slow"] == pytest.approx(1.0) and cols[2]["host_slow"] == pytest.approx(1.7)
    with pytest.raises(ValueError, match="every=0"):
        C.CpuSampler(every=0)


def test_host_slow_share_is_the_live_time_of_steps_on_a_slow_host():
    """The replay's share of live seconds in steps whose window found the host 1.4x slower or more,
    among the steps that have the column; NaN when none has it."""
    from kvrl.fidelity.replay import host_slow_share

    rows = [{"live_s": 1.0, "host_slow": 1.0}, {"live_s": 2.0, "host_slow": 1.7}, {"live_s": 1.0, "host_slow": 1.39},
            {"live_s": 5.0}, {"live_s": 3.0, "host_slow": float("nan")}]
    assert host_slow_share(rows) == pytest.approx(0.5)
    assert np.isnan(host_slow_share([{"live_s": 1.0}]))


def test_fast_host_totals_leave_the_slow_windows_out():
    """The replay totals over the steps recorded on a fast host only (host_slow below 1.4), in all
    and per kind; empty when no step has the column."""
    from kvrl.fidelity.replay import fast_host_totals

    step = lambda kind, live, sim, slow: {"kind": kind, "live_s": live, "sim_s": sim, "live_execute_s": live,
                                          "sim_host_s": 0.0, "host_slow": slow}
    rows = [step("decode", 1.0, 0.9, 1.0), step("mixed", 2.0, 1.0, 1.8), step("mixed", 1.0, 1.1, 1.2),
            step("decode", 1.0, 1.0, float("nan"))]
    fast = fast_host_totals(rows)
    assert fast["all"] == {"steps": 2, "live_s": 2.0, "sim_s": pytest.approx(2.0)}
    assert fast["mixed"] == {"steps": 1, "live_s": 1.0, "sim_s": 1.1}
    assert fast["decode"]["sim_s"] == 0.9 and fast["host"]["steps"] == 2
    assert fast_host_totals([{k: v for k, v in r.items() if k != "host_slow"} for r in rows]) == {}

