"""The typed parameters of workload configs: one ``Params`` dataclass per builder
(:mod:`kvrl.workloads.builders`), the nested specs they share (:class:`LengthParams`,
:class:`ArrivalParams`, :class:`TenantParams`) and the common transform keys (:class:`CommonParams`).

Each field is declared with :func:`key`: its default, a one-line doc (the comment of its line in
``conf/workload/<name>.yaml``) and, in the field's metadata, the checks its type cannot say:
``lo``/``hi`` (inclusive bounds), ``gt`` (exclusive lower bound), ``choices`` and ``length`` (of a
list). ``Optional[...]`` fields accept null. Units: lengths in tokens, times in seconds, rates in
requests per second. :mod:`kvrl.workloads.registry` validates a config against these classes.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, List, Optional

from . import transforms
from .adversarial import WRONG_MODES
from .arrivals import PROCESSES
from .burstgpt import TENANT_FROM
from .lengths import DISTS, FIELDS as LENGTH_FIELDS
from .mooncake import BLOCK_TOKENS, TIME_UNITS


def key(default: Any = dataclasses.MISSING, doc: str = "", *, factory: Optional[Callable[[], Any]] = None,
        **checks: Any) -> Any:
    """A dataclass field with its doc and checks (``lo``, ``gt``, ``hi``, ``choices``, ``length``) in
    its metadata; ``factory`` builds a mutable default (a nested spec or a list)."""
    meta = {"doc": doc, **checks}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


# ------------------------------------------------------------------------------ nested specs
@dataclass
class LengthParams:
    """A length distribution in tokens (:class:`~kvrl.workloads.lengths.LengthDist`): ``dist`` picks
    which keys matter (uniform: low, high; constant: mean; lognormal: mean and sigma or cv;
    empirical: trace and field); for the other kinds low/high clamp the samples."""

    dist: str = key("constant", "constant | uniform | lognormal | empirical", choices=DISTS)
    low: Optional[int] = key(None, "uniform: smallest length; others: clamp below (null = 1)", lo=1)
    high: Optional[int] = key(None, "uniform: largest length; others: clamp above (null = none)", lo=1)
    mean: Optional[float] = key(None, "lognormal: mean length; constant: the length", lo=1)
    sigma: Optional[float] = key(None, "lognormal: std of log-length (null = derive from cv)", lo=0)
    cv: Optional[float] = key(None, "lognormal: coefficient of variation, used when sigma is null", lo=0)
    trace: Optional[str] = key(None, "empirical: azure_code or a trace file path")
    field: str = key("prompt", "empirical: resample the prompt or output lengths", choices=LENGTH_FIELDS)


def lengths(dist: str, field: str = "prompt", **kw: Any) -> Callable[[], LengthParams]:
    """A factory of the default :class:`LengthParams` of a field."""
    return lambda: LengthParams(dist=dist, field=field, **kw)


@dataclass
class ArrivalParams:
    """An arrival process (:class:`~kvrl.workloads.arrivals.ArrivalProcess`)."""

    process: str = key("poisson", "poisson | gamma (bursty) | constant | offline (all at 0)", choices=PROCESSES)
    rate: Optional[float] = key(1.0, "mean arrivals per second (ignored when offline)", gt=0)
    cv: float = key(1.0, "gamma: inter-arrival coefficient of variation (1 = Poisson)", gt=0)


def arrivals(process: str = "poisson", rate: Optional[float] = 1.0, cv: float = 1.0) -> Callable[[], ArrivalParams]:
    """A factory of the default :class:`ArrivalParams` of a field."""
    return lambda: ArrivalParams(process=process, rate=rate, cv=cv)


@dataclass
class TenantParams:
    """One tenant's request stream (:class:`~kvrl.workloads.generators.TenantSpec`)."""

    name: str = key("default", "tenant name (unique)")
    arrival: ArrivalParams = key(doc="this tenant's arrival process", factory=arrivals())
    prompt_len: LengthParams = key(doc="prompt length after the system prompt",
                                   factory=lengths("lognormal", mean=256.0, cv=1.0))
    output_len: LengthParams = key(doc="output length", factory=lengths("lognormal", "output", mean=128.0, cv=1.0))
    priority: int = key(0, "scheduling priority (smaller = more important)")
    parallel_n: int = key(1, "parallel samples n for sampled requests", lo=1)
    parallel_prob: float = key(1.0, "probability a request uses parallel_n (else n=1)", lo=0, hi=1)
    slo_ttft_s: Optional[float] = key(None, "time-to-first-token SLO in s (null = run default)", gt=0)
    slo_tpot_s: Optional[float] = key(None, "time-per-output-token SLO in s (null = run default)", gt=0)
    system_prompt_len: int = key(0, "shared system prompt length (0 = none)", lo=0)
    rate_phases: Optional[List[float]] = key(None, "load phases: rate multipliers, each for phase_s s, cycling "
                                             "(null = stationary)")
    phase_s: float = key(10.0, "length of one load phase in s", gt=0)


