"""The workload builders and their parameter schemas: :data:`BUILDERS` (name -> :class:`Builder`:
docstring, parameters, the function that builds the requests) and the common transform keys of
:data:`COMMON`; :mod:`kvrl.workloads.config` validates a config against them and builds it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Optional

from . import adversarial, generators, transforms
from .arrivals import PROCESSES
from .azure import load_azure_csv
from .burstgpt import TENANT_FROM, load_burstgpt_csv
from .errors import WorkloadConfigError
from .formats import packaged_trace_path
from .jsonl import load_jsonl
from .lengths import DISTS, FIELDS as LENGTH_FIELDS
from .schema import Param, defaults

# ------------------------------------------------------------------------------ nested schemas
LENGTH = {
    "dist": Param("str", "constant", "constant | uniform | lognormal | empirical", choices=DISTS),
    "low": Param("int", None, "uniform: smallest length; others: clamp below (null = 1)",
                 nullable=True, lo=1),
    "high": Param("int", None, "uniform: largest length; others: clamp above (null = none)",
                  nullable=True, lo=1),
    "mean": Param("float", None, "lognormal: mean length; constant: the length", nullable=True,
                  lo=1),
    "sigma": Param("float", None, "lognormal: std of log-length (null = derive from cv)",
                   nullable=True, lo=0),
    "cv": Param("float", None, "lognormal: coefficient of variation, used when sigma is null",
                nullable=True, lo=0),
    "trace": Param("str", None, "empirical: azure_code or a trace file path", nullable=True),
    "field": Param("str", "prompt", "empirical: resample the prompt or output lengths",
                   choices=LENGTH_FIELDS),
}

ARRIVAL = {
    "process": Param("str", "poisson", "poisson | gamma (bursty) | constant | offline (all at 0)",
                     choices=PROCESSES),
    "rate": Param("float", 1.0, "mean arrivals per second (ignored when offline)", nullable=True,
                  gt=0),
    "cv": Param("float", 1.0, "gamma: inter-arrival coefficient of variation (1 = Poisson)", gt=0),
}


def _length_param(doc: str, dist: str = "constant", **kw) -> Param:
    d = {k: None for k in LENGTH}
    d.update(dist=dist, field="prompt")
    d.update(kw)
    return Param("dict", d, doc, fields=LENGTH)


def _arrival_param(doc: str, process: str = "poisson", rate: Optional[float] = 1.0,
                   cv: float = 1.0) -> Param:
    return Param("dict", {"process": process, "rate": rate, "cv": cv}, doc, fields=ARRIVAL)


TENANT = {
    "name": Param("str", "default", "tenant name (unique)"),
    "arrival": _arrival_param("this tenant's arrival process"),
    "prompt_len": _length_param(
        "prompt length after the system prompt", "lognormal", mean=256.0, cv=1.0),
    "output_len": _length_param("output length", "lognormal", mean=128.0, cv=1.0, field="output"),
    "priority": Param("int", 0, "scheduling priority (smaller = more important)"),
    "parallel_n": Param("int", 1, "parallel samples n for sampled requests", lo=1),
    "parallel_prob": Param("float", 1.0, "probability a request uses parallel_n (else n=1)", lo=0,
                           hi=1),
    "slo_ttft_s": Param("float", None, "time-to-first-token SLO in s (null = run default)",
                        nullable=True, gt=0),
    "slo_tpot_s": Param("float", None, "time-per-output-token SLO in s (null = run default)",
                        nullable=True, gt=0),
    "system_prompt_len": Param("int", 0, "shared system prompt length (0 = none)", lo=0),
}


def tenant_default(name: str, *, process="poisson", rate=1.0, cv=1.0, prompt=None, output=None,
                   **kw) -> dict:
    d = defaults(TENANT)
    d.update(name=name, arrival={"process": process, "rate": rate, "cv": cv}, **kw)
    if prompt:
        d["prompt_len"].update(prompt)
    if output:
        d["output_len"].update(output)
    return d


# ------------------------------------------------------------------------------ common keys
COMMON = {
    "name": Param("str", None, "which builder makes the requests"),
    "seed": Param("int", 0, "seed of every random draw (token ids, generators, subsample)", lo=0),
    "max_requests": Param("int", None, "keep the first N requests by arrival (null = all)",
                          nullable=True, lo=0),
    "rate_scale": Param("float", 1.0, "divide arrival times by this (2.0 = twice the rate)", gt=0),
    "offline": Param("bool", False, "put every arrival at t=0 (offline batch)"),
    "split": Param("str", None, "null | train | val | test: one contiguous time window",
                   nullable=True, choices=transforms.SPLITS),
    "split_fractions": Param("floats", [0.6, 0.2, 0.2], "train/val/test shares of the time span",
                             length=3, lo=0),
    "start_s": Param("float", 0.0, "time window start in s (re-based to 0)", lo=0),
    "duration_s": Param("float", None, "time window length in s (null = to the end)",
                        nullable=True, gt=0),
    "subsample": Param("float", None, "keep this seeded random fraction of requests (null = all)",
                       nullable=True, gt=0, hi=1),
    "slo_ttft_s": Param("float", None, "default TTFT SLO (s) for requests without one",
                        nullable=True, gt=0),
    "slo_tpot_s": Param("float", None, "default TPOT SLO (s) for requests without one",
                        nullable=True, gt=0),
    "overlong": Param("str", "reject", "requests over max_model_len: reject (engine says why), "
                      "clip or drop", choices=transforms.OVERLONG),
}
COMMON_ORDER_NOTE = ("common keys apply in this order: start_s/duration_s, split, subsample,\n"
                      "rate_scale, max_requests, overlong (with max_model_len), offline, SLO defaults")


# ------------------------------------------------------------------------------ builders
@dataclass(frozen=True)
class Builder:
    """``sized``: the builder's own keys say how many requests it makes (a generator); False for
    trace loaders, whose size is the file's."""
    name: str
    doc: str
    params: dict
    make: Callable[[dict, int, Optional[int]], list]
    sized: bool = True


