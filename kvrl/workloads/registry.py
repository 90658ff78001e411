"""The workload builder registry: each builder is registered with its ``Params`` dataclass
(:mod:`kvrl.workloads.params`), like the policy plugins (:mod:`kvrl.plugins.registry`), and a config
is validated into those dataclasses before the builder is called with them.

Registration stores the builder's schema in Hydra's ConfigStore as ``workload_schema/<name>``: a
node with ``name``, the builder's fields and the :class:`~kvrl.workloads.params.CommonParams`
fields. ``conf/workload/<name>.yaml`` starts from it (``defaults: [/workload_schema/<name>@_here_,
_self_]``), so composing an app's config type-checks ``workload.*`` and rejects an override of a key
the builder lacks, naming the key. (Not ``workload/<name>`` itself: beside a YAML file of the same
name, Hydra would apply it through its deprecated automatic schema matching.)

:func:`resolve` validates a config (a plain mapping or a ``DictConfig``) in three passes, each error a
:class:`~kvrl.workloads.errors.WorkloadConfigError` naming the dotted key:

1. keys and types, strictly, on the values as given: an unknown key; an int key given a bool, a
   float or a string; a float key given a bool or a string; a bool key given anything but a bool; a
   string key given a non-string; a list or mapping of the wrong shape. (On the Hydra command line
   the node's types apply first: OmegaConf turns the text ``'5'`` into the int 5 for an int key and
   a number into its text for a string key, both without loss, and rejects ``abc`` for an int key
   when composing. Bool keys are untyped in the node, so ``workload.offline=2`` reaches this pass
   and fails instead of becoming ``true``.)
2. the merge: ``OmegaConf.merge(OmegaConf.structured(Params), config)``, key by key at every depth
   as Hydra merges a YAML file or an override (``prompt_len: {mean: 300}`` changes that key only; a
   list such as ``tenants`` replaces the default list, each entry starting from the
   :class:`~kvrl.workloads.params.TenantParams` defaults), then ``OmegaConf.to_object``;
3. values: finite numbers within the field's bounds, choices, list lengths, non-empty names, then
   what the nested specs check themselves (a uniform length needs low and high, ...).
"""
from __future__ import annotations

import dataclasses
import functools
import math
import typing
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

from .errors import WorkloadConfigError
from .params import ArrivalParams, CommonParams, LengthParams, TenantParams

SCHEMA_GROUP = "workload_schema"


@dataclass(frozen=True)
class BuildContext:
    """What a builder gets besides its Params: the random seed, the vocabulary (token ids are drawn
    in ``[0, vocab_size)``) and the model's length limit in tokens (None = unknown)."""

    seed: int
    vocab_size: int
    max_model_len: Optional[int]


@dataclass(frozen=True)
class WorkloadSpec:
    """A registered builder. ``sized``: its own keys say how many requests it makes (a generator);
    False for trace loaders, whose size is the file's."""

    name: str
    doc: str
    params_cls: type
    build: Callable[[Any, BuildContext], list]
    sized: bool = True


BUILDERS: dict[str, WorkloadSpec] = {}


def register_workload(name: str, params_cls: type, doc: str, sized: bool = True) -> Callable:
    """Decorator registering ``build(params, ctx) -> list[Request]`` as workload ``name``, whose
    config keys are the fields of ``params_cls`` (a dataclass) plus the common keys. Registering the
    same function again is a no-op (a module imported twice); another one under a taken name raises
    ``ValueError``."""
    if not dataclasses.is_dataclass(params_cls):
        raise TypeError(f"workload {name!r}: Params must be a dataclass")
    clash = {f.name for f in dataclasses.fields(params_cls)} & ({"name"} | _names(CommonParams))
    if clash:
        raise TypeError(f"workload {name!r}: Params may not declare {sorted(clash)} (the common keys)")

    def decorate(build: Callable) -> Callable:
        old = BUILDERS.get(name)
        if old is not None and old.build.__qualname__ != build.__qualname__:
            raise ValueError(f"workload {name!r} is already registered by {old.build.__module__}."
                             f"{old.build.__qualname__}")
        BUILDERS[name] = WorkloadSpec(name, doc, params_cls, build, sized)
        _store_in_hydra(name, params_cls)
        return build
    return decorate


def _names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def schema_fields(name: str) -> list[dataclasses.Field]:
    """The config keys of builder ``name`` in file order: its Params fields, then the common ones."""
    return [*dataclasses.fields(BUILDERS[name].params_cls), *dataclasses.fields(CommonParams)]


