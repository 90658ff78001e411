"""Structured configs of kvrl-fidelity, kvrl-profile and kvrl-bench (kvrl/apps/live_schema.py, issue 19):
every documented command line composes and validates; a misspelt key, a wrong type or an
out-of-range value stops the app before any work, naming the key. (Before, these apps read untyped
dicts: ``num_requests=many`` composed, ``+max_num_seq=64`` and a workload entry's ``engin:`` were
silently ignored, and a bad grid key failed only after the model was built.)"""
from __future__ import annotations

import subprocess
import sys

import pytest
from hydra import compose, initialize_config_module
from hydra.errors import ConfigCompositionException

from kvrl.apps.live_schema import register_live_schemas, validate_bench, validate_fidelity, validate_profile
from kvrl.apps.schema import ConfigError

VALIDATE = {"fidelity": validate_fidelity, "profile": validate_profile, "bench": validate_bench}
WORKLOAD = ("workload:{name:synthetic,num_requests:8,seed:5,arrival:{rate:40.0},"
            "prompt_len:{dist:uniform,low:8,high:160},output_len:{dist:uniform,low:4,high:32}}")


def load(app: str, overrides: list[str]) -> dict:
    """What each app does first: Hydra composes its config, then ``validate_<app>`` checks it."""
    register_live_schemas()
    with initialize_config_module("kvrl.conf", version_base="1.3"):
        return VALIDATE[app](compose(app, overrides=overrides))


# The command lines of README.md, docs/fidelity.md, docs/benchmarks.md, benchmarks/calibrate.sh
# (its stages and its CPU smoke knobs), benchmarks/gpu_session.sh and tests/test_profile.py.
DOCUMENTED = [
    ("bench", []),
    ("bench", ["systems=[kvrl]", "profile=true"]),
    ("bench", ["systems=[kvrl]", "trace_steps=20"]),
    ("bench", ["systems=[hf_cb,hf_static]"]),
    ("bench", ["torch_device=cpu", "systems=[kvrl]", "preset=tiny"]),
    ("profile", ["model=qwen3-0.6b", "install_dir=kvrl/executors/profiles"]),
    ("profile", ["model=tiny", "backend.device=cpu"]),
    ("profile", ["model=llama-3-8b", "backend.dtype=bfloat16", "backend.device=auto", "install_dir=out/profiles",
                 "grid.prefix_cached=[1024,4096]", "grid.holdout=30", "grid.host_pressure_fraction=0.25"]),
    ("profile", ["model=qwen3-0.6b", "grid.host_lengths=lognormal", "grid.host_prompt=[32,2048]",
                 "grid.host_output=[16,1024]"]),
    ("profile", ["model=qwen3-0.6b", "grid.kv_fill=random"]),
    ("profile", ["model=tiny", "backend.dtype=float32", "backend.device=cpu", "progress=false",
                 "grid.decode_batch=[1,4,16]", "grid.host_requests=16", "grid.swaps=[1,16]"]),
    ("fidelity", ["model=qwen3-0.6b", "profile=runs/profile/x/profile.json"]),
    ("fidelity", ["model=tiny", "live.device=cpu", "max_requests=20", "warmup_requests=0"]),
    ("fidelity", ["model=qwen3-0.6b", "live.dtype=bfloat16", "live.device=auto", "profile=auto",
                  "workloads.poisson.workload.arrival.rate=200", "max_requests=300"]),
    ("fidelity", ["model=llama-3-8b", "live.dtype=bfloat16", "live.device=auto", "max_requests=200"]),
    ("fidelity", ["model=tiny", "live.device=cpu", "profile=p.json", f"+workloads.tiny={{doc:tiny,"
                  f"engine:{{num_blocks:32}},{WORKLOAD}}}", "only_workloads=[tiny]", "warmup_requests=3",
                  "engine.max_num_batched_tokens=256"]),
    ("fidelity", ["resim=out/fidelity_qwen3-0.6b", "profile=p.json", "refit=true", "only_policies=[vllm]"]),
]


