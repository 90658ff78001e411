"""Seeded synthetic workload generators.

Every generator takes ``vocab_size`` and ``seed`` and is reproducible bit for bit: the same
arguments give identical arrival times, lengths and token ids. Each aspect (arrivals, prompt
lengths, output lengths, token ids, parallel sampling) draws from its own stream
(:func:`kvrl.workloads._rng.make_rng`), so changing one parameter does not reshuffle the others.
Results are lists of :class:`Request` sorted by arrival (ties keep generation order).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from kvrl.engine.request import Request

from ._rng import make_rng
from .arrivals import ArrivalProcess
from .lengths import LengthDist
from .tokens import check_vocab_size, random_ids, readonly


def as_arrival(spec: "ArrivalProcess | Mapping[str, Any]") -> ArrivalProcess:
    if isinstance(spec, ArrivalProcess):
        return spec
    if not isinstance(spec, Mapping):
        raise ValueError(f"an arrival process must be a mapping, got {spec!r}")
    unknown = [k for k in spec if k not in ("process", "rate", "cv")]
    if unknown:
        raise ValueError(f"unknown arrival key {unknown[0]!r} (known: process, rate, cv)")
    kw = {k: v for k, v in spec.items() if v is not None}
    return ArrivalProcess(**kw)


@dataclass(frozen=True)
class TenantSpec:
    """One tenant's request stream.

    ``prompt_len`` is the length of the part after the tenant's system prompt (if
    ``system_prompt_len > 0``, every request starts with the same ``system_prompt_len`` ids and
    has prefix group ``"<name>-system"``). A request samples ``parallel_n`` completions with
    probability ``parallel_prob`` (else 1). ``rate_phases`` (None = a stationary rate): this
    tenant's arrival rate is multiplied by each factor in turn for ``phase_s`` seconds, cycling
    (:func:`phased_times`), so tenants with shifted phase lists make a traffic mix that shifts.
    """

    name: str = "default"
    arrival: ArrivalProcess = field(default_factory=ArrivalProcess)
    prompt_len: LengthDist = field(default_factory=lambda: LengthDist("constant", mean=128))
    output_len: LengthDist = field(default_factory=lambda: LengthDist("constant", mean=128))
    priority: int = 0
    parallel_n: int = 1
    parallel_prob: float = 1.0
    slo_ttft_s: Optional[float] = None
    slo_tpot_s: Optional[float] = None
    system_prompt_len: int = 0
    rate_phases: Optional[tuple[float, ...]] = None
    phase_s: float = 10.0

    def __post_init__(self):
        object.__setattr__(self, "arrival", as_arrival(self.arrival))
        if self.rate_phases is not None:
            object.__setattr__(self, "rate_phases", tuple(self.rate_phases))
            check_phases(self.rate_phases, self.phase_s)
        object.__setattr__(self, "prompt_len", LengthDist.from_spec(self.prompt_len))
        object.__setattr__(self, "output_len", LengthDist.from_spec(self.output_len))
        _check_parallel(self.parallel_n, self.parallel_prob)
        if self.system_prompt_len < 0:
            raise ValueError(f"system_prompt_len must be >= 0, got {self.system_prompt_len}")
        for k in ("slo_ttft_s", "slo_tpot_s"):
            v = getattr(self, k)
            if v is not None and not (math.isfinite(v) and v > 0):
                raise ValueError(f"{k} must be > 0 or None, got {v!r}")

    def arrivals(self, horizon_s: float, rng: np.random.Generator) -> np.ndarray:
        """This tenant's arrival times in ``[0, horizon_s)``, in s, ascending: its arrival process,
        with its rate phases applied (base-rate arrivals over a span long enough for the phases to
        map past ``horizon_s``, then cut there)."""
        if self.rate_phases is None:
            return self.arrival.until(horizon_s, rng)
        times = phased_times(self.arrival.until(horizon_s * max(self.rate_phases), rng), self.rate_phases,
                             self.phase_s)
        return times[times < horizon_s]

    @classmethod
    def from_spec(cls, spec: "TenantSpec | Mapping[str, Any]") -> "TenantSpec":
        if isinstance(spec, TenantSpec):
            return spec
        if not isinstance(spec, Mapping):
            raise ValueError(f"a tenant must be a mapping, got {spec!r}")
        known = cls.__dataclass_fields__
        unknown = [k for k in spec if k not in known]
        if unknown:
            raise ValueError(f"unknown tenant key {unknown[0]!r} (known: {', '.join(known)})")
        return cls(**dict(spec))


def _check_parallel(n: int, prob: float) -> None:
    if isinstance(n, bool) or int(n) != n or n < 1:
        raise ValueError(f"parallel_n must be an integer >= 1, got {n!r}")
    if not 0.0 <= prob <= 1.0:
        raise ValueError(f"parallel_prob must be in [0, 1], got {prob!r}")


def sample_parallel_n(count: int, n: int, prob: float, rng: np.random.Generator) -> np.ndarray:
    """Per-request sample counts: ``n`` with probability ``prob``, else 1."""
    _check_parallel(n, prob)
    if n == 1 or prob == 0.0:
        return np.ones(count, dtype=np.int64)
    if prob == 1.0:
        return np.full(count, n, dtype=np.int64)
    return np.where(rng.random(count) < prob, n, 1).astype(np.int64)


def _concat(prefix: Optional[np.ndarray], suffix: np.ndarray) -> np.ndarray:
    if prefix is None or prefix.size == 0:
        return readonly(suffix)
    return readonly(np.concatenate([prefix, suffix]))


def sort_by_arrival(reqs: list[Request]) -> list[Request]:
    return sorted(reqs, key=lambda r: r.arrival_s)


def tenant_stream(spec: TenantSpec, arrivals: np.ndarray, *, vocab_size: int, seed: int,
                  key: Sequence[Any], id_prefix: str, prefix: Optional[np.ndarray] = None,
                  prefix_group: Optional[str] = None) -> list[Request]:
    """Requests of one stream at the given arrival times (generation order).

    ``prefix`` (default: a fresh random system prompt of ``spec.system_prompt_len`` ids) starts
    every prompt; ``key`` separates this stream's random draws from other streams'.
    """
    count = int(arrivals.shape[0])
    plen = spec.prompt_len.sample(count, make_rng(seed, *key, "prompt-len"))
    olen = spec.output_len.sample(count, make_rng(seed, *key, "output-len"))
    ns = sample_parallel_n(count, spec.parallel_n, spec.parallel_prob,
                           make_rng(seed, *key, "parallel"))
    tok_rng = make_rng(seed, *key, "tokens")
    if prefix is None and spec.system_prompt_len > 0:
        prefix = readonly(random_ids(tok_rng, spec.system_prompt_len, vocab_size))
        prefix_group = prefix_group or f"{spec.name}-system"
    flat = random_ids(tok_rng, int(plen.sum()), vocab_size)
    suffixes = np.split(flat, np.cumsum(plen)[:-1]) if count else []
    group = prefix_group if prefix is not None and prefix.size else None
    return [Request(request_id=f"{id_prefix}-{i:06d}", arrival_s=float(arrivals[i]),
                    prompt_token_ids=_concat(prefix, suffixes[i]), output_len=int(olen[i]),
                    tenant=spec.name, priority=int(spec.priority), n=int(ns[i]),
                    prefix_group=group, slo_ttft_s=spec.slo_ttft_s, slo_tpot_s=spec.slo_tpot_s)
            for i in range(count)]


def _count(name: str, v: int, lo: int = 0) -> int:
    if isinstance(v, bool) or int(v) != v or v < lo:
        raise ValueError(f"{name} must be an integer >= {lo}, got {v!r}")
    return int(v)


# --------------------------------------------------------------------------------------------
def check_phases(rate_phases: Sequence[float], phase_s: float) -> np.ndarray:
    """``rate_phases`` as float64 factors, after checking them (a non-empty list of finite numbers
    > 0) and ``phase_s`` (a finite number > 0); ``ValueError`` naming the key otherwise."""
    factors = np.asarray([float(f) for f in rate_phases], dtype=np.float64)
    if factors.size == 0 or not np.all(np.isfinite(factors) & (factors > 0)):
        raise ValueError(f"rate_phases must be a non-empty list of numbers > 0, got {list(rate_phases)!r}")
    if not (math.isfinite(phase_s) and phase_s > 0):
        raise ValueError(f"phase_s must be a finite number > 0, got {phase_s!r}")
    return factors


def phased_times(times: np.ndarray, rate_phases: Sequence[float], phase_s: float) -> np.ndarray:
    """Arrival times of a process whose rate is multiplied by ``rate_phases[k]`` during the
    ``k``-th phase of ``phase_s`` seconds, cycling through the list: ``times`` (drawn at the base
    rate) are mapped through the inverse of the cumulative rate factor, so the arrival order and
    the inter-arrival distribution's shape are kept and the rate is piecewise constant."""
    factors = check_phases(rate_phases, phase_s)
    base = np.concatenate([[0.0], np.cumsum(factors * phase_s)])   # base time at each phase start
    cycle = base[-1]
    t = np.asarray(times, dtype=np.float64)
    n_cycles = np.floor(t / cycle)
    rest = t - n_cycles * cycle
    k = np.clip(np.searchsorted(base, rest, side="right") - 1, 0, factors.size - 1)
    return n_cycles * factors.size * phase_s + k * phase_s + (rest - base[k]) / factors[k]


