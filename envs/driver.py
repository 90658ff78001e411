"""Serving one episode: the engine's :class:`~kvrl.engine.loop.ServingLoop`, one iteration at a
time, and the reward accounting between decisions.

:meth:`EngineDriver.step` and :meth:`EngineDriver.step_iter` are one iteration of the loop that
:meth:`Engine.run` runs (idle until the next arrival, submit the arrivals that are due, run one
engine step), so an episode that serves a whole split reproduces ``kvrl-run`` on the same config
bit for bit.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Optional, Sequence

from kvrl.engine.engine import Engine
from kvrl.engine.loop import ServingLoop
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
    baseline_tokens: int = 0     # the reward baseline's served tokens that finished in the same interval

    def reward(self, cfg: RewardConfig) -> tuple[float, dict[str, float]]:
        """``(reward, components)``; the components sum to the reward."""
        served = self.good_tokens if cfg.kind == "goodput" else self.output_tokens
        components = {
            f"reward_{cfg.kind}": served / cfg.token_scale,
            "reward_recompute_penalty": -cfg.recompute_penalty * self.recomputed_tokens / cfg.token_scale,
            "reward_swap_penalty": -cfg.swap_penalty * self.swapped_tokens / cfg.token_scale,
        }
        if cfg.baseline is not None:
            components["reward_baseline"] = -self.baseline_tokens / cfg.token_scale
        return sum(components.values()), components


@dataclass(frozen=True)
class TokenCurve:
    """A reference run's served tokens (goodput or all output) as a step function of engine time:
    ``cum_tokens[i]`` tokens had finished by ``finish_s[i]`` (ascending)."""

    finish_s: tuple[float, ...]
    cum_tokens: tuple[int, ...]

    def upto(self, t: float) -> int:
        """Tokens of the requests that finished at or before engine time ``t`` (s)."""
        i = bisect.bisect_right(self.finish_s, t)
        return self.cum_tokens[i - 1] if i else 0


class EngineDriver:
    """Serves ``requests`` on ``engine``, optionally until engine time ``end_s``.

    ``finished``: every request was submitted and nothing is left (trace end). ``timed_out``:
    engine time reached ``end_s`` (a time limit; what is in flight stays unfinished).
    """

    def __init__(self, engine: Engine, requests: Sequence[Request], end_s: Optional[float] = None,
                 baseline: Optional[TokenCurve] = None) -> None:
        if not requests:
            raise ValueError("an episode needs at least one request")
        self.engine = engine
        self.baseline = baseline
        self._baseline_seen = 0
        self._open: list[RequestRecord] = []
        self._seen_recomputed = 0
        self._seen_swapped = 0
        # a bound method, not a closure: a deep copy of the driver (envs/rollout.py) rebinds it
        self.loop = ServingLoop(engine, requests, end_s=end_s, on_submit=self._track)
        self.step = self.loop.step              # one iteration, the eviction plugin deciding
        self.step_iter = self.loop.step_iter    # one iteration, yielding its block shortages

    def _track(self, request: Request) -> None:
        """Follow a submitted request until it finishes (:meth:`collect`)."""
        self._open.append(self.engine.metrics.requests[request.request_id])

    @property
    def pending(self) -> list[Request]:
        """The episode's requests, by arrival time."""
        return self.loop.pending

    @property
    def finished(self) -> bool:
        return self.loop.finished

    @property
    def timed_out(self) -> bool:
        return self.loop.timed_out

    @property
    def done(self) -> bool:
        """Finished, or a limit of the loop reached (the episode's ``end_s``)."""
        return self.loop.done

    def collect(self, final: bool = False) -> RewardParts:
        """What finished and what was recomputed or swapped since the last call; with a
        ``baseline``, its tokens that finished in the same interval of engine time (all that are
        left when ``final``)."""
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
        if self.baseline is not None:
            total = self.baseline.upto(math.inf if final else self.engine.now)
            parts.baseline_tokens, self._baseline_seen = total - self._baseline_seen, total
        return parts
