"""Format detection, a single ``load_trace`` entry and ``convert`` between the trace formats."""
from __future__ import annotations

import importlib.resources
import os
import secrets
from typing import Optional

from kvrl.engine.request import Request

from .azure import load_azure_csv, write_azure_csv
from .burstgpt import load_burstgpt_csv, write_burstgpt_csv
from .errors import TraceFormatError
from .jsonl import load_jsonl, write_jsonl
from .trace import LoadedTrace

FORMATS = ("azure", "burstgpt", "jsonl")

#: Traces shipped inside the package (``kvrl/workloads/data``).
PACKAGED = {"azure_code": "azure_llm_2023_code.csv"}


def packaged_trace_path(name: str = "azure_code") -> str:
    """Filesystem path of a packaged trace (``"azure_code"``: the Azure 2023 code trace)."""
    if name not in PACKAGED:
        raise ValueError(f"unknown packaged trace {name!r} (known: {', '.join(PACKAGED)})")
    return str(importlib.resources.files("kvrl.workloads").joinpath("data", PACKAGED[name]))


def detect_format(path: str | os.PathLike) -> str:
    """``"jsonl"`` for .jsonl/.json/.ndjson files; for CSVs, look at the header."""
    p = os.fspath(path)
    ext = os.path.splitext(p)[1].lower()
    if ext in (".jsonl", ".json", ".ndjson"):
        return "jsonl"
    try:
        with open(p, encoding="utf-8-sig", errors="replace") as f:
            head = f.readline()
    except OSError as e:
        raise TraceFormatError(p, None, f"cannot open: {e.strerror or e}") from None
    if head.lstrip().startswith("{"):
        return "jsonl"
    if "ContextTokens" in head or "TIMESTAMP" in head:
        return "azure"
    if "Request tokens" in head or "Response tokens" in head:
        return "burstgpt"
    raise TraceFormatError(p, 1, "cannot tell the trace format from the header; pass a format "
                                 f"({', '.join(FORMATS)})")


def load_trace(path: str | os.PathLike, format: Optional[str] = None, *, vocab_size: int,
               seed: int = 0, skip_bad_rows: bool = False, **options) -> LoadedTrace:
    """Load any supported trace (``format`` None = detect). ``options`` go to the BurstGPT loader."""
    fmt = format or detect_format(path)
    if fmt == "azure":
        if options:
            raise ValueError(f"options {sorted(options)} do not apply to the azure format")
        return load_azure_csv(path, vocab_size=vocab_size, seed=seed, skip_bad_rows=skip_bad_rows)
    if fmt == "burstgpt":
        return load_burstgpt_csv(path, vocab_size=vocab_size, seed=seed,
                                 skip_bad_rows=skip_bad_rows, **options)
    if fmt == "jsonl":
        if options:
            raise ValueError(f"options {sorted(options)} do not apply to the jsonl format")
        return load_jsonl(path, vocab_size=vocab_size, seed=seed, skip_bad_rows=skip_bad_rows)
    raise ValueError(f"unknown trace format {fmt!r} (known: {', '.join(FORMATS)})")


def write_trace(requests: list[Request], path: str | os.PathLike, format: str, *,
                tokens: bool = True) -> int:
    """Write requests in ``format``; the CSV formats keep lengths and arrivals only.

    Atomic: the file is written next to ``path`` under a temporary name and renamed into place, so
    a failure (a full disk) leaves any earlier ``path`` as it was and no truncated file behind.
    """
    writers = {"jsonl": lambda p: write_jsonl(requests, p, tokens=tokens),
               "azure": lambda p: write_azure_csv(requests, p),
               "burstgpt": lambda p: write_burstgpt_csv(requests, p)}
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
