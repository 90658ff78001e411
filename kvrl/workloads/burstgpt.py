"""BurstGPT traces: ``Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type``.

``Timestamp`` is seconds from the start of the collection; arrivals are re-based to the earliest
kept row. Rows with 0 response tokens are failed requests; they are dropped by default
(``drop_failures=True``, count in ``.dropped``) and otherwise kept with ``output_len`` 1.
``Model`` and ``Log Type`` are optional columns; they can filter rows and name the tenant.
"""
from __future__ import annotations

import csv
import logging
import os
from typing import Iterable, Optional, Sequence

import numpy as np

from kvrl.engine.request import Request

from ._fields import parse_count, parse_seconds
from .errors import TraceFormatError
from .trace import CsvRows, LengthTrace, LoadedTrace, collect_row_errors, materialize

log = logging.getLogger(__name__)

COLUMNS = ("Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens", "Log Type")
REQUIRED = ("Timestamp", "Request tokens", "Response tokens")
HEADER = ",".join(COLUMNS)
TENANT_FROM = ("none", "model", "log_type")


def read_burstgpt_csv(path: str | os.PathLike, *, skip_bad_rows: bool = False,
                      drop_failures: bool = True, models: Optional[Sequence[str]] = None,
                      log_types: Optional[Sequence[str]] = None,
                      tenant_from: str = "none") -> LengthTrace:
    """Parse a BurstGPT CSV into length columns (no token ids).

    Args:
        drop_failures: leave out rows with 0 response tokens (failed requests).
        models: keep only rows whose ``Model`` is in this list (None = all).
        log_types: keep only rows whose ``Log Type`` is in this list (None = all).
        tenant_from: ``"none"`` (tenant "default"), ``"model"`` or ``"log_type"``.
    """
    if tenant_from not in TENANT_FROM:
        raise ValueError(f"tenant_from must be one of {TENANT_FROM}, got {tenant_from!r}")
    rows = CsvRows(path, REQUIRED, HEADER)
    errs = collect_row_errors(rows.path, skip_bad_rows)
    model_set = None if models is None else set(models)
    type_set = None if log_types is None else set(log_types)
    times: list[float] = []
    plen: list[int] = []
    olen: list[int] = []
    index: list[int] = []
    tenants: list[str] = []
    dropped = 0
    for line, i, row in rows:
        try:
            rows.check_row(line, row)
            t = rows.get(line, row, "Timestamp", parse_seconds)
            p = rows.get(line, row, "Request tokens", parse_count)
            o = rows.get(line, row, "Response tokens", parse_count)
            if "Total tokens" in rows.columns:
                rows.get(line, row, "Total tokens", parse_count)
        except TraceFormatError as e:
            errs.add(e)
            continue
        model = row[rows.columns["Model"]].strip() if "Model" in rows.columns else ""
        ltype = row[rows.columns["Log Type"]].strip() if "Log Type" in rows.columns else ""
        if (drop_failures and o == 0) or (model_set is not None and model not in model_set) \
                or (type_set is not None and ltype not in type_set):
            dropped += 1
            continue
        times.append(t)
        plen.append(p)
        olen.append(o)
        index.append(i)
        if tenant_from == "model":
            tenants.append(model or "default")
        elif tenant_from == "log_type":
            tenants.append(ltype or "default")
    if errs.count:
        log.warning("%s: skipped %d malformed row(s)", rows.path, errs.count)
    arr = np.array(times, dtype=np.float64)
    if arr.size:
        arr -= arr.min()
    return LengthTrace(source=rows.path, arrival_s=arr, prompt_len=np.array(plen, dtype=np.int64),
                       output_len=np.array(olen, dtype=np.int64),
                       row=np.array(index, dtype=np.int64),
                       tenant=tenants if tenant_from != "none" else None,
                       skipped=errs.count, errors=errs.messages, dropped=dropped)


def load_burstgpt_csv(path: str | os.PathLike, *, vocab_size: int, seed: int = 0,
                      skip_bad_rows: bool = False, drop_failures: bool = True,
                      models: Optional[Sequence[str]] = None,
                      log_types: Optional[Sequence[str]] = None, tenant_from: str = "none",
                      id_prefix: str = "burstgpt") -> LoadedTrace:
    """Load a BurstGPT CSV as Requests sorted by arrival (see :func:`read_burstgpt_csv`)."""
    trace = read_burstgpt_csv(path, skip_bad_rows=skip_bad_rows, drop_failures=drop_failures,
                              models=models, log_types=log_types, tenant_from=tenant_from)
    return materialize(trace, vocab_size=vocab_size, seed=seed, id_prefix=id_prefix)


def write_burstgpt_csv(requests: Iterable[Request], path: str | os.PathLike, *,
                       model: Optional[str] = None, log_type: str = "Conversation log") -> int:
    """Write requests as a BurstGPT CSV (lengths only). ``Model`` = ``model`` or the tenant.

    Timestamps are written exactly (``repr`` of the float). Returns the number of rows.
    """
    n = 0
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(COLUMNS)
        for r in requests:
            w.writerow((repr(float(r.arrival_s)), model or r.tenant, r.prompt_len, r.output_len,
                        r.prompt_len + r.output_len, log_type))
            n += 1
    return n