def _need(p: dict, key: str) -> Any:
    if p.get(key) is None:
        raise WorkloadConfigError(f"workload {p['name']!r}: key {key!r} is required")
    return p[key]


def _trace_path(path: str) -> str:
    return os.path.expanduser(path)


def _azure_code(p, vocab, mml):
    path = packaged_trace_path("azure_code") if p["path"] is None else _trace_path(p["path"])
    return load_azure_csv(path, vocab_size=vocab, seed=p["seed"], skip_bad_rows=p["skip_bad_rows"])


def _azure_csv(p, vocab, mml):
    return load_azure_csv(_trace_path(_need(p, "path")), vocab_size=vocab, seed=p["seed"],
                          skip_bad_rows=p["skip_bad_rows"])


def _burstgpt(p, vocab, mml):
    return load_burstgpt_csv(_trace_path(_need(p, "path")), vocab_size=vocab, seed=p["seed"],
                             skip_bad_rows=p["skip_bad_rows"], drop_failures=p["drop_failures"],
                             models=p["models"], log_types=p["log_types"],
                             tenant_from=p["tenant_from"])


def _jsonl(p, vocab, mml):
    return load_jsonl(_trace_path(_need(p, "path")), vocab_size=vocab, seed=p["seed"],
                      skip_bad_rows=p["skip_bad_rows"])


def _synthetic(p, vocab, mml):
    return generators.synthetic(p["num_requests"], vocab_size=vocab, seed=p["seed"],
                                arrival=p["arrival"], prompt_len=p["prompt_len"],
                                output_len=p["output_len"], parallel_n=p["parallel_n"],
                                parallel_prob=p["parallel_prob"], tenant=p["tenant"],
                                priority=p["priority"], rate_phases=p["rate_phases"],
                                phase_s=p["phase_s"])


def _shared_prefix(p, vocab, mml):
    return generators.shared_prefix(p["num_requests"], vocab_size=vocab, seed=p["seed"],
                                    num_groups=p["num_groups"], prefix_len=p["prefix_len"],
                                    group_skew=p["group_skew"], arrival=p["arrival"],
                                    suffix_len=p["suffix_len"], output_len=p["output_len"],
                                    parallel_n=p["parallel_n"], parallel_prob=p["parallel_prob"],
                                    tenant=p["tenant"], priority=p["priority"])


def _multi_turn(p, vocab, mml):
    return generators.multi_turn(p["num_conversations"], vocab_size=vocab, seed=p["seed"],
                                 arrival=p["arrival"], min_turns=p["min_turns"],
                                 max_turns=p["max_turns"], system_prompt_len=p["system_prompt_len"],
                                 first_prompt_len=p["first_prompt_len"],
                                 user_turn_len=p["user_turn_len"], output_len=p["output_len"],
                                 mean_turn_gap_s=p["mean_turn_gap_s"], max_total_len=mml,
                                 tenant=p["tenant"], priority=p["priority"])


def _multi_tenant(p, vocab, mml):
    return generators.multi_tenant(p["tenants"], p["horizon_s"], vocab_size=vocab, seed=p["seed"])


def _fill_and_squeeze(p, vocab, mml):
    kw = {k: p[k] for k in FILL_AND_SQUEEZE}
    return adversarial.fill_and_squeeze(vocab_size=vocab, seed=p["seed"], max_model_len=mml, **kw)


