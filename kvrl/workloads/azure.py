"""Azure LLM inference traces (2023 and 2024): ``TIMESTAMP,ContextTokens,GeneratedTokens``.

``TIMESTAMP`` is a wall-clock time such as ``2023-11-16 18:17:03.9799600`` (an optional UTC offset,
as in the 2024 release, is honoured); arrivals are seconds since the earliest row, which is the
first row of the (time-sorted) published traces. Extra columns are ignored.
"""
from __future__ import annotations

import csv
import datetime as _dt
import logging
import os
from typing import Iterable

import numpy as np

from kvrl.engine.request import Request

from ._fields import parse_count, parse_timestamp_ns
from .errors import TraceFormatError
from .trace import CsvRows, LengthTrace, LoadedTrace, collect_row_errors, materialize, rebase_ns

log = logging.getLogger(__name__)

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
HEADER = ",".join(COLUMNS)


def read_azure_csv(path: str | os.PathLike, *, skip_bad_rows: bool = False) -> LengthTrace:
    """Parse an Azure CSV into length columns (no token ids)."""
    rows = CsvRows(path, COLUMNS, HEADER)
    errs = collect_row_errors(rows.path, skip_bad_rows)
    times: list[int] = []
    plen: list[int] = []
    olen: list[int] = []
    index: list[int] = []
    for line, i, row in rows:
        try:
            rows.check_row(line, row)
            t = rows.get(line, row, "TIMESTAMP", parse_timestamp_ns)
            p = rows.get(line, row, "ContextTokens", parse_count)
            o = rows.get(line, row, "GeneratedTokens", parse_count)
        except TraceFormatError as e:
            errs.add(e)
            continue
        times.append(t)
        plen.append(p)
        olen.append(o)
        index.append(i)
    if errs.count:
        log.warning("%s: skipped %d malformed row(s)", rows.path, errs.count)
    return LengthTrace(source=rows.path, arrival_s=rebase_ns(times),
                       prompt_len=np.array(plen, dtype=np.int64),
                       output_len=np.array(olen, dtype=np.int64),
                       row=np.array(index, dtype=np.int64), skipped=errs.count,
                       errors=errs.messages)


def load_azure_csv(path: str | os.PathLike, *, vocab_size: int, seed: int = 0,
                   skip_bad_rows: bool = False, id_prefix: str = "azure") -> LoadedTrace:
    """Load an Azure LLM inference CSV as Requests sorted by arrival.

    Prompts are seeded random ids (``seed``) in ``[0, vocab_size)``; request ids are
    ``azure-<data row index:06d>``. ``skip_bad_rows=True`` skips malformed rows (count in
    ``.skipped``, first messages in ``.errors``) instead of raising :class:`TraceFormatError`.
    """
    return materialize(read_azure_csv(path, skip_bad_rows=skip_bad_rows),
                       vocab_size=vocab_size, seed=seed, id_prefix=id_prefix)


def _format_timestamp(base: _dt.datetime, arrival_s: float) -> str:
    ticks = round(arrival_s * 1e7)  # 100 ns units, as in the published traces
    t = base + _dt.timedelta(microseconds=ticks // 10)
    return t.strftime("%Y-%m-%d %H:%M:%S.") + f"{t.microsecond:06d}{ticks % 10}"


def write_azure_csv(requests: Iterable[Request], path: str | os.PathLike, *,
                    start: str = "2023-11-16 00:00:00") -> int:
    """Write requests as an Azure CSV (lengths only; token ids, tenants and n are not kept).

    ``TIMESTAMP`` = ``start`` + arrival, with 7 fraction digits. Returns the number of rows.
    """
    base = _dt.datetime.fromisoformat(start)
    n = 0
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(COLUMNS)
        for r in requests:
            w.writerow((_format_timestamp(base, r.arrival_s), r.prompt_len, r.output_len))
            n += 1
    return n
