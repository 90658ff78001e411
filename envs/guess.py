"""Guessed futures: what a server could assume about the traffic to come, for planners that copy
the serving state and try each action on the copy (scripts/rl_rule_headroom.py, kvrl.envs.rollout).

A copied :class:`~kvrl.engine.loop.ServingLoop` holds the job's real future: the requests still to
arrive and every request's true output length. A planner that sees only what a server sees replaces
both on its copy:

* arrivals: :func:`forecast` replays the requests of the last window (a persistence forecast);
  :func:`poisson_forecast` draws a Poisson process at that window's rate, a new realisation per draw;
* output lengths: :func:`guessed_lengths` draws each unfinished sequence's length from the finished
  requests' lengths (or uses the requests' length hints).

:func:`draw_future` draws both, one guessed future; :func:`guess_future` puts one on a copy for a
:class:`Guess`. Forecast requests get new ids and prompt token ids shifted by their index (mod the
vocabulary), so they hit no prefix that the real requests cached.
"""
from __future__ import annotations

import bisect
import dataclasses
from dataclasses import dataclass
from typing import Optional

import numpy as np

from kvrl.engine.engine import Engine
from kvrl.engine.loop import ServingLoop
from kvrl.engine.request import Request


@dataclass(frozen=True)
class Guess:
    """How a guessed future is drawn. ``window_s``: the recent window (engine s) whose arrivals make
    the forecast; ``horizon_s``: how far ahead from now it runs (s; past the job's end too: a server
    does not know when its traffic stops); ``poisson``: arrivals drawn at the window's rate (else the
    window replayed); ``samples``: guessed futures per decision, the same for every action."""

    window_s: float = 5.0
    horizon_s: float = 20.0
    poisson: bool = True
    samples: int = 8

    def __post_init__(self) -> None:
        if self.window_s <= 0 or self.horizon_s <= 0 or self.samples < 1:
            raise ValueError(f"a guess needs window_s > 0, horizon_s > 0 and samples >= 1, got {self}")


def recent_arrivals(loop: ServingLoop, window_s: float) -> list[Request]:
    """The requests of ``loop`` that arrived in the last ``window_s`` seconds of its engine clock."""
    return [r for r in loop.pending[:loop.next_index] if r.arrival_s >= loop.engine.now - window_s]


def forecast(loop: ServingLoop, window_s: float, horizon_s: Optional[float] = None) -> list[Request]:
    """The requests that arrived in the last ``window_s`` seconds of ``loop``'s engine clock, arriving
    again every ``window_s`` seconds from now until the job's last arrival (a persistence forecast),
    with new ids and prompt token ids shifted by the repeat's index (mod the vocabulary). With
    ``horizon_s``, until ``horizon_s`` seconds from now instead, whether or not the job's arrivals stop
    before: a forecast that stops with the job tells the planner when to stop reserving."""
    now = loop.engine.now
    end = now + horizon_s if horizon_s is not None else loop.pending[-1].arrival_s
    vocab = loop.engine.executor.vocab_size
    recent = recent_arrivals(loop, window_s)
    future, k = [], 1
    while recent and now + (k - 1) * window_s <= end:
        future += [dataclasses.replace(r, request_id=f"{r.request_id}~{k}", arrival_s=r.arrival_s + k * window_s,
                                       prompt_token_ids=(r.prompt_token_ids + k) % vocab)
                   for r in recent if now <= r.arrival_s + k * window_s <= end]
        k += 1
    return sorted(future, key=lambda r: r.arrival_s)


