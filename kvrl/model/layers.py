"""Building blocks of kvrl's decoder: norm, rotary embedding, fused projections, paged attention, MLP.

All activations are flattened over the batch: ``[T, ...]`` with ``T`` tokens laid out as
described in :mod:`kvrl.model.metadata`. Numerics follow the Hugging Face implementations of the
supported families (fp32 RMSNorm statistics, fp32 rotary angles cast to the activation dtype).
"""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import nn

from kvrl.kernels import (
    paged_decode_attention,
    paged_prefill_attention,
    paged_step_attention,
    qk_norm_rotary,
    rms_norm,
    silu_and_mul,
    store_kv,
)
from kvrl.model.config import ModelConfig, RopeConfig
from kvrl.model.metadata import AttentionMetadata, PaddedAttentionMetadata


class RMSNorm(nn.Module):
    """``weight * x / sqrt(mean(x^2) + eps)`` over the last dim; statistics in fp32, output in x's dtype.

    ``forward(x)`` returns the normalised ``x``; ``forward(x, residual)`` first forms the residual
    stream ``h = x + residual`` and returns ``(norm(h), h)`` (one fused kernel on Triton).
    """

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: Optional[torch.Tensor] = None):
        return rms_norm(x, self.weight, self.eps, residual)


def rope_inv_freq(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    """Inverse frequencies ``[head_dim // 2]`` (fp32, CPU) for the given rope type."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (rope.theta ** exponents)
    if rope.rope_type == "linear":
        return inv_freq / rope.factor
    if rope.rope_type == "llama3":
        # Long wavelengths are slowed down by `factor`, short ones kept, the band between interpolated.
        old_len = rope.original_max_position_embeddings
        low_freq_wavelen = old_len / rope.low_freq_factor
        high_freq_wavelen = old_len / rope.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / rope.factor, inv_freq)
        smooth = (old_len / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
        smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
        in_band = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
        return torch.where(in_band, smoothed, scaled)
    return inv_freq


class RotaryEmbedding(nn.Module):
    """Maps positions to the ``cos``/``sin`` tables of neox-style (rotate-half) rotary embedding."""

    def __init__(self, rope: RopeConfig, head_dim: int):
        super().__init__()
        self.rope = rope
        self.head_dim = head_dim
        self.register_buffer("inv_freq", rope_inv_freq(rope, head_dim), persistent=False)

    def _apply(self, fn, recurse=True):
        # Moving or casting the model (.to(bfloat16), .to_empty(...)) must neither round nor drop the
        # fp32 frequencies: recompute them on the buffer's new device.
        super()._apply(fn, recurse)
        self.inv_freq = rope_inv_freq(self.rope, self.head_dim).to(self.inv_freq.device)
        return self

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions int64 ``[T]`` -> (cos, sin), each ``[T, 1, head_dim]`` (broadcast over heads).

        Angles are computed in fp32, then cast to ``dtype``, the dtype the rotation runs in.
        """
        freqs = positions[:, None].float() * self.inv_freq
        angles = torch.cat((freqs, freqs), dim=-1)[:, None, :]
        return angles.cos().to(dtype), angles.sin().to(dtype)


class PackedLinear(nn.Linear):
    """A linear layer whose output rows concatenate several checkpoint projections.

    ``shards`` maps each checkpoint projection name (a sibling module in the HF model, e.g.
    ``"q_proj"``) to its number of output rows, in packing order; the loader fills the rows.
    """

    def __init__(self, in_features: int, shards: dict[str, int], bias: bool):
        super().__init__(in_features, sum(shards.values()), bias=bias)
        self.shards = dict(shards)


class Attention(nn.Module):
    """GQA self-attention over the paged KV cache with fused QKV projection and optional q/k norm."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.scale = config.head_dim ** -0.5
        self.split_sizes = [config.q_size, config.kv_size, config.kv_size]
        self.qkv_proj = PackedLinear(
            config.hidden_size,
            {"q_proj": config.q_size, "k_proj": config.kv_size, "v_proj": config.kv_size},
            bias=config.qkv_bias,
        )
        self.o_proj = nn.Linear(config.q_size, config.hidden_size, bias=config.o_bias)
        self.q_norm: Optional[RMSNorm] = None
        self.k_norm: Optional[RMSNorm] = None
        if config.qk_norm:
            self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps)

    def project(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                kv_cache: tuple[torch.Tensor, torch.Tensor], slot_mapping: torch.Tensor) -> torch.Tensor:
        """hidden ``[T, hidden_size]`` -> queries ``[T, num_heads, head_dim]`` (normed, rotated);
        writes the tokens' K/V into ``kv_cache`` at ``slot_mapping`` (-1: not written). Its
        shapes depend only on ``T``: the part of a layer before attention that a CUDA graph
        captures per token count."""
        num_tokens = hidden.shape[0]
        q, k, v = self.qkv_proj(hidden).split(self.split_sizes, dim=-1)
        q = q.view(num_tokens, self.num_heads, self.head_dim)
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = qk_norm_rotary(q, k, cos, sin, self.q_norm.weight, self.k_norm.weight, self.q_norm.eps)
        else:
            q, k = qk_norm_rotary(q, k, cos, sin, None, None, 0.0)
        store_kv(k, v, kv_cache[0], kv_cache[1], slot_mapping)
        return q

    def attend(self, q: torch.Tensor, kv_cache: tuple[torch.Tensor, torch.Tensor], attn: AttentionMetadata,
               out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Paged attention of ``q [T, num_heads, head_dim]`` (prefill rows first, then one row per
        decode) -> ``[T, num_heads, head_dim]``, written into ``out`` when given (rows past the
        batch's tokens are not touched)."""
        k_cache, v_cache = kv_cache
        n = attn.num_prefill_tokens
        total = n + attn.num_decodes
        if out is None:
            out = torch.empty_like(q)
        if n > 0:
            paged_prefill_attention(
                q[:n], k_cache, v_cache, attn.prefill_block_tables, attn.prefill_cu_seqlens_q,
                attn.prefill_context_lens, self.scale, attn.max_prefill_q_len, out=out[:n],
            )
        if total > n:
            paged_decode_attention(
                q[n:total], k_cache, v_cache, attn.decode_block_tables, attn.decode_context_lens, self.scale,
                out=out[n:total],
            )
        return out

    def attend_padded(self, q: torch.Tensor, kv_cache: tuple[torch.Tensor, torch.Tensor],
                      attn: PaddedAttentionMetadata, out: torch.Tensor) -> torch.Tensor:
        """Paged attention of a padded step (``q`` and ``out`` ``[Tp, num_heads, head_dim]``; see
        :func:`kvrl.kernels.paged_step_attention`), launched from shapes alone."""
        return paged_step_attention(
            q, kv_cache[0], kv_cache[1], attn.prefill_block_tables, attn.prefill_cu_seqlens_q,
            attn.prefill_context_lens, attn.decode_block_tables, attn.decode_context_lens, attn.decode_row0,
            self.scale, out, attn.decode_splits, attn.decode_partials)

    def forward(
        self,
        hidden: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        attn: AttentionMetadata,
    ) -> torch.Tensor:
        """hidden ``[T, hidden_size]`` -> ``[T, hidden_size]``; writes this step's K/V into ``kv_cache``."""
        q = self.project(hidden, cos, sin, kv_cache, attn.slot_mapping)
        return self.project_out(self.attend(q, kv_cache, attn))

    def project_out(self, attn_out: torch.Tensor) -> torch.Tensor:
        """Attention output ``[T, num_heads, head_dim]`` -> ``[T, hidden_size]`` (output projection)."""
        return self.o_proj(attn_out.reshape(attn_out.shape[0], -1))


class GatedMLP(nn.Module):
    """``down(silu(gate(x)) * up(x))`` with gate and up fused into one projection."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        size = config.intermediate_size
        self.gate_up_proj = PackedLinear(
            config.hidden_size, {"gate_proj": size, "up_proj": size}, bias=config.mlp_bias
        )
        self.down_proj = nn.Linear(size, config.hidden_size, bias=config.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(silu_and_mul(self.gate_up_proj(x)))