def _store_in_hydra(name: str, params_cls: type) -> None:
    """Store ``name`` + the builder's fields + the common fields as ``workload_schema/<name>``; bool
    fields as ``Any`` (OmegaConf would turn 2 or 'yes' into true: pass 1 checks them instead)."""
    from hydra.core.config_store import ConfigStore

    hints = typing.get_type_hints(params_cls) | typing.get_type_hints(CommonParams)
    node_fields = [("name", str, dataclasses.field(default=name))]
    for f in schema_fields(name):
        default = (dataclasses.field(default=f.default) if f.default is not dataclasses.MISSING
                   else dataclasses.field(default_factory=f.default_factory))
        node_fields.append((f.name, Any if hints[f.name] is bool else hints[f.name], default))
    node = dataclasses.make_dataclass(f"{params_cls.__name__}Node", node_fields)
    ConfigStore.instance().store(group=SCHEMA_GROUP, name=name, node=node)


# ------------------------------------------------------------------------------ pass 1: keys and types
_KINDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def _unwrap(hint: Any) -> tuple[Any, bool]:
    """``(hint without Optional, nullable)``."""
    if typing.get_origin(hint) is typing.Union:
        rest = [a for a in typing.get_args(hint) if a is not type(None)]
        return rest[0], True
    return hint, False


def describe(f: dataclasses.Field, hint: Any) -> str:
    """What field ``f`` accepts, for messages (``a number > 0 or null``)."""
    base, nullable = _unwrap(hint)
    item = typing.get_args(base)[0] if typing.get_origin(base) is list else None
    if item is not None:
        text = "a list of mappings" if dataclasses.is_dataclass(item) else (
            "a list of numbers" if item is float else "a list of strings")
    else:
        text = "a mapping" if dataclasses.is_dataclass(base) else _KINDS[base]
    m = f.metadata
    if m.get("choices"):
        text = "one of " + ", ".join(map(str, m["choices"]))
    if m.get("length"):
        text += f" of length {m['length']}"
    bounds = [f"{op} {m[k]:g}" for k, op in (("gt", ">"), ("lo", ">="), ("hi", "<=")) if m.get(k) is not None]
    if bounds:
        text += " " + " and ".join(bounds)
    return text + (" or null" if nullable else "")


def _bad(where: str, key: str, f: dataclasses.Field, hint: Any, v: Any) -> WorkloadConfigError:
    return WorkloadConfigError(f"{where}: key {key!r} expects {describe(f, hint)}, got {v!r} ({type(v).__name__})")


def _scalar_ok(t: Any, v: Any) -> bool:
    if isinstance(v, bool):
        return t is bool
    if t is float:
        return isinstance(v, (int, float))
    return isinstance(v, t)


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def check_types(where: str, cls: type, cfg: Mapping[str, Any], prefix: str = "") -> None:
    """Pass 1 over mapping ``cfg`` against dataclass ``cls`` (module docs)."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = _hints(cls)
    for k, v in cfg.items():
        if k not in fields:
            known = ", ".join(prefix + n for n in fields)
            raise WorkloadConfigError(f"{where}: unknown key {prefix + str(k)!r} (known: {known})")
        f, hint = fields[k], hints[k]
        base, nullable = _unwrap(hint)
        if v is None:
            if not nullable:
                raise _bad(where, prefix + k, f, hint, v)
        elif dataclasses.is_dataclass(base):
            if not isinstance(v, Mapping):
                raise _bad(where, prefix + k, f, hint, v)
            check_types(where, base, v, f"{prefix}{k}.")
        elif typing.get_origin(base) is list:
            item = typing.get_args(base)[0]
            if not isinstance(v, (list, tuple)) or (dataclasses.is_dataclass(item) and not v):
                raise _bad(where, prefix + k, f, hint, v)
            for i, x in enumerate(v):
                if dataclasses.is_dataclass(item):
                    if not isinstance(x, Mapping):
                        raise WorkloadConfigError(f"{where}: key '{prefix}{k}.{i}' expects a mapping, got {x!r}")
                    check_types(where, item, x, f"{prefix}{k}.{i}.")
                elif not _scalar_ok(item, x):
                    raise _bad(where, prefix + k, f, hint, v)
        elif not _scalar_ok(base, v):
            raise _bad(where, prefix + k, f, hint, v)


# ------------------------------------------------------------------------------ pass 2: merge
@functools.lru_cache(maxsize=None)
def _defaults_node(cls: type) -> Any:
    """``OmegaConf.structured(cls)``, built once per class (the costly part; merging copies it)."""
    from omegaconf import OmegaConf
    return OmegaConf.structured(cls)


def merge(where: str, cls: type, cfg: Mapping[str, Any]) -> Any:
    """Pass 2: ``cfg`` merged onto ``cls``'s defaults by OmegaConf, as an instance of ``cls``."""
    from omegaconf import OmegaConf, errors

    try:
        return OmegaConf.to_object(OmegaConf.merge(_defaults_node(cls), dict(cfg)))
    except errors.OmegaConfBaseException as exc:       # pass 1 lets none through; kept for safety
        raise WorkloadConfigError(f"{where}: key {exc.full_key!r}: {str(exc.msg).splitlines()[0]}") from None


