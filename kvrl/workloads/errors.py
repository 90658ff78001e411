"""Errors raised by the workload library (all are ``ValueError`` subclasses)."""
from __future__ import annotations

from typing import Optional


class TraceFormatError(ValueError):
    """A trace file that cannot be parsed.

    The message names the file, the 1-based physical line and the field, e.g.
    ``trace.csv:17: field 'GeneratedTokens': expected a non-negative integer, got '-3'``.
    """

    def __init__(self, path: str, line: Optional[int], message: str, field: Optional[str] = None):
        self.path = str(path)
        self.line = line
        self.field = field
        self.reason = message
        where = self.path if line is None else f"{self.path}:{line}"
        if field is not None:
            where += f": field {field!r}"
        super().__init__(f"{where}: {message}")

    def __reduce__(self):   # picklable, so parallel sweep workers report the real error
        return (TraceFormatError, (self.path, self.line, self.reason, self.field))


class WorkloadConfigError(ValueError):
    """A workload config with an unknown key, a missing key or a value of the wrong type."""
