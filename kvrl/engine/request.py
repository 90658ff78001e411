"""Requests (what a workload asks for) and sequences (what the engine schedules).

A :class:`Request` is immutable workload data. The engine turns it into one :class:`Sequence`
(or ``n`` of them once a parallel-sampling request finishes its prefill and forks).
"""
from __future__ import annotations

import enum
import math
import struct
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

_FORMATS = {4: (np.dtype("<i4"), "i"), 8: (np.dtype("<i8"), "q")}   # width -> (numpy dtype, struct code)
_PACKERS: dict[int, dict] = {width: {} for width in _FORMATS}   # width -> n -> pack of n little-endian ints (token_bytes)


class RequestRejected(ValueError):
    """A request that the engine can never serve (too long, malformed); the rest keep running."""


@dataclass(frozen=True, eq=False, slots=True)
class Request:
    """One inference request as a workload describes it.

    Attributes:
        request_id: unique name within a workload.
        arrival_s: arrival time in seconds on the engine clock (0 for offline batches).
        prompt_token_ids: int32 array of prompt token ids (length >= 1).
        output_len: number of tokens to generate per sample (EOS is ignored), >= 1.
        tenant: tenant name; by default the prefix cache is scoped by tenant.
        priority: smaller value = more important (vLLM convention).
        n: parallel samples sharing the prompt (copy-on-write forks after prefill).
        prefix_group: name of a group whose requests share a prompt prefix (informational).
        slo_ttft_s / slo_tpot_s: per-request latency objectives in seconds; None = use the run default.
        cache_salt: extra key mixed into prefix-cache block hashes; None = derived from the tenant
            when the cache is tenant-scoped.
        clipped: what the workload changed to fit ``max_model_len`` (e.g. ``"prompt 3000->255,
            output 200->1"``); None = served as the workload gave it.
        output_len_hint: a front-end predictor's estimate of ``output_len`` in tokens (>= 1), the
            kind a server gets from a length-prediction model or the client; None = no estimate.
            Policies may read it (it is not the truth); the engine never does.
    """

    request_id: str
    arrival_s: float
    prompt_token_ids: np.ndarray
    output_len: int
    tenant: str = "default"
    priority: int = 0
    n: int = 1
    prefix_group: Optional[str] = None
    slo_ttft_s: Optional[float] = None
    slo_tpot_s: Optional[float] = None
    cache_salt: Optional[str] = None
    clipped: Optional[str] = None
    output_len_hint: Optional[int] = None
    prompt_len: int = field(init=False, repr=False)  # derived: len(prompt_token_ids)

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt_len", int(len(self.prompt_token_ids)))

    def validate(self) -> None:
        """Raise :class:`RequestRejected` naming the bad field."""
        if not isinstance(self.prompt_token_ids, np.ndarray) or self.prompt_token_ids.ndim != 1:
            raise RequestRejected(f"request {self.request_id!r}: prompt_token_ids must be a 1-D array")
        if self.prompt_len < 1:
            raise RequestRejected(f"request {self.request_id!r}: empty prompt (prompt_len must be >= 1)")
        if np.minimum.reduce(self.prompt_token_ids) < 0:     # (ndarray.min without its Python wrapper)
            raise RequestRejected(f"request {self.request_id!r}: negative token id in prompt")
        if not isinstance(self.output_len, (int, np.integer)) or self.output_len < 1:
            raise RequestRejected(
                f"request {self.request_id!r}: output_len must be an integer >= 1, got {self.output_len!r}")
        hint = self.output_len_hint
        if hint is not None and (isinstance(hint, bool) or not isinstance(hint, (int, np.integer)) or hint < 1):
            raise RequestRejected(
                f"request {self.request_id!r}: output_len_hint must be an integer >= 1 or None, got {hint!r}")
        if not isinstance(self.n, (int, np.integer)) or self.n < 1:
            raise RequestRejected(f"request {self.request_id!r}: n must be an integer >= 1, got {self.n!r}")
        if not math.isfinite(self.arrival_s) or self.arrival_s < 0:
            raise RequestRejected(f"request {self.request_id!r}: arrival_s must be finite and >= 0")


class SeqStatus(enum.Enum):
    WAITING = "waiting"      # not yet admitted, or preempted by recompute (KV dropped)
    RUNNING = "running"      # holds GPU blocks
    SWAPPED = "swapped"      # KV lives in the CPU pool
    FINISHED = "finished"
    ABORTED = "aborted"