def tenant(name: str, *, process: str = "poisson", rate: float = 1.0, cv: float = 1.0,
           prompt: Optional[dict] = None, output: Optional[dict] = None, **kw: Any) -> TenantParams:
    """A :class:`TenantParams` with ``prompt``/``output`` updating the default length specs."""
    t = TenantParams(name=name, arrival=ArrivalParams(process, rate, cv), **kw)
    t.prompt_len = dataclasses.replace(t.prompt_len, **(prompt or {}))
    t.output_len = dataclasses.replace(t.output_len, **(output or {}))
    return t


# ------------------------------------------------------------------------------ common keys
@dataclass
class CommonParams:
    """The transforms every workload goes through, in this order: length hints, start_s/duration_s,
    split, subsample, rate_scale, max_requests, overlong (with max_model_len), offline, SLO defaults."""

    seed: int = key(0, "seed of every random draw (token ids, generators, subsample)", lo=0)
    max_requests: Optional[int] = key(None, "keep the first N requests by arrival (null = all)", lo=0)
    rate_scale: float = key(1.0, "divide arrival times by this (2.0 = twice the rate)", gt=0)
    offline: bool = key(False, "put every arrival at t=0 (offline batch)")
    split: Optional[str] = key(None, "null | train | val | test: one contiguous time window",
                               choices=transforms.SPLITS)
    split_fractions: List[float] = key(doc="train/val/test shares of the time span", length=3, lo=0,
                                       factory=lambda: [0.6, 0.2, 0.2])
    start_s: float = key(0.0, "time window start in s (re-based to 0)", lo=0)
    duration_s: Optional[float] = key(None, "time window length in s (null = to the end)", gt=0)
    subsample: Optional[float] = key(None, "keep this seeded random fraction of requests (null = all)", gt=0, hi=1)
    slo_ttft_s: Optional[float] = key(None, "default TTFT SLO (s) for requests without one", gt=0)
    slo_tpot_s: Optional[float] = key(None, "default TPOT SLO (s) for requests without one", gt=0)
    overlong: str = key("reject", "requests over max_model_len: reject (engine says why), clip or drop",
                        choices=transforms.OVERLONG)
    length_hint_sigma: Optional[float] = key(
        None, "give each request an output_len_hint: its output length x exp(N(0, sigma^2)), a length "
        "predictor of that log-error (0 = exact; null = keep the workload's own hints)", lo=0)


# ------------------------------------------------------------------------------ trace loaders
@dataclass
class TraceParams:
    """A trace file; the loaders re-base arrival times to the earliest request."""

    path: Optional[str] = key(None, "trace file (required)")
    skip_bad_rows: bool = key(False, "skip malformed rows (count logged) instead of failing")


@dataclass
class AzureCodeParams(TraceParams):
    """The packaged Azure code trace, or another copy of it."""

    path: Optional[str] = key(None, "trace file (null = the packaged copy)")


@dataclass
class BurstGPTParams(TraceParams):
    """A BurstGPT CSV and its filters."""

    drop_failures: bool = key(True, "drop failed requests (0 response tokens)")
    models: Optional[List[str]] = key(None, "keep only these Model values (null = all)")
    log_types: Optional[List[str]] = key(None, "keep only these Log Type values (null = all)")
    tenant_from: str = key("none", "tenant name from: none | model | log_type", choices=TENANT_FROM)


