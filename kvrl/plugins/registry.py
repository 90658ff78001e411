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

Third-party packages expose plugins through the entry-point group ``kvrl.plugins``; each entry
point names a module (or object) whose import registers plugins. Discovery is lazy (first lookup
of an unknown name, or :func:`load_entry_points`), idempotent and per process, so worker
processes of a parallel sweep load them again on their own.
"""
from __future__ import annotations

import dataclasses
import importlib.metadata
import logging
from dataclasses import dataclass
from typing import Any, Callable, Mapping

log = logging.getLogger(__name__)

KINDS = ("scheduler", "watermark", "eviction", "prefix_cache")
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


_registry: dict[str, dict[str, PluginSpec]] = {kind: {} for kind in KINDS}
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
    node_cls = dataclasses.make_dataclass(
        f"{params_cls.__qualname__.replace('.', '_')}_{kind}_{name}",
        [("name", str, dataclasses.field(default=name))],
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


def make_params(kind: str, name: str, **params: Any) -> Any:
    """Build and validate the ``Params`` dataclass of a plugin from keyword arguments."""
    spec = get_spec(kind, name)
    known = {f.name for f in dataclasses.fields(spec.params_cls)}
    unknown = sorted(set(params) - known)
    if unknown:
        raise ValueError(f"{kind}={name}: unknown parameter(s) {unknown}; known: {sorted(known) or 'none'}")
    try:
        return spec.params_cls(**params)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{kind}={name}: {exc}") from exc


def create(kind: str, name: str, **params: Any) -> Any:
    """Instantiate the plugin ``(kind, name)`` with validated parameters."""
    spec = get_spec(kind, name)
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
