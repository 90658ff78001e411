"""Plugins named as rules in a task's config (``features.slot_rules``: eviction rules that fill
candidate slots; ``action.rules``: watermark rules an agent chooses among), checked when the
config is built."""
from __future__ import annotations

from typing import Any


def rule_spec(rule: Any, kind: str, key: str) -> dict:
    """A ``kind`` plugin named by ``rule`` (a name, or ``{name, **params}``) as ``{"name": ..., **params}``,
    checked by building the plugin; ``key`` names the config key in errors. ``agent`` is refused: it is
    what chooses among the rules."""
    from kvrl import plugins

    spec = {"name": rule} if isinstance(rule, str) else {str(k): v for k, v in dict(rule).items()}
    if "name" not in spec:
        raise ValueError(f"{key}: each rule needs a name (a {kind} plugin), got {rule!r}")
    try:
        plugins.create_from_config(kind, spec)
    except (KeyError, ValueError, TypeError) as err:
        raise ValueError(f"{key}: {err}") from err
    if spec["name"] == "agent":
        raise ValueError(f"{key}: 'agent' cannot be one of the rules (it is what chooses among them)")
    return spec
