"""Workload configs: ``resolve_config`` (validation against the builders' Params,
:mod:`kvrl.workloads.registry`) and ``build_workload``.

A config is a mapping (a plain dict or an OmegaConf ``DictConfig``, e.g. ``cfg.workload`` from
``conf/workload/<name>.yaml``) with ``name`` (the builder), the builder's parameters and the common
transform keys (:class:`~kvrl.workloads.params.CommonParams`). Unknown keys and values of the wrong
type raise :class:`~kvrl.workloads.errors.WorkloadConfigError` (a ``ValueError``) naming the key.
"""
from __future__ import annotations

import dataclasses
import importlib.resources
import logging
import os
from typing import Any, Mapping, Optional, Sequence

from kvrl.engine.request import Request

from . import builders, transforms  # noqa: F401  (builders: registers the built-in workloads)
from .errors import WorkloadConfigError
from .registry import BUILDERS, BuildContext, resolve
from .tokens import check_vocab_size

log = logging.getLogger(__name__)
WORKLOADS = tuple(BUILDERS)


# ------------------------------------------------------------------------------ API
def default_config(name: str) -> dict[str, Any]:
    """Every key of builder ``name`` at its default (what ``conf/workload/<name>.yaml`` holds)."""
    if name not in BUILDERS:
        raise WorkloadConfigError(f"unknown workload name {name!r} (known: {', '.join(WORKLOADS)})")
    return resolve_config({"name": name})


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
    """Validate a workload config and fill in defaults; returns a new plain dict (``name``, the
    builder's keys, the common keys)."""
    spec, params, common = resolve(_to_plain(cfg))
    return {"name": spec.name, **dataclasses.asdict(params), **dataclasses.asdict(common)}


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
    """The common transforms of ``params`` (a resolved config, or the asdict of a
    :class:`CommonParams` plus ``name``), in their fixed order; logs every request count they change
    (max_requests, overlong)."""
    where = f"workload {params.get('name')!r}"
    reqs = list(requests)
    if params["length_hint_sigma"] is not None:
        reqs = transforms.with_length_hints(reqs, params["length_hint_sigma"], params["seed"])
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
    spec, own, common = resolve(_to_plain(cfg))
    params = {"name": spec.name, **dataclasses.asdict(common)}
    vocab_size = check_vocab_size(vocab_size)
    if max_model_len is not None and (isinstance(max_model_len, bool)
                                      or not isinstance(max_model_len, int) or max_model_len < 2):
        raise ValueError(f"max_model_len must be an integer >= 2 or None, got {max_model_len!r}")
    ctx = BuildContext(seed=common.seed, vocab_size=vocab_size, max_model_len=max_model_len)
    reqs = apply_common(spec.build(own, ctx), params, max_model_len)
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
    from .conf_yaml import render
    return render(name)


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
    cfg.pop("defaults", None)          # the schema line of conf/workload/<name>.yaml (Hydra's)
    if overrides:
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(list(overrides)))
    return OmegaConf.to_container(cfg, resolve=True)


def available_workload_configs() -> list[str]:
    d = importlib.resources.files("kvrl.conf").joinpath("workload")
    try:
        return sorted(p.name[:-5] for p in d.iterdir() if p.name.endswith(".yaml"))
    except (FileNotFoundError, NotADirectoryError):
        return []