@dataclass
class MooncakeParams(TraceParams):
    """A Mooncake trace (prompt reuse as block hash ids) and how to scale it."""

    block_tokens: int = key(BLOCK_TOKENS, "prompt tokens per hash id in the file (512 in the public "
                            "Mooncake traces)", lo=1)
    time_unit: str = key("ms", "unit of timestamp: ms | s", choices=tuple(TIME_UNITS))
    prompt_scale: float = key(1.0, "multiply input_length and block_tokens by this (reuse kept)", gt=0)
    output_scale: float = key(1.0, "multiply output_length by this", gt=0)


# ------------------------------------------------------------------------------ generators
@dataclass
class SyntheticParams:
    """Independent requests (:func:`~kvrl.workloads.generators.synthetic`)."""

    num_requests: int = key(200, "number of requests", lo=0)
    arrival: ArrivalParams = key(doc="arrival process (offline = all at t=0)", factory=arrivals(rate=5.0))
    prompt_len: LengthParams = key(doc="prompt length distribution", factory=lengths("uniform", low=32, high=512))
    output_len: LengthParams = key(doc="output length distribution",
                                   factory=lengths("lognormal", "output", mean=128.0, cv=1.0))
    parallel_n: int = key(1, "parallel samples n for sampled requests", lo=1)
    parallel_prob: float = key(1.0, "probability a request uses parallel_n (else n=1)", lo=0, hi=1)
    tenant: str = key("default", "tenant name of every request")
    priority: int = key(0, "scheduling priority (smaller = more important)")
    rate_phases: Optional[List[float]] = key(None, "load phases: rate factors applied in turn, cycling "
                                                   "(null = stationary)", gt=0)
    phase_s: float = key(10.0, "length of each load phase in s (with rate_phases)", gt=0)


@dataclass
class SharedPrefixParams:
    """Groups of requests sharing a system prompt (:func:`~kvrl.workloads.generators.shared_prefix`)."""

    num_requests: int = key(500, "number of requests", lo=0)
    num_groups: int = key(8, "number of prefix groups (k)", lo=1)
    prefix_len: int = key(512, "shared prefix length per group (L)", lo=1)
    group_skew: float = key(0.0, "group popularity ~ 1/rank^skew (0 = uniform, 1 = Zipf)", lo=0)
    arrival: ArrivalParams = key(doc="arrival process", factory=arrivals(rate=5.0))
    suffix_len: LengthParams = key(doc="unique suffix length after the prefix",
                                   factory=lengths("lognormal", mean=128.0, cv=1.0))
    output_len: LengthParams = key(doc="output length distribution",
                                   factory=lengths("lognormal", "output", mean=128.0, cv=1.0))
    parallel_n: int = key(1, "parallel samples n for sampled requests", lo=1)
    parallel_prob: float = key(1.0, "probability a request uses parallel_n (else n=1)", lo=0, hi=1)
    tenant: str = key("default", "tenant name of every request")
    priority: int = key(0, "scheduling priority (smaller = more important)")


@dataclass
class MultiTurnParams:
    """Conversations whose turns extend each other (:func:`~kvrl.workloads.generators.multi_turn`;
    a conversation ends before a turn longer than ``max_model_len``)."""

    num_conversations: int = key(50, "number of conversations", lo=0)
    arrival: ArrivalParams = key(doc="arrival process of conversation starts", factory=arrivals(rate=1.0))
    min_turns: int = key(2, "fewest turns per conversation", lo=1)
    max_turns: int = key(6, "most turns per conversation", lo=1)
    system_prompt_len: int = key(0, "system prompt shared by all conversations (0 = none)", lo=0)
    first_prompt_len: LengthParams = key(doc="first user message length",
                                         factory=lengths("lognormal", mean=256.0, cv=1.0))
    user_turn_len: LengthParams = key(doc="later user message length", factory=lengths("lognormal", mean=64.0, cv=1.0))
    output_len: LengthParams = key(doc="answer length per turn",
                                   factory=lengths("lognormal", "output", mean=128.0, cv=1.0))
    mean_turn_gap_s: float = key(10.0, "mean exponential gap between turns in s (open loop)", lo=0)
    tenant: str = key("default", "tenant name of every request")
    priority: int = key(0, "scheduling priority (smaller = more important)")


