"""Shared plumbing for trace loaders: length-only columns, the loaded list type, CSV row reading."""
from __future__ import annotations

import csv
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np

from kvrl.engine.request import Request

from .errors import TraceFormatError
from .tokens import check_vocab_size, fill_prompts

#: How many row error messages a loader keeps when ``skip_bad_rows=True``.
MAX_KEPT_ERRORS = 20


class LoadedTrace(list):
    """A list of :class:`Request` sorted by arrival, plus what the loader had to leave out.

    Attributes:
        source: the file it came from.
        skipped: malformed rows skipped (``skip_bad_rows=True``); 0 otherwise.
        errors: the messages of the first skipped rows (at most ``MAX_KEPT_ERRORS``).
        dropped: well-formed rows left out on purpose (e.g. BurstGPT failures, model filters).
    """

    def __init__(self, requests=(), *, source: str = "", skipped: int = 0,
                 errors: Sequence[str] = (), dropped: int = 0):
        super().__init__(requests)
        self.source = source
        self.skipped = skipped
        self.errors = list(errors)
        self.dropped = dropped

    def __repr__(self) -> str:
        return (f"LoadedTrace({len(self)} requests from {self.source!r}, skipped={self.skipped}, "
                f"dropped={self.dropped})")


@dataclass
class LengthTrace:
    """A trace that records lengths only (the Azure and BurstGPT CSVs), one entry per kept row.

    ``arrival_s`` is re-based so the earliest kept row arrives at 0. ``row`` is the 0-based index of
    the row among the file's data rows (stable request ids even when rows are skipped).
    """

    source: str
    arrival_s: np.ndarray
    prompt_len: np.ndarray
    output_len: np.ndarray
    row: np.ndarray
    tenant: Optional[list[str]] = None
    skipped: int = 0
    errors: list[str] = field(default_factory=list)
    dropped: int = 0

    def __len__(self) -> int:
        return int(self.arrival_s.shape[0])


def rebase_ns(times_ns: Sequence[int]) -> np.ndarray:
    """Integer nanosecond times -> float seconds since the earliest (exact differences first)."""
    if not times_ns:
        return np.zeros(0, dtype=np.float64)
    t0 = min(times_ns)
    return np.array([t - t0 for t in times_ns], dtype=np.float64) / 1e9


def materialize(trace: LengthTrace, *, vocab_size: int, seed: int = 0,
                id_prefix: str = "req") -> LoadedTrace:
    """Turn a length trace into Requests with seeded random prompt ids, sorted by arrival.

    Request ``i`` (in file order) is named ``f"{id_prefix}-{row:06d}"``. A length of 0 is raised to
    1 (a Request needs at least one prompt token and one output token).
    """
    vocab_size = check_vocab_size(vocab_size)
    plen = np.maximum(trace.prompt_len, 1)
    olen = np.maximum(trace.output_len, 1)
    prompts = fill_prompts(plen, vocab_size=vocab_size, seed=seed)
    order = np.argsort(trace.arrival_s, kind="stable")
    arrivals = trace.arrival_s.tolist()
    outs = olen.tolist()
    rows = trace.row.tolist()
    tenants = trace.tenant
    reqs = [Request(request_id=f"{id_prefix}-{rows[i]:06d}", arrival_s=arrivals[i],
                    prompt_token_ids=prompts[i], output_len=outs[i],
                    tenant=tenants[i] if tenants is not None else "default")
            for i in order.tolist()]
    return LoadedTrace(reqs, source=trace.source, skipped=trace.skipped, errors=trace.errors,
                       dropped=trace.dropped)


