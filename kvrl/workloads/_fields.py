"""Strict parsers for single trace fields (shared by the CSV loaders).

Each parser takes the raw text and raises a plain ``ValueError`` whose message is the reason; the
loader wraps it into a :class:`~kvrl.workloads.errors.TraceFormatError` naming file, line and field.
"""
from __future__ import annotations

import datetime as _dt
import math
import re

#: Largest token count accepted for one request (guards against absurd values / memory blowups).
MAX_TOKENS = 1 << 24
#: Largest absolute time in seconds accepted in a trace (about 3,000 years).
MAX_SECONDS = 1e11

_INTEGRAL_FLOAT = re.compile(r"([0-9]+)\.0*")
_TIMESTAMP = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[ T]([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]{1,9}))?"
    r"\s*(Z|[+-][0-9]{2}:?[0-9]{2})?")
_EPOCH_ORDINAL = _dt.date(1970, 1, 1).toordinal()


def parse_count(text: str, max_value: int = MAX_TOKENS) -> int:
    """A non-negative integer token count (``12`` or ``12.0``), at most ``max_value``."""
    s = text.strip()
    if s.isascii() and s.isdigit():
        value = int(s)
    else:
        m = _INTEGRAL_FLOAT.fullmatch(s)
        if m is None:
            raise ValueError(f"expected a non-negative integer, got {text!r}")
        value = int(m.group(1))
    if value > max_value:
        raise ValueError(f"expected a non-negative integer <= {max_value}, got {text!r}")
    return value


def parse_seconds(text: str) -> float:
    """A finite number of seconds (may be fractional or negative; loaders re-base to the earliest)."""
    s = text.strip()
    try:
        if not s.isascii():
            raise ValueError
        value = float(s)
    except ValueError:
        raise ValueError(f"expected a number of seconds, got {text!r}") from None
    if not math.isfinite(value) or abs(value) > MAX_SECONDS:
        raise ValueError(f"expected a finite number of seconds (|x| <= {MAX_SECONDS:g}), got {text!r}")
    return value


def parse_timestamp_ns(text: str) -> int:
    """Nanoseconds since the Unix epoch of ``YYYY-MM-DD HH:MM:SS[.fffffff][Z|+HH:MM]``.

    Accepts any number of fraction digits up to 9 (the Azure traces use 7), a ``T`` or a space
    between date and time, and an optional UTC offset. A plain number is read as seconds.
    Returns a Python int so that differences are exact.
    """
    s = text.strip()
    m = _TIMESTAMP.fullmatch(s)
    if m is None:
        try:
            seconds = parse_seconds(s)
        except ValueError:
            raise ValueError(
                f"expected a timestamp like '2023-11-16 18:17:03.9799600', got {text!r}") from None
        return round(seconds * 1e9)
    year, month, day, hour, minute, sec, frac, tz = m.groups()
    try:
        ordinal = _dt.date(int(year), int(month), int(day)).toordinal()
    except ValueError as e:
        raise ValueError(f"invalid date in timestamp {text!r} ({e})") from None
    h, mi, se = int(hour), int(minute), int(sec)
    if h > 23 or mi > 59 or se > 60:
        raise ValueError(f"invalid time of day in timestamp {text!r}")
    total = (ordinal - _EPOCH_ORDINAL) * 86400 + h * 3600 + mi * 60 + se
    ns = int(frac.ljust(9, "0")) if frac else 0
    if tz and tz != "Z":
        sign = -1 if tz[0] == "-" else 1
        digits = tz[1:].replace(":", "")
        oh, om = int(digits[:2]), int(digits[2:])
        if oh > 23 or om > 59:
            raise ValueError(f"invalid UTC offset in timestamp {text!r}")
        total -= sign * (oh * 3600 + om * 60)
    return total * 1_000_000_000 + ns
