"""The simulated executor: a roofline cost model of one engine step on a virtual clock.

Step time = ``step_overhead_s`` + max(FLOPs / (matmul_flops * matmul_efficiency),
bytes / (hbm_bw * bandwidth_efficiency)) + block copies over HBM + swap-outs over PCIe; swap-ins
overlap the step (they are prefetched for the next one), so they only add time beyond it.

Counted per step: weights read once; K/V of every scheduled sequence's context read once and
its new tokens written once; 2 FLOPs per weight per token, causal attention FLOPs, and the LM
head only for rows that are sampled.
"""
from __future__ import annotations

from kvrl.engine.batch import ScheduledBatch, StepOutput
from kvrl.executors.base import Executor
from kvrl.executors.hardware import DeviceSpec, ModelShape


class SimExecutor(Executor):
    """Cost-model executor; sampled tokens are deterministic pseudo-random ids (seeded)."""

    name = "sim"

    def __init__(self, model: ModelShape, device: DeviceSpec, seed: int = 0) -> None:
        self.model = model
        self.device = device
        self.seed = seed
        self._block_bytes = 0
        m = model
        self._kv_tok = m.kv_bytes_per_token
        self._attn_flops_per_pair = 4 * m.num_layers * m.num_heads * m.head_dim
        self._flop_s = device.matmul_flops * device.matmul_efficiency
        self._byte_s = device.hbm_bw * device.bandwidth_efficiency
        self._layer_flops_per_token = 2 * m.layer_params
        self._head_flops_per_row = 2 * m.lm_head_params
        self._weight_bytes_read = (m.layer_params + m.lm_head_params) * m.dtype_bytes

    @property
    def vocab_size(self) -> int:
        return self.model.vocab_size

    @property
    def max_model_len(self) -> int:
        return self.model.max_model_len

    def kv_block_bytes(self, block_size: int) -> int:
        return self._kv_tok * block_size

    def kv_capacity_blocks(self, block_size: int, gpu_memory_utilization: float) -> int:
        activations = 2 * 2**30  # reserve for activations and the sampler's logits
        free = self.device.memory_bytes * gpu_memory_utilization - self.model.weight_bytes - activations
        return max(int(free // self.kv_block_bytes(block_size)), 0)

    def allocate_kv(self, num_blocks: int, num_cpu_blocks: int, block_size: int) -> None:
        self._block_bytes = self.kv_block_bytes(block_size)

    def step_time(self, num_tokens: int, num_sampled: int, kv_read_tokens: int, attn_pairs: int) -> float:
        """Roofline seconds of a forward pass over ``num_tokens`` tokens with ``num_sampled``
        LM-head rows, reading ``kv_read_tokens`` tokens of K/V and ``attn_pairs`` causal
        (query, key) pairs."""
        flops = num_tokens * self._layer_flops_per_token + num_sampled * self._head_flops_per_row + \
            self._attn_flops_per_pair * attn_pairs
        bytes_moved = self._weight_bytes_read + (kv_read_tokens + num_tokens) * self._kv_tok
        return self.device.step_overhead_s + max(flops / self._flop_s, bytes_moved / self._byte_s)

    def execute(self, batch: ScheduledBatch) -> StepOutput:
        num_tokens = num_sampled = kv_read = pairs = 0
        sampled: list[list[int]] = []
        vocab, seed = self.model.vocab_size, self.seed
        for item in batch.seqs:
            k, start = item.num_tokens, item.start
            num_tokens += k
            kv_read += start + k
            pairs += k * start + k * (k + 1) // 2
            if item.num_samples:
                num_sampled += item.num_samples
                base = item.seq.seq_id * 2654435761 + (start + k) * 40503 + seed
                sampled.append([(base + j * 97) % vocab for j in range(item.num_samples)])
            else:
                sampled.append([])
        elapsed = self.step_time(num_tokens, num_sampled, kv_read, pairs) if batch.seqs else 0.0
        elapsed += 2 * len(batch.copies) * self._block_bytes / self.device.hbm_bw
        elapsed += len(batch.swap_out) * self._block_bytes / self.device.pcie_bw
        swap_in = len(batch.swap_in) * self._block_bytes / self.device.pcie_bw
        elapsed = max(elapsed, swap_in)
        return StepOutput(sampled, elapsed)

    def estimate_prefill_s(self, num_tokens: int) -> float:
        if num_tokens <= 0:
            return 0.0
        return self.step_time(num_tokens, 1, num_tokens, num_tokens * (num_tokens + 1) // 2)

    def estimate_swap_s(self, num_blocks: int) -> float:
        return num_blocks * self._block_bytes / self.device.pcie_bw