def synthetic(num_requests: int = 200, *, vocab_size: int, seed: int = 0,
              arrival: "ArrivalProcess | Mapping" = ArrivalProcess("poisson", 5.0),
              prompt_len: "LengthDist | Mapping" = LengthDist("uniform", low=32, high=512),
              output_len: "LengthDist | Mapping" = LengthDist("lognormal", mean=128, cv=1.0),
              parallel_n: int = 1, parallel_prob: float = 1.0, tenant: str = "default",
              priority: int = 0, slo_ttft_s: Optional[float] = None,
              slo_tpot_s: Optional[float] = None, id_prefix: str = "syn",
              rate_phases: Optional[Sequence[float]] = None, phase_s: float = 10.0) -> list[Request]:
    """``num_requests`` independent requests with random prompts of random lengths.

    ``rate_phases`` (null = a stationary rate): load phases of ``phase_s`` seconds each, the
    arrival rate multiplied by each factor in turn, cycling (:func:`phased_times`)."""
    vocab_size = check_vocab_size(vocab_size)
    num_requests = _count("num_requests", num_requests)
    spec = TenantSpec(name=tenant, arrival=arrival, prompt_len=prompt_len, output_len=output_len,
                      priority=priority, parallel_n=parallel_n, parallel_prob=parallel_prob,
                      slo_ttft_s=slo_ttft_s, slo_tpot_s=slo_tpot_s)
    times = spec.arrival.times(num_requests, make_rng(seed, "synthetic", "arrivals"))
    if rate_phases is not None:
        times = phased_times(times, rate_phases, phase_s)
    return sort_by_arrival(tenant_stream(spec, times, vocab_size=vocab_size, seed=seed,
                                         key=("synthetic",), id_prefix=id_prefix))


