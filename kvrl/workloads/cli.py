"""``kvrl-trace``: inspect and convert workload traces.

    kvrl-trace stats FILE_OR_WORKLOAD [--format azure|burstgpt|jsonl|mooncake] [--png out.png]
                     [--set key=value ...] [--vocab-size N] [--max-model-len N] [--json]
    kvrl-trace convert IN OUT [--from azure|burstgpt|jsonl|mooncake|workload]
                       [--to azure|burstgpt|jsonl|mooncake]
                       [--no-tokens] [--vocab-size N] [--seed S] [--skip-bad-rows]
                       (OUT must not be IN; it is written atomically)
    kvrl-trace workloads            # list the workload configs

FILE_OR_WORKLOAD is a trace file or the name of a ``conf/workload`` config (``azure_code``,
``fill_and_squeeze``, ...; ``--set`` overrides its keys, e.g. ``--set max_requests=500``).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Optional, Sequence

from .config import available_workload_configs, build_workload, load_workload_config
from .formats import FORMATS, check_not_input, load_trace, write_trace
from .stats import format_stats, plot_stats, trace_stats

DEFAULT_VOCAB = 32000


def _load(source: str, fmt: Optional[str], args) -> tuple[list, str]:
    """Requests from a trace file or a workload config name; returns (requests, title)."""
    if fmt != "workload" and os.path.isfile(source) and not source.endswith((".yaml", ".yml")):
        reqs = load_trace(source, fmt, vocab_size=args.vocab_size, seed=args.seed or 0,
                          skip_bad_rows=args.skip_bad_rows)
        if getattr(reqs, "skipped", 0):
            print(f"warning: skipped {reqs.skipped} malformed row(s); first: {reqs.errors[0]}",
                  file=sys.stderr)
        return reqs, os.path.basename(source)
    if fmt not in (None, "workload"):
        raise ValueError(f"{source}: no such file")
    cfg = load_workload_config(source, getattr(args, "set", None) or ())
    if args.seed is not None:
        cfg["seed"] = args.seed
    return build_workload(cfg, vocab_size=args.vocab_size,
                          max_model_len=getattr(args, "max_model_len", None)), f"workload {source}"


def _json_safe(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _json_safe(x) for k, x in v.items()}
    return v


def cmd_stats(args) -> int:
    reqs, title = _load(args.source, args.format, args)
    st = trace_stats(reqs)
    if args.json:
        print(json.dumps(_json_safe(st), indent=2))
    else:
        print(format_stats(st, title))
    if args.png:
        plot_stats(reqs, args.png, title)
        print(f"wrote {args.png}", file=sys.stderr)
    return 0


def cmd_convert(args) -> int:
    check_not_input(args.input, args.output)
    reqs, _ = _load(args.input, args.from_format, args)
    to = args.to_format
    if to is None:
        ext = os.path.splitext(args.output)[1].lower()
        to = "jsonl" if ext in (".jsonl", ".json", ".ndjson") else None
        if to is None:
            raise ValueError("cannot tell the output format from its name; pass --to")
    n = write_trace(reqs, args.output, to, tokens=not args.no_tokens)
    print(f"wrote {n} requests to {args.output} ({to})", file=sys.stderr)
    return 0


def cmd_workloads(args) -> int:
    for name in available_workload_configs():
        print(name)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvrl-trace", description="Inspect and convert kvrl workload "
                                "traces (Azure / BurstGPT CSV, kvrl and Mooncake JSONL, workload configs).")
    sub = p.add_subparsers(dest="command", required=True)

    def common(sp):
        sp.add_argument("--vocab-size", type=int, default=DEFAULT_VOCAB,
                        help=f"vocabulary size for random token ids (default {DEFAULT_VOCAB})")
        sp.add_argument("--seed", type=int, default=None,
                        help="seed for random token ids / the workload's seed key (default 0 / "
                             "the config's)")
        sp.add_argument("--skip-bad-rows", action="store_true",
                        help="skip malformed rows instead of failing")
        sp.add_argument("--set", action="append", metavar="KEY=VALUE",
                        help="override a workload config key (repeatable)")
        sp.add_argument("--max-model-len", type=int, default=None,
                        help="apply a workload config's overlong (reject: count them, clip, "
                             "drop) to requests longer than this")

    s = sub.add_parser("stats", help="print statistics of a trace or workload, optionally a PNG")
    s.add_argument("source", metavar="FILE_OR_WORKLOAD")
    s.add_argument("--format", choices=FORMATS + ("workload",), default=None,
                   help="input format (default: detect from the file)")
    s.add_argument("--png", default=None, help="write arrivals/length plots to this PNG")
    s.add_argument("--json", action="store_true", help="print the statistics as JSON")
    common(s)
    s.set_defaults(func=cmd_stats)

    c = sub.add_parser("convert", help="convert a trace (or a workload config) to another format")
    c.add_argument("input", metavar="IN")
    c.add_argument("output", metavar="OUT")
    c.add_argument("--from", dest="from_format", choices=FORMATS + ("workload",), default=None,
                   help="input format (default: detect)")
    c.add_argument("--to", dest="to_format", choices=FORMATS, default=None,
                   help="output format (default: jsonl for .jsonl names)")
    c.add_argument("--no-tokens", action="store_true",
                   help="jsonl: write prompt_len instead of the token ids")
    common(c)
    c.set_defaults(func=cmd_convert)

    w = sub.add_parser("workloads", help="list the workload config names")
    w.set_defaults(func=cmd_workloads)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, OSError) as e:
        print(f"kvrl-trace: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
