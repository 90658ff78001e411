"""One registry for the four policy kinds, with entry-point discovery and Hydra ConfigStore nodes.

A plugin is a class registered under ``(kind, name)``::

    @kvrl.plugins.register("eviction", "my_policy")
    class MyPolicy(EvictionPolicy):
        @dataclass
        class Params:
            mode: str = "recompute"
        ...

Registration also stores the plugin's ``Params`` dataclass in Hydra's ConfigStore under the group
``<kind>`` with the option name ``<name>`` (plus a ``name`` field), so ``eviction=my_policy
eviction.mode=swap`` works on any kvrl Hydra app with no YAML, with OmegaConf type checking.

Parameters are validated the same way for built-in and third-party plugins when a plugin is
created (:func:`validate_params`, after the dataclass's own ``__post_init__``), from the field
declarations alone:

- ``Literal["a", "b"]`` fields accept only those values (``mode: Literal["recompute", "swap"]``);
- ``bool``, ``int``, ``float`` and ``str`` fields accept only values of that type (an int is a
  float; ``Optional[...]`` also accepts None);
- ``field(default=..., metadata={"range": (lo, hi)})`` bounds a number (either end may be None).

Errors name the key (``eviction.mode must be one of [...], got 'swapp'``). A plugin that misses an
abstract method of its kind (or misspells it) fails at creation, naming the method.

Third-party packages expose plugins through the entry-point group ``kvrl.plugins``; each entry
point names a module (or object) whose import registers plugins. Discovery is lazy (first lookup
of an unknown name, or :func:`load_entry_points`), idempotent and per process, so worker
processes of a parallel sweep load them again on their own.
"""
from __future__ import annotations

import dataclasses
import importlib.metadata
import logging
import numbers
import typing
from dataclasses import dataclass
from typing import Any, Callable, Dict, Literal, Mapping, Optional

from kvrl.plugins.base import check_choice, check_range

log = logging.getLogger(__name__)

KINDS = ("scheduler", "watermark", "eviction", "prefix_cache")
#: kinds a config may leave out (then the named default is built): ``tier`` (issue #20, kvrl.plugins.tiers)
OPTIONAL_KINDS = {"tier": "offload_all"}
ENTRY_POINT_GROUP = "kvrl.plugins"


