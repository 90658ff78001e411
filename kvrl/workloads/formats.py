"""Format detection, a single ``load_trace`` entry and ``convert`` between the trace formats."""
from __future__ import annotations

import importlib.resources
import json
import os
import secrets
from typing import Optional

from kvrl.engine.request import Request

from .azure import load_azure_csv, write_azure_csv
from .burstgpt import load_burstgpt_csv, write_burstgpt_csv
from .errors import TraceFormatError
from .jsonl import load_jsonl, write_jsonl
from .mooncake import load_mooncake, write_mooncake
from .trace import LoadedTrace

#: format -> (its loader, the keyword options that loader takes besides vocab_size, seed, skip_bad_rows)
LOADERS = {"azure": (load_azure_csv, ()),
           "burstgpt": (load_burstgpt_csv, ("drop_failures", "models", "log_types", "tenant_from")),
           "jsonl": (load_jsonl, ()),
           "mooncake": (load_mooncake, ("block_tokens", "time_unit", "prompt_scale", "output_scale"))}
FORMATS = tuple(LOADERS)

#: Traces shipped inside the package (``kvrl/workloads/data``).
PACKAGED = {"azure_code": "azure_llm_2023_code.csv"}


def packaged_trace_path(name: str = "azure_code") -> str:
    """Filesystem path of a packaged trace (``"azure_code"``: the Azure 2023 code trace)."""
    if name not in PACKAGED:
        raise ValueError(f"unknown packaged trace {name!r} (known: {', '.join(PACKAGED)})")
    return str(importlib.resources.files("kvrl.workloads").joinpath("data", PACKAGED[name]))


def _json_flavour(first_line: str) -> str:
    """``"mooncake"`` when the first object has Mooncake's fields, else ``"jsonl"``."""
    try:
        obj = json.loads(first_line)
    except ValueError:
        return "jsonl"  # the jsonl loader names the bad line
    return "mooncake" if isinstance(obj, dict) and ("input_length" in obj or "hash_ids" in obj) \
        else "jsonl"


def detect_format(path: str | os.PathLike) -> str:
    """For JSON lines, ``"mooncake"`` when the first line has ``input_length`` or ``hash_ids``,
    else ``"jsonl"``; for CSVs, look at the header."""
    p = os.fspath(path)
    ext = os.path.splitext(p)[1].lower()
    try:
        with open(p, encoding="utf-8-sig", errors="replace") as f:
            head = f.readline()
            while not head.strip() and head:
                head = f.readline()
    except OSError as e:
        raise TraceFormatError(p, None, f"cannot open: {e.strerror or e}") from None
    if ext in (".jsonl", ".json", ".ndjson") or head.lstrip().startswith("{"):
        return _json_flavour(head)
    if "ContextTokens" in head or "TIMESTAMP" in head:
        return "azure"
    if "Request tokens" in head or "Response tokens" in head:
        return "burstgpt"
    raise TraceFormatError(p, 1, "cannot tell the trace format from the header; pass a format "
                                 f"({', '.join(FORMATS)})")


def load_trace(path: str | os.PathLike, format: Optional[str] = None, *, vocab_size: int,
               seed: int = 0, skip_bad_rows: bool = False, **options) -> LoadedTrace:
    """Load any supported trace (``format`` None = detect). ``options`` go to the format's loader
    (:data:`LOADERS` lists which it takes)."""
    fmt = format or detect_format(path)
    if fmt not in LOADERS:
        raise ValueError(f"unknown trace format {fmt!r} (known: {', '.join(FORMATS)})")
    loader, takes = LOADERS[fmt]
    wrong = sorted(set(options) - set(takes))
    if wrong:
        raise ValueError(f"options {wrong} do not apply to the {fmt} format"
                         + (f" (it takes {', '.join(takes)})" if takes else ""))
    return loader(path, vocab_size=vocab_size, seed=seed, skip_bad_rows=skip_bad_rows, **options)


def write_trace(requests: list[Request], path: str | os.PathLike, format: str, *,
                tokens: bool = True) -> int:
    """Write requests in ``format``; the CSV formats keep lengths and arrivals only, mooncake
    lengths, arrivals and which prompts share which blocks of 512 tokens.

    Atomic: the file is written next to ``path`` under a temporary name and renamed into place, so
    a failure (a full disk) leaves any earlier ``path`` as it was and no truncated file behind.
    """
    writers = {"jsonl": lambda p: write_jsonl(requests, p, tokens=tokens),
               "azure": lambda p: write_azure_csv(requests, p),
               "burstgpt": lambda p: write_burstgpt_csv(requests, p),
               "mooncake": lambda p: write_mooncake(requests, p)}
    if format not in writers:
        raise ValueError(f"unknown trace format {format!r} (known: {', '.join(FORMATS)})")
    path = os.fspath(path)
    head, name = os.path.split(path)
    tmp = os.path.join(head, f".{name}.{secrets.token_hex(4)}.tmp")
    try:
        n = writers[format](tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return n


def check_not_input(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """Raise ``ValueError`` when ``dst`` is the file ``src`` (a conversion never overwrites its
    input: a failure half-way would lose it, and a success would replace the data with a copy)."""
    if os.path.exists(dst) and os.path.exists(src) and os.path.samefile(src, dst):
        raise ValueError(f"output {os.fspath(dst)!r} is the input file; write the conversion to "
                         f"another path")


def convert(src: str | os.PathLike, dst: str | os.PathLike, *, from_format: Optional[str] = None,
            to_format: Optional[str] = None, vocab_size: int = 32000, seed: int = 0,
            tokens: bool = True, skip_bad_rows: bool = False) -> int:
    """Convert a trace file between formats; returns the number of requests written.

    ``to_format`` None = from ``dst``'s extension (.jsonl -> jsonl, .csv -> azure). ``dst`` must
    not be ``src``; it is written atomically (:func:`write_trace`).
    """
    check_not_input(src, dst)
    reqs = load_trace(src, from_format, vocab_size=vocab_size, seed=seed,
                      skip_bad_rows=skip_bad_rows)
    if to_format is None:
        ext = os.path.splitext(os.fspath(dst))[1].lower()
        to_format = "jsonl" if ext in (".jsonl", ".json", ".ndjson") else "azure"
    return write_trace(reqs, dst, to_format, tokens=tokens)
