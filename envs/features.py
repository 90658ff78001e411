"""Observation features, shared by the environments and the ``agent`` plugins.

A :class:`FeatureTracker` is owned by an ``agent`` plugin and fed by its hooks (step end,
finish); the environment reads its observation from the same tracker, so an agent sees
identical numbers in training (``kvrl/Watermark-v0``, ``kvrl/Preemption-v0``) and when it runs
inside ``kvrl-run`` (``watermark=agent watermark.policy_path=...``).

Every feature lies in [0, 1]: fractions as they are, unbounded quantities squashed as
``x / (x + ref)`` (``ref`` maps to 0.5). Rates are exponential moving averages over engine time
(time constant ``tau_s``), so they do not depend on how long engine steps are; latencies are
moving averages over finished requests.

Engine features (:data:`ENGINE_FEATURES`): free-block fraction; running / waiting / swapped
counts; their tokens (fraction of the KV capacity); arrival rate and arrived prompt tokens per
second (fraction of the capacity); preemptions per second; recomputed tokens per second
(fraction of the capacity); recent TTFT and TPOT (against the SLO references); recent SLO
attainment; the oldest waiting request's age (against the TTFT reference); the current watermark
(reserved / total blocks).

History features (:data:`HISTORY_FEATURES`, appended with ``features.history``): arrival rate,
arrived prompt tokens per second and preemptions per second averaged over ``short_tau_s`` (a
burst or a load phase shows there within a second); the load trend (short-horizon over
short + long-horizon prompt-token rate: 0.5 steady, above rising, below falling); and the KV
demand of the running sequences, their tokens plus their predicted remaining output (as for
candidates) over the KV capacity, squashed at 1 (above 0.5: the running batch will not fit as it
grows, a preemption cascade is coming).

Prefix features (:data:`PREFIX_FEATURES`, appended after those with ``features.prefix``): the
prefix cache's recent hit rate (prompt tokens found cached over prompt tokens looked up, both
averaged over ``tau_s``; 0 before any lookup); the blocks registered in the cache and those of
them that no sequence holds (reclaimable: they count as free and are the first to go when
running requests need blocks), both as fractions of the pool.

Demand features (:data:`DEMAND_FEATURES`, appended after those with ``features.demand``), all
over the KV capacity and squashed at 1: the running sequences' predicted remaining output (how
much the batch will still grow); their predicted peak KV demand (sequences ordered by predicted
completion; at each completion, the tokens of those still running plus their growth until then,
the largest of these: what the batch needs at its fullest if nothing else is admitted); and the
waiting queue's predicted KV demand (tokens plus predicted output). With ``features.length_key:
tenant`` every prediction is conditioned on the request's tenant (its class).

SLO-mix features (:data:`SLO_MIX_FEATURES`, appended after those with ``features.slo_mix``): the
shares of the running and of the waiting sequences whose TPOT objective (their own, else the
run's) is below ``tpot_ref_s``: how much of the traffic now needs small decode batches (what the
``slo_mix`` watermark reacts to).

Candidate features (:data:`CANDIDATE_FEATURES`, one row per preemption candidate slot, slot 0 =
the newest admission, i.e. vLLM's LIFO victim): valid slot; needs the block; blocks held
(fraction of the pool); computed tokens (fraction of the capacity); generated tokens; remaining
output (predicted from finished requests, or the trace's oracle value); age; priority;
preemptions so far; fits the CPU swap pool; recompute time over swap-out-and-in time. With
``features.slo`` (:data:`SLO_CANDIDATE_FEATURES`, appended to each row): missed its TTFT already;
SLO slack (:func:`~kvrl.plugins.slack.slo_slack`, how long it can still be stalled and meet its
SLO; 0.5 at none left, below when it is behind, 1 for a failed-never objective). With
``features.slot_rules`` the first slots hold the victims of those eviction plugins, one each
(imitating a heuristic is one fixed action), the others the newest admissions not shown yet.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, NamedTuple, Optional, Sequence

import numpy as np

from kvrl import plugins
from kvrl.envs.config import FeatureConfig
from kvrl.plugins.lengths import RemainingOutput, completion_demand
from kvrl.plugins.slack import slo_slack, tight_tpot_share

if TYPE_CHECKING:
    from kvrl.engine.views import EngineView, SeqView

ENGINE_FEATURES = (
    "free_blocks", "running", "waiting", "swapped", "running_tokens", "waiting_tokens", "swapped_tokens",
    "arrival_rate", "arrival_tokens", "preemption_rate", "recompute_rate", "ttft", "tpot", "slo_attainment",
    "oldest_wait", "watermark",
)
HISTORY_FEATURES = (
    "arrival_rate_short", "arrival_tokens_short", "preemption_rate_short", "load_trend", "kv_demand",
)
PREFIX_FEATURES = ("prefix_hit_rate", "cached_blocks", "cached_free_blocks")
DEMAND_FEATURES = ("growth", "peak_demand", "waiting_demand")
SLO_MIX_FEATURES = ("tight_running", "tight_waiting")
CANDIDATE_FEATURES = (
    "valid", "needs_block", "blocks", "computed", "generated", "remaining", "age", "priority", "preemptions",
    "swap_fits", "recompute_vs_swap",
)
SLO_CANDIDATE_FEATURES = ("ttft_missed", "slo_slack")
GENERATED_REF = 32.0     # generated / remaining output tokens that map to 0.5


def engine_feature_names(config: FeatureConfig) -> tuple[str, ...]:
    """The names of :meth:`FeatureTracker.engine_features`' entries under ``config``."""
    return (ENGINE_FEATURES + (HISTORY_FEATURES if config.history else ())
            + (PREFIX_FEATURES if config.prefix else ()) + (DEMAND_FEATURES if config.demand else ())
            + (SLO_MIX_FEATURES if config.slo_mix else ()))


