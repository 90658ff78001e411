"""``conf/workload/<name>.yaml``, written from the builder's schema (:mod:`kvrl.workloads.params`):
the defaults list that types the node (``/workload_schema/<name>``), then every key at its default
with its doc as a comment. ``python -m kvrl.workloads.conf_yaml`` rewrites the files;
tests/test_workload_params.py checks they are current.
"""
from __future__ import annotations

import dataclasses
import json
import re
import sys
from pathlib import Path
from typing import Any

from .registry import BUILDERS, SCHEMA_GROUP, schema_fields

_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_./-]*")
_RESERVED = {"null", "true", "false", "yes", "no", "on", "off", "y", "n", "~"}
COMMENT_COL = 34


def _scalar(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return v if _PLAIN.fullmatch(v) and v.lower() not in _RESERVED else json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_scalar(x) for x in v) + "]"
    raise TypeError(v)


def _default(f: dataclasses.Field) -> Any:
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()


def render(name: str) -> str:
    """The commented YAML of builder ``name`` at its defaults."""
    spec = BUILDERS[name]
    lines = [f"# Workload '{name}': {spec.doc}.",
             f"# Schema: {spec.params_cls.__module__}.{spec.params_cls.__name__} + CommonParams, stored in",
             f"# Hydra's ConfigStore as {SCHEMA_GROUP}/{name} (types checked when composing). Docs: docs/workloads.md.",
             "# The keys from 'seed' on are the common transforms, applied in this order: start_s/duration_s,",
             "# split, subsample, rate_scale, max_requests, overlong (with max_model_len), offline, SLO defaults."]

    def emit(text: str, doc: str) -> None:
        lines.append(f"{text.ljust(COMMENT_COL - 1)} # {doc}")

    def block(fields: list, values: Any, indent: str, first: str = "") -> None:
        lead = first
        for f in fields:
            v = getattr(values, f.name) if dataclasses.is_dataclass(values) else values[f.name]
            pad, lead = lead or indent, ""
            if dataclasses.is_dataclass(v):
                emit(f"{pad}{f.name}:", f.metadata["doc"])
                block(dataclasses.fields(v), v, indent + "  ")
            elif isinstance(v, list) and v and dataclasses.is_dataclass(v[0]):
                emit(f"{pad}{f.name}:", f.metadata["doc"])
                for item in v:
                    block(dataclasses.fields(item), item, indent + "    ", first=indent + "  - ")
            else:
                emit(f"{pad}{f.name}: {_scalar(v)}", f.metadata["doc"])

    emit("defaults:", "the schema first, then the values below")
    emit(f"  - /{SCHEMA_GROUP}/{name}@_here_", "types and keys of this workload")
    emit("  - _self_", "then the values of this file")
    emit(f"name: {name}", "which builder makes the requests")
    fields = schema_fields(name)
    block(fields, {f.name: _default(f) for f in fields}, "")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    """Rewrite ``conf/workload/<name>.yaml`` for every builder under the conf dir ``argv[0]``."""
    root = Path(argv[0] if argv else Path(__file__).resolve().parents[2] / "conf") / "workload"
    for name in BUILDERS:
        (root / f"{name}.yaml").write_text(render(name))
    return 0


if __name__ == "__main__":
    from . import builders  # noqa: F401
    sys.exit(main(sys.argv[1:]))
