"""A tiny typed schema for workload configs: validation with key-naming errors, defaults, YAML.

A schema is a dict ``key -> Param``. ``validate`` checks a plain mapping against it (unknown key,
wrong type or out-of-range value -> :class:`WorkloadConfigError` naming the dotted key) and returns a
new dict with every key present (missing keys take their defaults). ``render_yaml`` writes the
defaults as a YAML document with a one-line comment per key.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from .errors import WorkloadConfigError


@dataclass(frozen=True)
class Param:
    """One config key.

    kind: ``int``, ``float``, ``bool``, ``str``, ``floats`` (list of numbers), ``strs`` (list of
    strings), ``dict`` (nested schema in ``fields``) or ``dicts`` (list of nested dicts).
    """

    kind: str
    default: Any
    doc: str
    nullable: bool = False
    choices: Optional[tuple] = None
    lo: Optional[float] = None          # inclusive lower bound
    gt: Optional[float] = None          # exclusive lower bound
    hi: Optional[float] = None          # inclusive upper bound
    length: Optional[int] = None        # exact list length (floats/strs)
    fields: Optional[dict] = None       # nested schema (dict/dicts)

    def describe(self) -> str:
        base = {"int": "an integer", "float": "a number", "bool": "true or false",
                "str": "a string", "floats": "a list of numbers", "strs": "a list of strings",
                "dict": "a mapping", "dicts": "a list of mappings"}[self.kind]
        if self.choices:
            base = "one of " + ", ".join(map(str, self.choices))
        if self.length:
            base += f" of length {self.length}"
        bounds = []
        if self.gt is not None:
            bounds.append(f"> {self.gt:g}")
        if self.lo is not None:
            bounds.append(f">= {self.lo:g}")
        if self.hi is not None:
            bounds.append(f"<= {self.hi:g}")
        if bounds:
            base += " " + " and ".join(bounds)
        return base + (" or null" if self.nullable else "")


def _bad(where: str, key: str, p: Param, v: Any) -> WorkloadConfigError:
    return WorkloadConfigError(f"{where}: key {key!r} expects {p.describe()}, got {v!r} "
                               f"({type(v).__name__})")


def _number_ok(p: Param, x: float) -> bool:
    if not math.isfinite(x):
        return False
    if p.lo is not None and x < p.lo:
        return False
    if p.gt is not None and x <= p.gt:
        return False
    if p.hi is not None and x > p.hi:
        return False
    return True


def check_value(where: str, key: str, p: Param, v: Any) -> Any:
    """Validate one value; returns it normalised (floats as float, nested dicts filled)."""
    if v is None:
        if p.nullable:
            return None
        raise _bad(where, key, p, v)
    k = p.kind
    if k == "int":
        if isinstance(v, bool) or not isinstance(v, int) or not _number_ok(p, v):
            raise _bad(where, key, p, v)
    elif k == "float":
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not _number_ok(p, float(v)):
            raise _bad(where, key, p, v)
        v = float(v)
    elif k == "bool":
        if not isinstance(v, bool):
            raise _bad(where, key, p, v)
    elif k == "str":
        if not isinstance(v, str) or (p.choices is None and not v):
            raise _bad(where, key, p, v)
    elif k in ("floats", "strs"):
        if not isinstance(v, (list, tuple)) or (p.length is not None and len(v) != p.length):
            raise _bad(where, key, p, v)
        if k == "floats":
            if any(isinstance(x, bool) or not isinstance(x, (int, float)) or not _number_ok(p, x)
                   for x in v):
                raise _bad(where, key, p, v)
            v = [float(x) for x in v]
        else:
            if any(not isinstance(x, str) for x in v):
                raise _bad(where, key, p, v)
            v = list(v)
    elif k == "dict":
        if not isinstance(v, Mapping):
            raise _bad(where, key, p, v)
        v = validate(v, p.fields, where, prefix=f"{key}.")
    elif k == "dicts":
        if not isinstance(v, (list, tuple)) or not v:
            raise _bad(where, key, p, v)
        out = []
        for i, item in enumerate(v):
            if not isinstance(item, Mapping):
                raise WorkloadConfigError(f"{where}: key '{key}.{i}' expects a mapping, got {item!r}")
            out.append(validate(item, p.fields, where, prefix=f"{key}.{i}."))
        v = out
    else:  # pragma: no cover - schema bug
        raise AssertionError(k)
    if p.choices is not None and v not in p.choices:
        raise _bad(where, key, p, v)
    return v


def validate(cfg: Mapping[str, Any], schema: Mapping[str, Param], where: str,
             prefix: str = "") -> dict[str, Any]:
    """Check ``cfg`` against ``schema``; fill defaults. ``where`` starts error messages."""
    for key in cfg:
        if not isinstance(key, str) or key not in schema:
            known = ", ".join(prefix + k for k in schema)
            raise WorkloadConfigError(f"{where}: unknown key {prefix + str(key)!r} (known: {known})")
    out = {}
    for key, p in schema.items():
        v = cfg[key] if key in cfg else defaults({key: p})[key]
        out[key] = check_value(where, prefix + key, p, v)
    return out


def defaults(schema: Mapping[str, Param]) -> dict[str, Any]:
    """A fresh copy of the schema's defaults (nested dicts filled)."""
    return json.loads(json.dumps({k: p.default for k, p in schema.items()}))


# ---------------------------------------------------------------------------------- YAML output
_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_./-]*")
_RESERVED = {"null", "true", "false", "yes", "no", "on", "off", "y", "n", "~"}


def _scalar(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        if _PLAIN.fullmatch(v) and v.lower() not in _RESERVED:
            return v
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_scalar(x) for x in v) + "]"
    raise TypeError(v)


def render_yaml(schema: Mapping[str, Param], values: Mapping[str, Any], header: str = "",
                comment_col: int = 34) -> str:
    """YAML for ``values`` (validated against ``schema``) with each key's doc as a comment."""
    lines = [f"# {h}" if h else "#" for h in header.splitlines()] if header else []

    def emit(text: str, doc: str) -> None:
        lines.append(f"{text.ljust(comment_col - 1)} # {doc}" if doc else text)

    def block(sch: Mapping[str, Param], vals: Mapping[str, Any], indent: str, first: str = "") -> None:
        lead = first
        for key, p in sch.items():
            v = vals[key]
            pad = lead or indent
            lead = ""
            if p.kind == "dict":
                emit(f"{pad}{key}:", p.doc)
                block(p.fields, v, indent + "  ")
            elif p.kind == "dicts":
                emit(f"{pad}{key}:", p.doc)
                for item in v:
                    block(p.fields, item, indent + "    ", first=indent + "  - ")
            else:
                emit(f"{pad}{key}: {_scalar(v)}", p.doc)

    block(schema, values, "")
    return "\n".join(lines) + "\n"
