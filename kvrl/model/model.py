"""kvrl's causal LM for the Llama / Mistral / Qwen2 / Qwen3 families over a paged KV cache."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from kvrl.model.config import ModelConfig
from kvrl.model.layers import Attention, GatedMLP, RMSNorm, RotaryEmbedding
from kvrl.model.metadata import AttentionMetadata

KVCache = tuple[torch.Tensor, torch.Tensor]


class DecoderLayer(nn.Module):
    """Pre-norm transformer block: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``.

    The residual adds are fused into the following norms (``norm(x, residual)`` returns
    ``(norm(x + residual), x + residual)``): a layer takes the pair ``(delta, residual)`` whose sum
    is its input stream (``residual`` None on the first layer, where ``delta`` is the embedding)
    and returns ``(mlp_out, stream after the attention add)``, whose sum is its output stream.
    Float addition commutes, so this is bitwise the unfused recurrence.
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = GatedMLP(config)

    def before_attention(
        self, hidden: torch.Tensor, residual: Optional[torch.Tensor], cos: torch.Tensor, sin: torch.Tensor,
        kv_cache: KVCache, slot_mapping: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(delta, residual)`` -> ``(queries, residual stream)``: the input norm, the Q/K/V
        projection, q/k norm and rotary, and the K/V write (see :meth:`Attention.project`)."""
        if residual is None:
            residual = hidden
            hidden = self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        return self.self_attn.project(hidden, cos, sin, kv_cache, slot_mapping), residual

    def after_attention(self, attn_out: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Attention output ``[T, num_heads, head_dim]`` and the residual stream -> the layer's
        ``(mlp_out, residual)``: output projection, residual add + norm, MLP."""
        hidden = self.self_attn.project_out(attn_out)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual

    def forward(
        self, hidden: torch.Tensor, residual: Optional[torch.Tensor], cos: torch.Tensor, sin: torch.Tensor,
        kv_cache: KVCache, attn: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        q, residual = self.before_attention(hidden, residual, cos, sin, kv_cache, attn.slot_mapping)
        return self.after_attention(self.self_attn.attend(q, kv_cache, attn), residual)


class CausalLM(nn.Module):
    """Decoder-only LM whose attention reads and writes a paged KV cache.

    Parameter names mirror the HF checkpoint without its ``model.`` prefix, except that q/k/v and
    gate/up projections are fused (``qkv_proj``, ``gate_up_proj``); with tied embeddings there is
    no ``lm_head`` and the logits use ``embed_tokens.weight``. Constructing the module runs the
    default torch initialisation; :func:`kvrl.model.load_model` builds it on the meta device instead.

    ``forward`` has no host syncs and no per-token Python loops; its control flow depends only on
    the Python ints of :class:`AttentionMetadata` (token and sequence counts), so a decode step of
    fixed batch size can be captured in a CUDA graph.
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.rotary = RotaryEmbedding(config.rope, config.head_dim)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = None
        if not config.tie_word_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[KVCache],
        attn: AttentionMetadata,
    ) -> torch.Tensor:
        """Run one step over a flattened batch.

        Args:
            input_ids: int64 ``[T]`` token ids, prefill tokens first, then one per decode sequence.
            positions: int64 ``[T]`` position of each token within its sequence.
            kv_caches: one ``(k_cache, v_cache)`` per layer, each ``[num_blocks, block_size,
                num_kv_heads, head_dim]`` in the model dtype; this step's K/V are written into them.
            attn: where to write K/V and what each sequence attends to.

        Returns:
            final-norm hidden states ``[T, hidden_size]``; pass the rows to sample from to
            :meth:`compute_logits`.
        """
        if len(kv_caches) != len(self.layers):
            raise ValueError(f"expected {len(self.layers)} KV caches (one per layer), got {len(kv_caches)}")
        hidden, cos, sin = self.embed(input_ids, positions)
        residual = None
        for layer, kv_cache in zip(self.layers, kv_caches):
            hidden, residual = layer(hidden, residual, cos, sin, kv_cache, attn)
        if residual is None:
            return self.norm(hidden)
        return self.final_norm(hidden, residual)

    def embed(self, input_ids: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Token embeddings ``[T, hidden_size]`` and the rotary ``cos, sin`` ``[T, 1, head_dim]``."""
        hidden = self.embed_tokens(input_ids)
        cos, sin = self.rotary(positions, hidden.dtype)
        return hidden, cos, sin

    def final_norm(self, hidden: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """The last layer's ``(mlp_out, residual)`` -> final-norm hidden states."""
        return self.norm(hidden, residual)[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden ``[S, hidden_size]`` -> fp32 logits ``[S, vocab_size]``."""
        weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(hidden, weight).float()
