"""kvrl-bench's configuration composes with the overrides its docs name (issue 19)."""
from hydra import compose, initialize_config_module

from kvrl.apps.live_schema import register_live_schemas


def test_bench_device_is_overridable_from_the_command_line():
    """``device=`` selects the conf/device group in every kvrl app, so the bench names its torch
    device ``torch_device`` (before, ``kvrl-bench device=cpu`` failed: no match in the defaults list)."""
    register_live_schemas()
    with initialize_config_module("kvrl.conf", version_base="1.3"):
        cfg = compose("bench", overrides=["torch_device=cpu", "systems=[kvrl]", "preset=tiny"])
    assert cfg.torch_device == "cpu" and list(cfg.systems) == ["kvrl"] and "device" not in cfg