def _prefix_probe(p, vocab, mml):
    kw = {k: p[k] for k in PREFIX_PROBE}
    return adversarial.prefix_probe(vocab_size=vocab, seed=p["seed"], **kw)


SKIP = Param("bool", False, "skip malformed rows (count logged) instead of failing")
STREAM = {
    "parallel_n": Param("int", 1, "parallel samples n for sampled requests", lo=1),
    "parallel_prob": Param("float", 1.0, "probability a request uses parallel_n (else n=1)",
                           lo=0, hi=1),
    "tenant": Param("str", "default", "tenant name of every request"),
    "priority": Param("int", 0, "scheduling priority (smaller = more important)"),
}

FILL_AND_SQUEEZE = {
    "horizon_s": Param("float", 120.0, "benign traffic runs over [0, horizon_s)", gt=0),
    "benign": Param("dict", tenant_default("benign", rate=2.0,
                                           prompt={"mean": 512.0}, output={"mean": 128.0}),
                    "the benign tenant", fields=TENANT),
    "attacker": Param("str", "attacker", "attacker tenant name"),
    "attacker_priority": Param("int", 0, "attacker scheduling priority"),
    "attack_start_s": Param("float", 20.0, "when the attacker's first probe arrives", lo=0),
    "probe_count": Param("int", 8, "phase 1: number of probe requests", lo=0),
    "probe_rate": Param("float", 1.0, "probes per second", gt=0),
    "probe_prompt_len": Param("int", 256, "probe prompt length", lo=1),
    "probe_output_len": Param("int", 16, "probe output length", lo=1),
    "flood_count": Param("int", 32, "phase 2: number of max-length flood requests", lo=0),
    "flood_rate": Param("float", 20.0, "flood requests per second", gt=0),
    "flood_prompt_len": Param("int", None, "flood prompt length (null = max_model_len - output)",
                              nullable=True, lo=1),
    "flood_output_len": Param("int", 256, "flood output length", lo=1),
    "squeeze_delay_s": Param("float", 1.0, "gap between the last flood and the first squeeze", lo=0),
    "squeeze_count": Param("int", 200, "phase 3: number of tiny requests", lo=0),
    "squeeze_rate": Param("float", 20.0, "tiny requests per second", gt=0),
    "squeeze_prompt_len": Param("int", 8, "tiny request prompt length", lo=1),
    "squeeze_output_len": Param("int", 8, "tiny request output length", lo=1),
}

PREFIX_PROBE = {
    "horizon_s": Param("float", 60.0, "victim traffic runs over [0, horizon_s)", gt=0),
    "victim": Param("dict", tenant_default("victim", rate=2.0, system_prompt_len=512,
                                           prompt={"mean": 128.0}, output={"mean": 64.0}),
                    "the victim tenant (system_prompt_len >= 1: the secret prefix)",
                    fields=TENANT),
    "attacker": Param("str", "attacker", "attacker tenant name"),
    "attacker_priority": Param("int", 0, "attacker scheduling priority"),
    "attack_start_s": Param("float", 10.0, "when the first probe arrives", lo=0),
    "num_probes": Param("int", 40, "number of candidate prefixes sent", lo=0),
    "probe_rate": Param("float", 2.0, "probes per second", gt=0),
    "probe_len": Param("int", None, "candidate length (null = whole system prompt)",
                       nullable=True, lo=1),
    "correct_fraction": Param("float", 0.5, "share of candidates that are the true prefix",
                              lo=0, hi=1),
    "wrong_mode": Param("str", "perturb", "wrong candidates: random | perturb | perturb_last",
                        choices=adversarial.WRONG_MODES),
    "probe_suffix_len": Param("int", 1, "random ids appended after each candidate", lo=0),
    "probe_output_len": Param("int", 1, "tokens generated per probe", lo=1),
}

BUILDERS: dict[str, Builder] = {}


def _register(name: str, doc: str, params: dict, make, sized: bool = True) -> None:
    BUILDERS[name] = Builder(name, doc, params, make, sized)


