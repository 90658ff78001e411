"""Model shapes and device specifications for the cost model (and for sizing the KV pool)."""
from __future__ import annotations

from dataclasses import dataclass, fields

from kvrl.plugins.base import check_range


@dataclass
class ModelShape:
    """The shape of a decoder-only transformer, enough to count its bytes and FLOPs.

    ``dtype_bytes`` is the width of weights and KV entries (2 for bf16/fp16).
    """

    name: str = "qwen3-0.6b"
    num_layers: int = 28
    hidden_size: int = 1024
    num_heads: int = 16
    num_kv_heads: int = 8
    head_dim: int = 128
    intermediate_size: int = 3072
    vocab_size: int = 151936
    tie_word_embeddings: bool = True
    max_model_len: int = 40960
    dtype_bytes: int = 2

    def __post_init__(self) -> None:
        for f in fields(self):
            if f.type in ("int",) and f.name != "name":
                check_range(f"model.{f.name}", getattr(self, f.name), 1)
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"model.num_heads ({self.num_heads}) must be a multiple of model.num_kv_heads "
                             f"({self.num_kv_heads})")

    @property
    def layer_params(self) -> int:
        """Parameters of all transformer layers (projections and MLP; norms ignored)."""
        h, hd = self.hidden_size, self.head_dim
        attn = h * (self.num_heads + 2 * self.num_kv_heads) * hd + self.num_heads * hd * h
        mlp = 3 * h * self.intermediate_size
        return self.num_layers * (attn + mlp)

    @property
    def lm_head_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def weight_bytes(self) -> int:
        """Bytes of all weights held on the device."""
        embed = 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size
        return (self.layer_params + self.lm_head_params + embed) * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes


@dataclass
class DeviceSpec:
    """Ceilings of one accelerator, as measured (not datasheet) where a measurement exists.

    Attributes:
        memory_bytes: device memory. hbm_bw: device-to-device copy bandwidth in B/s (bytes read +
        written). matmul_flops: dense bf16 matrix rate in FLOP/s. pcie_bw: host<->device copy
        bandwidth in B/s (one direction, pinned memory). step_overhead_s: fixed cost of one engine
        step (scheduling, launches, sampling) on top of the roofline time.
        matmul_efficiency / bandwidth_efficiency: fraction of the ceilings a real step reaches.
    """

    name: str = "h200"
    memory_bytes: float = 141e9
    hbm_bw: float = 4.3e12
    matmul_flops: float = 790e12
    pcie_bw: float = 50e9
    step_overhead_s: float = 1.0e-3
    matmul_efficiency: float = 0.6
    bandwidth_efficiency: float = 0.8

    def __post_init__(self) -> None:
        for name in ("memory_bytes", "hbm_bw", "matmul_flops", "pcie_bw"):
            check_range(f"device.{name}", getattr(self, name), 1.0)
        check_range("device.step_overhead_s", self.step_overhead_s, 0.0)
        check_range("device.matmul_efficiency", self.matmul_efficiency, 0.01, 1.0)
        check_range("device.bandwidth_efficiency", self.bandwidth_efficiency, 0.01, 1.0)


MODEL_SHAPES = {
    "qwen3-0.6b": ModelShape(),
    "llama-3-8b": ModelShape(name="llama-3-8b", num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8,
                             head_dim=128, intermediate_size=14336, vocab_size=128256, tie_word_embeddings=False,
                             max_model_len=8192),
}

# H100/H200 copy bandwidth and matrix rate as measured on this workplace's machines (KINDS.md,
# 2026-10/11); PCIe Gen5 x16 pinned-copy rate is a lead until profiled.
DEVICES = {
    "h200": DeviceSpec(),
    "h100": DeviceSpec(name="h100", memory_bytes=80e9, hbm_bw=3.0e12, matmul_flops=798e12),
    "a100": DeviceSpec(name="a100", memory_bytes=80e9, hbm_bw=1.7e12, matmul_flops=280e12, pcie_bw=24e9),
}
