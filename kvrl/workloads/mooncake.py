"""Mooncake traces: JSONL with prompt reuse recorded as block hash ids.

The format of the public Mooncake traces (kvcache-ai/Mooncake, ``FAST25-release/traces``), which
NVIDIA Dynamo and AIPerf also replay. One JSON object per line::

    timestamp      number >= 0: arrival, in ms since the first request (``time_unit``)
    input_length   int >= 1: prompt tokens
    output_length  int >= 1: tokens generated
    hash_ids       list of ints >= 0 (default []): one id per block of ``block_tokens`` prompt
                   tokens (512 in the public traces), the last block possibly partial. Equal ids
                   are equal blocks, so two prompts share a prefix exactly as far as their
                   ``hash_ids`` agree.

``chat_id``, ``parent_chat_id``, ``turn``, ``type`` and ``session_id`` (fields of other traces in
this format) are read and ignored; any other field is an error, as are ``text_input`` /
``input_text`` (text prompts need a tokenizer, which kvrl's trace loaders do not have).

**Prompts keep the trace's reuse.** Block ``h``'s token ids are a function of ``(seed, h)`` only,
so every request holding block ``h`` holds the same ids there, and the prefix cache sees exactly
the hits the trace records. Tokens past ``len(hash_ids) * block_tokens`` (a trace that records
fewer blocks than its prompt has) are drawn for that request alone.

**Scaling for smaller models and pools.** ``prompt_scale`` multiplies ``input_length`` and
``block_tokens`` together (the block structure, and so the reuse, is kept: a block of 512 tokens
at scale 1/16 is a block of 32); ``output_scale`` multiplies ``output_length``. Scaled lengths
are rounded and at least 1.

A line whose ``hash_ids`` hold more blocks than its prompt has (``(len - 1) * block_tokens >=
input_length``) is an error that names the block size the line suggests: traces written with
another block size (16 tokens, say) must be read with it.
"""
from __future__ import annotations

import functools
import json
import logging
import math
import os
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

from kvrl.engine.request import Request

from ._fields import MAX_SECONDS, MAX_TOKENS
from ._rng import check_seed, make_rng
from .tokens import check_vocab_size, prefix_block_ids, random_ids, readonly
from .trace import FieldError, LengthTrace, LoadedTrace, collect_row_errors, parse_json_lines

log = logging.getLogger(__name__)

FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
IGNORED = ("chat_id", "parent_chat_id", "turn", "type", "session_id")
TIME_UNITS = {"ms": 1e-3, "s": 1.0}
#: Block size of the public Mooncake traces, in tokens.
BLOCK_TOKENS = 512
_MAX_HASH_ID = (1 << 63) - 1


@dataclass
class BlockTrace(LengthTrace):
    """A :class:`LengthTrace` whose prompts are sequences of hashed blocks.

    ``hash_ids[i]`` is row ``i``'s block ids (int64); ``block_tokens`` the tokens per block, both
    after ``prompt_scale``.
    """

    hash_ids: list = field(default_factory=list)
    block_tokens: int = BLOCK_TOKENS


def _count(obj: dict, name: str, lo: int) -> int:
    if name not in obj:
        raise FieldError(name, "missing (required)")
    v = obj[name]
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= MAX_TOKENS:
        raise FieldError(name, f"expected an integer in [{lo}, {MAX_TOKENS}], got {v!r}")
    return v


def _timestamp(obj: dict, scale_s: float) -> float:
    if "timestamp" not in obj:
        raise FieldError("timestamp", "missing (required)")
    v = obj["timestamp"]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 \
            or v * scale_s > MAX_SECONDS:
        raise FieldError("timestamp", f"expected a finite number >= 0, got {v!r}")
    return float(v) * scale_s


