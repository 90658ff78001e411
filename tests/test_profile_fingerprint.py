"""The shipped step-time profiles must describe this tree's live executor (issue 16), and ``auto``
must pick one of the executor mode it models."""
from __future__ import annotations

import json

import pytest

from kvrl.executors import profile as P

SHIPPED = sorted(p.name for p in P.PACKAGED_DIR.glob("*.json"))


#: profiles of another host class, shipped beside the defaults (``profile=h200x4/<name>``)
HOST_CLASS = sorted(f"h200x4/{p.name}" for p in (P.PACKAGED_DIR / "h200x4").glob("*.json"))


@pytest.mark.parametrize("name", SHIPPED + HOST_CLASS)
def test_shipped_profile_measured_this_trees_timing_code(name):
    """Every shipped profile must describe this tree's live executor: when kernels, model or
    executor code change, re-profile (benchmarks/calibrate.sh) or record in the profile's
    meta.fingerprint_accepted why timing is unaffected."""
    from kvrl.executors.fingerprint import staleness

    meta = json.loads((P.PACKAGED_DIR / name).read_text())["meta"]
    assert staleness(meta) is None, f"{name}: {staleness(meta)}"


def test_every_shipped_key_has_a_profile_of_each_executor_mode():
    """For each device and shape, one shipped profile measured the default (piecewise) path and one
    the whole-step graph path (``backend.step_graphs``); their file names say which."""
    modes: dict[str, set] = {}
    for name in SHIPPED:
        d = json.loads((P.PACKAGED_DIR / name).read_text())
        steps = P.registry.profiled_step_graphs(d["meta"])
        assert name.endswith("_step_graphs.json") == steps, name
        modes.setdefault(name.removesuffix(".json").removesuffix("_step_graphs"), set()).add(steps)
    assert len(modes) == 4 and all(m == {False, True} for m in modes.values()), modes


@pytest.mark.parametrize("step_graphs", [False, True])
def test_auto_picks_the_profile_of_the_modelled_executor_mode(step_graphs):
    from kvrl.executors.hardware import DEVICES, MODEL_SHAPES
    from kvrl.executors.sim import SimExecutor

    sim = SimExecutor(MODEL_SHAPES["qwen3-0.6b"], DEVICES["h200"], profile="auto", step_graphs=step_graphs)
    assert P.registry.profiled_step_graphs(sim.profile.meta) == step_graphs
    assert sim.profile.path.endswith("_step_graphs.json") == step_graphs


def test_host_class_profiles_are_chosen_by_path_or_beside_a_live_host_of_their_class():
    """``h200x4/`` holds one profile per H200 shape. A sim of its own never picks them with ``auto``
    (the defaults stay what every committed sim result used), nor does a sim beside a live host of
    another CPU count; a sim beside a live host of the profiles' CPU count does (whole-step graphs,
    the mode they measured; piecewise still gets the default); an explicit ``h200x4/<name>`` always
    resolves to it."""
    from kvrl.executors.hardware import DEVICES, MODEL_SHAPES
    from kvrl.executors.sim import SimExecutor

    assert HOST_CLASS == ["h200x4/h200_llama-3-8b_bfloat16_step_graphs.json",
                          "h200x4/h200_qwen3-0.6b_bfloat16_step_graphs.json"]
    assert [d.name for d in P.registry.host_class_dirs()] == ["h200x4"]
    for model, name in (("qwen3-0.6b", HOST_CLASS[1]), ("llama-3-8b", HOST_CLASS[0])):
        cpus = json.loads((P.PACKAGED_DIR / name).read_text())["meta"]["cpu_count"]
        assert cpus == 64
        for host_cpus in (None, 2, 16):
            auto = SimExecutor(MODEL_SHAPES[model], DEVICES["h200"], profile="auto", host_cpus=host_cpus)
            assert "h200x4" not in auto.profile.path and auto.profile.path.endswith("_step_graphs.json")
        beside = SimExecutor(MODEL_SHAPES[model], DEVICES["h200"], profile="auto", host_cpus=cpus)
        assert beside.profile.path.endswith(name)
        _, why = P.resolve_profile("auto", MODEL_SHAPES[model], DEVICES["h200"], host_cpus=cpus)
        assert why == "auto (a profile of this host's class: 64 CPUs)"
        piecewise = SimExecutor(MODEL_SHAPES[model], DEVICES["h200"], profile="auto", step_graphs=False, host_cpus=cpus)
        assert "h200x4" not in piecewise.profile.path and not piecewise.profile.path.endswith("_step_graphs.json")
        chosen = SimExecutor(MODEL_SHAPES[model], DEVICES["h200"], profile=name)
        assert chosen.profile.path.endswith(name) and "host_class" in chosen.profile.meta


def test_a_profile_of_the_live_hosts_class_on_the_path_is_preferred_to_a_newer_one(tmp_path, monkeypatch):
    """With ``host_cpus``, ``auto`` prefers a profile measured on a host of that many CPUs over a newer
    one of another host's; without it, the newest wins as before."""
    from kvrl.executors.hardware import DEVICES, MODEL_SHAPES

    src = json.loads((P.PACKAGED_DIR / "h200_qwen3-0.6b_bfloat16_step_graphs.json").read_text())
    for name, cpus, created in (("this_class.json", 8, 2e9), ("newer_other.json", 32, 3e9)):
        d = json.loads(json.dumps(src))
        d["meta"].update(cpu_count=cpus, created=created)
        (tmp_path / name).write_text(json.dumps(d))
    monkeypatch.setenv(P.registry.ENV_PATH, str(tmp_path))
    P.registry.clear_cache()
    try:
        shape, dev = MODEL_SHAPES["qwen3-0.6b"], DEVICES["h200"]
        assert P.resolve_profile("auto", shape, dev)[0].path.endswith("newer_other.json")
        assert P.resolve_profile("auto", shape, dev, host_cpus=8)[0].path.endswith("this_class.json")
        assert P.resolve_profile("auto", shape, dev, host_cpus=4)[0].path.endswith("newer_other.json")
    finally:
        monkeypatch.delenv(P.registry.ENV_PATH)
        P.registry.clear_cache()
