"""What an environment keeps across episodes: the run config with the ``agent`` plugin in place,
one executor (a live model loads once), the split's requests, and the choice of each episode's
arrivals."""
from __future__ import annotations

import bisect
import copy
import functools
import json
from typing import Any, Mapping, Optional

import numpy as np
from omegaconf import OmegaConf

from kvrl.builder import build_engine, build_executor
from kvrl.engine.request import Request
from kvrl.envs.config import EnvConfig, episode_rate_scales, resolve_features, variant_workloads
from kvrl.envs.driver import EngineDriver, TokenCurve
from kvrl.workloads import build_workload

MAX_WINDOW_DRAWS = 100


def cached_workload(workload: Mapping[str, Any], vocab_size: int, max_model_len: int) -> tuple[Request, ...]:
    """:func:`build_workload`, memoised per process on the config's content (building a trace
    with its token ids takes seconds; requests are immutable, so engines may share them)."""
    return _cached(json.dumps(OmegaConf.to_container(OmegaConf.create(dict(workload)), resolve=True), sort_keys=True),
                   vocab_size, max_model_len)


@functools.lru_cache(maxsize=32)
def _cached(workload_json: str, vocab_size: int, max_model_len: int) -> tuple[Request, ...]:
    return tuple(build_workload(json.loads(workload_json), vocab_size=vocab_size, max_model_len=max_model_len))