@pytest.mark.parametrize("app,overrides", DOCUMENTED, ids=[f"{a}:{' '.join(o)[:40]}" for a, o in DOCUMENTED])
def test_documented_command_lines_compose_and_validate(app, overrides):
    cfg = load(app, overrides)
    assert isinstance(cfg, dict) and "hydra" not in cfg


def test_the_defaults_are_the_yaml_values_typed():
    bench = load("bench", [])
    assert bench["systems"] == ["kvrl", "hf_cb", "hf_static"] and bench["max_num_batched_tokens"] == 16384
    fid = load("fidelity", [])
    assert fid["engine"]["cpu_device_num_blocks"] == 2048 and fid["live_repeats"] == 3
    assert set(fid["policies"]) == {"vllm", "sjf_swap"} and "poisson" in fid["workloads"]
    assert load("profile", ["model=tiny"])["model"]["num_layers"] == 2


REJECTED = [
    # (app, overrides, words the error must contain)
    ("bench", ["num_requests=many"], "num_requests"),                  # wrong type
    ("bench", ["+max_num_seq=64"], "max_num_seq"),                     # misspelt key added with +
    ("bench", ["systems=[kvrl,vllm]"], "systems"),
    ("bench", ["min_len=2000"], "max_len"),                            # min_len > max_len
    ("bench", ["preset=qwen3-06b"], "preset"),                         # before: silently a tiny model
    ("bench", ["torch_device=gpu"], "torch_device"),
    ("profile", ["grid.decode_batch=16"], "grid.decode_batch"),        # wrong type (a list)
    ("profile", ["+grid.decode_batchs=[1,2]"], "grid.decode_batchs"),  # misspelt key added with +
    ("profile", ["+disk.mbs=10"], "disk.mbs"),                         # before: silently ignored
    ("profile", ["num_blocks=lots"], "num_blocks"),
    ("profile", ["grid.reps=0"], "grid.reps"),
    ("profile", ["grid.host_prompt=[100,10]"], "grid.host_prompt"),
    ("profile", ["grid.host_pressure_fraction=1.5"], "grid.host_pressure_fraction"),
    ("profile", ["grid.host_lengths=zipf"], "grid.host_lengths"),
    ("profile", ["grid.kv_fill=ones"], "grid.kv_fill"),
    ("profile", ["model.family=gpt"], "model.family"),
    ("profile", ["backend=sim"], "profile"),                           # the sim backend's key is not a live key
    ("fidelity", ["warmup_requests=many"], "warmup_requests"),         # wrong type
    ("fidelity", ["live_repeats=0"], "live_repeats"),
    ("fidelity", [f"+workloads.t={{doc:t,engin:{{num_blocks:32}},{WORKLOAD}}}"], "workloads.t.engin"),
    ("fidelity", [f"+workloads.t={{doc:t,engine:{{num_block:32}},{WORKLOAD}}}"], "workloads.t.engine.num_block"),
    ("fidelity", ["+workloads.t={doc:t}"], "workloads.t.workload"),
    ("fidelity", ["+policies.p={scheduler:{name:fcfs},watermrk:{name:fixed},eviction:{name:lifo},"
                  "prefix_cache:{name:none}}"], "policies.p.watermrk"),
    ("fidelity", ["+policies.p={scheduler:{name:fcfs},watermark:{name:fixed,fracton:0.1},eviction:{name:lifo},"
                  "prefix_cache:{name:none}}"], "fracton"),
    ("fidelity", ["+engine.num_block=3"], "engine.num_block"),
    ("fidelity", ["workloads.poisson.workload.arrival.rate=-1"], "workloads.poisson.workload"),
    ("fidelity", ["only_workloads=[posson]"], "only_workloads"),
    ("fidelity", ["refit=true"], "refit"),                             # before: silently ignored without resim
    ("fidelity", ["host_speed=fast"], "host_speed"),
    ("fidelity", ["host_speed=0"], "host_speed"),
    ("fidelity", ["sim_step_scale=0.97"], "sim_step_scale"),             # a sensitivity check of recorded runs only
    ("fidelity", ["resim=out/x", "sim_step_scale=0"], "sim_step_scale"),
    ("fidelity", ["live.device=gpu"], "live.device"),
]


