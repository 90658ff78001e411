"""The sim's per-step jitter (``SimExecutor(step_noise=...)``), the profile's measured step-time scatter
(``StepProfile.step_noise``) and kvrl-fidelity's sim ensembles (``sim_ensemble``)."""
from __future__ import annotations

import math
import statistics

import pytest

from kvrl.executors import profile as P
from kvrl.executors.hardware import DeviceSpec, ModelShape
from kvrl.executors.sim import SimExecutor
from kvrl.fidelity.compare import mean_summary
from kvrl.fidelity.pairs import serve_sims, step_noise
from kvrl.workloads import build_workload

TINY = ModelShape(name="tiny", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16,
                  intermediate_size=128, vocab_size=512, max_model_len=1024)
CPU = DeviceSpec(name="cpu", memory_bytes=16e9, hbm_bw=20e9, matmul_flops=2e11, pcie_bw=20e9)


def _served(sim: SimExecutor) -> tuple[float, list[float]]:
    """A small pressured workload on ``sim`` (roofline): the run's duration and its step times."""
    from kvrl.builder import build_engine

    reqs = build_workload({"name": "synthetic", "num_requests": 40, "seed": 3, "arrival": {"rate": 400.0},
                           "prompt_len": {"dist": "uniform", "low": 16, "high": 200},
                           "output_len": {"dist": "uniform", "low": 8, "high": 120}},
                          vocab_size=TINY.vocab_size, max_model_len=TINY.max_model_len)
    eng = build_engine({"engine": {"num_blocks": 64, "block_size": 16, "max_num_batched_tokens": 256},
                        "scheduler": {"name": "fcfs"}, "watermark": {"name": "fixed", "fraction": 0.01},
                        "eviction": {"name": "lifo"}, "prefix_cache": {"name": "none"}}, executor=sim)
    eng.run(reqs)
    return eng.metrics.summary()["duration_s"], [row[2] for row in eng.metrics.steps]


def test_without_jitter_the_sim_is_deterministic_and_jitter_is_seeded():
    plain = [_served(SimExecutor(TINY, CPU, profile="none")) for _ in range(2)]
    assert plain[0] == plain[1]
    assert _served(SimExecutor(TINY, CPU, profile="none", step_noise=0.0, noise_seed=7)) == plain[0]
    a, b, c = (_served(SimExecutor(TINY, CPU, profile="none", step_noise=0.1, noise_seed=s)) for s in (1, 1, 2))
    assert a == b and a != c and a != plain[0]


def test_jitter_is_a_mean_one_lognormal_factor_per_step():
    sim = SimExecutor(TINY, CPU, profile="none", step_noise=0.2, noise_seed=0, step_time_scale=2.0)
    draws = [sim._step_scale() / 2.0 for _ in range(20000)]
    logs = [math.log(d) for d in draws]
    assert statistics.fmean(draws) == pytest.approx(1.0, abs=0.01)        # mean one: the model's speed kept
    assert statistics.stdev(logs) == pytest.approx(0.2, rel=0.03)
    assert statistics.fmean(logs) == pytest.approx(-0.02, abs=0.005)       # -s^2 / 2
    with pytest.raises(ValueError, match="step_noise=-0.1"):
        SimExecutor(TINY, CPU, profile="none", step_noise=-0.1)
    with pytest.raises(ValueError, match=r"in \[0, 1\)"):
        SimExecutor(TINY, CPU, profile="none", step_noise=1.5)


def test_a_profiles_step_noise_is_the_median_log_spread_of_its_repeated_timings():
    z90 = statistics.NormalDist().inv_cdf(0.9)
    sample = lambda sigma, reps=7: {"t": 1e-3, "t_median": 1e-3, "t_p90": 1e-3 * math.exp(sigma * z90), "reps": reps}
    samples = [sample(0.01), sample(0.02), sample(0.04), sample(0.5, reps=3), {"t": 1e-3}]   # 3 reps: not counted
    prof = P.StepProfile(P.ProfileKey.of(TINY, CPU), None, {}, samples, [], {}, {})
    assert prof.step_noise == pytest.approx(0.02)
    assert P.StepProfile(P.ProfileKey.of(TINY, CPU), None, {}, [{"t": 1e-3}], [], {}, {}).step_noise == 0.0
    assert step_noise("profile", prof) == pytest.approx(0.02) and step_noise(0.05, prof) == 0.05
    assert step_noise("profile", None) == 0.0                                # the roofline: no measured scatter


def test_shipped_profiles_record_a_small_positive_step_noise():
    from kvrl.executors.profile import load_cached, profile_file

    for spec in ("kvrl/executors/profiles/h200_qwen3-0.6b_bfloat16_step_graphs.json",
                 "kvrl/executors/profiles/h200_llama-3-8b_bfloat16_step_graphs.json"):
        assert 0.005 < load_cached(profile_file(spec)).step_noise < 0.1


def test_an_ensemble_is_the_mean_over_seeded_jittered_runs():
    seen = []

    def serve(seed):
        seen.append(seed)
        return {"throughput_tok_s": 100.0 + (seed or 0), "preemptions": 2 * (seed or 0), "finished": 8}

    assert serve_sims(serve, 1) == ({"throughput_tok_s": 100.0, "preemptions": 0, "finished": 8}, [])
    assert seen == [None]
    seen.clear()
    mean, runs = serve_sims(serve, 3)
    assert seen == [0, 1, 2] and len(runs) == 3
    assert mean == {"throughput_tok_s": 101.0, "preemptions": 2.0, "finished": 8.0} == mean_summary(runs)


@pytest.mark.parametrize("override, message", [("sim_ensemble=0", "sim_ensemble"),
                                               ("sim_step_noise=-0.5", "sim_step_noise=-0.5"),
                                               ("sim_step_noise=often", "sim_step_noise='often'")])
def test_fidelity_rejects_a_bad_ensemble_setting(override, message):
    from kvrl.apps.live_schema import compose_fidelity

    with pytest.raises(Exception, match=message):
        compose_fidelity([override])
    assert compose_fidelity(["sim_ensemble=4", "sim_step_noise=0.02"])["sim_ensemble"] == 4