class CsvRows:
    """Iterate the data rows of a CSV file with a header, with file/line aware errors.

    Yields ``(line, data_index, row)``; ``line`` is the 1-based physical line where the row ends.
    Blank lines are ignored. The file is decoded line by line, so a line that is not UTF-8 is a
    row error (reported by :meth:`check_row`, skippable) with its exact line number. Broken CSV
    quoting and a bad header raise :class:`TraceFormatError` from the iterator (not skippable).
    """

    def __init__(self, path: str | os.PathLike, required: Sequence[str], expected_header: str):
        self.path = os.fspath(path)
        self.required = list(required)
        self.expected_header = expected_header
        self._bad: dict[int, str] = {}
        self._lineno = 0
        self._start = 1

    def _lines(self, f) -> Iterator[str]:
        for raw in f:
            self._lineno += 1
            if self._lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            try:
                yield raw.decode("utf-8")
            except UnicodeDecodeError as e:
                self._bad[self._lineno] = e.reason
                yield raw.decode("utf-8", errors="replace")

    def __iter__(self) -> Iterator[tuple[int, int, list[str]]]:
        path = self.path
        try:
            f = open(path, "rb")
        except OSError as e:
            raise TraceFormatError(path, None, f"cannot open: {e.strerror or e}") from None
        with f:
            reader = csv.reader(self._lines(f))
            try:
                header = None
                for header in reader:
                    if header:
                        break
                if not header:
                    raise TraceFormatError(path, None,
                                           f"empty file: expected a header row {self.expected_header}")
                line = reader.line_num
                if any(n <= line for n in self._bad):
                    bad = min(self._bad)
                    raise TraceFormatError(path, bad, f"not valid UTF-8 text ({self._bad[bad]})")
                names = [h.strip() for h in header]
                missing = [c for c in self.required if c not in names]
                if missing:
                    raise TraceFormatError(
                        path, line, f"missing column {missing[0]!r} in header {','.join(names)!r} "
                                    f"(expected {self.expected_header})")
                self.columns = {n: i for i, n in enumerate(names)}
                self.width = len(names)
                index = 0
                for row in reader:
                    if not row:
                        line = reader.line_num
                        continue
                    self._start = line + 1
                    line = reader.line_num
                    yield line, index, row
                    index += 1
            except csv.Error as e:
                raise TraceFormatError(path, reader.line_num, f"malformed CSV: {e}") from None

    def check_row(self, line: int, row: list[str]) -> None:
        """Raise a (skippable) row error for bad encoding or a wrong number of fields."""
        for n in range(self._start, line + 1):
            if n in self._bad:
                raise TraceFormatError(self.path, n, f"not valid UTF-8 text ({self._bad[n]})")
        if len(row) != self.width:
            raise TraceFormatError(self.path, line,
                                   f"expected {self.width} comma-separated fields, got {len(row)}")

    def get(self, line: int, row: list[str], column: str, parse: Callable[[str], object]):
        """Parse one field, naming file/line/field on error."""
        try:
            return parse(row[self.columns[column]])
        except ValueError as e:
            raise TraceFormatError(self.path, line, str(e), column) from None


def collect_row_errors(path: str, skip_bad_rows: bool):
    """A small helper object: ``add(err)`` re-raises unless skipping; counts and keeps messages."""
    return _RowErrors(path, skip_bad_rows)


class _RowErrors:
    def __init__(self, path: str, skip: bool):
        self.path = path
        self.skip = skip
        self.count = 0
        self.messages: list[str] = []

    def add(self, err: TraceFormatError) -> None:
        if not self.skip:
            raise err
        self.count += 1
        if len(self.messages) < MAX_KEPT_ERRORS:
            self.messages.append(str(err))


class FieldError(ValueError):
    """A bad value of one named field of a JSON-lines row; the loader adds the file and line."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


def parse_json_lines(path: str, parse: Callable[[str], Any], errs: "_RowErrors") -> Iterator[tuple[int, int, Any]]:
    """``(line number, data index, parse(text))`` for each data line of a JSON-lines file.

    A leading UTF-8 BOM is dropped and blank lines are skipped (they take no data index). A line that is
    not UTF-8, or whose ``parse`` raises :class:`FieldError` or ``ValueError``, becomes a
    :class:`TraceFormatError` naming file, line (and field) and goes to ``errs`` (raised unless it skips
    bad rows); a line that is not UTF-8 takes no data index either. Failing to open the file raises.
    """
    try:
        f = open(path, "rb")
    except OSError as e:
        raise TraceFormatError(path, None, f"cannot open: {e.strerror or e}") from None
    index = 0
    with f:
        for lineno, raw in enumerate(f, 1):
            if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            try:
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise TraceFormatError(path, lineno, f"not valid UTF-8 text ({e.reason})") from None
                if not text.strip():
                    continue
                this = index
                index += 1
                try:
                    rec = parse(text)
                except FieldError as e:
                    raise TraceFormatError(path, lineno, str(e), e.field) from None
                except ValueError as e:
                    raise TraceFormatError(path, lineno, str(e)) from None
            except TraceFormatError as e:
                errs.add(e)
                continue
            yield lineno, this, rec