class EngineSession:
    """Engines for successive episodes of one environment.

    ``role`` (``watermark`` or ``eviction``) is the plugin kind replaced by ``agent``.
    ``requests``: the scenario's split (the first family's, at its own rate); ``family``: the index in
    ``episode.workloads`` of the last episode's workload (0 without a mixture).
    """

    def __init__(self, config: EnvConfig, role: str) -> None:
        run = copy.deepcopy(config.run)
        run["workload"]["split"] = config.episode.split
        run[role] = {"name": "agent"}
        self.config = config
        self.role = role
        self.run = OmegaConf.create(run)
        self.features = resolve_features(config)
        self.executor = build_executor(self.run)
        max_model_len = run["engine"].get("max_model_len") or self.executor.max_model_len
        self._max_model_len = max_model_len
        self.families = variant_workloads(run["workload"], config.episode.workloads)
        self._rate_scales = [episode_rate_scales(config, family) for family in self.families]
        self._pools: dict[tuple[int, Optional[float]], tuple[list[Request], list[float]]] = {}
        self.family = 0
        self._turn = 0
        self.requests = self._pool(0, None)[0]   # the scenario's own split, built (and checked) up front

    def _build(self, workload: Mapping[str, Any], max_model_len: int) -> list[Request]:
        return list(cached_workload(workload, self.executor.vocab_size, max_model_len))

    def episode(self, rng: np.random.Generator, options: Optional[Mapping[str, Any]]) -> tuple[list[Request], Optional[float]]:
        """``(requests, end_s)`` of the next episode (see :class:`~kvrl.envs.config.EpisodeConfig`).

        ``options["workload"]``: a list of requests or a workload config, served to completion;
        ``options["start_s"]``: the window start for this episode.
        """
        options = dict(options or {})
        unknown = sorted(set(options) - {"workload", "start_s"})
        if unknown:
            raise ValueError(f"unknown reset option(s) {unknown}; known: ['start_s', 'workload']")
        if "workload" in options:
            workload = options["workload"]
            if isinstance(workload, Mapping) or OmegaConf.is_config(workload):
                workload = self._build(workload, self._max_model_len)
            requests = sorted(workload, key=lambda r: r.arrival_s)
            if not requests:
                raise ValueError("reset(options={'workload': ...}) got no requests")
            return requests, None
        ep = self.config.episode
        self.family, rate = self._next_family_and_rate(rng)
        everything, arrivals = self._pool(self.family, rate)
        if ep.window_s is None:
            return everything, None
        start = options.get("start_s", ep.start_s)
        if start is not None:
            requests = self._window(everything, arrivals, float(start), ep.window_s)
            if not requests:
                raise ValueError(f"the window [{start}, {start + ep.window_s}) s of split {ep.split!r} holds no "
                                 f"arrivals (its arrivals span [{arrivals[0]}, {arrivals[-1]}] s)")
            return requests, float(start) + ep.window_s
        lo, hi = arrivals[0], max(arrivals[0], arrivals[-1] - ep.window_s)
        for _ in range(MAX_WINDOW_DRAWS):
            start = float(rng.uniform(lo, hi)) if hi > lo else lo
            requests = self._window(everything, arrivals, start, ep.window_s)
            if requests:
                return requests, start + ep.window_s
        raise ValueError(f"no arrivals in {MAX_WINDOW_DRAWS} random windows of {ep.window_s} s of split {ep.split!r}")

    def _next_family_and_rate(self, rng: np.random.Generator) -> tuple[int, Optional[float]]:
        """The next episode's workload family and rate scale (None: the family's own). Windowed episodes draw
        both with ``rng`` (the family only in a mixture, the rate only with ``episode.rate_scales``);
        whole-split ones (validation) take them in turn: every family at one load, then the next load."""
        n = len(self.families)
        if self.config.episode.window_s is None:
            turn, self._turn = self._turn, self._turn + 1
            family = turn % n
            rates = self._rate_scales[family]
            return family, (rates[turn // n % len(rates)] if rates is not None else None)
        family = int(rng.integers(n)) if n > 1 else 0
        rates = self._rate_scales[family]
        return family, (rates[int(rng.integers(len(rates)))] if rates is not None else None)

    def perturb_cost(self, rng: np.random.Generator) -> float:
        """Draw this episode's step-time factor ``exp(N(0, episode.step_time_sigma))`` and set the
        sim executor's factor to it times the configured ``backend.step_time_scale`` (domain
        randomisation; no draw and factor 1 when the sigma is 0). Returns the drawn factor."""
        sigma = self.config.episode.step_time_sigma
        if sigma == 0.0:
            return 1.0
        if not hasattr(self.executor, "step_time_scale"):
            raise ValueError(f"env.episode.step_time_sigma={sigma} perturbs the sim's cost model; the "
                             f"{type(self.executor).__name__} executor has none (set it to 0)")
        factor = float(np.exp(rng.normal(0.0, sigma)))
        self.executor.step_time_scale = self.executor.base_step_time_scale * factor
        return factor

    def _pool(self, family: int, rate_scale: Optional[float]) -> tuple[list[Request], list[float]]:
        """Family ``family``'s split requests (and their arrival times), at ``rate_scale`` (null: the
        family's own ``rate_scale``)."""
        key = (family, rate_scale)
        if key not in self._pools:
            workload = dict(self.families[family])
            if rate_scale is not None:
                workload["rate_scale"] = rate_scale
            requests = self._build(workload, self._max_model_len)
            if not requests:
                raise ValueError(f"workload family {family} ({workload.get('name')}) has no requests in split "
                                 f"{self.config.episode.split!r}")
            self._pools[key] = (requests, [r.arrival_s for r in requests])
        return self._pools[key]

    @staticmethod
    def _window(requests: list[Request], arrivals: list[float], start: float, length: float) -> list[Request]:
        i = bisect.bisect_left(arrivals, start)
        j = bisect.bisect_left(arrivals, start + length)
        return requests[i:j]

    def start(self, requests: list[Request], end_s: Optional[float]) -> EngineDriver:
        """A fresh engine (same executor) and its driver for one episode; with ``reward.baseline``,
        the episode's arrivals are first served with the baseline plugin (:meth:`baseline_curve`)."""
        baseline = self.baseline_curve(requests, end_s) if self.config.reward.baseline is not None else None
        engine = build_engine(self.run, executor=self.executor, record_steps=False)
        return EngineDriver(engine, requests, end_s, baseline=baseline)

    def baseline_curve(self, requests: list[Request], end_s: Optional[float]) -> TokenCurve:
        """Serve ``requests`` (until ``end_s``) with ``reward.baseline`` in the agent's place and
        return its served tokens (``reward.kind``) over engine time."""
        reward = self.config.reward
        run = OmegaConf.create({**OmegaConf.to_container(self.run), self.role: dict(reward.baseline)})
        driver = EngineDriver(build_engine(run, executor=self.executor, record_steps=False), requests, end_s)
        while not driver.done:
            driver.step()
        done = sorted((r.finish_s, r.output_tokens) for r in driver.engine.metrics.requests.values()
                      if r.finish_s is not None and not r.error and (reward.kind != "goodput" or r.meets_slo))
        cum = np.cumsum([tokens for _, tokens in done], dtype=np.int64)
        return TokenCurve(tuple(t for t, _ in done), tuple(int(c) for c in cum))