@pytest.mark.parametrize("app,overrides,key", REJECTED, ids=[f"{a}:{k}" for a, _, k in REJECTED])
def test_a_bad_key_type_or_value_is_rejected_naming_the_key(app, overrides, key):
    with pytest.raises((ConfigCompositionException, ConfigError)) as info:
        load(app, overrides)
    text = f"{info.value} {info.value.__cause__ or ''}"
    assert key in text, text


@pytest.mark.parametrize("module,overrides,key", [
    ("kvrl.apps.bench", ["+max_num_seq=64", "systems=[kvrl]", "preset=tiny", "torch_device=cpu",
                         "num_requests=2", "checkpoint_root=ckpt"], "max_num_seq"),
    ("kvrl.apps.profile_app", ["model=tiny", "backend.device=cpu", "+grid.decode_batchs=[1]"], "grid.decode_batchs"),
    ("kvrl.apps.fidelity", ["model=tiny", "live.device=cpu", "warmup_requests=0", "only_workloads=[t]",
                            f"+workloads.t={{doc:t,engin:{{num_blocks:32}},{WORKLOAD}}}"], "workloads.t.engin"),
])
def test_each_app_stops_before_any_work_naming_the_key(module, overrides, key, tmp_path):
    """The app exits non-zero, names the key, and leaves nothing but Hydra's own files (before:
    the bench ran, the profile built the model first, fidelity ignored ``engin`` and ran)."""
    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", module, *overrides, f"hydra.run.dir={run_dir}"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode != 0 and key in proc.stderr, proc.stderr[-2000:]
    written = sorted(p.name for p in run_dir.iterdir() if p.suffix != ".log")    # Hydra's job log aside
    assert written == [".hydra"] and not (tmp_path / "ckpt").exists()


def test_the_tenants_fidelity_set_serves_the_tenants_tasks_test_jobs():
    """conf/fidelity_set/tenants.yaml (benchmarks/fidelity_tenants.sh) is the multi-tenant task's test jobs as
    kvrl-eval builds them (env=tenants, test split, seeds 0-9, resample 0.8): request for request, with the
    task's SLO on each request. A change to conf/env/tenants.yaml that the set does not follow fails here."""
    import numpy as np
    from omegaconf import OmegaConf

    from kvrl.apps.eval import job_workload
    from kvrl.apps.rl_schema import register_rl_schemas
    from kvrl.workloads import build_workload

    fid = load("fidelity", ["+fidelity_set=tenants", "only_workloads=[tenants_s3]",
                            "+policies.lpm={scheduler: {name: lpm}, watermark: {name: fixed, fraction: 0.01}, "
                            "eviction: {name: lifo, mode: recompute}, prefix_cache: {name: hash_lru}}",
                            "only_policies=[vllm,lpm]"])
    assert [f"tenants_s{s}" for s in range(10)] == [w for w in fid["workloads"] if w.startswith("tenants_s")]
    register_rl_schemas()
    with initialize_config_module("kvrl.conf", version_base="1.3"):
        task = OmegaConf.to_container(compose("eval", overrides=["env=tenants"]), resolve=True)
    entry = fid["workloads"]["tenants_s3"]
    assert {k: entry["engine"][k] for k in ("num_blocks", "num_cpu_blocks", "prefix_cache_scope")} == \
        {k: task["engine"][k] for k in ("num_blocks", "num_cpu_blocks", "prefix_cache_scope")}
    ours = build_workload(dict(entry["workload"]), vocab_size=1000, max_model_len=40960)
    theirs = build_workload(job_workload(task["workload"], "test", 3, task["resample"]), vocab_size=1000,
                            max_model_len=40960)
    assert len(ours) == len(theirs) > 50
    for a, b in zip(ours, theirs):
        assert (a.request_id, a.arrival_s, a.output_len, a.tenant) == (b.request_id, b.arrival_s, b.output_len, b.tenant)
        assert np.array_equal(a.prompt_token_ids, b.prompt_token_ids)
        assert (a.slo_ttft_s, a.slo_tpot_s) == (task["slo"]["ttft_s"], task["slo"]["tpot_s"])