def _hash_ids(obj: dict) -> np.ndarray:
    v = obj.get("hash_ids", [])
    if not isinstance(v, list) or len(v) > MAX_TOKENS or \
            not all(isinstance(h, int) and not isinstance(h, bool) and 0 <= h <= _MAX_HASH_ID for h in v):
        s = repr(v)
        raise FieldError("hash_ids", f"expected a list of integers in [0, 2**63), got "
                                      f"{s if len(s) <= 60 else s[:57] + '...'}")
    return np.array(v, dtype=np.int64)


def _scaled(n: int, scale: float) -> int:
    return max(1, int(round(n * scale)))


def _parse(text: str, *, scale_s: float, block_tokens: int) -> tuple[float, int, int, np.ndarray]:
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise ValueError(f"invalid JSON ({e})") from None
    if not isinstance(obj, dict):
        raise ValueError("expected a JSON object")
    for name in obj:
        if name in ("text_input", "input_text"):
            raise FieldError(name, "text prompts are not supported (kvrl's trace loaders have no "
                                    "tokenizer); give input_length and hash_ids")
        if name not in FIELDS and name not in IGNORED:
            raise FieldError(name, f"unknown field (known: {', '.join(FIELDS + IGNORED)})")
    t = _timestamp(obj, scale_s)
    n_in = _count(obj, "input_length", 1)
    n_out = _count(obj, "output_length", 1)
    ids = _hash_ids(obj)
    if ids.size and (ids.size - 1) * block_tokens >= n_in:
        raise FieldError("hash_ids", f"{ids.size} blocks of {block_tokens} tokens for an input of "
                                      f"{n_in} tokens (about {math.ceil(n_in / ids.size)} tokens a "
                                      f"block): read the trace with that block_tokens")
    return t, n_in, n_out, ids


def read_mooncake(path: str | os.PathLike, *, block_tokens: int = BLOCK_TOKENS, time_unit: str = "ms",
                  prompt_scale: float = 1.0, output_scale: float = 1.0,
                  skip_bad_rows: bool = False) -> BlockTrace:
    """Parse a Mooncake trace into lengths and block ids (no token ids); arrivals re-based to 0.

    Lengths and ``block_tokens`` in the result are scaled (module docstring). Raises
    :class:`~kvrl.workloads.errors.TraceFormatError` naming file, line and field; with ``skip_bad_rows`` a bad line is
    counted in ``skipped`` instead.
    """
    path = os.fspath(path)
    if time_unit not in TIME_UNITS:
        raise ValueError(f"time_unit must be one of {sorted(TIME_UNITS)}, got {time_unit!r}")
    if isinstance(block_tokens, bool) or not isinstance(block_tokens, int) or block_tokens < 1:
        raise ValueError(f"block_tokens must be an integer >= 1, got {block_tokens!r}")
    for name, s in (("prompt_scale", prompt_scale), ("output_scale", output_scale)):
        if not (isinstance(s, (int, float)) and math.isfinite(s) and s > 0):
            raise ValueError(f"{name} must be a finite number > 0, got {s!r}")
    scaled_block = _scaled(block_tokens, prompt_scale)
    errs = collect_row_errors(path, skip_bad_rows)
    times: list[float] = []
    plen: list[int] = []
    olen: list[int] = []
    rows: list[int] = []
    blocks: list[np.ndarray] = []
    parse = functools.partial(_parse, scale_s=TIME_UNITS[time_unit], block_tokens=block_tokens)
    for _, this, (t, n_in, n_out, ids) in parse_json_lines(path, parse, errs):
        times.append(t)
        plen.append(_scaled(n_in, prompt_scale))
        olen.append(_scaled(n_out, output_scale))
        rows.append(this)
        blocks.append(ids)
    if errs.count:
        log.warning("%s: skipped %d malformed line(s)", path, errs.count)
    arr = np.array(times, dtype=np.float64)
    if arr.size:
        arr -= arr.min()
    return BlockTrace(source=path, arrival_s=arr, prompt_len=np.array(plen, dtype=np.int64),
                      output_len=np.array(olen, dtype=np.int64), row=np.array(rows, dtype=np.int64),
                      skipped=errs.count, errors=errs.messages, hash_ids=blocks, block_tokens=scaled_block)


