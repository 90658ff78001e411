"""Keys added with ``+`` are checked against the app's schema (issue 19): Hydra's append goes past
the structured config's types, so before, ``kvrl-run +max_step=5`` or ``+slo.ttft=1`` composed and
was silently ignored; now ``validate_config`` (run first thing by every engine app and by the
sweep-wide check) rejects it naming the key."""
from __future__ import annotations

import pytest
from hydra import compose, initialize_config_module

import kvrl.apps.run  # noqa: F401  (stores run_schema and the plugin options)
from kvrl.apps.attack import register_attack_schema
from kvrl.apps.rl_schema import register_rl_schemas
from kvrl.apps.schema import ConfigError, validate_config


def _validate(app: str, overrides: list[str]) -> None:
    register_rl_schemas()
    register_attack_schema()
    with initialize_config_module("kvrl.conf", version_base="1.3"):
        validate_config(compose(app, overrides=overrides))


@pytest.mark.parametrize("app,override,key", [
    ("run", "+max_step=5", "max_step"),
    ("run", "+slo.ttft=1", "slo.ttft"),
    ("run", "+logger.projct=kvrl", "logger.projct"),
    ("train", "+train.n_env=4", "train.n_env"),
    ("eval", "+seed_list=[1,2]", "seed_list"),
    ("attack", "+attack.threshhold=kmeans", "attack.threshhold"),
])
def test_a_misspelt_key_added_with_plus_is_rejected(app, override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        _validate(app, [override])


@pytest.mark.parametrize("app,overrides", [
    ("run", ["backend=live", "+backend.weights=memory"]),        # free-form nodes take new keys
    ("run", ["workload=synthetic", "workload.num_requests=5"]),
    ("train", []), ("eval", []), ("select", ["agents=[runs/train/x]"]),
    ("attack", []), ("attack", ["command=fill_squeeze", "workload=fill_and_squeeze"]),
    ("attack", ["command=benign_cost", "workload=multi_tenant", "+attack.fill_squeeze.workload.probe_count=0"]),
])
def test_keys_of_free_form_nodes_and_the_defaults_still_pass(app, overrides):
    _validate(app, overrides)