def shared_prefix(num_requests: int = 500, *, vocab_size: int, seed: int = 0, num_groups: int = 8,
                  prefix_len: int = 512, group_skew: float = 0.0,
                  arrival: "ArrivalProcess | Mapping" = ArrivalProcess("poisson", 5.0),
                  suffix_len: "LengthDist | Mapping" = LengthDist("lognormal", mean=128, cv=1.0),
                  output_len: "LengthDist | Mapping" = LengthDist("lognormal", mean=128, cv=1.0),
                  parallel_n: int = 1, parallel_prob: float = 1.0, tenant: str = "default",
                  priority: int = 0, slo_ttft_s: Optional[float] = None,
                  slo_tpot_s: Optional[float] = None, id_prefix: str = "sp") -> list[Request]:
    """Shared system prompts: ``num_groups`` groups, each with its own ``prefix_len``-token prefix.

    Each request picks a group (probability proportional to ``1 / rank**group_skew``: 0 = uniform,
    1 = Zipf) and its prompt is the group prefix followed by a unique random suffix. Prefix groups
    are named ``system-000``, ``system-001``, ...
    """
    vocab_size = check_vocab_size(vocab_size)
    num_requests = _count("num_requests", num_requests)
    num_groups = _count("num_groups", num_groups, 1)
    prefix_len = _count("prefix_len", prefix_len, 1)
    if not (math.isfinite(group_skew) and group_skew >= 0):
        raise ValueError(f"group_skew must be >= 0, got {group_skew!r}")
    spec = TenantSpec(name=tenant, arrival=arrival, prompt_len=suffix_len, output_len=output_len,
                      priority=priority, parallel_n=parallel_n, parallel_prob=parallel_prob,
                      slo_ttft_s=slo_ttft_s, slo_tpot_s=slo_tpot_s)
    times = spec.arrival.times(num_requests, make_rng(seed, "shared-prefix", "arrivals"))
    weights = 1.0 / np.arange(1, num_groups + 1, dtype=np.float64) ** group_skew
    groups = make_rng(seed, "shared-prefix", "groups").choice(
        num_groups, size=num_requests, p=weights / weights.sum())
    prefix_rng = make_rng(seed, "shared-prefix", "prefixes")
    prefixes = [readonly(random_ids(prefix_rng, prefix_len, vocab_size)) for _ in range(num_groups)]
    reqs = []
    for g in range(num_groups):
        idx = np.flatnonzero(groups == g)
        sub = tenant_stream(spec, times[idx], vocab_size=vocab_size, seed=seed,
                            key=("shared-prefix", "group", g), id_prefix="_",
                            prefix=prefixes[g], prefix_group=f"system-{g:03d}")
        for i, r in zip(idx.tolist(), sub):
            reqs.append((i, r))
    reqs.sort(key=lambda t: t[0])
    out = [_rename(r, f"{id_prefix}-{i:06d}") for i, r in reqs]
    return sort_by_arrival(out)


