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


def test_host_class_profiles_are_chosen_by_path_not_by_auto():
    """``h200x4/`` holds one profile per H200 shape that ``auto`` never picks (the defaults stay what
    every committed sim result used); an explicit ``h200x4/<name>`` resolves to it."""
    from kvrl.executors.hardware import DEVICES, MODEL_SHAPES
    from kvrl.executors.sim import SimExecutor

    assert HOST_CLASS == ["h200x4/h200_llama-3-8b_bfloat16_step_graphs.json",
                          "h200x4/h200_qwen3-0.6b_bfloat16_step_graphs.json"]
    for model, name in (("qwen3-0.6b", HOST_CLASS[1]), ("llama-3-8b", HOST_CLASS[0])):
        auto = SimExecutor(MODEL_SHAPES[model], DEVICES["h200"], profile="auto")
        assert "h200x4" not in auto.profile.path
        chosen = SimExecutor(MODEL_SHAPES[model], DEVICES["h200"], profile=name)
        assert chosen.profile.path.endswith(name) and "host_class" in chosen.profile.meta
