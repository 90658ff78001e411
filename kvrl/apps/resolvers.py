"""OmegaConf resolvers used by the apps' configs (``conf/*.yaml``); registered on import of
:mod:`kvrl.apps`, so before Hydra composes any app's config.

* ``${kvrl.stamp:}``: a run directory name unique to this launch, ``HH-MM-SS-ffffff-xxxx`` (local
  time to the microsecond, then 4 random hex digits), so two apps started at the same moment never
  share a directory. Cached like Hydra's ``${now:...}``: every read within one config (and the jobs
  of one sweep, which copy the launcher's cache) sees the same name.
* ``${kvrl.trace_cap:NAME,N}``: ``N`` when workload ``NAME`` is a trace (its size is the file's),
  ``None`` when its own keys say how many requests it makes (a generator's ``num_requests``,
  ``horizon_s``, ...): a default ``max_requests`` that caps long traces but never a generator.
"""
from __future__ import annotations

import datetime
import secrets
from typing import Optional

from omegaconf import OmegaConf


def run_stamp() -> str:
    """``HH-MM-SS-ffffff-xxxx``: the local time to the microsecond and 4 random hex digits."""
    return f"{datetime.datetime.now():%H-%M-%S-%f}-{secrets.token_hex(2)}"


def trace_cap(name: str, cap: Optional[int]) -> Optional[int]:
    """``cap`` for a trace workload ``name``, None for a generator (or an unknown name, which the
    workload registry then reports)."""
    from kvrl.workloads import BUILDERS

    builder = BUILDERS.get(name)
    if builder is None or builder.sized or cap is None:
        return None
    return int(cap)


def register() -> None:
    """Register the resolvers (idempotent)."""
    for name, fn, cache in (("kvrl.stamp", run_stamp, True), ("kvrl.trace_cap", trace_cap, False)):
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn, use_cache=cache)