class UnknownPluginError(KeyError):
    """An unknown plugin kind or name; the message lists the known ones."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message readable
        return str(self.args[0])


@dataclass(frozen=True)
class PluginSpec:
    kind: str
    name: str
    cls: type
    params_cls: type


_registry: dict[str, dict[str, PluginSpec]] = {kind: {} for kind in (*KINDS, *OPTIONAL_KINDS)}
_entry_points_loaded = False


@dataclass
class NoParams:
    """Parameters of a plugin that takes none."""


def _check_kind(kind: str) -> None:
    if kind not in _registry:
        raise UnknownPluginError(f"unknown plugin kind {kind!r}; known kinds: {', '.join(KINDS)}")


def register(kind: str, name: str) -> Callable[[type], type]:
    """Class decorator registering a plugin under ``(kind, name)``.

    The class's nested ``Params`` dataclass (or :class:`NoParams`) declares its parameters.
    Registering the same class twice is a no-op (modules may be imported again); a different
    class under a taken name raises ``ValueError``.
    """
    _check_kind(kind)

    def decorate(cls: type) -> type:
        params_cls = getattr(cls, "Params", NoParams)
        if not dataclasses.is_dataclass(params_cls):
            raise TypeError(f"{cls.__name__}.Params must be a dataclass")
        if any(f.name == "name" for f in dataclasses.fields(params_cls)):
            raise TypeError(f"{cls.__name__}.Params may not declare a field called 'name'")
        old = _registry[kind].get(name)
        if old is not None and old.cls.__qualname__ != cls.__qualname__:
            raise ValueError(f"{kind} plugin {name!r} is already registered by {old.cls.__module__}.{old.cls.__qualname__}")
        _registry[kind][name] = PluginSpec(kind, name, cls, params_cls)
        cls.plugin_kind, cls.plugin_name = kind, name
        _store_in_hydra(kind, name, params_cls)
        return cls

    return decorate


def _store_in_hydra(kind: str, name: str, params_cls: type) -> None:
    """Store ``Params`` + a ``name`` field as the Hydra config option ``<kind>=<name>``."""
    try:
        from hydra.core.config_store import ConfigStore
    except ImportError:  # Hydra is a dependency; tolerate its absence for library-only use
        return
    # OmegaConf has no Literal type: such fields are stored as their values' type (validated at create)
    overrides = []
    for f, hint in _field_hints(params_cls).items():
        if typing.get_origin(hint) is Literal:
            types = {type(v) for v in typing.get_args(hint)}
            default = (dataclasses.field(default=f.default) if f.default is not dataclasses.MISSING
                       else dataclasses.field(default_factory=f.default_factory))
            overrides.append((f.name, types.pop() if len(types) == 1 else Any, default))
    node_cls = dataclasses.make_dataclass(
        f"{params_cls.__qualname__.replace('.', '_')}_{kind}_{name}",
        [("name", str, dataclasses.field(default=name)), *overrides],
        bases=(params_cls,),
    )
    ConfigStore.instance().store(group=kind, name=name, node=node_cls)


def load_entry_points(force: bool = False) -> None:
    """Import every module named in the ``kvrl.plugins`` entry-point group (once per process)."""
    global _entry_points_loaded
    if _entry_points_loaded and not force:
        return
    _entry_points_loaded = True
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            ep.load()
        except Exception as exc:  # a broken third-party plugin must not take the built-ins down
            log.warning("could not load kvrl plugin entry point %s = %s: %s", ep.name, ep.value, exc)


def _ensure_builtins() -> None:
    from kvrl.plugins import builtins  # noqa: F401  (registers the built-ins)


def available(kind: str) -> list[str]:
    """Sorted names of the registered plugins of ``kind`` (built-ins and entry points)."""
    _check_kind(kind)
    _ensure_builtins()
    load_entry_points()
    return sorted(_registry[kind])


def get_spec(kind: str, name: str) -> PluginSpec:
    _check_kind(kind)
    _ensure_builtins()
    if name not in _registry[kind]:
        load_entry_points()
    if name not in _registry[kind]:
        raise UnknownPluginError(
            f"unknown {kind} plugin {name!r}; known {kind} plugins: {', '.join(sorted(_registry[kind]))}")
    return _registry[kind][name]


def _field_hints(params_cls: type) -> dict:
    """``{field: resolved type hint}`` of a Params dataclass (string annotations resolved)."""
    try:
        hints = typing.get_type_hints(params_cls)
    except Exception:     # an annotation that cannot be resolved: validate what __post_init__ does only
        hints = {}
    return {f: hints[f.name] for f in dataclasses.fields(params_cls) if f.name in hints}


def _check_type(key: str, value: Any, hint: Any) -> None:
    origin = typing.get_origin(hint)
    if origin is Literal:
        check_choice(key, value, typing.get_args(hint))
        return
    if origin is typing.Union:
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            _check_type(key, value, rest[0])
        return
    expected = {bool: (bool,), int: (numbers.Integral,), float: (numbers.Real,), str: (str,)}.get(hint)
    if expected is None:
        return
    if not isinstance(value, expected) or (hint is not bool and isinstance(value, bool)):
        raise ValueError(f"{key} must be of type {hint.__name__}, got {value!r}")


def validate_params(kind: str, params: Any) -> None:
    """Check a Params instance against its field declarations (see module doc); ``ValueError``
    names the key as ``<kind>.<field>``."""
    for f, hint in _field_hints(type(params)).items():
        key, value = f"{kind}.{f.name}", getattr(params, f.name)
        _check_type(key, value, hint)
        bounds = f.metadata.get("range")
        if bounds is not None and value is not None:
            check_range(key, value, *bounds)


def make_params(kind: str, name: str, **params: Any) -> Any:
    """Build and validate the ``Params`` dataclass of a plugin from keyword arguments."""
    spec = get_spec(kind, name)
    known = {f.name for f in dataclasses.fields(spec.params_cls)}
    unknown = sorted(set(params) - known)
    if unknown:
        raise ValueError(f"{kind}={name}: unknown parameter(s) {unknown}; known: {sorted(known) or 'none'}")
    try:
        made = spec.params_cls(**params)
        validate_params(kind, made)
        return made
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{kind}={name}: {exc}") from exc


def inner_plugin_spec(kind: str, inner: str, inner_params: Optional[Dict[str, Any]], shortcut: str = "",
                      shortcut_value: Any = None, shortcut_param: str = "",
                      shortcut_inner: tuple[str, ...] = ()) -> tuple[str, dict]:
    """The ``(name, params)`` of a plugin that wraps another of ``kind`` (its ``inner``): the inner name and
    ``inner_params`` validated now, errors naming ``inner``, with a one-parameter shortcut merged in
    (``shortcut`` = ``shortcut_value`` sets the inner's ``shortcut_param``, allowed for ``shortcut_inner``
    only)."""
    if not isinstance(inner, str) or not inner:
        raise ValueError(f"inner must be the name of a {kind} plugin, got {inner!r}")
    if inner_params is not None and not isinstance(inner_params, dict):
        try:
            inner_params = dict(inner_params)
        except (TypeError, ValueError):
            raise ValueError(f"inner_params must be a mapping of parameter names to values, got {inner_params!r}") from None
    params = dict(inner_params or {})
    if shortcut_value is not None:
        if inner not in shortcut_inner:
            raise ValueError(f"{shortcut} applies to inner={'|'.join(shortcut_inner)} only (inner={inner!r}); "
                             f"set inner_params instead")
        if shortcut_param in params and params[shortcut_param] != shortcut_value:
            raise ValueError(f"{shortcut}={shortcut_value!r} contradicts inner_params.{shortcut_param}="
                             f"{params[shortcut_param]!r}")
        params[shortcut_param] = shortcut_value
    try:
        make_params(kind, inner, **params)   # validates now, naming the key
    except UnknownPluginError as exc:
        raise ValueError(f"inner: {exc}") from None
    except (TypeError, ValueError) as exc:
        raise ValueError(f"inner: {exc}") from None
    return inner, params


def create(kind: str, name: str, **params: Any) -> Any:
    """Instantiate the plugin ``(kind, name)`` with validated parameters. A plugin class that does
    not implement every abstract method of its kind raises ``TypeError`` naming them."""
    spec = get_spec(kind, name)
    missing = sorted(getattr(spec.cls, "__abstractmethods__", ()))
    if missing:
        raise TypeError(f"{kind} plugin {name!r} ({spec.cls.__module__}.{spec.cls.__qualname__}) does not implement "
                        f"{', '.join(missing)} (required by {kind} plugins; misspelt?)")
    return spec.cls(make_params(kind, name, **params))


def create_from_config(kind: str, cfg: Mapping[str, Any]) -> Any:
    """Instantiate from a config node ``{name: ..., <params>}`` (a Hydra group option)."""
    from omegaconf import DictConfig, OmegaConf

    if isinstance(cfg, DictConfig):
        cfg = OmegaConf.to_container(cfg, resolve=True)
    cfg = dict(cfg)
    if "name" not in cfg:
        raise ValueError(f"{kind} config needs a 'name' (one of {available(kind)})")
    name = cfg.pop("name")
    return create(kind, name, **cfg)
