"""The kvrl JSONL trace format: one JSON object per line, one request per object.

Fields (only ``arrival_s``, ``output_len`` and one of ``prompt_tokens`` / ``prompt_len`` are required)::

    request_id   string, unique in the file            default "req-<data line index:06d>"
    arrival_s    number >= 0, seconds                   (kept as is, not re-based)
    prompt_tokens list of token ids (ints >= 0)         exact prompt
    prompt_len   int >= 1                               length only: ids are seeded random
    prefix_len   int >= 0, <= the prompt's length       with prompt_len + prefix_group: how many
                                                        leading ids are the group's shared prefix
                                                        (default: the shortest prompt of the group)
    output_len   int >= 1
    tenant       string                                 default "default"
    priority     int (smaller = more important)         default 0
    n            int >= 1, parallel samples             default 1
    prefix_group string or null                         default null
    slo_ttft_s   number > 0 or null                     default null (run default)
    slo_tpot_s   number > 0 or null                     default null (run default)
    cache_salt   string or null                         default null
    output_len_hint int >= 1 or null                    default null: a length predictor's estimate
                                                        of output_len (policies may read it)

Blank lines are ignored; unknown fields are errors (they are usually typos), and so are strings
that are not valid Unicode (a lone surrogate such as ``"\\ud800"``: no output file could hold them).
"""
from __future__ import annotations

import json
import logging
import math
import os
from typing import Any, Iterable, Optional

import numpy as np

from kvrl.engine.request import Request

from ._fields import MAX_TOKENS
from .errors import TraceFormatError
from .tokens import check_vocab_size, fill_prompts
from .trace import FieldError, LoadedTrace, collect_row_errors, parse_json_lines

log = logging.getLogger(__name__)

FIELDS = ("request_id", "arrival_s", "prompt_tokens", "prompt_len", "prefix_len", "output_len",
          "tenant", "priority", "n", "prefix_group", "slo_ttft_s", "slo_tpot_s", "cache_salt",
          "output_len_hint")
_MAX_TOKEN_ID = (1 << 31) - 1


def _int(obj: dict, key: str, default: Any, lo: int, hi: int = MAX_TOKENS) -> Any:
    if key not in obj:
        return default
    v = obj[key]
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise FieldError(key, f"expected an integer in [{lo}, {hi}], got {v!r}")
    return v


def _num(obj: dict, key: str, default: Any, *, positive: bool, nullable: bool) -> Any:
    if key not in obj:
        return default
    v = obj[key]
    if v is None and nullable:
        return None
    ok = not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v) \
        and (v > 0 if positive else v >= 0) and abs(v) <= 1e11
    if not ok:
        what = "a finite number > 0" if positive else "a finite number >= 0"
        raise FieldError(key, f"expected {what}{' or null' if nullable else ''}, got {v!r}")
    return float(v)


def _str(obj: dict, key: str, default: Any, *, nullable: bool) -> Any:
    if key not in obj:
        return default
    v = obj[key]
    if v is None and nullable:
        return None
    if not isinstance(v, str):
        raise FieldError(key, f"expected a string{' or null' if nullable else ''}, got {v!r}")
    try:
        v.encode("utf-8")
    except UnicodeEncodeError as e:
        raise FieldError(key, f"not valid Unicode text ({e.reason} at character {e.start}: "
                               f"{_short(v)}); ids and names must be writable as UTF-8") from None
    return v


def _tokens(v: Any, vocab_size: Optional[int]) -> np.ndarray:
    hi = _MAX_TOKEN_ID if vocab_size is None else vocab_size - 1
    if not isinstance(v, list) or not v or len(v) > MAX_TOKENS:
        raise FieldError("prompt_tokens", f"expected a non-empty list of at most {MAX_TOKENS} "
                                           f"token ids, got {_short(v)}")
    try:
        a = np.asarray(v)
    except (ValueError, TypeError, OverflowError):
        a = None
    if a is None or a.ndim != 1 or a.dtype.kind not in "iu":
        raise FieldError("prompt_tokens", f"expected a list of integer token ids, got {_short(v)}")
    if a.min() < 0 or a.max() > hi:
        raise FieldError("prompt_tokens", f"token ids must be in [0, {hi}], got min {a.min()} "
                                           f"max {a.max()}")
    a = a.astype(np.int32)
    a.flags.writeable = False
    return a


def _short(v: Any) -> str:
    s = repr(v)
    return s if len(s) <= 60 else s[:57] + "..."


