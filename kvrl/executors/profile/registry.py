"""Profiles on disk: :class:`StepProfile` (load, save, refit) and the lookup of the profile that
matches a model shape on a device (``profile=auto|none|<path>``).
"""
from __future__ import annotations

import json
import logging
import math
import os
import statistics
import time
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import NamedTuple, Optional, Sequence, Union

from kvrl.executors.hardware import DeviceSpec, ModelShape
from kvrl.executors.profile.format import (FORMAT, LOADABLE_FIT_VERSIONS, VERSION, ProfileError, ProfileKey,
                                           round_floats)
from kvrl.executors.profile.model import StepModel, fit_model, refit_report


log = logging.getLogger(__name__)

#: the fewest timings of one grid point whose spread :attr:`StepProfile.step_noise` counts
MIN_NOISE_REPS = 5


@dataclass
class StepProfile:
    """A loaded profile: its key, metadata, samples and fitted model."""

    key: ProfileKey
    model: StepModel
    meta: dict
    samples: list
    host_samples: list
    fit_report: dict
    raw_key: dict
    path: Optional[str] = None
    engine_samples: list = field(default_factory=list)   # the engine run's steps (engine_factor)

    def matches(self, shape: ModelShape, device: Union[DeviceSpec, str]) -> bool:
        return ProfileKey.of(shape, device) == self.key

    @cached_property
    def step_noise(self) -> float:
        """How much a live step's time scatters when the same step is timed again: the median over
        the grid samples timed at least :data:`MIN_NOISE_REPS` times of ``ln(t_p90 / t_median) / z_0.9``
        (a lognormal's log-standard deviation, from its 90th percentile); 0.0 where no sample has
        them. A measured input of the sim's per-step jitter (``SimExecutor(step_noise=...)``); computed once per
        loaded profile (kvrl-fidelity asks for it for every jittered sim)."""
        z90 = statistics.NormalDist().inv_cdf(0.9)
        spreads = [math.log(s["t_p90"] / s["t_median"]) / z90 for s in self.samples
                   if s.get("reps", 0) >= MIN_NOISE_REPS and s.get("t_median", 0) > 0 and s.get("t_p90", 0) > 0]
        return max(statistics.median(spreads), 0.0) if spreads else 0.0

    def describe(self) -> str:
        ho = self.fit_report.get("holdout", {})
        err = f", held-out median error {ho['median_abs_rel_err']:.1%}" if ho.get("n") else ""
        return f"{self.path or '<in memory>'} ({self.raw_key.get('gpu_name', self.key.device)}{err})"

    def to_dict(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "key": self.raw_key, "meta": self.meta,
                "samples": self.samples, "host_samples": self.host_samples, "engine_samples": self.engine_samples,
                "model": self.model.to_dict(), "fit": self.fit_report}

    def save(self, path: Union[str, os.PathLike]) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(round_floats(self.to_dict()), separators=(",", ":")))
        os.replace(tmp, path)
        self.path = str(path)

    @classmethod
    def from_dict(cls, d: dict, path: Optional[str] = None) -> "StepProfile":
        if d.get("format") != FORMAT:
            raise ProfileError(f"{path or 'profile'}: not a {FORMAT} file (format={d.get('format')!r})")
        if int(d.get("version", 0)) > VERSION:
            raise ProfileError(f"{path or 'profile'}: version {d.get('version')} is newer than this kvrl ({VERSION})")
        raw_key = dict(d["key"])
        model_d = d.get("model")
        if model_d is None or int(model_d.get("fit_version", 0)) not in LOADABLE_FIT_VERSIONS:
            model = fit_model(d["samples"], d.get("engine_samples", []), d.get("host_samples", ()), d.get("meta", {}))
        else:
            model = StepModel.from_dict(model_d)
        return cls(ProfileKey.from_dict(raw_key), model, d.get("meta", {}), d.get("samples", []),
                   d.get("host_samples", []), d.get("fit", {}), raw_key, path, d.get("engine_samples", []))

    def refitted(self) -> "StepProfile":
        """This profile with its model fitted again from its samples by this kvrl's fitting code."""
        model = fit_model(self.samples, self.engine_samples, self.host_samples, self.meta)
        return replace(self, model=model, path=f"{self.path} (refitted)" if self.path else None)

    @classmethod
    def pooled(cls, profiles: list["StepProfile"]) -> "StepProfile":
        """One profile from several re-profiles of the same code on the same device and shape: their
        grid, held-out and engine-run samples and host rows together, the model fitted once over all
        of them (:func:`fit_model`), the fit report's grid and held-out errors recomputed over the
        pooled samples. A grid point measured in each re-profile then enters the fit once per
        re-profile, so the fit sees the mean of its times, and terms that the samples identify
        only weakly move less from one pooled fit to the next than between single re-profiles.

        Every profile must have the same key (device and model shape), block size and code
        fingerprint (``meta["fingerprint"]["code"]``): a :class:`ProfileError` names the first that
        differs. The pooled profile's ``meta`` is the newest profile's, with ``meta["pooled_from"]``
        listing each source (path, ``created_utc``, sample counts)."""
        if len(profiles) < 2:
            raise ProfileError(f"pooling needs at least two profiles (got {len(profiles)})")
        first = profiles[0]
        fp = lambda p: (p.meta.get("fingerprint") or {}).get("code")
        for p in profiles[1:]:
            name = p.path or "<in memory>"
            if p.key != first.key:
                raise ProfileError(f"cannot pool {name}: its key differs ({'; '.join(first.key.mismatch(p.key))})")
            if p.meta.get("block_size") != first.meta.get("block_size"):
                raise ProfileError(f"cannot pool {name}: block_size {p.meta.get('block_size')} != "
                                   f"{first.meta.get('block_size')}")
            if fp(p) is None or fp(p) != fp(first):
                raise ProfileError(f"cannot pool {name}: meta.fingerprint.code {fp(p)!r} != {fp(first)!r} (only "
                                   f"re-profiles of the same timing code are pooled)")
        newest = max(profiles, key=lambda p: float(p.meta.get("created", 0.0)))
        samples = [s for p in profiles for s in p.samples]
        engine = [s for p in profiles for s in p.engine_samples]
        host = [r for p in profiles for r in p.host_samples]
        meta = dict(newest.meta)
        meta["pooled_from"] = [{"path": p.path, "created_utc": p.meta.get("created_utc"), "samples": len(p.samples),
                                "engine_samples": len(p.engine_samples), "host_samples": len(p.host_samples)}
                               for p in profiles]
        model = fit_model(samples, engine, host, meta)
        report = {"pooled": len(profiles), **refit_report(model, samples, host),
                  "seconds": {"total": sum(float(p.fit_report.get("seconds", {}).get("total", 0.0)) for p in profiles)}}
        return cls(newest.key, model, meta, samples, host, report, dict(newest.raw_key), None, engine)

    @classmethod
    def load(cls, path: Union[str, os.PathLike]) -> "StepProfile":
        path = os.fspath(path)
        try:
            with open(path) as f:
                data = json.load(f)
        except FileNotFoundError:
            raise ProfileError(f"profile file {path!r} does not exist (profile=auto|none|<path>)") from None
        except json.JSONDecodeError as exc:
            raise ProfileError(f"{path}: not valid JSON ({exc})") from None
        return cls.from_dict(data, path)