def poisson_forecast(loop: ServingLoop, window_s: float, horizon_s: float, rng: np.random.Generator) -> list[Request]:
    """A random forecast: arrivals from now for ``horizon_s`` seconds as a Poisson process at the rate
    of the last ``window_s`` seconds (their count / ``window_s``), each a copy of one of those requests
    drawn at random, with a new id and its prompt token ids shifted by its index + 1 (mod the
    vocabulary). Empty when nothing arrived in the window."""
    now, vocab = loop.engine.now, loop.engine.executor.vocab_size
    recent = recent_arrivals(loop, window_s)
    future, t = [], now
    while recent:
        t += rng.exponential(window_s / len(recent))
        if t > now + horizon_s:
            break
        r = recent[int(rng.integers(len(recent)))]
        i = len(future)
        future.append(dataclasses.replace(r, request_id=f"{r.request_id}~p{i}", arrival_s=float(t),
                                          prompt_token_ids=(r.prompt_token_ids + i + 1) % vocab))
    return future


def guessed_lengths(loop: ServingLoop, future: list[Request], rng: np.random.Generator,
                    hints: bool = False) -> tuple[dict[int, int], list[Request]]:
    """Output lengths a server could guess. Every unfinished sequence's length is drawn from the output
    lengths of the requests finished so far that exceed what it has generated (one token more than
    that where none does), and each request of ``future`` drawn from all of them (one token where none
    has finished: the same rule for a request that has generated nothing; never a copied request's
    own length, which no server knows). With ``hints``, each request's ``output_len_hint`` instead (a
    length predictor's estimate), at least one token more than generated. Returns
    ``{seq_id: output_len}`` and ``future`` with its lengths replaced."""
    def hinted(request: Request, made: int) -> int:
        if request.output_len_hint is None:
            raise ValueError(f"request {request.request_id!r} has no output_len_hint: set workload.length_hint_sigma")
        return max(made + 1, request.output_len_hint)

    done = sorted(loop.engine.metrics.finished_output_lens)
    lengths = {}
    for seq in loop.engine.live_sequences():
        made = len(seq.output_token_ids)
        if hints:
            lengths[seq.seq_id] = hinted(seq.request, made)
            continue
        longer = done[bisect.bisect_right(done, made):]
        lengths[seq.seq_id] = int(rng.choice(longer)) if longer else made + 1
    if hints:
        future = [dataclasses.replace(r, output_len=hinted(r, 0)) for r in future]
    else:
        future = [dataclasses.replace(r, output_len=int(rng.choice(done)) if done else 1) for r in future]
    return lengths, future


def set_lengths(engine: Engine, lengths: dict[int, int]) -> None:
    """Give ``engine``'s live sequences the output lengths ``lengths`` (``{seq_id: output_len}``)."""
    for seq in engine.live_sequences():
        engine.set_output_len(seq, lengths[seq.seq_id])


def draw_future(loop: ServingLoop, window_s: Optional[float], horizon_s: Optional[float], poisson: bool,
                rng: np.random.Generator, hints: bool = False) -> tuple[dict[int, int], list[Request]]:
    """One guessed future of ``loop`` (not changed), drawn from ``rng``: ``({seq_id: output_len}, the
    requests still to arrive)``. The arrivals are a forecast of the last ``window_s`` seconds:
    :func:`poisson_forecast` ``horizon_s`` ahead with ``poisson``, else :func:`forecast` replayed
    ``horizon_s`` ahead (None: to the job's last arrival); ``window_s`` None keeps the job's own
    arrivals. Then every output length, the live sequences' and the arrivals', by
    :func:`guessed_lengths` (with ``hints``, the requests' length hints). The arrivals are drawn
    before the lengths."""
    if window_s is None:
        future = loop.pending[loop.next_index:]
    elif poisson:
        future = poisson_forecast(loop, window_s, horizon_s, rng)
    else:
        future = forecast(loop, window_s, horizon_s)
    return guessed_lengths(loop, future, rng, hints)


def guess_future(loop: ServingLoop, guess: Guess, rng: np.random.Generator) -> None:
    """Replace, on ``loop`` (a copy: it is changed in place), the requests still to arrive and every
    output length by one :func:`draw_future` of ``guess``."""
    lengths, future = draw_future(loop, guess.window_s, guess.horizon_s, guess.poisson, rng)
    loop.pending = loop.pending[:loop.next_index] + future
    set_lengths(loop.engine, lengths)
