"""Step-time profiles (kvrl/executors/profile.py), the sim's use of them, and the kvrl-profile and
kvrl-fidelity apps on CPU with the tiny model."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from kvrl import plugins
from kvrl.engine.config import EngineConfig
from kvrl.engine.engine import Engine
from kvrl.executors import profile as P
from kvrl.executors.hardware import DEVICES, MODEL_SHAPES, DeviceSpec, ModelShape
from kvrl.executors.host_speed import thread_sched_s
from kvrl.executors.sim import SimExecutor
from kvrl.workloads import build_workload
from tests.helpers import step_features

# the shape the live executor reports for conf/model/tiny.yaml on CPU (fp32)
TINY = ModelShape(name="tiny", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16,
                  intermediate_size=128, vocab_size=512, tie_word_embeddings=False, max_model_len=2048, dtype_bytes=4)
CPU = DeviceSpec(name="cpu", memory_bytes=16e9, hbm_bw=20e9, matmul_flops=2e11, pcie_bw=20e9)

# Held-out tolerance on CPU. The CI machine is shared (load averages of 4-8 on 2 cores were seen
# while writing this), so single steps of a few ms are often descheduled: the profile times the
# minimum of interleaved repetitions, and the bound is loose. On a GPU, kvrl-profile reports the
# same statistics (docs/fidelity.md).
HOLDOUT_MEDIAN_TOL = 0.5

SMALL_GRID = ["grid.decode_batch=[1,4,16]", "grid.decode_ctx=[16,128,512]", "grid.ragged_batch=[4,16]",
              "grid.ragged_ctx=[64]", "grid.prefill_tokens=[4,32,128,256]", "grid.prefill_seqs=[1,4]",
              "grid.prefix_query=[8,64]", "grid.prefix_cached=[256]", "grid.mixed_batch=[4,16]",
              "grid.mixed_ctx=[128]", "grid.mixed_prefill=[32,128]", "grid.copies=[1,16]", "grid.swaps=[1,16]",
              "grid.overlap_swap_in=[8]", "grid.holdout=16", "grid.host_requests=16"]


def _cli(module: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=300,
                          cwd=cwd)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


@pytest.fixture(scope="module")
def cpu_profile(tmp_path_factory) -> Path:
    """kvrl-profile of the tiny model on CPU over a small grid (the one real measurement here)."""
    root = tmp_path_factory.mktemp("profile")
    _cli("kvrl.apps.profile_app", "model=tiny", "backend.device=cpu", f"hydra.run.dir={root / 'run'}",
         f"install_dir={root / 'installed'}", "progress=false", *SMALL_GRID, cwd=root)
    return root / "run" / "profile.json"


@pytest.fixture(autouse=True)
def _fresh_profile_index(monkeypatch):
    monkeypatch.delenv(P.ENV_PATH, raising=False)
    P.clear_cache()
    yield
    P.clear_cache()


def _engine(executor, num_blocks=256, **policies):
    cfg = EngineConfig(num_blocks=num_blocks, block_size=16, num_cpu_blocks=64, max_model_len=2048,
                       max_num_batched_tokens=256)
    return Engine(cfg, executor, plugins.create("scheduler", policies.get("scheduler", "fcfs")),
                  plugins.create("watermark", "fixed"), plugins.create("eviction", "lifo", mode="auto"),
                  plugins.create("prefix_cache", "hash_lru"))


def _requests(n=40, seed=3):
    return build_workload({"name": "synthetic", "num_requests": n, "seed": seed, "arrival": {"rate": 50.0},
                           "prompt_len": {"dist": "uniform", "low": 8, "high": 300},
                           "output_len": {"dist": "uniform", "low": 4, "high": 120}},
                          vocab_size=512, max_model_len=2048)


# ------------------------------------------------------------------------------ the profile file
def test_profile_cli_writes_a_small_profile_keyed_by_device_and_shape(cpu_profile):
    data = json.loads(cpu_profile.read_text())
    assert data["format"] == P.FORMAT and data["version"] == P.VERSION
    key = data["key"]
    assert key["device"] == "cpu" and key["dtype"] == "float32"
    assert P.ProfileKey.from_dict(key) == P.ProfileKey.of(TINY, CPU)
    assert cpu_profile.stat().st_size < 300_000
    groups = {s["group"] for s in data["samples"]}
    assert {"decode", "ragged", "prefill", "prefix", "mixed", "mixed_long", "copy", "swap_out", "swap_in", "overlap",
            "holdout", "scatter", "scatter_ref", "shared", "shared_mixed"} <= groups
    # decodes over one prefix in common KV blocks, alone and beside a chunk: they price a shared token
    shared = [s for s in data["samples"] if s["group"].startswith("shared")]
    assert shared and all(0 < s["dec_shared"] < s["dec_kv"] and not s.get("diagnostic") for s in shared)
    assert any(s["n_pre"] for s in shared) and not all(s["n_pre"] for s in shared)
    # fit version 9: small chunks beside long decodes are fitted (mixed_dec); scattered-KV decodes only reported
    assert "mixed_dec" in data["model"]["eager"]["coef"]
    assert all(s.get("diagnostic") for s in data["samples"] if s["group"].startswith("scatter"))
    assert data["fit"]["scatter"]["points"] and data["fit"]["scatter"]["median_ratio"] > 0
    assert "scattered over the pool" in (cpu_profile.parent / "profile.md").read_text()
    # the host model against each engine run, one per policy kind (fcfs, pressured recompute / swap, oracle SJF)
    assert list(data["fit"]["host_by_run"]) == ["fcfs/lifo", "pressure fcfs/lifo recompute",
                                                "pressure fcfs/most_blocks swap", "pressure oracle sjf/most_blocks swap",
                                                "pressure fcfs/most_blocks swap, all at once"]
    assert all(st["n"] > 0 for st in data["fit"]["host_by_run"].values())
    assert "model vs each engine run" in (cpu_profile.parent / "profile.md").read_text()
    # terms the engine runs leave unidentified are listed (and fitted as 0)
    assert set(data["fit"]["host_unidentified"]) <= set(P.HOST_TERMS)
    assert all(data["model"]["host"][k] == 0.0 for k in data["fit"]["host_unidentified"])
    assert "host terms the engine runs do not identify" in (cpu_profile.parent / "profile.md").read_text()
    # the pressured runs' pool is half the unpressured run's peak use: they queue (this tiny grid's
    # runs are short: not every one preempts)
    pool, work = data["fit"]["host_pool"], data["fit"]["host_run_work"]
    assert pool["pressure_blocks"] < pool["peak_blocks"] and list(work) == list(data["fit"]["host_by_run"])
    pressured = [w for label, w in work.items() if label.startswith("pressure")]
    assert all(w["queued_steps"] > 0 for w in pressured) and sum(w["preemptions"] for w in pressured) > 0
    assert "steps with requests left waiting" in (cpu_profile.parent / "profile.md").read_text()
    assert all(s["t"] > 0 and s["reps"] >= 3 for s in data["samples"])
    # the host's speed while the engine runs were timed, for the sim's host_speed
    meta = data["meta"]
    probe = meta["host_probe"]
    assert probe["n"] > 0 and 0 < probe["p10_s"] <= probe["median_s"] <= probe["p90_s"] < 0.1 and meta["python"]
    if thread_sched_s() is not None:       # Linux with scheduler statistics: the engine thread's waits
        assert probe["cpu_s"] > 0 and probe["wait_s"] >= 0 and probe["contention"] >= 1
    assert "host speed while the engine runs were timed" in (cpu_profile.parent / "profile.md").read_text()
    assert data["meta"]["fit_stat"] == "min" and data["meta"]["cpu_threads"] == 1
    assert len(data["host_samples"]) > 10 and data["model"]["host"]["base"] > 0
    assert (cpu_profile.parent / "profile.md").read_text().startswith("# Step-time profile")
    installed = list((cpu_profile.parent.parent / "installed").glob("*.json"))
    assert [p.name for p in installed] == ["cpu_tiny_float32.json"]


def test_profile_grid_builds_decodes_over_a_shared_prefix_in_the_same_blocks():
    """The ``shared`` grid points: every decode's first blocks are one common set (a prefix-cache
    hit on a system prompt, whole blocks), its other blocks its own, and the batch's features count
    those tokens as shared; a decode no longer than the prefix shares nothing."""
    from kvrl.executors.profile.features import batch_features
    from kvrl.profiling.batches import GRIDS, BatchFactory, grid_points

    factory = BatchFactory(num_blocks=256, block_size=16, vocab_size=512, max_len=1024)
    batch = factory.batch(decode_lens=[200] * 4 + [40], shared_prefix=70, prefills=[(32, 0)])
    decodes = [item.seq for item in batch.seqs if item.num_tokens == 1]
    assert [s.block_table[:4] for s in decodes[:4]] == [[0, 1, 2, 3]] * 4
    own = [b for s in decodes for b in s.block_table[4:]] + batch.seqs[0].seq.block_table
    assert len(own) == len(set(own)) and not set(own) & {0, 1, 2, 3}
    assert [s.shared_prefix_tokens for s in decodes] == [64] * 4 + [0]
    f = batch_features(batch)
    assert f["dec_shared"] == 4 * 64 and f["dec_kv"] == 4 * 200 + 40 and f["n_pre"] == 1
    groups = [(g, graph) for g, graph, _ in grid_points(GRIDS["gpu"], graphs=True, max_len=4096)]
    assert groups.count(("shared", True)) == groups.count(("shared", False)) == groups.count(("shared_mixed", False)) == 6


def test_batch_factory_prefix_groups_set_how_many_decodes_read_each_shared_block():
    """``prefix_groups``: decode ``i`` reads prefix set ``i % prefix_groups``; the sets and every
    decode's own blocks are disjoint, and each decode's prefix tokens still count as shared."""
    from kvrl.executors.profile.features import batch_features
    from kvrl.profiling.batches import BatchFactory

    factory = BatchFactory(num_blocks=256, block_size=16, vocab_size=512, max_len=1024)
    batch = factory.batch(decode_lens=[100] * 6, shared_prefix=32, prefix_groups=3)
    tables = [item.seq.block_table for item in batch.seqs]
    assert [t[:2] for t in tables] == [[0, 1], [2, 3], [4, 5]] * 2
    own = [b for t in tables for b in t[2:]]
    assert len(own) == len(set(own)) and min(own) == 6
    f = batch_features(batch)
    assert f["dec_shared"] == 6 * 32 and f["dec_coread"] == 3 * 32      # the first reader of each set alone
    assert [item.seq.co_read_prefix_tokens for item in batch.seqs] == [0] * 3 + [32] * 3
    alone = factory.batch(decode_lens=[100] * 4, shared_prefix=32, prefix_groups=4)
    assert len({b for item in alone.seqs for b in item.seq.block_table}) == 4 * 7    # no block read twice


def test_fitted_model_predicts_held_out_cpu_steps(cpu_profile):
    prof = P.StepProfile.load(cpu_profile)
    prof.model.engine_factor = {"graph": 1.0, "eager": 1.0}   # held-out steps are timed like the grid
    prof.model.rebuild()
    held = [s for s in prof.samples if s.get("holdout")]
    grid = [s for s in prof.samples if not s.get("holdout")]
    assert len(held) == 16
    pred = np.asarray([prof.model.predict_features(s, bool(s["graph"])) for s in held])
    t = np.asarray([s["t"] for s in held])
    err = np.abs(pred - t) / t
    assert np.median(err) < HOLDOUT_MEDIAN_TOL, (np.median(err), err)
    # the model orders the held-out steps by cost, which no constant predictor can. Most held-out
    # steps of the tiny model lie within 2.5-5 ms of each other, where a burst of load on the shared
    # 2-core CI machine reorders them (a rank correlation over all pairs failed CI at 0.59), so the
    # check is on the pairs whose measured times differ by 2x or more: a constant predictor orders
    # none of them, a random one half; the model, measured under 8 busy processes on 2 cores, 76%.
    wide = [(i, j) for i in range(len(t)) for j in range(len(t)) if t[j] >= 2 * t[i]]
    ordered = sum(pred[j] > pred[i] for i, j in wide)
    assert len(wide) >= 10 and ordered >= 0.7 * len(wide), (ordered, len(wide), pred, t)
    assert len(grid) > len(held)
    assert prof.fit_report["holdout"]["n"] == 16
    assert abs(prof.fit_report["holdout"]["median_abs_rel_err"] - np.median(err)) < 1e-3


@pytest.mark.parametrize("token_sizes", [(), (16, 64, 256, 1024, 4096)])
def test_fit_recovers_a_known_step_model(token_sizes):
    """Samples generated by a known model on a grid like kvrl-profile's are fitted back exactly
    (no timing noise here): the fit is an exact least-squares problem when the truth is in its
    class (shared prefix tokens priced apart included); also when non-graph steps are padded to
    piecewise-graph token buckets."""
    sizes = [1, 2, 4, 8, 16, 32, 64]
    truth = P.StepModel(
        sizes,
        {"base": {"knots": [1, 4, 16, 64], "values": [1e-3, 1.2e-3, 1.5e-3, 3e-3]},
         "kv": {"knots": [1, 4, 16, 64], "values": [4e-8, 3e-8, 2e-8, 1.5e-8]},
         "kvmax": {"knots": [1, 4, 16, 64], "values": [0.0, 0.0, 0.0, 0.0]}, "shared": 6e-9},
        {"dense": {"knots": [1, 16, 64, 256, 1024], "values": [2e-3, 2.1e-3, 2.5e-3, 4e-3, 1e-2]},
         "kv": {"knots": [1, 4, 16, 64], "values": [5e-8, 4e-8, 3e-8, 2e-8]},
         "kvmax": {"knots": [1, 4, 16, 64], "values": [1e-9, 1e-9, 1e-9, 1e-9]},
         "coef": {"pre_pairs": 1e-10, "pre_ctx": 2e-8, "pre_max_ctx": 1e-7, "n_pre": 5e-5, "has_pre": 3e-4, "has_dec": 2e-4,
                  "rows": 1e-6, "n_dec": 1e-5, "dec_shared": 1e-8}},
        {"copy": [1e-4, 2e-6], "swap_out": [5e-5, 2e-6], "swap_in": [4e-5, 1e-6],
         "swap_out_xfer": [2e-4, 5e-5], "swap_in_xfer": [2e-4, 4e-5]},
        {"base": 1e-4, "per_seq": 2e-6, "per_prefill": 1e-5}, token_sizes=token_sizes)

    def sample(graph, dec=(), pre=(), copies=0, swap_out=0, swap_in=0, shared=0, **extra):
        f = step_features(dec, pre, copies, swap_out, swap_in, shared)
        f.update(graph=graph, t=truth.predict_features(f, cuda_graphs=graph), **extra)
        return f

    samples = []
    for graph in (True, False):
        for b in (1, 4, 16, 64):
            for L in (16, 256, 1024):
                samples.append(sample(graph, [L] * b))
                samples.append(sample(graph, list(np.linspace(L // 8, 2 * L - L // 8, b).astype(int)) if b > 1 else [L]))
                samples.append(sample(graph, [L] * b, shared=L // 2))
    for n in (16, 64, 256, 1024):
        for s in (1, 4):
            samples.append(sample(False, pre=[(n // s, 0)] * s))
    for q in (16, 256):
        for c in (512, 2048):
            samples.append(sample(False, pre=[(q, c)]))
    for b in (4, 16, 64):
        for n in (64, 256):
            samples.append(sample(False, [512] * b, pre=[(n, 0)]))
    for n in (1, 16, 128):
        samples += [sample(False, copies=n), sample(False, swap_out=n, t_xfer=truth.swap_out_xfer(n)),
                    sample(False, swap_in=n, t_xfer=truth.swap_in_xfer(n))]
    samples.append(sample(True, [256] * 16, swap_in=64))
    train_rng = np.random.default_rng(1)
    for _ in range(60 if token_sizes else 0):   # padding hides N within a bucket: fit varied steps, as kvrl-profile does
        pre = [(int(train_rng.integers(2, 300)), int(train_rng.choice([0, 512])))]
        b = int(train_rng.choice([0, 4, 16, 64]))   # the truth's knots in B, so it stays in the fit's class
        samples.append(sample(False, list(train_rng.integers(16, 1024, b)), pre))
    host = [(s, p, truth.host_s(s, p)) for s in range(1, 40) for p in (0, 1, 2)]
    fit = P.StepModel.fit(samples, sizes, host, token_sizes=token_sizes)
    assert P.StepModel.from_dict(fit.to_dict()).token_sizes == list(token_sizes)

    rng = np.random.default_rng(0)
    for _ in range(200):
        b = int(rng.integers(1, 65))
        dec = list(rng.integers(16, 1024, b))
        pre = [(int(rng.integers(2, 200)), int(rng.choice([0, 512])))] if rng.random() < 0.5 else []
        graph = not pre
        f = sample(graph, dec, pre, copies=int(rng.integers(0, 3)), swap_in=int(rng.integers(0, 2)) * 8,
                   shared=int(rng.choice([0, 0, 128, 512])))
        if graph and P.StepModel.pad(fit, b) != b:
            continue   # between captured sizes the truth's interpolation differs from a padded graph
        got = fit.predict_features(f, cuda_graphs=graph, host=True)
        want = truth.predict_features(f, cuda_graphs=graph, host=True)
        assert got == pytest.approx(want, rel=0.02), (f, got, want)
    for n in (1, 50, 500):
        assert fit.swap_out_xfer(n) == pytest.approx(truth.swap_out_xfer(n), rel=0.02)
        assert fit.swap_in_xfer(n) == pytest.approx(truth.swap_in_xfer(n), rel=0.02)


def test_fit_generalizes_on_a_gpu_like_step_law_outside_its_class():
    """Samples on kvrl-profile's GPU grid from a roofline-like law the model cannot represent
    exactly (max of CPU launch floor and GPU time, matmul tiles of 128 tokens, attention bandwidth
    ramping with batch, padded CUDA-graph batches, 2% noise): the fit predicts random engine-like
    steps within a few percent, and the total time of those steps within 3%."""
    from kvrl.profiling.batches import GRIDS, BatchFactory, grid_points, random_points

    m = MODEL_SHAPES["qwen3-0.6b"]
    sizes = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512)
    kv_tok, weights = m.kv_bytes_per_token, (m.layer_params + m.lm_head_params) * 2

    def law(f, graph):
        b, n = f["n_dec"], f["pre_tok"] + f["n_dec"]
        bw = 4e12 * min(1.0, 0.3 + 0.7 * min(b, 64) / 64) if b else 4e12
        if graph:
            bp = next(s for s in sizes if s >= b)
            gpu = max(weights / 4e12, 2 * (m.layer_params + m.lm_head_params) * bp / 600e12) + f["dec_kv"] * kv_tok / bw
            return 40e-6 + 3e-6 * b + f["dec_kv"] / 16 * 20e-9 + max(gpu, 0.9e-3)
        flops = (2 * m.layer_params * -(-n // 128) * 128 + 2 * m.lm_head_params * f["rows"]
                 + 4 * m.num_layers * m.num_heads * m.head_dim * f["pre_pairs"])
        gpu = max(weights / 4e12, flops / 600e12) + (f["dec_kv"] * kv_tok / bw if b else 0) + f["pre_ctx"] * kv_tok / 4e12
        return 200e-6 + 12e-6 * (b + f["n_pre"]) + (f["dec_kv"] + f["pre_ctx"]) / 16 * 30e-9 + max(gpu, 2.5e-3)

    factory = BatchFactory(70000, 16, 1000, m.max_model_len)
    rng = np.random.default_rng(0)

    def measure(points):
        out = []
        for _, graph, kw in points:
            if not (kw.get("decode_lens") or kw.get("prefills")) or kw.get("swap_in"):
                continue
            f = P.batch_features(factory.batch(**kw))
            graph = bool(graph and not f["n_pre"])
            out.append({**f, "graph": graph, "t": law(f, graph) * rng.lognormal(0, 0.02)})
        return out

    grid = measure(grid_points(GRIDS["gpu"], True, m.max_model_len)
                   + random_points(GRIDS["gpu"], GRIDS["gpu"]["random"], True, m.max_model_len, seed=0, group="random"))
    held = measure(random_points(GRIDS["gpu"], 200, True, m.max_model_len, seed=0))
    model = P.StepModel.fit(grid, sizes)
    stats = P.error_stats([model.predict_features(s, s["graph"]) for s in held], [s["t"] for s in held])
    assert stats["median_abs_rel_err"] < 0.04 and stats["p90_abs_rel_err"] < 0.10, stats
    assert abs(stats["total_rel_err"]) < 0.03, stats
    assert any(model.eager["floor"].values())        # the host-bound floor was found and kept


def test_nnls_is_non_negative_and_matches_scipy():
    rng = np.random.default_rng(1)
    for _ in range(20):
        A = rng.normal(size=(30, 8))
        b = rng.normal(size=30)
        x = P.nnls(A, b)
        assert (x >= 0).all()
        try:
            from scipy.optimize import nnls as scipy_nnls
        except ImportError:
            continue
        ref = scipy_nnls(A, b)[0]
        assert np.linalg.norm(A @ x - b) == pytest.approx(np.linalg.norm(A @ ref - b), rel=1e-6, abs=1e-9)


def test_profile_round_trip_and_refit_from_samples(cpu_profile, tmp_path):
    prof = P.StepProfile.load(cpu_profile)
    probe = [s for s in prof.samples if s["group"] in ("holdout", "mixed", "prefix")]
    before = [prof.model.predict_features(s, bool(s["graph"]), host=True) for s in probe]
    prof.save(tmp_path / "again.json")
    again = P.StepProfile.load(tmp_path / "again.json")
    assert [again.model.predict_features(s, bool(s["graph"]), host=True) for s in probe] == pytest.approx(before, rel=1e-5)
    data = json.loads(cpu_profile.read_text())
    data["model"]["fit_version"] = -1          # an old fit: loading refits from the stored samples
    refit = P.StepProfile.from_dict(data)
    assert [refit.model.predict_features(s, bool(s["graph"]), host=True) for s in probe] == pytest.approx(before, rel=1e-3)
    with pytest.raises(P.ProfileError, match="does not exist"):
        P.StepProfile.load(tmp_path / "missing.json")
    with pytest.raises(P.ProfileError, match="not a kvrl-step-profile"):
        P.StepProfile.from_dict({"format": "other"})


# ------------------------------------------------------------------------------ the sim
def test_sim_with_a_profile_is_deterministic_and_uses_it(cpu_profile):
    runs = []
    for _ in range(2):
        sim = SimExecutor(TINY, CPU, seed=0, profile=str(cpu_profile))
        assert sim.cost_source == f"profile:{cpu_profile}"
        eng = _engine(sim, num_blocks=48)
        metrics = eng.run(_requests())
        runs.append((metrics, list(eng.metrics.steps)))
    assert runs[0] == runs[1]
    assert runs[0][0]["finished"] == 40 and runs[0][0]["preemptions"] > 0
    roof = _engine(SimExecutor(TINY, CPU, seed=0, profile="none"), num_blocks=48)
    assert roof.run(_requests())["duration_s"] != runs[0][0]["duration_s"]
    # each step's duration is the profile's prediction for that step (engine time between steps included)
    prof = P.StepProfile.load(cpu_profile)
    assert all(row[2] > prof.model.host["base"] for row in runs[0][1])
    sim = SimExecutor(TINY, CPU, profile=str(cpu_profile))
    assert 0 < sim.estimate_prefill_s(16) < sim.estimate_prefill_s(256)
    assert 0 < sim.estimate_swap_s(1) < sim.estimate_swap_s(16)


def test_sim_prices_a_step_as_the_model_prices_its_batch_features(cpu_profile):
    """The sim's hot path counts a step's features inline; it must agree with batch_features (what
    kvrl-profile fits on and the fidelity replay prices), prefix-cache hits (dec_shared) included."""
    from kvrl.profiling.batches import BatchFactory

    prof = P.StepProfile.load(cpu_profile)
    factory = BatchFactory(4096, 16, TINY.vocab_size, TINY.max_model_len)
    sim = SimExecutor(TINY, CPU, seed=0, profile=str(cpu_profile))
    sim.allocate_kv(4096, 0, 16)
    prev_pre_tok = 0      # the sim prices the previous step's prefill tokens in this step's host time
    for kw in ({"decode_lens": [40, 300, 17]}, {"prefills": [(64, 0), (16, 200)]},
               {"decode_lens": [90, 500], "prefills": [(32, 64)], "copies": 2}):
        batch = factory.batch(**kw)
        batch.num_admitted, batch.num_preempted, batch.num_finished, batch.num_waiting = 2, 1, 3, 40
        for i, item in enumerate(batch.seqs):
            item.seq.shared_prefix_tokens = 48 * (i % 2)    # every other sequence had a prefix hit
        f = {**P.batch_features(batch), **P.host_work(batch, prev_pre_tok)}
        prev_pre_tok = f["pre_tok"]
        assert f["dec_shared"] == sum(min(48 * (i % 2), it.start + 1) for i, it in enumerate(batch.seqs)
                                      if it.num_tokens == 1)
        assert sim.execute(batch).elapsed_s == pytest.approx(prof.model.predict_features(f, host=True), rel=1e-12)


def test_profile_for_another_gpu_or_shape_is_not_used(cpu_profile, caplog, monkeypatch):
    roofline = SimExecutor(MODEL_SHAPES["qwen3-0.6b"], DEVICES["h200"], profile="none")
    caplog.set_level(logging.INFO, logger="kvrl.executors.sim")
    other_gpu = SimExecutor(TINY, DEVICES["h200"], profile=str(cpu_profile))
    assert other_gpu.cost_source == "roofline" and other_gpu.profile is None
    assert any(r.levelno == logging.WARNING and "device: h200 != cpu" in r.message for r in caplog.records)
    caplog.clear()
    wider = ModelShape(**{**TINY.__dict__, "hidden_size": 128})
    other_shape = SimExecutor(wider, CPU, profile=str(cpu_profile))
    assert other_shape.cost_source == "roofline"
    assert any("hidden_size: 128 != 64" in r.message for r in caplog.records)
    # the fallback is exactly the roofline
    qwen = SimExecutor(MODEL_SHAPES["qwen3-0.6b"], DEVICES["h200"], profile=str(cpu_profile))
    reqs = _requests(12)
    a, b = _engine(qwen).run(reqs), _engine(roofline).run(reqs)
    assert a == b

    # profile=auto finds profiles on $KVRL_PROFILE_PATH, only for their own device and shape
    monkeypatch.setenv(P.ENV_PATH, str(cpu_profile.parent))
    P.clear_cache()
    caplog.clear()
    assert SimExecutor(TINY, CPU).cost_source == f"profile:{cpu_profile}"   # a profile of the other mode, said
    assert any(r.levelno == logging.WARNING and "measured the live executor with step_graphs=False" in r.message
               for r in caplog.records)
    assert SimExecutor(TINY, DEVICES["h100"]).cost_source == "roofline"
    assert SimExecutor(MODEL_SHAPES["qwen3-0.6b"], CPU).cost_source == "roofline"
    assert any("no profile matches device=h100" in r.message for r in caplog.records)


def test_shipped_and_archived_profiles_load_by_name_and_keep_their_fit():
    """The shipped H200 profiles match their shapes under ``auto`` (by default the whole-step graph
    profile, as the live executor runs by default); an archived one loads by its path relative to
    the profiles directory (as the RL task files pin it), with its stored model (fit version 5)
    unchanged rather than refitted."""
    qwen, h200 = MODEL_SHAPES["qwen3-0.6b"], DEVICES["h200"]
    P.clear_cache()
    assert SimExecutor(qwen, h200).cost_source == \
        f"profile:{P.PACKAGED_DIR / 'h200_qwen3-0.6b_bfloat16_step_graphs.json'}"
    assert SimExecutor(qwen, h200, step_graphs=False).cost_source == \
        f"profile:{P.PACKAGED_DIR / 'h200_qwen3-0.6b_bfloat16.json'}"
    assert SimExecutor(MODEL_SHAPES["llama-3-8b"], h200).cost_source.startswith("profile:")
    name = "archive/h200_qwen3-0.6b_bfloat16_d5ff5ad.json"
    archived = SimExecutor(qwen, h200, profile=name)
    assert archived.cost_source == f"profile:{P.PACKAGED_DIR / name}"
    stored = json.loads((P.PACKAGED_DIR / name).read_text())["model"]
    assert stored["fit_version"] == 5 and archived.profile.model.eager == stored["eager"]
    assert archived.profile.model.token_sizes == []


def test_a_loaded_older_fit_saved_again_keeps_its_fit_version(tmp_path):
    """A profile of an older fit (the archived fit-10 one) saved again is still labelled with its own fit version,
    not relabelled as the current fit, and prices every step as it did; a fresh fit is the current version."""
    name = "archive/h200_qwen3-0.6b_bfloat16_step_graphs_fit10.json"
    old = P.StepProfile.load(P.PACKAGED_DIR / name)
    assert old.model.fit_version == 10 < P.FIT_VERSION
    old.save(tmp_path / "again.json")
    again = P.StepProfile.load(tmp_path / "again.json")
    assert json.loads((tmp_path / "again.json").read_text())["model"]["fit_version"] == 10
    assert again.model.fit_version == 10
    step = dict(n_pre=1, pre_tok=512, n_dec=64, dec_kv=64 * 900, dec_max=1500)
    assert again.model.predict_features(step) == old.model.predict_features(step)
    fresh = P.StepModel.fit([dict(step, graph=False, t=1e-3), dict(step, n_dec=8, dec_kv=8 * 900, graph=False, t=5e-4)])
    assert fresh.fit_version == fresh.to_dict()["fit_version"] == P.FIT_VERSION


def test_sim_swap_stream_overlaps_swap_outs_and_delays_the_step_after_a_swap_in():
    """Swap transfers run on a modelled side stream: a swap-out costs its step only the gather and
    the next step ends after the transfer; a swap-in delays the next step's forward pass until it
    has landed; old fit-version-4 profiles refit with their swap terms as transfer times."""
    from kvrl.profiling.batches import BatchFactory

    m, dev = MODEL_SHAPES["qwen3-0.6b"], DEVICES["h200"]
    sim = SimExecutor(m, dev, profile="none")
    sim.allocate_kv(4096, 1024, 16)
    f = BatchFactory(4096, 16, m.vocab_size, 8192, 0)
    xfer = 256 * sim.kv_block_bytes(16) / dev.pcie_bw
    decode = sim.execute(f.batch(decode_lens=[512] * 8)).elapsed_s
    out_only = sim.execute(f.batch(swap_out=256)).elapsed_s
    assert 0 < out_only < 0.1 * xfer                                  # the gather; the transfer starts at its end
    waited_out = sim.execute(f.batch(decode_lens=[512] * 8)).elapsed_s
    assert waited_out == pytest.approx(xfer, rel=1e-6)                # the next step ends after the transfer
    issued = sim.execute(f.batch(decode_lens=[512] * 8, swap_in=256)).elapsed_s
    assert issued == pytest.approx(decode)                             # a swap-in is issued, overlapped ...
    waited = sim.execute(f.batch(decode_lens=[512] * 8)).elapsed_s
    assert waited == pytest.approx(xfer, rel=1e-6)                     # ... and the next forward waits for it
    assert sim.execute(f.batch(decode_lens=[512] * 8)).elapsed_s == pytest.approx(decode)

    # a fit-version-4 profile is refitted from its samples on load; its swaps carry no transfer times
    def op_sample(op, n, t):
        return {**dict.fromkeys(P.FEATURES, 0), op: n, "graph": False, "t": t}
    samples = [{**dict.fromkeys(P.FEATURES, 0), "n_pre": 1, "pre_tok": k, "pre_pairs": k * (k + 1) // 2,
                "pre_ctx": k, "rows": 1, "graph": False, "t": 1e-3 + 1e-6 * k} for k in (16, 64, 256, 1024)]
    for n in (1, 16, 128):
        samples += [op_sample("swap_out", n, 1e-4 + 2e-5 * n), op_sample("swap_in", n, 1e-4 + 3e-5 * n)]
    old = P.StepModel.fit(samples)
    assert old.swap_out_xfer(10) == pytest.approx(3e-4) and old.swap_in_xfer(10) == pytest.approx(4e-4)
    assert old.predict(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, swap_out=10, swap_in=10) == 0.0


def test_engine_factor_is_the_median_ratio_of_engine_steps_to_the_model():
    """Steps inside an engine run that take 10% longer than the grid-fitted model (and one
    stall) give an eager factor of 1.1; a kind with too few steps keeps 1.0; the factor scales
    forward passes and survives a save/load round trip."""
    eager = {"dense": {"knots": [1.0], "values": [1e-3]}, "kv": {"knots": [1.0], "values": [0.0]},
             "kvmax": {"knots": [1.0], "values": [0.0]},
             "coef": dict.fromkeys(("pre_pairs", "pre_ctx", "pre_max_ctx", "n_pre", "has_pre", "has_dec", "rows",
                                    "n_dec"), 0.0)}
    ops = {k: [0.0, 0.0] for k in P.StepModel.OPS}
    model = P.StepModel([], None, eager, ops, {"base": 0.0, "per_seq": 0.0, "per_prefill": 0.0})
    f = dict.fromkeys(P.FEATURES, 0)
    f.update(n_pre=1, pre_tok=10, pre_pairs=55, pre_ctx=10, pre_max_ctx=10, rows=1)
    times = [1.1e-3 * (1 + 0.01 * (i % 3 - 1)) for i in range(30)] + [0.3]
    k = P.fit_engine_factor(model, [{**f, "t": t, "graph": False} for t in times] + [{**f, "t": 5e-3, "graph": True}])
    assert k["eager"] == pytest.approx(1.1) and k["graph"] == 1.0
    model.engine_factor = k
    model.rebuild()
    assert model.forward_s(1, 10, 55, 10, 10, 0, 0, 0, 0, 1, cuda_graphs=False) == pytest.approx(1.1e-3)
    again = P.StepModel.from_dict(json.loads(json.dumps(model.to_dict())))
    assert again.forward_s(1, 10, 55, 10, 10, 0, 0, 0, 0, 1, cuda_graphs=False) == pytest.approx(1.1e-3)


def test_profiled_cost_model_is_a_few_microseconds(cpu_profile):
    model = P.StepProfile.load(cpu_profile).model
    cases = [(0, 0, 0, 0, 0, 64, 6400, 120, 0, 64, 0, 0, 0), (1, 200, 30000, 400, 400, 30, 3000, 300, 1000, 31, 2, 0, 4)]
    for args in cases:
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(5000):
                model.predict(*args)
            best = min(best, (time.perf_counter() - t0) / 5000)
        assert best < 25e-6, best     # ~1-2 us on an idle machine; loose for a loaded CI runner


# ------------------------------------------------------------------------------ kvrl-fidelity
def test_fidelity_cli_runs_end_to_end_on_the_tiny_model(cpu_profile, tmp_path):
    out = tmp_path / "fid"
    wl = ("{doc:tiny,engine:{num_blocks:32},workload:{name:synthetic,num_requests:8,seed:5,arrival:{rate:40.0},"
          "prompt_len:{dist:uniform,low:8,high:160},output_len:{dist:uniform,low:4,high:32}}}")
    proc = _cli("kvrl.apps.fidelity", "model=tiny", "live.device=cpu", f"hydra.run.dir={out}",
                f"profile={cpu_profile}", f"+workloads.tiny={wl}", "only_workloads=[tiny]", "warmup_requests=3",
                "engine.max_num_batched_tokens=256", cwd=tmp_path)
    table = (out / "fidelity.md").read_text()
    assert "## Per-metric error" in table and "## Policy ranking" in table and "## Replay" in table
    assert f"profile:{cpu_profile}" in table
    rows = list(__import__("csv").reader((out / "fidelity.csv").open()))
    metrics = {r[2] for r in rows[1:] if r[1] != "ranking"}
    assert {"throughput_tok_s", "goodput_tok_s", "ttft_p50_s", "ttft_mean_s", "ttft_p99_s", "tpot_p50_s",
            "tpot_mean_s", "tpot_p99_s", "preemptions", "kv_utilization"} <= metrics
    assert "Target TTFT p50 s: under 10%" in table and "### Replay by step kind" in table
    assert "## Live vs live" in table and "throughput_tok_s_live_again" in metrics
    assert "live GC pauses" in table
    assert "## Sim vs the mean of the live runs (3 per pair)" in table and "against the live mean" in table
    assert {r[1] for r in rows[1:] if r[1] != "ranking"} == {"vllm", "sjf_swap"}
    assert any(r[1] == "ranking" for r in rows[1:])
    for pol in ("vllm", "sjf_swap"):
        for side in ("live", "sim"):
            m = json.loads((out / "runs" / "tiny" / pol / side / "metrics.json").read_text())
            assert m["finished"] == 8
            assert (out / "runs" / "tiny" / pol / side / "steps.csv").stat().st_size > 0
        header = (out / "runs" / "tiny" / pol / "replay.csv").read_text().splitlines()[0].split(",")
        assert {"pre_tok_prev", "swap_blocks", "swap_step", "cpu_wait", "cpu_steal", "cpu_busy"} <= set(header)
        assert (out / f"steps_tiny_{pol}.png").stat().st_size > 0
    assert "Per-metric error" in proc.stdout
    # every pair records the live host's speed beside the profile's; the default sim leaves the
    # profile's host terms as they are
    first = json.loads((out / "fidelity.json").read_text())
    for r in first.values():
        assert r["live_host_probe"]["median_s"] > 0 and np.isfinite(r["host_probe_ratio"]) and r["host_speed"] == 1.0
    assert "sim host speed (live / profile host probe)" in table and "| x1.00 (" in table
    # every pair after the first is also served at the host speed the pairs before it measured (a
    # prediction): the first has no earlier replay to calibrate on
    (p0, r0), (p1, r1) = first.items()
    assert "sim_cal" not in r0 and "calibration_scale" not in r0
    assert r1["calibration_scale"] == pytest.approx(1 / (1 + r0["replay"]["total_rel_err"]), rel=1e-12)
    assert r1["sim_cal"]["finished"] == 8 and (r1["sim_cal"] != r1["sim"]) == (r1["calibration_scale"] != 1.0)
    # and each pair at its own replay's host speed, after the fact
    for r in (r0, r1):
        assert r["host_speed_scale"] == pytest.approx(1 / (1 + r["replay"]["total_rel_err"]), rel=1e-12)
        assert r["sim_host"]["finished"] == 8
    assert r1["sim_host"] == r1["sim_cal"] or r1["host_speed_scale"] != r1["calibration_scale"]
    section = table.split("## The sim calibrated on earlier pairs: a prediction")[1]
    assert "- every target at once: " in section and " of 1 at its own host speed." in section

    # the sim side again, offline, against this run's live results: the same sim metrics (the sim
    # is deterministic and gets the same requests, engine configuration and profile), live kept
    again = tmp_path / "resim"
    _cli("kvrl.apps.fidelity", f"resim={out}", f"profile={cpu_profile}", f"hydra.run.dir={again}", "plots=false",
         cwd=tmp_path)
    first, second = (json.loads((d / "fidelity.json").read_text()) for d in (out, again))
    assert second.keys() == first.keys()
    for pair, r in first.items():
        assert second[pair]["sim"] == r["sim"] and second[pair]["live"] == r["live"]
        assert second[pair]["live_repeats"] == r["live_repeats"]
        assert second[pair]["replay"]["steps"] == r["replay"]["steps"]
    table = (again / "fidelity.md").read_text()
    assert "re-simulated offline" in table and "## Sim vs the mean of the live runs" in table
    # resim calibrates the same way on its own re-priced replays, and its calibrated sim is exactly
    # the sim at that step-time scale
    scale = second[p1]["calibration_scale"]
    assert "sim_cal" not in second[p0] and scale == pytest.approx(1 / (1 + second[p0]["replay"]["total_rel_err"]))
    _cli("kvrl.apps.fidelity", f"resim={out}", f"profile={cpu_profile}", f"sim_step_scale={scale!r}",
         "only_workloads=[tiny]", f"only_policies=[{p1.split('/')[1]}]", f"hydra.run.dir={tmp_path / 'scaled'}",
         "plots=false", cwd=tmp_path)    # only_*: the names of the run re-simulated (tiny is not in conf/)
    scaled = json.loads((tmp_path / "scaled" / "fidelity.json").read_text())
    assert scaled[p1]["sim"] == second[p1]["sim_cal"] and "sim_cal" not in scaled[p1]
    assert scaled[p1]["sim_host"] == second[p1]["sim_host"]     # its own replay, whatever sim_step_scale
    _cli("kvrl.apps.fidelity", f"resim={out}", f"profile={cpu_profile}", "refit=true", "only_policies=[vllm]",
         f"hydra.run.dir={tmp_path / 'refit'}", "plots=false", cwd=tmp_path)
    assert "(refitted)" in (tmp_path / "refit" / "fidelity.md").read_text()
    # host_speed=probe: the live run's recorded probe over the profile's scales the host terms of
    # the sim and of the replay (host_speed=2: by two)
    for setting, d in (("probe", "probe"), ("2", "double")):
        _cli("kvrl.apps.fidelity", f"resim={out}", f"profile={cpu_profile}", f"host_speed={setting}",
             f"hydra.run.dir={tmp_path / d}", "plots=false", cwd=tmp_path)
    probe, double = (json.loads((tmp_path / d / "fidelity.json").read_text()) for d in ("probe", "double"))
    for pair, r in first.items():
        ratio = r["host_probe_ratio"]
        assert probe[pair]["host_speed"] == (pytest.approx(ratio) if 0.25 <= ratio <= 4 else 1.0)
        host = lambda res: res["replay"]["by_kind"]["host"]["sim_s"]
        assert host(double[pair]) == pytest.approx(2 * host(second[pair]), rel=1e-9)
        assert host(probe[pair]) == pytest.approx(probe[pair]["host_speed"] * host(second[pair]), rel=1e-9)
        # the sim serves with the scaled host terms too, so its run changes; not necessarily towards a lower
        # throughput: a slower host lets more requests queue per step (on CI's measured tiny profile a
        # doubled host once finished the job 0.002% sooner)
        assert host(second[pair]) > 0 and double[pair]["sim"] != second[pair]["sim"]
    # sim_step_scale=2 (a sensitivity check): every sim step's compute takes twice as long, so the
    # sim's run changes; the replay still prices the live steps as profiled
    _cli("kvrl.apps.fidelity", f"resim={out}", f"profile={cpu_profile}", "sim_step_scale=2",
         f"hydra.run.dir={tmp_path / 'slow'}", "plots=false", cwd=tmp_path)
    slow = json.loads((tmp_path / "slow" / "fidelity.json").read_text())
    for pair, r in second.items():
        # the sim's run changes; its duration need not grow 1.5x where arrivals, not steps, set the pace
        # (CI's measured tiny profile once gave 0.221 s against 0.152 s)
        assert slow[pair]["sim"] != r["sim"] and slow[pair]["sim"]["duration_s"] != r["sim"]["duration_s"]
        assert slow[pair]["replay"]["by_kind"] == r["replay"]["by_kind"]
    assert "sim step scale: 2" in (tmp_path / "slow" / "fidelity.md").read_text()
    # sim_ensemble=3: every prediction (as priced, at host speed, calibrated) is the mean of 3 runs whose step
    # times jitter; the deterministic run is kept beside it
    _cli("kvrl.apps.fidelity", f"resim={out}", f"profile={cpu_profile}", "sim_ensemble=3", "sim_step_noise=0.2",
         f"hydra.run.dir={tmp_path / 'ensemble'}", "plots=false", cwd=tmp_path)
    ens = json.loads((tmp_path / "ensemble" / "fidelity.json").read_text())
    for pair, r in second.items():
        e = ens[pair]
        assert e["sim_deterministic"] == r["sim"] and len(e["sim_runs"]) == 3 and len(e["sim_host_runs"]) == 3
        assert len({run["duration_s"] for run in e["sim_runs"]}) == 3          # each run its own jitter
        assert e["sim"]["duration_s"] == pytest.approx(np.mean([run["duration_s"] for run in e["sim_runs"]]))
    assert len(ens[p1]["sim_cal_runs"]) == 3 and "sim_cal_runs" not in ens[p0]
    report = (tmp_path / "ensemble" / "fidelity.md").read_text()
    assert "the mean of 3 runs whose step times jitter" in report
    assert "## The sim's own spread (3 jittered runs per prediction)" in report and "pairs have a sim ensemble" in report
    bad = subprocess.run([sys.executable, "-m", "kvrl.apps.fidelity", f"resim={tmp_path / 'nowhere'}",
                          f"profile={cpu_profile}", f"hydra.run.dir={tmp_path / 'bad'}"], capture_output=True,
                         text=True, cwd=tmp_path)
    assert bad.returncode != 0 and "need the output directory of a kvrl-fidelity run" in bad.stderr
    bad = subprocess.run([sys.executable, "-m", "kvrl.apps.fidelity", f"resim={out}", "only_workloads=[tiny,tinny]",
                          f"profile={cpu_profile}", f"hydra.run.dir={tmp_path / 'bad'}"], capture_output=True,
                         text=True, cwd=tmp_path)
    assert bad.returncode != 0 and "unknown name(s) ['tinny'] in the run re-simulated" in bad.stderr


def test_fidelity_profile_select_prices_with_the_profile_closest_on_the_first_live_run(cpu_profile, tmp_path):
    """profile=select, kvrl-fidelity's default: of the matching profiles (here on $KVRL_PROFILE_PATH: the
    measured one and a newer copy whose forward passes cost ten times as much, which auto would pick; ten, not
    three, so that a live run slowed by a loaded CI machine still lies nearer the measured one),
    the one whose prices of
    the first pair's first live run sum closest to its live time prices every pair; fidelity.json and the
    report say which, on which pair, and every candidate's total replay error. resim asks for one profile."""
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    d = json.loads(cpu_profile.read_text())
    (profiles / "measured.json").write_text(json.dumps(d))
    d["meta"]["created"] += 1000.0
    d["model"]["engine_factor"] = {k: 10.0 * v for k, v in d["model"]["engine_factor"].items()}
    (profiles / "slow_newer.json").write_text(json.dumps(d))
    out = tmp_path / "fid"
    wl = ("{doc:tiny,engine:{num_blocks:32},workload:{name:synthetic,num_requests:8,seed:5,arrival:{rate:40.0},"
          "prompt_len:{dist:uniform,low:8,high:160},output_len:{dist:uniform,low:4,high:32}}}")
    env = {**os.environ, P.ENV_PATH: str(profiles)}
    proc = subprocess.run([sys.executable, "-m", "kvrl.apps.fidelity", "model=tiny", "live.device=cpu",
                           f"hydra.run.dir={out}", f"+workloads.tiny={wl}", "only_workloads=[tiny]",
                           "warmup_requests=3", "live_repeats=1", "plots=false", "engine.max_num_batched_tokens=256"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads((out / "fidelity.json").read_text())
    assert set(results) == {"tiny/vllm", "tiny/sjf_swap"}
    for r in results.values():
        sel = r["profile_select"]
        assert sel["profile"] == str(profiles / "measured.json") and sel["chosen_on"] == "tiny/vllm"
        errors = sel["replay_errors"]
        assert set(errors) == {str(profiles / "measured.json"), str(profiles / "slow_newer.json")}
        assert abs(errors[str(profiles / "measured.json")]) < abs(errors[str(profiles / "slow_newer.json")])
    table = (out / "fidelity.md").read_text()
    assert f"profile=select: {profiles / 'measured.json'}" in table and "tiny/vllm's first live run" in table
    # resim re-prices with one given profile: the default (select) and auto name what to add
    for extra in ([], ["profile=auto"]):
        bad = subprocess.run([sys.executable, "-m", "kvrl.apps.fidelity", f"resim={out}", *extra,
                              f"hydra.run.dir={tmp_path / 'bad'}"], capture_output=True, text=True, cwd=tmp_path,
                             env=env)
        assert bad.returncode != 0 and "add profile=<profile.json>" in bad.stderr, bad.stderr[-2000:]


# ------------------------------------------------------------------------------ pressure-aware terms
def test_fit_host_recovers_the_host_work_terms_and_old_rows_still_fit():
    """Host gaps that grow with admissions, preemptions, finishes and queue length are fitted
    term by term (fit version 8); rows of older profiles (three columns) fit those terms as zero."""
    rng = np.random.default_rng(0)
    truth = {"base": 40e-6, "per_seq": 2e-6, "per_prefill": 5e-6, "per_admit": 30e-6, "per_preempt": 80e-6,
             "per_finish": 10e-6, "per_waiting": 0.5e-6, "per_prefill_token": 0.05e-6}
    rows = []
    for _ in range(400):
        s, p, a, e, f, w, t = (int(rng.integers(0, hi)) for hi in (256, 8, 6, 4, 10, 300, 4000))
        gap = (truth["base"] + truth["per_seq"] * s + truth["per_prefill"] * p + truth["per_admit"] * a
               + truth["per_preempt"] * e + truth["per_finish"] * f + truth["per_waiting"] * w
               + truth["per_prefill_token"] * t)
        rows.append([s, p, gap, a, e, f, w, t])
    fitted = P.fit_host(rows)
    for k, v in truth.items():
        assert fitted[k] == pytest.approx(v, rel=1e-6, abs=1e-12), k
    old = P.fit_host([r[:3] for r in rows])
    assert all(old[k] == 0.0 for k in P.HOST_WORK_TERMS)


def test_sim_prices_host_work_only_with_a_profile_that_has_it(cpu_profile):
    """The same batch costs more host time when the engine admitted and preempted around it, by
    exactly the profile's host-work terms (fit version 11: with the queue's per-step term); a
    fit-version-7 host model (no such terms) prices it as before."""
    from kvrl.profiling.batches import BatchFactory

    prof = P.StepProfile.load(cpu_profile)
    prof.model.host = {**prof.model.host, "per_admit": 1e-4, "per_preempt": 2e-4, "per_finish": 0.0,
                       "per_waiting": 1e-6, "per_prefill_token": 0.0, "per_wait_step": 3e-5}
    prof.model.rebuild()
    sim = SimExecutor(TINY, CPU, seed=0, profile=prof)
    sim.allocate_kv(4096, 0, 16)
    factory = BatchFactory(4096, 16, TINY.vocab_size, TINY.max_model_len)
    quiet = sim.execute(factory.batch(decode_lens=[40, 300])).elapsed_s
    busy_batch = factory.batch(decode_lens=[40, 300])
    busy_batch.num_admitted, busy_batch.num_preempted, busy_batch.num_waiting = 3, 2, 50
    busy = sim.execute(busy_batch).elapsed_s
    assert busy - quiet == pytest.approx(3e-4 + 4e-4 + 50e-6 + 3e-5, rel=1e-9)
    for k in (*P.HOST_WORK_TERMS, P.QUEUE_STEP_TERM):
        prof.model.host.pop(k)
    prof.model.rebuild()
    assert sim.execute(busy_batch).elapsed_s == pytest.approx(quiet, rel=1e-12)


def test_engine_reports_host_work_and_shared_prefix_tokens_per_step():
    """Every batch carries what the engine did while scheduling it (admissions, preemptions,
    finishes of the previous step, queue length), and a sequence's prefix-cache tokens are
    counted as shared only while it holds the cached blocks: a swap-in gets private copies."""
    from tests.helpers import make_engine, make_request

    eng = make_engine(num_blocks=24, block_size=4, num_cpu_blocks=64, eviction_params={"mode": "swap"})
    system = list(range(1, 17))                           # 4 full blocks shared by every request
    reqs = [make_request(f"r{i}", tokens=system + [100 + i] * 3, output_len=30, arrival_s=0.0) for i in range(6)]
    for r in reqs:
        eng.add_request(r)
    admitted = preempted = 0
    finished_before = 0                                  # sequences finished when the last batch was planned
    seen_shared = seen_swapped_private = False
    while eng.has_unfinished:
        waiting, finished_now = len(eng.waiting) + len(eng.preempted), len(eng.metrics.finished_output_lens)
        batch = eng.step()
        assert batch.num_waiting == waiting and batch.num_finished == finished_now - finished_before
        finished_before = finished_now
        admitted += batch.num_admitted
        preempted += batch.num_preempted
        seen_shared |= any(item.seq.shared_prefix_tokens > 0 for item in batch.seqs)
        for seq in eng.swapped:
            assert seq.shared_prefix_tokens == 0
            seen_swapped_private = True
    assert seen_shared and seen_swapped_private
    assert preempted == eng.metrics.preemptions > 0
    assert admitted == len(reqs) + eng.metrics.preemptions     # every preempted sequence came back once


# ------------------------------------------------------------------------------ fingerprints
def test_fingerprint_ignores_docstrings_and_comments_but_not_code():
    from kvrl.executors.fingerprint import source_digest

    base = "def f(x):\n    return x + 1\n"
    assert source_digest(base) == source_digest('"""doc"""\n# note\ndef f(x):\n    """d"""\n    return x + 1  # c\n')
    assert source_digest(base) != source_digest("def f(x):\n    return x + 2\n")


def test_staleness_flags_a_changed_fingerprint_unless_the_profile_says_why():
    """A deliberately changed code hash makes the check fail (the CI test below then fails);
    recording the tree's hash with a reason in the profile accepts it; no fingerprint at all is stale."""
    from kvrl.executors.fingerprint import code_fingerprint, staleness

    tree = code_fingerprint()
    assert staleness({"fingerprint": {"code": tree}}) is None
    changed = {"fingerprint": {"code": "0" * 16}}
    assert "re-profile" in staleness(changed)
    assert staleness({**changed, "fingerprint_accepted": [{"code": tree, "why": "comment-only kernel edit"}]}) is None
    assert staleness({**changed, "fingerprint_accepted": [{"code": tree, "why": ""}]}) is not None
    assert "no code fingerprint" in staleness({})


def test_sim_warns_once_when_its_profile_is_stale(cpu_profile, caplog):
    import kvrl.executors.sim as sim_mod

    prof = P.StepProfile.load(cpu_profile)
    assert prof.meta["fingerprint"]["code"]               # kvrl-profile records it
    prof.meta["fingerprint"] = {**prof.meta["fingerprint"], "code": "f" * 16}
    prof.path = f"{cpu_profile}-stale"
    caplog.set_level(logging.WARNING, logger="kvrl.executors.sim")
    sim_mod._WARNED_STALE.discard(prof.path)
    first = SimExecutor(TINY, CPU, profile=prof)
    SimExecutor(TINY, CPU, profile=prof)
    assert first.profile_staleness and "re-profile" in first.profile_staleness
    assert sum("re-profile" in r.message for r in caplog.records) == 1