def _default_tenants() -> List[TenantParams]:
    return [tenant("interactive", rate=4.0, prompt={"mean": 256.0}, output={"mean": 64.0}, priority=0,
                   slo_ttft_s=0.5, slo_tpot_s=0.05),
            tenant("batch", rate=1.0, prompt={"mean": 2048.0, "cv": 0.5}, output={"mean": 512.0}, priority=1),
            tenant("bursty", process="gamma", rate=2.0, cv=4.0, prompt={"mean": 512.0}, output={"mean": 128.0},
                   priority=0, parallel_n=4, parallel_prob=0.25, system_prompt_len=256)]


@dataclass
class MultiTenantParams:
    """Several tenants over one horizon (:func:`~kvrl.workloads.generators.multi_tenant`)."""

    horizon_s: float = key(60.0, "every tenant sends requests over [0, horizon_s)", gt=0)
    tenants: List[TenantParams] = key(doc="the tenants; each entry has the keys below", factory=_default_tenants)


@dataclass
class FillAndSqueezeParams:
    """The fill-and-squeeze attack (:func:`~kvrl.workloads.adversarial.fill_and_squeeze`)."""

    horizon_s: float = key(120.0, "benign traffic runs over [0, horizon_s)", gt=0)
    benign: TenantParams = key(doc="the benign tenant", factory=lambda: tenant(
        "benign", rate=2.0, prompt={"mean": 512.0}, output={"mean": 128.0}))
    attacker: str = key("attacker", "attacker tenant name")
    attacker_priority: int = key(0, "attacker scheduling priority")
    attack_start_s: float = key(20.0, "when the attacker's first probe arrives", lo=0)
    probe_count: int = key(8, "phase 1: number of probe requests", lo=0)
    probe_rate: float = key(1.0, "probes per second", gt=0)
    probe_prompt_len: int = key(256, "probe prompt length", lo=1)
    probe_output_len: int = key(16, "probe output length", lo=1)
    flood_count: int = key(32, "phase 2: number of max-length flood requests", lo=0)
    flood_rate: float = key(20.0, "flood requests per second", gt=0)
    flood_prompt_len: Optional[int] = key(None, "flood prompt length (null = max_model_len - output)", lo=1)
    flood_output_len: int = key(256, "flood output length", lo=1)
    squeeze_delay_s: float = key(1.0, "gap between the last flood and the first squeeze", lo=0)
    squeeze_count: int = key(200, "phase 3: number of tiny requests", lo=0)
    squeeze_rate: float = key(20.0, "tiny requests per second", gt=0)
    squeeze_prompt_len: int = key(8, "tiny request prompt length", lo=1)
    squeeze_output_len: int = key(8, "tiny request output length", lo=1)


@dataclass
class PrefixProbeParams:
    """The prefix-probing attack (:func:`~kvrl.workloads.adversarial.prefix_probe`)."""

    horizon_s: float = key(60.0, "victim traffic runs over [0, horizon_s)", gt=0)
    victim: TenantParams = key(doc="the victim tenant (system_prompt_len >= 1: the secret prefix)",
                               factory=lambda: tenant("victim", rate=2.0, system_prompt_len=512,
                                                      prompt={"mean": 128.0}, output={"mean": 64.0}))
    attacker: str = key("attacker", "attacker tenant name")
    attacker_priority: int = key(0, "attacker scheduling priority")
    attack_start_s: float = key(10.0, "when the first probe arrives", lo=0)
    num_probes: int = key(40, "number of candidate prefixes sent", lo=0)
    probe_rate: float = key(2.0, "probes per second", gt=0)
    probe_len: Optional[int] = key(None, "candidate length (null = whole system prompt)", lo=1)
    correct_fraction: float = key(0.5, "share of candidates that are the true prefix", lo=0, hi=1)
    wrong_mode: str = key("perturb", "wrong candidates: random | perturb | perturb_last", choices=WRONG_MODES)
    probe_suffix_len: int = key(1, "random ids appended after each candidate", lo=0)
    probe_output_len: int = key(1, "tokens generated per probe", lo=1)
