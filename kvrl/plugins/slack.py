"""SLO slack of a running sequence: how long it can still be stalled and meet its objectives; and
the share of sequences with a tight TPOT objective.

Shared by the ``slo_slack`` eviction plugin and the environments' SLO candidate features
(:mod:`kvrl.envs.features`), and (:func:`tight_tpot_share`) by the ``slo_mix`` watermark and the
environments' SLO-mix features. A request meets its SLO when its TTFT is within ``slo_ttft_s`` and
its mean TPOT, ``(finish - first token) / (output - 1)``, within ``slo_tpot_s``
(:mod:`kvrl.engine.metrics`). With ``remaining`` more tokens to come, generated at ``pace`` x
``slo_tpot_s`` each, the sequence finishes on time when it is stalled for at most

    slo_tpot_s * (num_output - 1 + remaining) - (now - first_token_s) - pace * slo_tpot_s * remaining

seconds (before its first token, the TTFT's time left bounds this too).
"""
from __future__ import annotations

import math
import operator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

    from kvrl.engine.views import SeqView


def tight_tpot_share(seqs: "Sequence[SeqView]", limit_s: float, *, inclusive: bool) -> float:
    """The share of ``seqs`` whose TPOT objective (their own, else the run's; none never counts)
    is below ``limit_s`` seconds, or at most ``limit_s`` with ``inclusive``; 0 for no sequences."""
    if not seqs:
        return 0.0
    within = operator.le if inclusive else operator.lt
    return sum(1 for s in seqs if s.slo_tpot_s is not None and within(s.slo_tpot_s, limit_s)) / len(seqs)


def slo_slack(seq: "SeqView", now: float, remaining: float, pace: float) -> float:
    """Seconds the sequence can still be stalled and meet its SLO (see the module docstring).

    ``remaining``: predicted output tokens still to come; ``pace``: the time per future token as
    a fraction of the TPOT objective. ``-inf`` when it already missed its TTFT (it fails whatever
    happens now); ``+inf`` when it has no objective that can still fail. May be negative: on the
    predicted course it misses the TPOT objective already."""
    ttft, tpot = seq.slo_ttft_s, seq.slo_tpot_s
    first = seq.first_token_s
    if first is None:
        ttft_left = math.inf if ttft is None else ttft - (now - seq.arrival_s)
        if ttft_left < 0:
            return -math.inf
        tpot_left = math.inf if tpot is None else (1.0 - pace) * tpot * max(remaining - 1.0, 0.0)
        return min(ttft_left, tpot_left)
    if ttft is not None and first - seq.arrival_s > ttft:
        return -math.inf
    if tpot is None:
        return math.inf
    return tpot * (seq.num_output - 1 + remaining) - (now - first) - pace * tpot * remaining
