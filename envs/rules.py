"""Plugins named as rules in a task's config (``features.slot_rules``: eviction rules that fill
candidate slots; ``action.rules``: watermark rules an agent chooses among), checked when the
config is built."""
from __future__ import annotations

from typing import Any


def rule_spec(rule: Any, kind: str, key: str) -> dict:
    """A ``kind`` plugin named by ``rule`` (a name, or ``{name, **params}``) as ``{"name": ..., **params}``,
    checked by building the plugin; ``key`` names the config key in errors. ``agent`` is refused unless it
    names a saved agent (``policy_path``), which then decides by itself like any rule (an agent that
    gates another, e.g. between a learned policy and a safe constant); a driven ``agent`` is what chooses
    among the rules."""
    from kvrl import plugins

    spec = {"name": rule} if isinstance(rule, str) else {str(k): v for k, v in dict(rule).items()}
    if "name" not in spec:
        raise ValueError(f"{key}: each rule needs a name (a {kind} plugin), got {rule!r}")
    try:
        plugins.create_from_config(kind, spec)
    except (KeyError, ValueError, TypeError) as err:
        raise ValueError(f"{key}: {err}") from err
    if spec["name"] == "agent" and not spec.get("policy_path"):
        raise ValueError(f"{key}: 'agent' is a rule only with a policy_path (a saved agent that decides by "
                         "itself); without one it is what chooses among the rules")
    return spec