# ------------------------------------------------------------------------------ pass 3: values
def _number_ok(m: Mapping[str, Any], x: float) -> bool:
    return (math.isfinite(x) and (m.get("lo") is None or x >= m["lo"]) and (m.get("gt") is None or x > m["gt"])
            and (m.get("hi") is None or x <= m["hi"]))


def check_values(where: str, obj: Any, prefix: str = "") -> None:
    """Pass 3 over a Params instance (module docs), nested specs included."""
    hints = _hints(type(obj))
    for f in dataclasses.fields(obj):
        v, key, m = getattr(obj, f.name), prefix + f.name, f.metadata
        if v is None:
            continue
        if dataclasses.is_dataclass(v):
            check_values(where, v, f"{key}.")
            _check_spec(where, key, v)
        elif isinstance(v, list) and v and dataclasses.is_dataclass(v[0]):
            for i, x in enumerate(v):
                check_values(where, x, f"{key}.{i}.")
                _check_spec(where, f"{key}.{i}", x)
        else:
            items = v if isinstance(v, list) else [v]
            ok = all(_number_ok(m, float(x)) for x in items if isinstance(x, (int, float)) and not isinstance(x, bool))
            ok = ok and (m.get("length") is None or len(v) == m["length"])
            ok = ok and (m.get("choices") is None or v in m["choices"])
            ok = ok and not (isinstance(v, str) and not v and m.get("choices") is None)
            if not ok:
                raise _bad(where, key, f, hints[f.name], v)


def _check_spec(where: str, key: str, spec: Any) -> None:
    """What the nested spec's own class checks (``uniform lengths need low and high``, ...)."""
    from .arrivals import ArrivalProcess
    from .generators import TenantSpec
    from .lengths import LengthDist

    make = {LengthParams: LengthDist.from_spec, TenantParams: TenantSpec.from_spec,
            ArrivalParams: lambda d: ArrivalProcess(**d)}.get(type(spec))
    if make is None:
        return
    try:
        make(dataclasses.asdict(spec))
    except (ValueError, TypeError) as e:
        raise WorkloadConfigError(f"{where}: key {key!r}: {e}") from None


# ------------------------------------------------------------------------------ API
def resolve(cfg: Mapping[str, Any]) -> tuple[WorkloadSpec, Any, CommonParams]:
    """Validate a plain workload config (``name`` + the builder's keys + the common keys); returns
    the builder's spec, its Params and the CommonParams (module docs)."""
    from . import builders  # noqa: F401  (registers the built-in builders)

    name = cfg.get("name")
    known = ", ".join(BUILDERS)
    if name is None:
        raise WorkloadConfigError(f"workload config: key 'name' is required (one of {known})")
    if not isinstance(name, str) or name not in BUILDERS:
        raise WorkloadConfigError(f"workload config: key 'name' must be one of {known}, got {name!r}")
    spec, where = BUILDERS[name], f"workload {name!r}"
    own, common = _names(spec.params_cls), _names(CommonParams)
    for k in cfg:
        if k != "name" and k not in own and k not in common:
            known = ", ".join(["name", *(f.name for f in schema_fields(name))])
            raise WorkloadConfigError(f"{where}: unknown key {k!r} (known: {known})")
    parts = []
    for cls, names in ((spec.params_cls, own), (CommonParams, common)):
        part = {k: v for k, v in cfg.items() if k in names}
        check_types(where, cls, part)
        obj = merge(where, cls, part)
        check_values(where, obj)
        parts.append(obj)
    params, com = parts
    if abs(sum(com.split_fractions) - 1.0) > 1e-6:
        raise WorkloadConfigError(f"{where}: key 'split_fractions' must sum to 1, got {com.split_fractions}")
    return spec, params, com


def as_kwargs(params: Any) -> dict[str, Any]:
    """A Params instance as keyword arguments of a generator: fields by name, nested specs as dicts."""
    return {f.name: _plain(getattr(params, f.name)) for f in dataclasses.fields(params)}


def _plain(v: Any) -> Any:
    if dataclasses.is_dataclass(v):
        return dataclasses.asdict(v)
    if isinstance(v, list):
        return [_plain(x) for x in v]
    return v
