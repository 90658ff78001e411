"""``scored``: an admission order learned as a linear score of what a server knows about each waiting request.

The built-in orders each rank by one quantity: ``lpm`` the cached prefix, ``fcfs`` the arrival, ``sjf`` the
predicted output. On the multi-tenant task the right one differs from run to run and within a run (docs/rl.md,
"Choosing the admission order while serving": a planner choosing among the three every second gains 13% over
``lpm`` with foresight). ``scored`` ranks by a weighted sum of per-request features instead, so one policy can
hold several of those reasons at once, and its weights can be learned (``scripts/order_search.py``: the
cross-entropy method on training windows, paired against ``lpm``).

Features of a waiting request, each in [0, 1] (``x / (x + ref)`` squashes unbounded counts):

* ``cached``: prompt tokens found in the prefix cache now, ``k / (k + 1024)`` (``lpm``'s key);
* ``prefill``: tokens still to prefill, ``u / (u + 512)`` with ``u = num_tokens - k``;
* ``output``: predicted remaining output, ``r / (r + 256)`` (:class:`~kvrl.plugins.lengths.RemainingOutput`
  over the finished requests, ``length_key`` none or tenant; ``sjf``'s reason);
* ``wait``: time waited since arrival in units of the request's TTFT objective ``w``, ``w / (w + 1)`` (seconds
  when it has none; ``fcfs``'s reason);
* ``late``: 1 once it has waited past its TTFT objective (it can no longer count toward goodput), else 0.

The score is ``sum(weight_f * feature_f)``; the highest score is admitted first, ties by arrival. The default
weights (``cached`` 1, the rest 0) order exactly as ``lpm`` does. Like ``lpm``, with more than ``max_queue``
waiting requests it falls back to arrival order (looking prefixes up costs hashing).
"""
from __future__ import annotations

from dataclasses import dataclass

from kvrl.plugins.base import SchedulerPolicy, check_choice, check_range
from kvrl.plugins.lengths import RemainingOutput
from kvrl.plugins.registry import register

#: the features, in the order of :meth:`ScoredScheduler.features`
FEATURES = ("cached", "prefill", "output", "wait", "late")
CACHED_REF, PREFILL_REF, OUTPUT_REF = 1024.0, 512.0, 256.0   # tokens that map to 0.5


@register("scheduler", "scored")
class ScoredScheduler(SchedulerPolicy):
    """Admits the waiting request with the highest ``sum(weight * feature)`` first, ties by arrival. Features, each
    in [0, 1]: ``cached`` (prompt tokens found cached, k/(k+1024)), ``prefill`` (tokens still to prefill,
    u/(u+512)), ``output`` (predicted remaining output, r/(r+256)), ``wait`` (time waited in units of the TTFT
    objective, w/(w+1)), ``late`` (1 once waited past the TTFT objective). Parameters: the five weights (default
    1, 0, 0, 0, 0: ``lpm``'s order; ``late=-10 prefill=-1`` is the hand-written SLO-aware order of docs/rl.md),
    ``length_key`` (``none`` or ``tenant``: which finished requests predict the remaining output), ``max_queue``
    (default 128: above it, arrival order). ``scripts/order_search.py`` learns the weights."""

    static_key = False

    @dataclass
    class Params:
        cached: float = 1.0
        prefill: float = 0.0
        output: float = 0.0
        wait: float = 0.0
        late: float = 0.0
        length_key: str = "none"
        max_queue: int = 128

        def __post_init__(self):
            for name in FEATURES:
                check_range(name, getattr(self, name))
            check_choice("length_key", self.length_key, ("none", "tenant"))
            check_range("max_queue", self.max_queue, 1)

    def __init__(self, params) -> None:
        super().__init__(params)
        self.weights = tuple(float(getattr(params, name)) for name in FEATURES)
        self.lengths = RemainingOutput(params.length_key)

    def on_finish(self, seq) -> None:
        self.lengths.add(seq)

    def features(self, seq) -> tuple[float, ...]:
        """``seq``'s features in :data:`FEATURES` order; the cache is looked up only when a weight needs it."""
        w_cached, w_prefill, w_output, w_wait, w_late = self.weights
        cached = seq.cached_prefix_tokens if (w_cached or w_prefill) else 0
        todo = max(seq.num_tokens - cached, 0)
        remaining = self.lengths.of(seq) if w_output else 0.0
        slo = seq.slo_ttft_s
        waited = self.engine.now - seq.arrival_s
        w = waited / slo if slo else waited
        return (cached / (cached + CACHED_REF), todo / (todo + PREFILL_REF), remaining / (remaining + OUTPUT_REF),
                max(w, 0.0) / (max(w, 0.0) + 1.0), 1.0 if slo and waited > slo else 0.0)

    def score(self, seq) -> float:
        return sum(w * f for w, f in zip(self.weights, self.features(seq)) if w)

    def key(self, seq):
        return (-self.score(seq), seq.arrival_s, seq.seq_id)

    def order(self, waiting):
        if len(waiting) > self.params.max_queue:
            return sorted(waiting, key=lambda s: (s.arrival_s, s.seq_id))
        return sorted(waiting, key=self.key)