#: where ``profile: auto`` looks: the profiles shipped with kvrl, then ``$KVRL_PROFILE_PATH``
#: (directories or files, separated by ``os.pathsep``).
PACKAGED_DIR = Path(__file__).resolve().parents[1] / "profiles"


ENV_PATH = "KVRL_PROFILE_PATH"


class IndexedProfile(NamedTuple):
    """What profile lookup needs of a profile file, read once per directory scan."""
    path: str
    key: ProfileKey
    created: float           #: meta.created (seconds since the epoch)
    block_size: int
    step_graphs: bool        #: :func:`profiled_step_graphs`
    cpu_count: Optional[int]  #: meta.cpu_count: the profiling host's ``os.cpu_count()`` (None if not recorded)


#: scanned directories -> their profiles (:func:`_scan`)
_INDEX: dict[tuple[Path, ...], list[IndexedProfile]] = {}
_LOADED: dict[str, StepProfile] = {}
#: shipped subdirectories that hold no host-class profiles
_NOT_HOST_CLASS = ("archive",)


def clear_cache() -> None:
    """Forget the scanned profile directories and loaded profiles (tests; new files)."""
    _INDEX.clear()
    _LOADED.clear()


def search_paths() -> list[Path]:
    paths = [PACKAGED_DIR]
    for p in os.environ.get(ENV_PATH, "").split(os.pathsep):
        if p:
            paths.append(Path(p).expanduser())
    return paths


def host_class_dirs() -> list[Path]:
    """The shipped profile directories of other host classes than the defaults' (``h200x4/``: hosts of
    four H200s), each profile with its host's ``meta.cpu_count``: ``profile=auto`` considers them
    only for a live host of that many CPUs (:func:`resolve_profile`'s ``host_cpus``)."""
    return sorted(d for d in PACKAGED_DIR.iterdir()
                  if d.is_dir() and d.name not in _NOT_HOST_CLASS and not d.name.startswith(("_", ".")))


def _scan(roots: Sequence[Path]) -> list[IndexedProfile]:
    """Every readable profile in ``roots`` (directories: their ``*.json``; files: themselves), cached."""
    key = tuple(roots)
    if key not in _INDEX:
        found = []
        for root in roots:
            files = sorted(root.glob("*.json")) if root.is_dir() else ([root] if root.is_file() else [])
            for f in files:
                try:
                    with open(f) as fh:
                        d = json.load(fh)
                    if d.get("format") != FORMAT:
                        continue
                    meta = d.get("meta", {})
                    cpus = meta.get("cpu_count")
                    found.append(IndexedProfile(str(f), ProfileKey.from_dict(d["key"]), float(meta.get("created", 0.0)),
                                                int(meta.get("block_size", 16)), profiled_step_graphs(meta),
                                                int(cpus) if cpus else None))
                except (OSError, ValueError, KeyError, TypeError) as exc:
                    log.warning("ignoring unreadable profile %s: %s", f, exc)
        _INDEX[key] = found
    return _INDEX[key]