@dataclass(eq=False, slots=True)
class Sequence:
    """One token stream the engine schedules.

    ``token_ids`` = prompt followed by outputs. ``num_computed`` counts the leading tokens whose KV
    is in the cache; a step computes tokens ``[num_computed, num_computed + k)`` and samples a new
    token exactly when that reaches ``num_tokens``.
    """

    seq_id: int
    request: Request
    output_token_ids: list[int] = field(default_factory=list)
    num_computed: int = 0
    status: SeqStatus = SeqStatus.WAITING
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)  # chained hashes of full blocks, in order
    cpu_block_table: list[int] = field(default_factory=list)  # while SWAPPED
    admitted_s: float = -1.0     # engine time of the latest admission (or swap-in)
    admit_order: int = -1        # increasing counter; larger = admitted more recently
    first_token_s: float = -1.0
    finish_s: float = -1.0
    num_preemptions: int = 0
    num_cached_prompt_tokens: int = 0  # prefix-cache hit at first admission
    shared_prefix_tokens: int = 0      # KV tokens held in prefix-cache blocks since the latest admission
                                       # (0 after a preemption: a swap-in gets private blocks)
    co_read_prefix_tokens: int = 0     # of those, the tokens in blocks another sequence held at that
                                       # admission: blocks more than one decode reads (the step model's
                                       # shared KV tokens from fit version 12, kvrl.executors.profile)
    parent_seq_id: Optional[int] = None
    error: Optional[str] = None
    #: the planner's decode item for this sequence (a :class:`~kvrl.engine.batch.ScheduledSeq`),
    #: reused from step to step while nothing else holds it (see ``_schedule_running`` in
    #: :mod:`kvrl.engine.planning`); not part of the sequence's state
    decode_item: Optional[object] = field(default=None, repr=False)
    #: the block pool's record of this sequence's prefix-cache family while it holds blocks (see
    #: lazy registration in :mod:`kvrl.engine.prefix_identity`); not part of the sequence's state
    prefix_family: Optional[object] = field(default=None, repr=False)
    #: the block pool's last answer to "how many of its leading blocks are cached" while it waits, if any:
    #: ``(where the pool's reclaim log stood, full blocks asked about, the blocks found as a set)`` (see
    #: ``peek_cached_tokens`` in :mod:`kvrl.engine.prefix_identity`); not part of the sequence's state
    prefix_peek: Optional[tuple] = field(default=None, repr=False)

    @property
    def prompt_len(self) -> int:
        return self.request.prompt_len

    @property
    def num_tokens(self) -> int:
        return self.request.prompt_len + len(self.output_token_ids)

    @property
    def num_output(self) -> int:
        return len(self.output_token_ids)

    @property
    def remaining_output(self) -> int:
        return self.request.output_len - len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status in (SeqStatus.FINISHED, SeqStatus.ABORTED)

    def token_bytes(self, start: int, end: int, width: int = 4) -> bytes:
        """Token ids in positions ``[start, end)`` as little-endian integers of ``width`` bytes (4
        or 8: what :func:`kvrl.engine.hashing.block_bytes` gives for :meth:`token_slice`), without
        an intermediate array for the generated part."""
        request = self.request
        plen = request.prompt_len
        if end <= plen:
            part = request.prompt_token_ids[start:end]
            dtype = _FORMATS[width][0]
            return (part if part.dtype is dtype else part.astype(dtype)).tobytes()   # no copy to convert
        lo = start - plen if start > plen else 0
        pack = _PACKERS[width].get(end - plen - lo)
        if pack is None:
            pack = _PACKERS[width][end - plen - lo] = struct.Struct(f"<{end - plen - lo}{_FORMATS[width][1]}").pack
        out = pack(*self.output_token_ids[lo:end - plen])
        if start >= plen:
            return out
        part = request.prompt_token_ids[start:]
        dtype = _FORMATS[width][0]
        return (part if part.dtype is dtype else part.astype(dtype)).tobytes() + out

    def token_slice(self, start: int, end: int) -> np.ndarray:
        """Token ids in positions ``[start, end)`` as an int64 array."""
        prompt = self.request.prompt_token_ids
        plen = prompt.shape[0]
        if end <= plen:
            return prompt[start:end].astype(np.int64, copy=False)
        out = np.asarray(self.output_token_ids[max(start - plen, 0): end - plen], dtype=np.int64)
        if start >= plen:
            return out
        return np.concatenate([prompt[start:].astype(np.int64), out])
