"""The built-in workload builders, each registered with its ``Params`` dataclass
(:mod:`kvrl.workloads.params`) and called with it (:func:`kvrl.workloads.registry.register_workload`).

A builder is ``build(params, ctx) -> list[Request]``: the trace loaders read ``params.path``; the
generators are called with the Params fields as keyword arguments (their argument names match).
"""
from __future__ import annotations

import os

from . import adversarial, generators
from .azure import load_azure_csv
from .burstgpt import load_burstgpt_csv
from .errors import WorkloadConfigError
from .formats import packaged_trace_path
from .jsonl import load_jsonl
from .mooncake import load_mooncake
from .params import (AzureCodeParams, BurstGPTParams, FillAndSqueezeParams, MooncakeParams, MultiTenantParams,
                     MultiTurnParams, PrefixProbeParams, SharedPrefixParams, SyntheticParams, TraceParams)
from .registry import BuildContext, as_kwargs, register_workload


def _path(name: str, p: TraceParams) -> str:
    if p.path is None:
        raise WorkloadConfigError(f"workload {name!r}: key 'path' is required")
    return os.path.expanduser(p.path)


# ------------------------------------------------------------------------------ trace loaders
@register_workload("azure_code", AzureCodeParams, "the packaged Azure LLM inference 2023 code trace "
                   "(8,819 requests, 1 hour)", sized=False)
def azure_code(p: AzureCodeParams, ctx: BuildContext) -> list:
    path = packaged_trace_path("azure_code") if p.path is None else _path("azure_code", p)
    return load_azure_csv(path, vocab_size=ctx.vocab_size, seed=ctx.seed, skip_bad_rows=p.skip_bad_rows)


@register_workload("azure_csv", TraceParams, "any Azure LLM inference CSV (2023 or 2024: TIMESTAMP,"
                   "ContextTokens,GeneratedTokens)", sized=False)
def azure_csv(p: TraceParams, ctx: BuildContext) -> list:
    return load_azure_csv(_path("azure_csv", p), vocab_size=ctx.vocab_size, seed=ctx.seed,
                          skip_bad_rows=p.skip_bad_rows)


@register_workload("burstgpt", BurstGPTParams, "a BurstGPT CSV (Timestamp,Model,Request tokens,"
                   "Response tokens,...)", sized=False)
def burstgpt(p: BurstGPTParams, ctx: BuildContext) -> list:
    return load_burstgpt_csv(_path("burstgpt", p), vocab_size=ctx.vocab_size, seed=ctx.seed,
                             skip_bad_rows=p.skip_bad_rows, drop_failures=p.drop_failures, models=p.models,
                             log_types=p.log_types, tenant_from=p.tenant_from)


@register_workload("jsonl", TraceParams, "a kvrl JSONL trace (one request per line)", sized=False)
def jsonl(p: TraceParams, ctx: BuildContext) -> list:
    return load_jsonl(_path("jsonl", p), vocab_size=ctx.vocab_size, seed=ctx.seed, skip_bad_rows=p.skip_bad_rows)


@register_workload("mooncake", MooncakeParams, "a Mooncake trace (timestamp,input_length,output_length,"
                   "hash_ids): prompts share prefixes as their block ids do", sized=False)
def mooncake(p: MooncakeParams, ctx: BuildContext) -> list:
    return load_mooncake(_path("mooncake", p), vocab_size=ctx.vocab_size, seed=ctx.seed,
                         block_tokens=p.block_tokens, time_unit=p.time_unit, prompt_scale=p.prompt_scale,
                         output_scale=p.output_scale, skip_bad_rows=p.skip_bad_rows)


# ------------------------------------------------------------------------------ generators
@register_workload("synthetic", SyntheticParams, "independent requests with random lengths")
def synthetic(p: SyntheticParams, ctx: BuildContext) -> list:
    return generators.synthetic(vocab_size=ctx.vocab_size, seed=ctx.seed, **as_kwargs(p))


@register_workload("shared_prefix", SharedPrefixParams, "k system prompts shared by groups of requests")
def shared_prefix(p: SharedPrefixParams, ctx: BuildContext) -> list:
    return generators.shared_prefix(vocab_size=ctx.vocab_size, seed=ctx.seed, **as_kwargs(p))


@register_workload("multi_turn", MultiTurnParams, "conversations whose turns extend the previous prompt + answer")
def multi_turn(p: MultiTurnParams, ctx: BuildContext) -> list:
    return generators.multi_turn(vocab_size=ctx.vocab_size, seed=ctx.seed, max_total_len=ctx.max_model_len,
                                 **as_kwargs(p))


@register_workload("multi_tenant", MultiTenantParams, "several tenants, each with its own rate, length mix, "
                   "priority and SLOs")
def multi_tenant(p: MultiTenantParams, ctx: BuildContext) -> list:
    return generators.multi_tenant(vocab_size=ctx.vocab_size, seed=ctx.seed, **as_kwargs(p))


@register_workload("fill_and_squeeze", FillAndSqueezeParams, "attacker probes, floods the KV cache, then "
                   "squeezes with tiny requests, next to a benign tenant")
def fill_and_squeeze(p: FillAndSqueezeParams, ctx: BuildContext) -> list:
    return adversarial.fill_and_squeeze(vocab_size=ctx.vocab_size, seed=ctx.seed, max_model_len=ctx.max_model_len,
                                        **as_kwargs(p))


@register_workload("prefix_probe", PrefixProbeParams, "attacker probes a victim's system prompt with "
                   "labelled candidates")
def prefix_probe(p: PrefixProbeParams, ctx: BuildContext) -> list:
    return adversarial.prefix_probe(vocab_size=ctx.vocab_size, seed=ctx.seed, **as_kwargs(p))
