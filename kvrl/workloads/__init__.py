"""Workloads: trace loaders, seeded generators, transforms, and the config entry point.

The engine apps call :func:`build_workload` with ``cfg.workload`` (from ``conf/workload/<name>.yaml``)::

    reqs = build_workload(cfg.workload, vocab_size=model.vocab_size, max_model_len=4096)

Every function returns ``list[Request]`` sorted by arrival. See ``docs/workloads.md``.
"""
from __future__ import annotations

from .adversarial import fill_and_squeeze, prefix_probe, probe_label
from .arrivals import (ArrivalProcess, constant_arrivals, gamma_arrivals, offline_arrivals,
                       poisson_arrivals)
from .azure import load_azure_csv, read_azure_csv, write_azure_csv
from .burstgpt import load_burstgpt_csv, read_burstgpt_csv, write_burstgpt_csv
from .config import (BUILDERS, WORKLOADS, Workload, apply_common, build_workload, default_config,
                     load_workload_config, resolve_config, workload_yaml)
from .errors import TraceFormatError, WorkloadConfigError
from .formats import FORMATS, convert, detect_format, load_trace, packaged_trace_path, write_trace
from .generators import TenantSpec, multi_tenant, multi_turn, shared_prefix, synthetic
from .jsonl import load_jsonl, write_jsonl
from .mooncake import load_mooncake, read_mooncake, write_mooncake
from .params import ArrivalParams, CommonParams, LengthParams, TenantParams
from .registry import BuildContext, WorkloadSpec, register_workload
from .lengths import LengthDist, empirical_lengths
from .stats import format_stats, plot_stats, trace_stats
from .tokens import fill_prompts
from .trace import LengthTrace, LoadedTrace
from .transforms import (OVERLONG, clip_lengths, fit_lengths, make_offline, scale_rate, select_split, split_by_time,
                         split_windows, subsample, take, time_window, with_default_slos)

__all__ = [
    "build_workload", "Workload", "resolve_config", "default_config", "apply_common", "workload_yaml",
    "load_workload_config", "BUILDERS", "WORKLOADS", "register_workload", "WorkloadSpec", "BuildContext",
    "CommonParams", "LengthParams", "ArrivalParams", "TenantParams",
    "TraceFormatError", "WorkloadConfigError",
    "load_azure_csv", "read_azure_csv", "write_azure_csv",
    "load_burstgpt_csv", "read_burstgpt_csv", "write_burstgpt_csv",
    "load_jsonl", "write_jsonl", "load_mooncake", "read_mooncake", "write_mooncake", "load_trace", "write_trace", "convert", "detect_format",
    "packaged_trace_path", "FORMATS", "LoadedTrace", "LengthTrace", "fill_prompts",
    "ArrivalProcess", "poisson_arrivals", "gamma_arrivals", "constant_arrivals", "offline_arrivals",
    "LengthDist", "empirical_lengths", "TenantSpec",
    "synthetic", "shared_prefix", "multi_turn", "multi_tenant",
    "fill_and_squeeze", "prefix_probe", "probe_label",
    "scale_rate", "time_window", "subsample", "take", "clip_lengths", "fit_lengths", "OVERLONG", "make_offline",
    "with_default_slos", "split_by_time", "split_windows", "select_split",
    "trace_stats", "format_stats", "plot_stats",
]
