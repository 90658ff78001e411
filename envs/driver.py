"""Serving one episode: the arrival loop of :meth:`Engine.run`, one engine step at a time, and the
reward accounting between decisions.

:meth:`EngineDriver.step` is exactly one iteration of :meth:`Engine.run`'s loop (idle until the
next arrival, submit the arrivals that are due, run one engine step), so an episode that serves a
whole split reproduces ``kvrl-run`` on the same config bit for bit.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from kvrl.engine.engine import Engine
from kvrl.engine.metrics import RequestRecord
from kvrl.engine.request import Request
from kvrl.envs.config import RewardConfig


@dataclass
class RewardParts:
    """What happened between two decisions (tokens; counts)."""

    finished: int = 0            # requests that finished (aborted ones excluded)
    output_tokens: int = 0       # their output tokens
    good_tokens: int = 0         # output tokens of those that met their TTFT/TPOT SLOs
    recomputed_tokens: int = 0   # tokens whose KV was dropped by recompute preemptions
    swapped_tokens: int = 0      # blocks swapped out or in, times the block size

    def reward(self, cfg: RewardConfig) -> tuple[float, dict[str, float]]:
        """``(reward, components)``; the components sum to the reward."""
        served = self.good_tokens if cfg.kind == "goodput" else self.output_tokens
        components = {
            f"reward_{cfg.kind}": served / cfg.token_scale,
            "reward_recompute_penalty": -cfg.recompute_penalty * self.recomputed_tokens / cfg.token_scale,
            "reward_swap_penalty": -cfg.swap_penalty * self.swapped_tokens / cfg.token_scale,
        }
        return sum(components.values()), components


class EngineDriver:
    """Serves ``requests`` (sorted by arrival) on ``engine``, optionally until engine time ``end_s``.

    ``finished``: every request was submitted and nothing is left (trace end). ``timed_out``:
    engine time reached ``end_s`` (a time limit; what is in flight stays unfinished).
    """

    def __init__(self, engine: Engine, requests: Sequence[Request], end_s: Optional[float] = None) -> None:
        if not requests:
            raise ValueError("an episode needs at least one request")
        self.engine = engine
        self.pending = list(requests)
        self.end_s = end_s
        self._next = 0
        self._open: list[RequestRecord] = []
        self._seen_recomputed = 0
        self._seen_swapped = 0
        engine.metrics.start_s = engine.now = self.pending[0].arrival_s

    @property
    def finished(self) -> bool:
        return self._next >= len(self.pending) and not self.engine.has_unfinished

    @property
    def timed_out(self) -> bool:
        return self.end_s is not None and self.engine.now >= self.end_s

    @property
    def done(self) -> bool:
        return self.finished or self.timed_out

    def step(self) -> None:
        """One iteration of :meth:`Engine.run`'s loop. Call only while not :attr:`finished`."""
        engine, pending = self.engine, self.pending
        if not engine.has_unfinished and pending[self._next].arrival_s > engine.now:
            engine.now = pending[self._next].arrival_s       # idle until the next arrival
        while self._next < len(pending) and pending[self._next].arrival_s <= engine.now:
            request = pending[self._next]
            if engine.submit(request):
                self._open.append(engine.metrics.requests[request.request_id])
            self._next += 1
        if engine.has_unfinished:
            engine.step()

    def collect(self) -> RewardParts:
        """What finished and what was recomputed or swapped since the last call."""
        parts = RewardParts()
        still_open = []
        for rec in self._open:
            if rec.finish_s is None:
                still_open.append(rec)
            elif not rec.error:
                parts.finished += 1
                parts.output_tokens += rec.output_tokens
                if rec.meets_slo:
                    parts.good_tokens += rec.output_tokens
        self._open = still_open
        m = self.engine.metrics
        swapped = m.swapped_out_blocks + m.swapped_in_blocks
        parts.recomputed_tokens = m.recomputed_tokens - self._seen_recomputed
        parts.swapped_tokens = (swapped - self._seen_swapped) * self.engine.config.block_size
        self._seen_recomputed, self._seen_swapped = m.recomputed_tokens, swapped
        return parts