def _rename(r: Request, request_id: str) -> Request:
    return Request(request_id=request_id, arrival_s=r.arrival_s,
                   prompt_token_ids=r.prompt_token_ids, output_len=r.output_len, tenant=r.tenant,
                   priority=r.priority, n=r.n, prefix_group=r.prefix_group,
                   slo_ttft_s=r.slo_ttft_s, slo_tpot_s=r.slo_tpot_s, cache_salt=r.cache_salt)


def multi_turn(num_conversations: int = 50, *, vocab_size: int, seed: int = 0,
               arrival: "ArrivalProcess | Mapping" = ArrivalProcess("poisson", 1.0),
               min_turns: int = 2, max_turns: int = 6, system_prompt_len: int = 0,
               first_prompt_len: "LengthDist | Mapping" = LengthDist("lognormal", mean=256, cv=1.0),
               user_turn_len: "LengthDist | Mapping" = LengthDist("lognormal", mean=64, cv=1.0),
               output_len: "LengthDist | Mapping" = LengthDist("lognormal", mean=128, cv=1.0),
               mean_turn_gap_s: float = 10.0, max_total_len: Optional[int] = None,
               tenant: str = "default", priority: int = 0, slo_ttft_s: Optional[float] = None,
               slo_tpot_s: Optional[float] = None) -> list[Request]:
    """Multi-turn conversations whose turns extend each other.

    Conversation ``c`` starts at the ``c``-th arrival of ``arrival`` and has a uniform number of
    turns in ``[min_turns, max_turns]``. Turn 0's prompt is the (optional, shared by all
    conversations) system prompt plus a first user message; turn ``t+1``'s prompt is turn ``t``'s
    prompt, then ``output_len`` ids standing for turn ``t``'s answer, then a new user message. So every
    prompt starts with the previous turn's whole prompt and the prefix cache can reuse it.
    (The answer ids are random stand-ins: an engine generates its own tokens, so only the prompt part
    is guaranteed to match.) Turns follow each other after exponential gaps of mean
    ``mean_turn_gap_s`` (open loop). With ``max_total_len`` a conversation ends before a turn whose
    prompt + output would exceed it. Request ids are ``conv-CCCC-turn-TT``; the prefix group is the
    conversation ``conv-CCCC``.
    """
    vocab_size = check_vocab_size(vocab_size)
    num_conversations = _count("num_conversations", num_conversations)
    min_turns = _count("min_turns", min_turns, 1)
    max_turns = _count("max_turns", max_turns, 1)
    if min_turns > max_turns:
        raise ValueError(f"min_turns ({min_turns}) must be <= max_turns ({max_turns})")
    system_prompt_len = _count("system_prompt_len", system_prompt_len)
    if not (math.isfinite(mean_turn_gap_s) and mean_turn_gap_s >= 0):
        raise ValueError(f"mean_turn_gap_s must be >= 0, got {mean_turn_gap_s!r}")
    arrival = as_arrival(arrival)
    first = LengthDist.from_spec(first_prompt_len)
    user = LengthDist.from_spec(user_turn_len)
    out = LengthDist.from_spec(output_len)
    starts = arrival.times(num_conversations, make_rng(seed, "multi-turn", "arrivals"))
    turns = make_rng(seed, "multi-turn", "turns").integers(
        min_turns, max_turns + 1, size=num_conversations)
    tok = make_rng(seed, "multi-turn", "tokens")
    system = random_ids(tok, system_prompt_len, vocab_size)
    reqs = []
    for c in range(num_conversations):
        rng = make_rng(seed, "multi-turn", "conversation", c)
        k = int(turns[c])
        firsts = first.sample(1, rng)
        users = user.sample(k, rng)
        outs = out.sample(k, rng)
        gaps = rng.exponential(mean_turn_gap_s, size=k) if mean_turn_gap_s > 0 else np.zeros(k)
        prompt = np.concatenate([system, random_ids(rng, int(firsts[0]), vocab_size)])
        t_arr = float(starts[c])
        for t in range(k):
            if t > 0:
                answer = random_ids(rng, int(outs[t - 1]), vocab_size)
                prompt = np.concatenate([prompt, answer, random_ids(rng, int(users[t]), vocab_size)])
                t_arr += float(gaps[t])
            if max_total_len is not None and prompt.size + int(outs[t]) > max_total_len:
                break
            reqs.append(Request(request_id=f"conv-{c:04d}-turn-{t:02d}", arrival_s=t_arr,
                                prompt_token_ids=readonly(prompt), output_len=int(outs[t]),
                                tenant=tenant, priority=priority, prefix_group=f"conv-{c:04d}",
                                slo_ttft_s=slo_ttft_s, slo_tpot_s=slo_tpot_s))
    return sort_by_arrival(reqs)


def multi_tenant(tenants: Sequence["TenantSpec | Mapping"], horizon_s: float = 60.0, *,
                 vocab_size: int, seed: int = 0) -> list[Request]:
    """Several tenants, each with its own arrival process, length mix, priority and SLOs, over
    ``[0, horizon_s)``. Request ids are ``<tenant>-NNNNNN``; tenant ``i`` draws from its own random
    streams, so editing one tenant leaves the others' requests unchanged."""
    vocab_size = check_vocab_size(vocab_size)
    specs = [TenantSpec.from_spec(t) for t in tenants]
    if not specs:
        raise ValueError("multi_tenant needs at least one tenant")
    names = [s.name for s in specs]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"tenant names must be unique, repeated: {dup}")
    if not (math.isfinite(horizon_s) and horizon_s > 0):
        raise ValueError(f"horizon_s must be > 0, got {horizon_s!r}")
    reqs = []
    for i, s in enumerate(specs):
        times = s.arrivals(horizon_s, make_rng(seed, "tenant", i, "arrivals"))
        reqs += tenant_stream(s, times, vocab_size=vocab_size, seed=seed, key=("tenant", i),
                              id_prefix=s.name)
    return sort_by_arrival(reqs)
