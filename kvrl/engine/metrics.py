"""Metrics: one definition, used by every app, environment and benchmark (docs/design.md §5).

Units: seconds of engine time (the executor's reported step durations plus idle gaps between
arrivals), tokens, blocks; ``policy_time_s`` and the host-gap counts are wall seconds.

Outcomes. Every request the workload submitted ends in exactly one of: *finished* (all samples
generated), *aborted* (a policy fault, an executor error such as non-finite logits, or
:meth:`Engine.abort`; ``error`` says why) or *rejected* (it can never be served; never ran). The
workload may also have *clipped* requests (lengths cut to fit ``max_model_len``; they run and
count normally) and *dropped* ones (never submitted, not in ``requests``).

One definition of success, used everywhere: a request *meets its SLO* when it finished without
error, its TTFT is within ``slo_ttft_s`` and its mean TPOT within ``slo_tpot_s`` (a missing SLO
always holds). Aborted and rejected requests are failures:

- ``slo_attainment`` = requests meeting their SLO / all submitted requests (finished + aborted +
  rejected), so a run cannot raise it by failing requests;
- ``goodput_tok_s`` = output tokens of requests meeting their SLO / run duration; a failed request
  contributes nothing. Shedding load can still raise goodput (fewer requests share the engine),
  so read it with ``aborted``, ``rejected`` and ``policy_errors``: a run with any of them is not
  comparable with a clean one (kvrl-report marks it);
- latency percentiles (``ttft_*``, ``tpot_*``) are over finished requests only: failed requests
  have no latency, which is why the counts above are reported next to them.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

from kvrl.engine.guards import PolicyTimer

#: a host gap (time between two steps) longer than this is counted in ``long_host_gaps``
LONG_HOST_GAP_S = 0.05

# Per-step columns written to steps.csv, in order.
STEP_COLUMNS = (
    "step", "time_s", "duration_s", "num_running", "num_waiting", "num_swapped", "prefill_tokens",
    "decode_tokens", "used_blocks", "free_blocks", "tokens_stored", "kv_utilization", "kv_occupancy",
    "reserved_blocks", "preemptions", "finished",
)


@dataclass
class RequestRecord:
    """Outcome of one request (all its samples)."""

    request_id: str
    tenant: str
    arrival_s: float
    prompt_len: int
    output_tokens: int = 0
    first_token_s: Optional[float] = None
    finish_s: Optional[float] = None
    tpot_s: Optional[float] = None
    slo_ttft_s: Optional[float] = None
    slo_tpot_s: Optional[float] = None
    num_preemptions: int = 0
    error: Optional[str] = None
    clipped: str = ""              # what the workload changed to fit max_model_len ("" = nothing)

    @property
    def ttft_s(self) -> Optional[float]:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def meets_slo(self) -> bool:
        if self.finish_s is None or self.error:
            return False
        if self.slo_ttft_s is not None and self.ttft_s > self.slo_ttft_s:
            return False
        if self.slo_tpot_s is not None and self.tpot_s is not None and self.tpot_s > self.slo_tpot_s:
            return False
        return True


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


@dataclass
class MetricsCollector:
    """Accumulates per-step rows and per-request records; :meth:`summary` gives docs/design.md §5."""

    num_blocks: int
    block_size: int
    default_slo_ttft_s: Optional[float] = None
    default_slo_tpot_s: Optional[float] = None
    record_steps: bool = True
    steps: list[tuple] = field(default_factory=list)
    requests: dict[str, RequestRecord] = field(default_factory=dict)
    rejected: list[tuple[str, str]] = field(default_factory=list)
    dropped: list[tuple[str, str]] = field(default_factory=list)   # (request_id, reason): never submitted
    finished_output_lens: list[int] = field(default_factory=list)
    preemptions: int = 0
    policy_errors: int = 0
    policy_error_counts: dict[str, int] = field(default_factory=dict)   # "<kind> [call]: <error type>" -> count
    policy_timer: PolicyTimer = field(default_factory=PolicyTimer)      # wall time in policy calls
    host_gap_s: float = 0.0          # live: wall time between steps (the engine's host work and idling)
    long_host_gaps: int = 0          # of those gaps, how many exceeded LONG_HOST_GAP_S
    uncounted_host_gap_s: float = 0.0   # gap time the executor left out of its step durations
    swapped_out_blocks: int = 0
    swapped_in_blocks: int = 0
    recomputed_tokens: int = 0
    arrived_prompt_tokens: int = 0     # prompt tokens of accepted requests
    prompt_tokens_looked_up: int = 0
    prompt_tokens_hit: int = 0
    prefix_check_failures: int = 0   # admissions whose prefix match ended at a block failing the identity check
    busy_time_s: float = 0.0
    _util_time: float = 0.0       # integral of kv_utilization over busy time
    _occ_time: float = 0.0        # integral of kv_occupancy over busy time
    start_s: float = 0.0
    end_s: float = 0.0
    num_finished: int = 0
    extra_summary: Optional[Callable[[], dict]] = None   # more summary keys (the CPU tier's, kvrl.engine.tiers)

    def add_request(self, request) -> RequestRecord:
        rec = RequestRecord(
            request_id=request.request_id, tenant=request.tenant, arrival_s=request.arrival_s,
            prompt_len=request.prompt_len, clipped=request.clipped or "",
            slo_ttft_s=request.slo_ttft_s if request.slo_ttft_s is not None else self.default_slo_ttft_s,
            slo_tpot_s=request.slo_tpot_s if request.slo_tpot_s is not None else self.default_slo_tpot_s)
        self.requests[request.request_id] = rec
        self.arrived_prompt_tokens += request.prompt_len
        return rec

    def record_step(self, step: int, now: float, duration_s: float, num_running: int, num_waiting: int,
                    num_swapped: int, prefill_tokens: int, decode_tokens: int, used_blocks: int,
                    tokens_stored: int, reserved_blocks: int) -> None:
        """One executed step ending at ``now``: :meth:`record_occupancy`, and its row (with
        ``record_steps``)."""
        util, occ = self.record_occupancy(now, duration_s, used_blocks, tokens_stored)
        if self.record_steps:
            self.steps.append((step, now, duration_s, num_running, num_waiting, num_swapped, prefill_tokens,
                               decode_tokens, used_blocks, self.num_blocks - used_blocks, tokens_stored, util,
                               occ, reserved_blocks, self.preemptions, self.num_finished))

    def record_occupancy(self, now: float, duration_s: float, used_blocks: int,
                         tokens_stored: int) -> tuple[float, float]:
        """What every step adds to the run's totals, rows or not: the KV utilization and
        occupancy integrals over its ``duration_s`` and the run's end ``now``; returns the step's
        (utilization, occupancy). The engine calls only this when no rows are recorded."""
        util = tokens_stored / (used_blocks * self.block_size) if used_blocks else 0.0
        occ = used_blocks / self.num_blocks
        if used_blocks:
            self._util_time += util * duration_s
            self.busy_time_s += duration_s
        self._occ_time += occ * duration_s
        self.end_s = now
        return util, occ

    def record_host_gap(self, gap_s: float, counted: bool) -> None:
        """A live executor's host gap before a step; ``counted``: included in the step's duration."""
        self.host_gap_s += gap_s
        if gap_s > LONG_HOST_GAP_S:
            self.long_host_gaps += 1
        if not counted:
            self.uncounted_host_gap_s += gap_s

    def wall_clock(self) -> dict[str, float]:
        """Wall-clock measurements, kept out of :meth:`summary` so that summaries of the same
        simulated run compare equal: ``policy_time_s`` (wall seconds in policy calls, outermost
        only), ``host_gap_s`` (live: wall seconds between steps), ``long_host_gaps`` (gaps over
        ``LONG_HOST_GAP_S``), ``uncounted_host_gap_s`` (gap time left out of step durations)."""
        return {"policy_time_s": self.policy_timer.total_s, "host_gap_s": self.host_gap_s,
                "long_host_gaps": self.long_host_gaps, "uncounted_host_gap_s": self.uncounted_host_gap_s}

    def summary(self) -> dict[str, float]:
        """Run-level metrics (docs/design.md §5) plus ``rejected``, ``aborted``, ``clipped`` (accepted requests
        whose lengths the workload cut to fit ``max_model_len``) and ``dropped`` (requests the workload
        removed, never submitted; not in ``requests``) counts."""
        recs = list(self.requests.values())
        done = [r for r in recs if r.finish_s is not None and not r.error]
        duration = max(self.end_s - self.start_s, 1e-12)
        out_tokens = sum(r.output_tokens for r in done)
        good = [r for r in done if r.meets_slo]
        good_tokens = sum(r.output_tokens for r in good)
        submitted = len(recs) + len(self.rejected)
        ttfts = [r.ttft_s for r in done]
        tpots = [r.tpot_s for r in done if r.tpot_s is not None]
        looked = self.prompt_tokens_looked_up
        return {
            "requests": submitted,
            "finished": len(done),
            "rejected": len(self.rejected),
            "aborted": sum(1 for r in recs if r.error),
            "clipped": sum(1 for r in recs if r.clipped),
            "dropped": len(self.dropped),
            "output_tokens": out_tokens,
            "duration_s": duration,
            "throughput_tok_s": out_tokens / duration,
            "goodput_tok_s": good_tokens / duration,
            "slo_attainment": len(good) / submitted if submitted else float("nan"),
            "ttft_p50_s": _pct(ttfts, 50),
            "ttft_p99_s": _pct(ttfts, 99),
            "tpot_p50_s": _pct(tpots, 50),
            "tpot_p99_s": _pct(tpots, 99),
            "kv_utilization": self._util_time / self.busy_time_s if self.busy_time_s else float("nan"),
            "kv_occupancy": self._occ_time / duration,
            "preemptions": self.preemptions,
            "swapped_out_blocks": self.swapped_out_blocks,
            "swapped_in_blocks": self.swapped_in_blocks,
            "recomputed_tokens": self.recomputed_tokens,
            "prefix_hit_rate": self.prompt_tokens_hit / looked if looked else 0.0,
            "prefix_check_failures": self.prefix_check_failures,
            "policy_errors": self.policy_errors,
            "steps": len(self.steps) if self.record_steps else float("nan"),
            **(self.extra_summary() if self.extra_summary is not None else {}),
        }

    def write_steps_csv(self, f) -> None:
        """Write the per-step rows to the open text file ``f``."""
        writer = csv.writer(f)
        writer.writerow(STEP_COLUMNS)
        writer.writerows(self.steps)

    def write_requests_csv(self, f) -> None:
        """Write one row per request (rejected and dropped ones included) to the open text file ``f``;
        ``clipped`` says what the workload changed in a request ("" = nothing)."""
        cols = ("request_id", "tenant", "arrival_s", "prompt_len", "output_tokens", "ttft_s", "tpot_s",
                "finish_s", "num_preemptions", "meets_slo", "error", "clipped")
        writer = csv.writer(f)
        writer.writerow(cols)
        for r in self.requests.values():
            writer.writerow((r.request_id, r.tenant, r.arrival_s, r.prompt_len, r.output_tokens, r.ttft_s,
                             r.tpot_s, r.finish_s, r.num_preemptions, r.meets_slo, r.error or "", r.clipped))
        for rid, reason in self.rejected:
            writer.writerow((rid, "", "", "", 0, "", "", "", 0, False, f"rejected: {reason}", ""))
        for rid, reason in self.dropped:
            writer.writerow((rid, "", "", "", 0, "", "", "", 0, False, f"dropped: {reason}", ""))