def candidate_feature_names(config: FeatureConfig) -> tuple[str, ...]:
    """The names of one candidate row of :meth:`FeatureTracker.candidate_features` under ``config``."""
    return CANDIDATE_FEATURES + (SLO_CANDIDATE_FEATURES if config.slo else ())


def squash(x: float, ref: float) -> float:
    """``x / (x + ref)`` for ``x >= 0``: 0 at 0, 0.5 at ``ref``, below 1."""
    x = max(x, 0.0)
    return x / (x + ref)


class Counters(NamedTuple):
    """Cumulative engine counters the rate features difference over time."""

    arrivals: int          # requests submitted (accepted or rejected)
    accepted: int          # requests accepted (their records, in arrival order)
    arrived_tokens: int    # prompt tokens of the accepted requests
    preemptions: int
    recomputed_tokens: int


def reserved_fraction(view: "EngineView") -> float:
    """The watermark in force: blocks the watermark policy reserves now / total blocks (0 when the
    engine is idle, as the engine ignores the watermark then)."""
    return view.reserved_blocks / view.num_blocks


class FeatureTracker:
    """Running statistics of one engine and the feature vectors built from them.

    Call :meth:`on_step_end` and :meth:`on_finish` from the policy hooks of the same names;
    :meth:`engine_features` and :meth:`candidate_features` may be called at any time after
    :meth:`bind`.
    """

    def __init__(self, config: FeatureConfig) -> None:
        self.config = config
        self.view: Optional["EngineView"] = None
        self._last_t = 0.0
        self._last = Counters(0, 0, 0, 0, 0)
        self.arrival_rate = 0.0       # requests / s
        self.arrival_tokens = 0.0     # prompt tokens / s
        self.preemption_rate = 0.0    # preemptions / s
        self.recompute_rate = 0.0     # recomputed tokens / s
        self.ttft_s = 0.0
        self.tpot_s = 0.0
        self.slo_attainment = 1.0
        self.short_arrival_rate = 0.0       # the same, over short_tau_s
        self.short_arrival_tokens = 0.0
        self.short_preemption_rate = 0.0
        self.looked_up_tokens = 0.0          # prompt tokens looked up in the prefix cache / s
        self.hit_tokens = 0.0                # ... of those, found cached / s
        self._last_prefix = (0, 0)
        self.remaining_output = RemainingOutput(config.length_key, config.min_class_history)
        self.slot_rules = [plugins.create_from_config("eviction", rule) for rule in config.slot_rules]

    def bind(self, view: "EngineView") -> None:
        self.view = view
        for rule in self.slot_rules:
            rule.bind(view)
        self._last_t = view.now
        self._last = self._counters()
        if self.config.prefix:
            self._last_prefix = (view.prompt_tokens_looked_up, view.prompt_tokens_hit)

    def _counters(self) -> Counters:
        """Read the engine's cumulative counters through its view."""
        view = self.view
        return Counters(view.num_arrived, view.num_accepted, view.arrived_prompt_tokens, view.num_preemptions,
                        view.recomputed_tokens)

    # ------------------------------------------------------------------ hooks
    def on_step_end(self) -> None:
        """Update the rate averages with the counters' change since the last call."""
        now = self.view.now
        dt = now - self._last_t
        if dt <= 0.0:
            return
        counters = self._counters()
        cfg = self.config
        w = 1.0 - math.exp(-dt / cfg.tau_s)
        last = self._last
        self.arrival_rate += w * ((counters.arrivals - last.arrivals) / dt - self.arrival_rate)
        self.arrival_tokens += w * ((counters.arrived_tokens - last.arrived_tokens) / dt - self.arrival_tokens)
        self.preemption_rate += w * ((counters.preemptions - last.preemptions) / dt - self.preemption_rate)
        self.recompute_rate += w * ((counters.recomputed_tokens - last.recomputed_tokens) / dt - self.recompute_rate)
        if cfg.history:
            ws = 1.0 - math.exp(-dt / cfg.short_tau_s)
            self.short_arrival_rate += ws * ((counters.arrivals - last.arrivals) / dt - self.short_arrival_rate)
            self.short_arrival_tokens += ws * ((counters.arrived_tokens - last.arrived_tokens) / dt
                                               - self.short_arrival_tokens)
            self.short_preemption_rate += ws * ((counters.preemptions - last.preemptions) / dt
                                                - self.short_preemption_rate)
        if cfg.prefix:
            looked, hit = self.view.prompt_tokens_looked_up, self.view.prompt_tokens_hit
            self.looked_up_tokens += w * ((looked - self._last_prefix[0]) / dt - self.looked_up_tokens)
            self.hit_tokens += w * ((hit - self._last_prefix[1]) / dt - self.hit_tokens)
            self._last_prefix = (looked, hit)
        self._last, self._last_t = counters, now

    def on_finish(self, seq: "SeqView") -> None:
        """Fold a finished sequence's TTFT, TPOT and SLO outcome into the latency averages."""
        cfg = self.config
        a = cfg.latency_alpha
        ttft = seq.first_token_s - seq.arrival_s
        tpot = (self.view.now - seq.first_token_s) / (seq.num_output - 1) if seq.num_output > 1 else 0.0
        self.ttft_s += a * (ttft - self.ttft_s)
        self.tpot_s += a * (tpot - self.tpot_s)
        met = ttft <= cfg.ttft_ref_s and tpot <= cfg.tpot_ref_s
        self.slo_attainment += a * (float(met) - self.slo_attainment)
        self.remaining_output.add(seq)
        for rule in self.slot_rules:
            rule.on_finish(seq)

    # ------------------------------------------------------------------ features
    def engine_features(self) -> np.ndarray:
        """The :data:`ENGINE_FEATURES` vector, then :data:`HISTORY_FEATURES` with
        ``features.history`` and :data:`PREFIX_FEATURES` with ``features.prefix`` (float32, in
        [0, 1]; names: :func:`engine_feature_names`)."""
        cfg, v = self.config, self.view
        capacity = float(v.num_blocks * v.block_size)
        now = v.now
        running, waiting, swapped = v.running, v.waiting, v.swapped
        oldest = max((now - s.arrival_s for s in waiting), default=0.0)
        values = (
            v.num_free_blocks / v.num_blocks,
            squash(len(running), cfg.count_scale),
            squash(len(waiting), cfg.count_scale),
            squash(len(swapped), cfg.count_scale),
            min(sum(s.num_tokens for s in running) / capacity, 1.0),
            squash(sum(s.num_tokens for s in waiting) / capacity, 1.0),
            squash(sum(s.num_tokens for s in swapped) / capacity, 1.0),
            squash(self.arrival_rate, cfg.rate_ref),
            squash(self.arrival_tokens / capacity, 1.0),
            squash(self.preemption_rate, 1.0),
            squash(self.recompute_rate / capacity, 0.1),
            squash(self.ttft_s, cfg.ttft_ref_s),
            squash(self.tpot_s, cfg.tpot_ref_s),
            self.slo_attainment,
            squash(oldest, cfg.ttft_ref_s),
            min(reserved_fraction(v), 1.0),
        )
        if cfg.history:
            long_tokens, short_tokens = self.arrival_tokens, self.short_arrival_tokens
            demand = sum(s.num_tokens + self._remaining(s) for s in running) / capacity
            values += (
                squash(self.short_arrival_rate, cfg.rate_ref),
                squash(short_tokens / capacity, 1.0),
                squash(self.short_preemption_rate, 1.0),
                short_tokens / (short_tokens + long_tokens) if short_tokens + long_tokens > 0 else 0.5,
                squash(demand, 1.0),
            )
        if cfg.prefix:
            looked = self.looked_up_tokens
            values += (
                min(self.hit_tokens / looked, 1.0) if looked > 0 else 0.0,
                v.num_cached_blocks / v.num_blocks,
                v.num_cached_free_blocks / v.num_blocks,
            )
        if cfg.demand:
            values += self._demand_features(running, waiting, capacity)
        if cfg.slo_mix:
            values += (tight_tpot_share(running, cfg.tpot_ref_s, inclusive=False),
                       tight_tpot_share(waiting, cfg.tpot_ref_s, inclusive=False))
        return np.asarray(values, dtype=np.float32)

    def _demand_features(self, running, waiting, capacity: float) -> tuple[float, float, float]:
        """:data:`DEMAND_FEATURES` (see the module docstring)."""
        tokens = np.fromiter((s.num_tokens for s in running), dtype=np.float64, count=len(running))
        remaining = np.fromiter((self._remaining(s) for s in running), dtype=np.float64, count=len(running))
        peak = float(np.max(completion_demand(tokens, remaining)[0])) if len(running) else 0.0
        queued = sum(s.num_tokens + self._remaining(s) for s in waiting)
        return (squash(float(remaining.sum()) / capacity, 1.0), squash(peak / capacity, 1.0),
                squash(queued / capacity, 1.0))

    def candidate_slots(self, candidates: Sequence["SeqView"]) -> list["SeqView"]:
        """The candidates shown to the agent, one per slot (at most ``top_k``): the victims of the
        ``slot_rules`` plugins in order, then the newest admissions not shown yet (without rules:
        newest first, slot 0 = LIFO)."""
        by_id = {s.seq_id: s for s in candidates}
        slots = [by_id[rule.select(candidates).seq_id] for rule in self.slot_rules]
        shown = {s.seq_id for s in slots}
        newest = sorted((s for s in candidates if s.seq_id not in shown), key=lambda s: -s.admit_order)
        return slots + newest[: self.config.top_k - len(slots)]

    def candidate_features(self, candidates: Sequence["SeqView"], slots: Sequence["SeqView"]) -> np.ndarray:
        """A ``(top_k, len(CANDIDATE_FEATURES))`` float32 array for ``slots`` (from
        :meth:`candidate_slots`); rows past the candidates are zero. ``candidates[0]`` is the
        sequence that needs the block (the engine's contract)."""
        cfg, v = self.config, self.view
        out = np.zeros((cfg.top_k, len(candidate_feature_names(cfg))), dtype=np.float32)
        capacity = float(v.num_blocks * v.block_size)
        free_cpu = v.num_free_cpu_blocks
        needer = candidates[0].seq_id
        for i, s in enumerate(slots):
            blocks = s.num_blocks
            swap_s = 2.0 * v.estimate_swap_s(blocks)
            recompute_s = v.estimate_recompute_s(s.num_computed)
            row = (
                1.0,
                float(s.seq_id == needer),
                blocks / v.num_blocks,
                min(s.num_computed / capacity, 1.0),
                squash(s.num_output, GENERATED_REF),
                squash(self._remaining(s), GENERATED_REF),
                squash(v.now - s.arrival_s, cfg.ttft_ref_s),
                squash(float(s.priority), 1.0),
                squash(s.num_preemptions, 1.0),
                float(0 < blocks <= free_cpu),
                squash(recompute_s / swap_s, 1.0) if swap_s > 0 else 0.0,
            )
            if cfg.slo:
                row += self._slo_features(s)
            out[i] = row
        return out

    def _slo_features(self, s: "SeqView") -> tuple[float, float]:
        """:data:`SLO_CANDIDATE_FEATURES` of one candidate (see the module docstring)."""
        slack = slo_slack(s, self.view.now, self._remaining(s), self.config.slo_pace)
        ttft_missed = float(slack == -math.inf)
        return ttft_missed, 0.5 + 0.5 * math.tanh(slack / self.config.slack_ref_s) if slack != -math.inf else 0.0

    def _remaining(self, s: "SeqView") -> float:
        """Remaining output tokens: the trace's value with ``oracle_lengths``, else
        :class:`RemainingOutput`'s prediction."""
        if self.config.oracle_lengths:
            return float(s.output_len - s.num_output)
        return self.remaining_output.of(s)
