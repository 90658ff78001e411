"""Built-in scheduler policies: ``fcfs``, ``priority``, ``sjf``, ``lpm``.

A scheduler orders the waiting queue; the engine then admits in that order while the token
budget, the sequence cap and the watermark allow (stopping at the first request that does not fit,
so a policy's order is also its head-of-line rule).
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from kvrl.plugins.base import SchedulerPolicy, check_range
from kvrl.plugins.registry import register


@register("scheduler", "fcfs")
class FCFS(SchedulerPolicy):
    """First come, first served: waiting requests are admitted in arrival order (ties by sequence
    id), so no request overtakes an earlier one and head-of-line blocking is possible. vLLM's
    default policy. No parameters."""

    def key(self, seq):
        return (seq.arrival_s, seq.seq_id)


@register("scheduler", "priority")
class PriorityScheduler(SchedulerPolicy):
    """Smallest ``priority`` value first, then arrival time: vLLM's priority scheduling (without
    priority-driven preemption of running requests, which is the eviction plugin's business).
    No parameters."""

    def key(self, seq):
        return (seq.priority, seq.arrival_s, seq.seq_id)


@register("scheduler", "sjf")
class ShortestJobFirst(SchedulerPolicy):
    """Shortest job first by output length, predicted: the mean output length of finished requests in
    the same prompt-length bucket (powers of two), falling back to the global mean and then to
    ``default_len``. With ``oracle=true`` it reads each request's exact output length instead, which
    no server knows: an upper bound on what length prediction can give, for studies only. Ties by
    arrival. Parameters: ``oracle`` (bool, default false), ``default_len`` (tokens, default 256). Sources: SJF/SRPT scheduling for LLM
    serving (e.g. Qiu et al. 2024, "Efficient interactive LLM serving with proxy model-based
    sequence length prediction")."""

    @dataclass
    class Params:
        oracle: bool = False
        default_len: int = 256

        def __post_init__(self):
            check_range("default_len", self.default_len, 1)

    def __init__(self, params) -> None:
        super().__init__(params)
        self.static_key = params.oracle
        self._sum: dict[int, float] = defaultdict(float)
        self._count: dict[int, int] = defaultdict(int)

    @staticmethod
    def _bucket(prompt_len: int) -> int:
        return max(prompt_len, 1).bit_length()

    def predict(self, seq) -> float:
        if self.params.oracle:
            return seq.output_len
        b = self._bucket(seq.prompt_len)
        if self._count[b]:
            return self._sum[b] / self._count[b]
        total = sum(self._count.values())
        return sum(self._sum.values()) / total if total else self.params.default_len

    def on_finish(self, seq):
        b = self._bucket(seq.prompt_len)
        self._sum[b] += seq.num_output
        self._count[b] += 1

    def key(self, seq):
        return (self.predict(seq) - seq.num_output, seq.arrival_s, seq.seq_id)


@register("scheduler", "lpm")
class LongestPrefixMatch(SchedulerPolicy):
    """Longest cached prefix first (SGLang's ``lpm``): requests whose prompt is most covered by the
    prefix cache go first, which keeps shared prefixes hot and saves prefill. Looking prefixes up
    costs hashing, so with more than ``max_queue`` waiting requests it falls back to FCFS, as
    SGLang does. Parameters: ``max_queue`` (default 128)."""

    @dataclass
    class Params:
        max_queue: int = 128

        def __post_init__(self):
            check_range("max_queue", self.max_queue, 1)

    static_key = False

    def key(self, seq):
        return (-seq.cached_prefix_tokens, seq.arrival_s, seq.seq_id)

    def order(self, waiting):
        if len(waiting) > self.params.max_queue:
            return sorted(waiting, key=lambda s: (s.arrival_s, s.seq_id))
        return sorted(waiting, key=self.key)
