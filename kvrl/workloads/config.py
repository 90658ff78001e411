"""Workload configs: validation against the builders' schemas (:mod:`kvrl.workloads.builders`), and ``build_workload``.

A config is a flat mapping (a plain dict or an OmegaConf ``DictConfig``, e.g. ``cfg.workload`` from
``conf/workload/<name>.yaml``) with ``name`` (the builder), the builder's parameters, and the common
transform keys of :data:`COMMON`. Unknown keys and values of the wrong type raise
:class:`~kvrl.workloads.errors.WorkloadConfigError` (a ``ValueError``) naming the key.
"""
from __future__ import annotations

import importlib.resources
import logging
import os
from typing import Any, Callable, Mapping, Optional, Sequence

from kvrl.engine.request import Request

from . import generators, transforms
from .arrivals import ArrivalProcess
from .builders import ARRIVAL, BUILDERS, COMMON, COMMON_ORDER_NOTE, LENGTH, TENANT, WORKLOADS
from .errors import WorkloadConfigError
from .lengths import LengthDist
from .schema import Param, defaults, render_yaml, validate
from .tokens import check_vocab_size

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------ API
def schema_for(name: str) -> dict[str, Param]:
    """The full schema (builder parameters then common keys) of builder ``name``."""
    if name not in BUILDERS:
        raise WorkloadConfigError(f"unknown workload name {name!r} (known: {', '.join(WORKLOADS)})")
    return {"name": COMMON["name"], **BUILDERS[name].params,
            **{k: p for k, p in COMMON.items() if k != "name"}}


def default_config(name: str) -> dict[str, Any]:
    """Every key of builder ``name`` at its default (what ``conf/workload/<name>.yaml`` holds)."""
    d = defaults(schema_for(name))
    d["name"] = name
    return d


def _to_plain(cfg: Any) -> Mapping[str, Any]:
    try:
        from omegaconf import DictConfig, OmegaConf
    except ImportError:  # pragma: no cover
        DictConfig = ()
    if DictConfig and isinstance(cfg, DictConfig):
        cfg = OmegaConf.to_container(cfg, resolve=True)
    if not isinstance(cfg, Mapping):
        raise WorkloadConfigError(f"a workload config must be a mapping, got {type(cfg).__name__}")
    return cfg


def resolve_config(cfg: Any) -> dict[str, Any]:
    """Validate a workload config and fill in defaults; returns a new plain dict."""
    cfg = _to_plain(cfg)
    name = cfg.get("name")
    if name is None:
        raise WorkloadConfigError(f"workload config: key 'name' is required "
                                  f"(one of {', '.join(WORKLOADS)})")
    if not isinstance(name, str) or name not in BUILDERS:
        raise WorkloadConfigError(f"workload config: key 'name' must be one of "
                                  f"{', '.join(WORKLOADS)}, got {name!r}")
    where = f"workload {name!r}"
    params = validate(cfg, schema_for(name), where)
    # semantic checks of nested specs, reported with their key
    for key, p in schema_for(name).items():
        if p.kind == "dict" and p.fields is LENGTH:
            _semantic(where, key, lambda v=params[key]: LengthDist.from_spec(v))
        elif p.kind == "dict" and p.fields is ARRIVAL:
            _semantic(where, key, lambda v=params[key]: ArrivalProcess(**v))
        elif p.kind == "dict" and p.fields is TENANT:
            _semantic(where, key, lambda v=params[key]: generators.TenantSpec.from_spec(v))
        elif p.kind == "dicts" and p.fields is TENANT:
            for i, t in enumerate(params[key]):
                _semantic(where, f"{key}.{i}", lambda v=t: generators.TenantSpec.from_spec(v))
    if abs(sum(params["split_fractions"]) - 1.0) > 1e-6:
        raise WorkloadConfigError(f"{where}: key 'split_fractions' must sum to 1, "
                                  f"got {params['split_fractions']}")
    return params


def _semantic(where: str, key: str, fn: Callable[[], Any]) -> None:
    try:
        fn()
    except (ValueError, TypeError) as e:
        raise WorkloadConfigError(f"{where}: key {key!r}: {e}") from None


class Workload(list):
    """The requests a workload config built (a ``list[Request]`` sorted by arrival), plus what its
    transforms changed: ``dropped`` = ``(request_id, reason)`` of every request ``overlong: drop``
    removed; ``clipped`` = how many requests ``overlong: clip`` shortened (each carries
    ``Request.clipped``); ``overlong`` = how many kept requests exceed ``max_model_len`` (with
    ``overlong: reject`` the engine rejects them); ``truncated`` = requests ``max_requests`` cut."""

    def __init__(self, requests=(), *, dropped=(), overlong: int = 0, truncated: int = 0):
        super().__init__(requests)
        self.dropped = list(dropped)
        self.clipped = sum(1 for r in self if r.clipped)
        self.overlong = overlong
        self.truncated = truncated