_register("azure_code", "the packaged Azure LLM inference 2023 code trace (8,819 requests, 1 hour)", {
    "path": Param("str", None, "trace file (null = the packaged copy)", nullable=True),
    "skip_bad_rows": SKIP,
}, _azure_code, sized=False)
_register("azure_csv", "any Azure LLM inference CSV (2023 or 2024: TIMESTAMP,ContextTokens,"
                       "GeneratedTokens)", {
    "path": Param("str", None, "trace file (required)", nullable=True),
    "skip_bad_rows": SKIP,
}, _azure_csv, sized=False)
_register("burstgpt", "a BurstGPT CSV (Timestamp,Model,Request tokens,Response tokens,...)", {
    "path": Param("str", None, "trace file (required)", nullable=True),
    "skip_bad_rows": SKIP,
    "drop_failures": Param("bool", True, "drop failed requests (0 response tokens)"),
    "models": Param("strs", None, "keep only these Model values (null = all)", nullable=True),
    "log_types": Param("strs", None, "keep only these Log Type values (null = all)",
                       nullable=True),
    "tenant_from": Param("str", "none", "tenant name from: none | model | log_type",
                         choices=TENANT_FROM),
}, _burstgpt, sized=False)
_register("jsonl", "a kvrl JSONL trace (one request per line)", {
    "path": Param("str", None, "trace file (required)", nullable=True),
    "skip_bad_rows": SKIP,
}, _jsonl, sized=False)
_register("synthetic", "independent requests with random lengths", {
    "num_requests": Param("int", 200, "number of requests", lo=0),
    "arrival": _arrival_param("arrival process (offline = all at t=0)", "poisson", 5.0),
    "prompt_len": _length_param("prompt length distribution", "uniform", low=32, high=512),
    "output_len": _length_param(
        "output length distribution", "lognormal", mean=128.0, cv=1.0, field="output"),
    **STREAM,
    "rate_phases": Param("floats", None, "load phases: rate factors applied in turn, cycling "
                                         "(null = stationary)", nullable=True, gt=0),
    "phase_s": Param("float", 10.0, "length of each load phase in s (with rate_phases)", gt=0),
}, _synthetic)
_register("shared_prefix", "k system prompts shared by groups of requests", {
    "num_requests": Param("int", 500, "number of requests", lo=0),
    "num_groups": Param("int", 8, "number of prefix groups (k)", lo=1),
    "prefix_len": Param("int", 512, "shared prefix length per group (L)", lo=1),
    "group_skew": Param("float", 0.0, "group popularity ~ 1/rank^skew (0 = uniform, 1 = Zipf)",
                        lo=0),
    "arrival": _arrival_param("arrival process", "poisson", 5.0),
    "suffix_len": _length_param(
        "unique suffix length after the prefix", "lognormal", mean=128.0, cv=1.0),
    "output_len": _length_param(
        "output length distribution", "lognormal", mean=128.0, cv=1.0, field="output"),
    **STREAM,
}, _shared_prefix)
_register("multi_turn", "conversations whose turns extend the previous prompt + answer", {
    "num_conversations": Param("int", 50, "number of conversations", lo=0),
    "arrival": _arrival_param("arrival process of conversation starts", "poisson", 1.0),
    "min_turns": Param("int", 2, "fewest turns per conversation", lo=1),
    "max_turns": Param("int", 6, "most turns per conversation", lo=1),
    "system_prompt_len": Param("int", 0, "system prompt shared by all conversations (0 = none)",
                               lo=0),
    "first_prompt_len": _length_param("first user message length", "lognormal", mean=256.0, cv=1.0),
    "user_turn_len": _length_param("later user message length", "lognormal", mean=64.0, cv=1.0),
    "output_len": _length_param(
        "answer length per turn", "lognormal", mean=128.0, cv=1.0, field="output"),
    "mean_turn_gap_s": Param("float", 10.0, "mean exponential gap between turns in s (open loop)",
                             lo=0),
    "tenant": STREAM["tenant"],
    "priority": STREAM["priority"],
}, _multi_turn)
_register("multi_tenant", "several tenants, each with its own rate, length mix, priority and SLOs", {
    "horizon_s": Param("float", 60.0, "every tenant sends requests over [0, horizon_s)", gt=0),
    "tenants": Param("dicts", [
        tenant_default("interactive", rate=4.0, prompt={"mean": 256.0}, output={"mean": 64.0},
                       priority=0, slo_ttft_s=0.5, slo_tpot_s=0.05),
        tenant_default("batch", rate=1.0, prompt={"mean": 2048.0, "cv": 0.5},
                       output={"mean": 512.0}, priority=1),
        tenant_default("bursty", process="gamma", rate=2.0, cv=4.0, prompt={"mean": 512.0},
                       output={"mean": 128.0}, priority=0, parallel_n=4, parallel_prob=0.25,
                       system_prompt_len=256),
    ], "the tenants; each entry has the keys below", fields=TENANT),
}, _multi_tenant)
_register("fill_and_squeeze", "attacker probes, floods the KV cache, then squeezes with tiny "
                              "requests, next to a benign tenant", FILL_AND_SQUEEZE,
          _fill_and_squeeze)
_register("prefix_probe", "attacker probes a victim's system prompt with labelled candidates",
          PREFIX_PROBE, _prefix_probe)

WORKLOADS = tuple(BUILDERS)