def load_cached(path: str) -> StepProfile:
    prof = _LOADED.get(path)
    if prof is None:
        prof = _LOADED[path] = StepProfile.load(path)
    return prof


def profile_file(spec: Union[str, os.PathLike]) -> str:
    """A profile's file path: ``spec`` as given (absolute or relative to the working directory) or,
    when no such file exists, relative to the shipped profiles directory (``archive/<name>.json``)."""
    if not os.path.exists(spec) and (PACKAGED_DIR / spec).is_file():
        return os.fspath(PACKAGED_DIR / spec)
    return os.fspath(spec)


def profiled_step_graphs(meta: dict) -> bool:
    """Whether a profile measured the live executor with whole-step graphs (``backend.step_graphs``;
    profiles without the entry predate them)."""
    return bool(meta.get("step_graphs", False))


def resolve_profile(spec: Union[str, StepProfile, None], shape: ModelShape, device: DeviceSpec,
                    block_size: Optional[int] = None, step_graphs: bool = True,
                    host_cpus: Optional[int] = None) -> tuple[Optional[StepProfile], str]:
    """The profile to use for ``shape`` on ``device`` and why, from ``spec``: ``"auto"`` (the
    newest matching profile on :func:`search_paths`, preferring one that measured the executor mode
    ``step_graphs`` (whole-step graphs on or off), then ``block_size``; a profile of the other mode
    only where none of this mode matches, e.g. a device where the live executor runs no graphs,
    which the reason says), ``"none"``/None
    (roofline), a file path (absolute, relative to the working directory, or relative to the
    shipped profiles directory, e.g. ``archive/<name>.json``), or a :class:`StepProfile`. A profile
    for another device or shape is never used: the reason names the mismatching fields.

    ``host_cpus``: the CPU count of the live host the sim stands beside (sim-beside-live), or None
    (a sim of its own). With it, ``"auto"`` also considers the shipped host-class profiles
    (:func:`host_class_dirs`) measured on a host of exactly that many CPUs, and prefers, after the
    executor mode, a profile whose ``meta.cpu_count`` is ``host_cpus`` (docs/fidelity.md, "Runs
    37-40" and "Runs 41-43": each host class is priced best by its own class's profile). Without
    one of that class the choice is as without ``host_cpus``."""
    want = ProfileKey.of(shape, device)
    if spec is None or (isinstance(spec, str) and spec.lower() in ("none", "roofline", "off", "")):
        return None, "profile disabled (profile=none)"
    if isinstance(spec, str) and spec.lower() == "auto":
        hits = [row for row in _scan(search_paths()) if row.key == want]
        if host_cpus:
            hits += [row for row in _scan(host_class_dirs()) if row.key == want and row.cpu_count == host_cpus]
        if not hits:
            return None, f"no profile matches {want.describe()} on {[str(p) for p in search_paths()]}"
        hits.sort(key=lambda r: (r.step_graphs == bool(step_graphs), bool(host_cpus) and r.cpu_count == host_cpus,
                                 r.block_size == (block_size or 16), r.created))
        best = hits[-1]
        if best.step_graphs != bool(step_graphs):
            return load_cached(best.path), f"auto (no profile of step_graphs={bool(step_graphs)} matches)"
        if host_cpus and best.cpu_count == host_cpus:
            return load_cached(best.path), f"auto (a profile of this host's class: {host_cpus} CPUs)"
        return load_cached(best.path), "auto"
    prof = spec if isinstance(spec, StepProfile) else load_cached(profile_file(spec))
    if prof.key != want:
        return None, f"profile {prof.path or '<in memory>'} is for another device/shape ({'; '.join(want.mismatch(prof.key))})"
    return prof, "explicit"


def matching_profiles(shape: ModelShape, device: DeviceSpec, step_graphs: bool = True) -> list[StepProfile]:
    """Every profile that can price ``shape`` on ``device``, newest first: the matching ones on
    :func:`search_paths` and in every host-class directory (:func:`host_class_dirs`), of the executor
    mode ``step_graphs`` (those of the other mode only where none of this mode matches). The
    candidates a sim beside a live run chooses from by pricing the run's own steps
    (:func:`kvrl.apps.sim_beside.select_profile`)."""
    want = ProfileKey.of(shape, device)
    found = {os.path.realpath(row.path): row for row in _scan([*search_paths(), *host_class_dirs()]) if row.key == want}
    hits = list(found.values())          # a directory both on the path and shipped counts once
    same_mode = [row for row in hits if row.step_graphs == bool(step_graphs)]
    return [load_cached(row.path) for row in sorted(same_mode or hits, key=lambda r: r.created, reverse=True)]


def now_stamp() -> float:
    return time.time()