def _mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser on uint64 (wrapping arithmetic): a fixed, well-spread bijection."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def block_token_ids(hash_ids: np.ndarray, n_tokens: int, *, block_tokens: int, vocab_size: int,
                    seed: int = 0) -> np.ndarray:
    """The first ``n_tokens`` ids of the blocks ``hash_ids`` (int32, at most ``len * block_tokens``).

    Position ``j`` of block ``h`` gets ``mix(seed, h, j) % vocab_size``: the same block always has
    the same ids, whichever request holds it and wherever the file lists it.
    """
    n = min(int(n_tokens), int(hash_ids.size) * block_tokens)
    pos = np.arange(n, dtype=np.uint64)
    h = hash_ids.astype(np.uint64)[pos // np.uint64(block_tokens)]
    with np.errstate(over="ignore"):
        key = _mix64(np.uint64(check_seed(seed)) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(1))
        x = _mix64(_mix64(h ^ key) + pos % np.uint64(block_tokens))
    return (x % np.uint64(vocab_size)).astype(np.int32)


def load_mooncake(path: str | os.PathLike, *, vocab_size: int, seed: int = 0,
                  block_tokens: int = BLOCK_TOKENS, time_unit: str = "ms", prompt_scale: float = 1.0,
                  output_scale: float = 1.0, skip_bad_rows: bool = False,
                  id_prefix: str = "mooncake") -> LoadedTrace:
    """Load a Mooncake trace as Requests sorted by arrival (stable for ties).

    Request ``i`` (the ``i``-th data line) is named ``f"{id_prefix}-{i:06d}"``. See
    :func:`read_mooncake` for the options and :func:`block_token_ids` for the prompts' ids.
    """
    vocab_size = check_vocab_size(vocab_size)
    trace = read_mooncake(path, block_tokens=block_tokens, time_unit=time_unit,
                          prompt_scale=prompt_scale, output_scale=output_scale,
                          skip_bad_rows=skip_bad_rows)
    tail_rng = make_rng(seed, "mooncake-tail")
    arrivals = trace.arrival_s.tolist()
    outs = trace.output_len.tolist()
    reqs = []
    for i in np.argsort(trace.arrival_s, kind="stable").tolist():
        n = int(trace.prompt_len[i])
        ids = block_token_ids(trace.hash_ids[i], n, block_tokens=trace.block_tokens,
                              vocab_size=vocab_size, seed=seed)
        if ids.size < n:
            ids = np.concatenate([ids, random_ids(tail_rng, n - ids.size, vocab_size)])
        reqs.append(Request(request_id=f"{id_prefix}-{int(trace.row[i]):06d}", arrival_s=arrivals[i],
                            prompt_token_ids=readonly(ids), output_len=outs[i]))
    return LoadedTrace(reqs, source=trace.source, skipped=trace.skipped, errors=trace.errors)


def write_mooncake(requests: Iterable[Request], path: str | os.PathLike, *,
                   block_tokens: int = BLOCK_TOKENS) -> int:
    """Write requests as a Mooncake trace: arrivals (ms), lengths and the prompts' block ids.

    The ids, numbered by :func:`~kvrl.workloads.tokens.prefix_block_ids` as the Mooncake traces number
    theirs (a chain), keep which prompts share which prefixes, not the token ids;
    tenant, priority, ``n`` and SLOs are not in the format. Returns the number of lines.
    """
    reqs = list(requests)
    blocks = prefix_block_ids(reqs, block_tokens)
    with open(path, "w", encoding="utf-8") as f:
        for r, ids in zip(reqs, blocks):
            obj: dict[str, Any] = {"timestamp": float(r.arrival_s) * 1e3, "input_length": r.prompt_len,
                                   "output_length": int(r.output_len), "hash_ids": ids}
            f.write(json.dumps(obj, separators=(", ", ": ")))
            f.write("\n")
    return len(reqs)