def apply_common(requests: Sequence[Request], params: Mapping[str, Any],
                 max_model_len: Optional[int] = None) -> Workload:
    """The common transforms, in a fixed order (see the module docs); logs every request count they
    change (max_requests, overlong)."""
    where = f"workload {params.get('name')!r}"
    reqs = list(requests)
    if params["start_s"] or params["duration_s"] is not None:
        reqs = transforms.time_window(reqs, params["start_s"], params["duration_s"])
    if params["split"] is not None:
        reqs = transforms.select_split(reqs, params["split"], params["split_fractions"])
    if params["subsample"] is not None:
        reqs = transforms.subsample(reqs, params["subsample"], params["seed"])
    reqs = transforms.scale_rate(reqs, params["rate_scale"])
    before = len(reqs)
    reqs = transforms.take(reqs, params["max_requests"])
    truncated = before - len(reqs)
    if truncated:
        log.info("%s: max_requests=%d keeps the first %d of %d requests", where,
                 params["max_requests"], len(reqs), before)
    dropped: list[tuple[str, str]] = []
    overlong = 0
    if max_model_len is not None:
        mode = params["overlong"]
        n = len(reqs)
        reqs, dropped = transforms.fit_lengths(reqs, max_model_len, mode)
        changed = len(dropped) if mode == "drop" else sum(1 for r in reqs if r.clipped)
        overlong = sum(1 for r in reqs if r.prompt_len + r.output_len > max_model_len)
        if mode == "reject" and overlong:
            log.warning("%s: %d of %d requests exceed max_model_len=%d (prompt + output); "
                        "workload.overlong=reject: the engine rejects them, with the reason in "
                        "requests.csv (overlong=clip or drop changes them instead)", where,
                        overlong, n, max_model_len)
        elif changed:
            log.warning("%s: workload.overlong=%s %s %d of %d requests longer than max_model_len=%d "
                        "(per request in requests.csv; metrics '%s')", where, mode,
                        "clipped" if mode == "clip" else "dropped", changed, n, max_model_len,
                        "clipped" if mode == "clip" else "dropped")
    if params["offline"]:
        reqs = transforms.make_offline(reqs)
    reqs = transforms.with_default_slos(reqs, params["slo_ttft_s"], params["slo_tpot_s"])
    return Workload(reqs, dropped=dropped, overlong=overlong, truncated=truncated)


def build_workload(cfg: Mapping, *, vocab_size: int,
                   max_model_len: Optional[int] = None) -> Workload:
    """Build the requests a workload config describes (sorted by arrival, unique ids, validated).

    ``vocab_size`` bounds random token ids; ``max_model_len`` (if given) applies ``overlong`` to
    requests longer than the model accepts (``reject`` keeps them for the engine to reject,
    ``clip`` shortens, ``drop`` removes them; counts logged and kept on the result) and sizes
    max-length adversarial requests. Returns a :class:`Workload` (a ``list[Request]``).
    Raises ``ValueError`` (:class:`WorkloadConfigError` for config problems, ``TraceFormatError``
    for bad trace files).
    """
    params = resolve_config(cfg)
    vocab_size = check_vocab_size(vocab_size)
    if max_model_len is not None and (isinstance(max_model_len, bool)
                                      or not isinstance(max_model_len, int) or max_model_len < 2):
        raise ValueError(f"max_model_len must be an integer >= 2 or None, got {max_model_len!r}")
    builder = BUILDERS[params["name"]]
    reqs = apply_common(builder.make(params, vocab_size, max_model_len), params, max_model_len)
    seen = set()
    for r in reqs:
        r.validate()
        if r.request_id in seen:
            raise ValueError(f"workload {params['name']!r}: duplicate request id {r.request_id!r}")
        seen.add(r.request_id)
    if not reqs:
        raise ValueError(f"workload {params['name']!r} has no requests after its transforms "
                         f"(check max_requests, split, start_s/duration_s, subsample"
                         f"{', overlong' if reqs.dropped else ''})")
    return reqs


def workload_yaml(name: str) -> str:
    """The commented YAML of builder ``name`` at its defaults (the ``conf/workload`` file)."""
    schema = schema_for(name)
    b = BUILDERS[name]
    header = (f"Workload '{name}': {b.doc}.\n"
              f"Build: kvrl.workloads.build_workload(cfg.workload, vocab_size=..., max_model_len=...)\n"
              f"Docs: docs/workloads.md. The keys from 'seed' on are the common transforms;\n"
              f"{COMMON_ORDER_NOTE}.")
    return render_yaml(schema, default_config(name), header=header)


def workload_config_path(name: str) -> str:
    """Path of ``conf/workload/<name>.yaml`` inside the installed ``kvrl.conf`` package."""
    return str(importlib.resources.files("kvrl.conf").joinpath("workload", f"{name}.yaml"))


def load_workload_config(name_or_path: str, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Load a workload YAML by name (``conf/workload/<name>.yaml``) or path, apply dotted
    ``key=value`` overrides (OmegaConf syntax), and return a plain dict."""
    from omegaconf import OmegaConf

    path = name_or_path
    if not os.path.isfile(path):
        path = workload_config_path(name_or_path)
        if not os.path.isfile(path):
            raise ValueError(f"{name_or_path!r} is neither a file nor a workload config "
                             f"(known: {', '.join(sorted(available_workload_configs()))})")
    cfg = OmegaConf.load(path)
    if overrides:
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(list(overrides)))
    return OmegaConf.to_container(cfg, resolve=True)


def available_workload_configs() -> list[str]:
    d = importlib.resources.files("kvrl.conf").joinpath("workload")
    try:
        return sorted(p.name[:-5] for p in d.iterdir() if p.name.endswith(".yaml"))
    except (FileNotFoundError, NotADirectoryError):
        return []
