"""The executor interface shared by the live (real model) and sim (cost model) backends.

The engine's code is identical for both: only :meth:`Executor.execute` differs.
"""
from __future__ import annotations

from abc import ABC, abstractmethod

from kvrl.engine.batch import ScheduledBatch, StepOutput


class Executor(ABC):
    """Runs scheduled batches on a KV cache of ``num_blocks`` blocks of ``block_size`` tokens.

    Lifecycle: the engine asks :meth:`kv_capacity_blocks` (if it must size the pool), then calls
    :meth:`allocate_kv` once, then :meth:`execute` every step.
    """

    name: str = ""
    #: step durations include the engine's host time between steps (wall-clock executors), so the
    #: engine does not charge policy time on top (``engine.charge_policy_time``)
    measures_host_time: bool = False

    @property
    @abstractmethod
    def vocab_size(self) -> int: ...

    @property
    @abstractmethod
    def max_model_len(self) -> int: ...

    @abstractmethod
    def kv_block_bytes(self, block_size: int) -> int:
        """Bytes of K and V for one block over all layers."""

    @abstractmethod
    def kv_capacity_blocks(self, block_size: int, gpu_memory_utilization: float) -> int:
        """GPU blocks that fit in the device memory left for the KV cache."""

    @abstractmethod
    def allocate_kv(self, num_blocks: int, num_cpu_blocks: int, block_size: int) -> None:
        """Create the GPU cache and the CPU swap pool."""

    def allocate_tier(self, num_blocks: int, block_size: int) -> None:
        """Create the CPU tier of ``num_blocks`` blocks under the prefix cache (``engine.cpu_tier_blocks``;
        :mod:`kvrl.engine.tiers`); called after :meth:`allocate_kv`. Executors without one refuse."""
        raise ValueError(f"engine.cpu_tier_blocks > 0: the {self.name or type(self).__name__} executor has no CPU tier")

    def tier_transfer_s(self) -> tuple[float, float]:
        """Seconds spent so far loading blocks from the CPU tier and storing blocks to it."""
        return 0.0, 0.0

    @abstractmethod
    def execute(self, batch: ScheduledBatch) -> StepOutput:
        """Run the batch's block operations and forward pass; sample; report elapsed seconds."""

    @abstractmethod
    def estimate_prefill_s(self, num_tokens: int) -> float:
        """Estimated seconds to prefill ``num_tokens`` tokens (for cost-aware policies)."""

    @abstractmethod
    def estimate_swap_s(self, num_blocks: int) -> float:
        """Estimated seconds to move ``num_blocks`` blocks one way between GPU and CPU."""
