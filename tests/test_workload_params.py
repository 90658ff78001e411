"""Workload builders registered with typed Params in Hydra's ConfigStore (issue 19): one schema per
builder, composed under every ``conf/workload`` file; strict types and key-naming errors on plain
configs and on the command line; OmegaConf's merge (the one rule for YAML, overrides and dicts);
a third-party builder registered the same way."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_module
from hydra.core.config_store import ConfigStore
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

import kvrl.apps.run  # noqa: F401  (stores run_schema and the plugin options)
from kvrl.apps.schema import ConfigError, validate_config
from kvrl.workloads import (BUILDERS, WORKLOADS, WorkloadConfigError, build_workload, default_config,
                            register_workload, resolve_config)
from kvrl.workloads.config import workload_config_path

VOCAB = 1000


def _compose(overrides: list[str]):
    with initialize_config_module("kvrl.conf", version_base="1.3"):
        return compose("run", overrides=overrides)


def test_every_builder_has_a_typed_schema_in_the_config_store():
    repo = ConfigStore.instance().repo["workload_schema"]
    for name, spec in BUILDERS.items():
        node = repo[f"{name}.yaml"].node
        assert node.name == name
        own = [f.name for f in dataclasses.fields(spec.params_cls)]
        assert list(node)[1:1 + len(own)] == own, name
        assert dataclasses.is_dataclass(spec.params_cls) and callable(spec.build)


@pytest.mark.parametrize("name", WORKLOADS)
def test_kvrl_run_workload_composes_onto_its_schema(name):
    cfg = _compose([f"workload={name}", "workload.max_requests=5"])
    assert OmegaConf.get_type(cfg.workload).__name__ == f"{BUILDERS[name].params_cls.__name__}Node"
    validate_config(cfg)
    got = OmegaConf.to_container(cfg.workload, resolve=True)
    assert got == {**default_config(name), "max_requests": 5, "seed": 0}


def test_a_wrong_type_fails_when_composing_naming_the_key():
    with pytest.raises(ConfigCompositionException) as exc:
        _compose(["workload=synthetic", "workload.num_requests=abc"])
    assert "workload.num_requests" in str(exc.value) + str(exc.value.__cause__)
    with pytest.raises(ConfigCompositionException) as exc:
        _compose(["workload=multi_tenant", "workload.tenants.0.parallel_prob=high"])
    assert "parallel_prob" in str(exc.value) + str(exc.value.__cause__)


def test_command_line_conversions_are_lossless_or_rejected():
    # '5' is the int 5 (OmegaConf's conversion of an exact text); 2 for a bool key is not true
    cfg = _compose(["workload=synthetic", "workload.num_requests='5'"])
    validate_config(cfg)
    assert cfg.workload.num_requests == 5
    with pytest.raises(ConfigError, match=r"key 'offline' expects true or false, got 2"):
        validate_config(_compose(["workload=synthetic", "workload.offline=2"]))
    with pytest.raises(ConfigError, match=r"unknown key 'zzz'"):
        validate_config(_compose(["workload=synthetic", "+workload.zzz=1"]))
    with pytest.raises(ConfigError, match=r"key 'arrival\.rate' expects a number > 0 or null, got inf"):
        validate_config(_compose(["workload=synthetic", "workload.arrival.rate=inf"]))


@pytest.mark.parametrize("cfg,match", [
    ({"name": "synthetic", "num_requests": "5"}, r"key 'num_requests' expects an integer >= 0, got '5' \(str\)"),
    ({"name": "synthetic", "offline": 1}, r"key 'offline' expects true or false, got 1"),
    ({"name": "synthetic", "tenant": 5}, r"key 'tenant' expects a string, got 5"),
    ({"name": "synthetic", "rate_scale": "2"}, r"key 'rate_scale' expects a number > 0, got '2'"),
    ({"name": "synthetic", "prompt_len": {"dsit": "uniform"}}, r"unknown key 'prompt_len\.dsit'"),
    ({"name": "synthetic", "split_fractions": [0.5, "0.3", 0.2]}, r"key 'split_fractions'"),
    ({"name": "multi_tenant", "tenants": [{"name": "a"}, {"name": "b", "parallel_prob": 2.0}]},
     r"key 'tenants\.1\.parallel_prob' expects a number >= 0 and <= 1"),
    ({"name": "multi_tenant", "tenants": [{"name": "a", "arrival": {"rate": True}}]},
     r"key 'tenants\.0\.arrival\.rate'"),
    ({"name": "prefix_probe", "victim": {"prompt_len": {"dist": "uniform", "high": 1}}},
     r"key 'victim\.prompt_len': uniform lengths need low and high"),
])
def test_plain_configs_are_strict_and_errors_name_the_dotted_key(cfg, match):
    with pytest.raises(WorkloadConfigError, match=match):
        resolve_config(cfg)


def test_a_plain_config_merges_like_hydra_key_by_key():
    # one rule for YAML files, overrides and dicts: a nested mapping updates the default's keys
    got = resolve_config({"name": "synthetic", "arrival": {"process": "gamma", "cv": 2.0}})
    assert got["arrival"] == {"process": "gamma", "rate": 5.0, "cv": 2.0}
    # a list replaces the default list; each entry starts from the TenantParams defaults
    got = resolve_config({"name": "multi_tenant", "tenants": [{"name": "a", "output_len": {"mean": 10.0}}]})
    (t,) = got["tenants"]
    assert t["output_len"] == {**default_config("multi_tenant")["tenants"][0]["output_len"], "mean": 10.0,
                               "cv": 1.0, "field": "output"}
    assert t["arrival"] == {"process": "poisson", "rate": 1.0, "cv": 1.0} and t["system_prompt_len"] == 0
    # and the composed node gives the same for the same values
    cfg = _compose(["workload=multi_tenant", "workload.tenants=[{name: a, output_len: {mean: 10.0}}]"])
    assert resolve_config(cfg.workload)["tenants"] == got["tenants"]


def test_a_constant_length_outside_inherited_clamps_is_an_error_not_a_silent_clip():
    # the merge keeps synthetic's uniform low/high: a constant 1000 would be clamped to 512 everywhere
    with pytest.raises(WorkloadConfigError, match=r"key 'prompt_len': the constant length 1000 lies outside "
                                                  r"\[low=32, high=512\]"):
        resolve_config({"name": "synthetic", "prompt_len": {"dist": "constant", "mean": 1000.0}})
    with pytest.raises(ConfigError, match=r"prompt_len.*lies outside"):
        validate_config(_compose(["workload=synthetic", "workload.prompt_len.dist=constant",
                                  "workload.prompt_len.mean=1000"]))
    got = resolve_config({"name": "synthetic", "prompt_len": {"dist": "constant", "mean": 1000.0, "low": None,
                                                              "high": None}})
    reqs = build_workload({**got, "num_requests": 3}, vocab_size=VOCAB)
    assert [r.prompt_len for r in reqs] == [1000] * 3


def test_conf_workload_files_are_rendered_from_the_schemas():
    from kvrl.workloads.conf_yaml import render
    for name in WORKLOADS:
        assert Path(workload_config_path(name)).read_text() == render(name), (
            f"conf/workload/{name}.yaml is stale: python -m kvrl.workloads.conf_yaml")


def test_a_third_party_builder_registers_like_a_plugin():
    from kvrl.engine.request import Request

    @dataclasses.dataclass
    class EchoParams:
        """``count`` requests of ``length`` tokens, one a second."""
        count: int = dataclasses.field(default=3, metadata={"doc": "requests", "lo": 1})
        length: int = dataclasses.field(default=4, metadata={"doc": "prompt tokens", "lo": 1})

    @register_workload("test_echo", EchoParams, "a test builder")
    def echo(p: EchoParams, ctx) -> list:
        return [Request(request_id=f"e{i}", arrival_s=float(i), prompt_token_ids=np.full(p.length, i % ctx.vocab_size),
                        output_len=1) for i in range(p.count)]
    try:
        assert "test_echo.yaml" in ConfigStore.instance().repo["workload_schema"]
        reqs = build_workload({"name": "test_echo", "count": 2, "rate_scale": 2.0}, vocab_size=VOCAB)
        assert [(r.request_id, r.arrival_s, r.prompt_len) for r in reqs] == [("e0", 0.0, 4), ("e1", 0.5, 4)]
        with pytest.raises(WorkloadConfigError, match=r"key 'count' expects an integer >= 1, got 0"):
            build_workload({"name": "test_echo", "count": 0}, vocab_size=VOCAB)
        with pytest.raises(ValueError, match=r"'synthetic' is already registered by kvrl\.workloads\.builders\.synthetic"):
            register_workload("synthetic", EchoParams, "another")(echo)
        with pytest.raises(TypeError, match=r"may not declare \['seed'\]"):
            register_workload("test_bad", dataclasses.make_dataclass("Bad", [("seed", int, 0)]), "bad")
    finally:
        BUILDERS.pop("test_echo", None)