def _parse_line(text: str, vocab_size: Optional[int]) -> dict:
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise ValueError(f"invalid JSON ({e})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {_short(obj)}")
    unknown = [k for k in obj if k not in FIELDS]
    if unknown:
        raise FieldError(unknown[0], f"unknown field (known: {', '.join(FIELDS)})")
    for key in ("arrival_s", "output_len"):
        if key not in obj:
            raise FieldError(key, "missing (required)")
    rec = {
        "request_id": _str(obj, "request_id", None, nullable=False),
        "arrival_s": _num(obj, "arrival_s", None, positive=False, nullable=False),
        "output_len": _int(obj, "output_len", None, 1),
        "output_len_hint": None if obj.get("output_len_hint") is None else _int(obj, "output_len_hint", None, 1),
        "tenant": _str(obj, "tenant", "default", nullable=False),
        "priority": _int(obj, "priority", 0, -(1 << 31), (1 << 31) - 1),
        "n": _int(obj, "n", 1, 1, 1 << 16),
        "prefix_group": _str(obj, "prefix_group", None, nullable=True),
        "slo_ttft_s": _num(obj, "slo_ttft_s", None, positive=True, nullable=True),
        "slo_tpot_s": _num(obj, "slo_tpot_s", None, positive=True, nullable=True),
        "cache_salt": _str(obj, "cache_salt", None, nullable=True),
        "prompt_len": _int(obj, "prompt_len", None, 1),
        "prefix_len": _int(obj, "prefix_len", None, 0),
        "tokens": None,
    }
    if "prompt_tokens" in obj:
        rec["tokens"] = _tokens(obj["prompt_tokens"], vocab_size)
        if rec["prompt_len"] is not None and rec["prompt_len"] != rec["tokens"].shape[0]:
            raise FieldError("prompt_len", f"{rec['prompt_len']} disagrees with the "
                                            f"{rec['tokens'].shape[0]} ids in prompt_tokens")
    elif rec["prompt_len"] is None:
        raise FieldError("prompt_tokens", "missing (give prompt_tokens or prompt_len)")
    length = rec["prompt_len"] if rec["tokens"] is None else rec["tokens"].shape[0]
    if rec["prefix_len"] is not None and rec["prefix_len"] > length:
        raise FieldError("prefix_len", f"{rec['prefix_len']} exceeds the prompt's {length} tokens")
    return rec


def load_jsonl(path: str | os.PathLike, *, vocab_size: Optional[int] = None, seed: int = 0,
               skip_bad_rows: bool = False) -> LoadedTrace:
    """Load a kvrl JSONL trace as Requests sorted by arrival (stable for ties).

    ``vocab_size`` bounds the ids in ``prompt_tokens`` and is required when some line gives only
    ``prompt_len`` (those prompts get seeded random ids; see :func:`kvrl.workloads.tokens.fill_prompts`).
    """
    path = os.fspath(path)
    if vocab_size is not None:
        vocab_size = check_vocab_size(vocab_size)
    errs = collect_row_errors(path, skip_bad_rows)
    recs: list[dict] = []
    seen: dict[str, int] = {}
    for lineno, this, rec in parse_json_lines(path, lambda text: _parse_line(text, vocab_size), errs):
        if rec["request_id"] is None:
            rec["request_id"] = f"req-{this:06d}"
        rid = rec["request_id"]
        if rid in seen:
            errs.add(TraceFormatError(path, lineno, f"duplicate id {rid!r} (first on line {seen[rid]})", "request_id"))
            continue
        seen[rid] = lineno
        recs.append(rec)
    if errs.count:
        log.warning("%s: skipped %d malformed line(s)", path, errs.count)
    fill = [i for i, r in enumerate(recs) if r["tokens"] is None]
    if fill:
        if vocab_size is None:
            raise ValueError(f"{path}: some lines give prompt_len without prompt_tokens; "
                             f"pass vocab_size to fill them with random ids")
        prompts = fill_prompts([recs[i]["prompt_len"] for i in fill], vocab_size=vocab_size,
                               seed=seed, prefix_groups=[recs[i]["prefix_group"] for i in fill],
                               prefix_lens=[recs[i]["prefix_len"] for i in fill])
        for i, p in zip(fill, prompts):
            recs[i]["tokens"] = p
    recs.sort(key=lambda r: r["arrival_s"])
    reqs = [Request(request_id=r["request_id"], arrival_s=r["arrival_s"],
                    prompt_token_ids=r["tokens"], output_len=r["output_len"], tenant=r["tenant"],
                    priority=r["priority"], n=r["n"], prefix_group=r["prefix_group"],
                    slo_ttft_s=r["slo_ttft_s"], slo_tpot_s=r["slo_tpot_s"],
                    cache_salt=r["cache_salt"], output_len_hint=r["output_len_hint"]) for r in recs]
    return LoadedTrace(reqs, source=path, skipped=errs.count, errors=errs.messages)


def request_to_dict(r: Request, *, tokens: bool = True) -> dict:
    """The JSONL object for one request (fields at their default are still written, None omitted)."""
    d: dict[str, Any] = {"request_id": r.request_id, "arrival_s": float(r.arrival_s)}
    if tokens:
        d["prompt_tokens"] = r.prompt_token_ids.tolist()
    else:
        d["prompt_len"] = r.prompt_len
    d.update(output_len=int(r.output_len), tenant=r.tenant, priority=int(r.priority), n=int(r.n))
    for key in ("prefix_group", "slo_ttft_s", "slo_tpot_s", "cache_salt"):
        v = getattr(r, key)
        if v is not None:
            d[key] = v
    if r.output_len_hint is not None:
        d["output_len_hint"] = int(r.output_len_hint)
    return d


def write_jsonl(requests: Iterable[Request], path: str | os.PathLike, *, tokens: bool = True) -> int:
    """Write requests as kvrl JSONL; returns the number of lines.

    ``tokens=True`` writes the exact prompt ids (a lossless round trip through :func:`load_jsonl`);
    ``tokens=False`` writes ``prompt_len`` only (small files; ids are re-drawn on load).
    """
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for r in requests:
            f.write(json.dumps(request_to_dict(r, tokens=tokens), separators=(",", ":")))
            f.write("\n")
            n += 1
    return n
