"""What one forward pass needs to know about the paged KV cache.

Batch layout contract (shared by the live executor, the model and the kernels): the flattened
token batch holds the prefill tokens of every prefill sequence first (sequence after sequence,
each a contiguous chunk), then exactly one token per decode sequence.

KV cache layout per layer: ``k_cache`` and ``v_cache`` are ``[num_blocks, block_size,
num_kv_heads, head_dim]``; token slot ``s`` lives at block ``s // block_size``, offset
``s % block_size``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


@dataclass
class AttentionMetadata:
    """Per-step attention inputs, all tensors on the model's device.

    Attributes:
        slot_mapping: int64 ``[num_tokens]``; cache slot where each token's K/V is written
            (-1 = do not write).
        num_prefill_tokens: the first ``num_prefill_tokens`` tokens belong to prefill sequences.
        prefill_cu_seqlens_q: int32 ``[P + 1]``; cumulative query lengths of the P prefill sequences.
        prefill_context_lens: int32 ``[P]``; KV length of each prefill sequence after this step
            (cached prefix + earlier chunks + this chunk). The queries are the last
            ``q_len`` positions of that context; attention is causal.
        prefill_block_tables: int32 ``[P, max_blocks]``; padded with 0.
        max_prefill_q_len: largest query chunk among the prefill sequences.
        decode_context_lens: int32 ``[D]``; KV length including the token computed now.
        decode_block_tables: int32 ``[D, max_blocks]``; padded with 0.
        block_size: tokens per block.
    """

    slot_mapping: torch.Tensor
    num_prefill_tokens: int
    prefill_cu_seqlens_q: torch.Tensor
    prefill_context_lens: torch.Tensor
    prefill_block_tables: torch.Tensor
    max_prefill_q_len: int
    decode_context_lens: torch.Tensor
    decode_block_tables: torch.Tensor
    block_size: int

    @property
    def num_prefills(self) -> int:
        return int(self.prefill_context_lens.shape[0])

    @property
    def num_decodes(self) -> int:
        return int(self.decode_context_lens.shape[0])


@dataclass
class PaddedAttentionMetadata:
    """Attention inputs of a step padded to fixed shapes, so a CUDA graph can capture the step
    (:func:`kvrl.kernels.paged_step_attention`); device tensors, refilled in place every step.

    Attributes:
        prefill_cu_seqlens_q: int32 ``[P_max + 1]``; unused entries repeat the last used value.
        prefill_context_lens: int32 ``[P_max]``.
        prefill_block_tables: int32 ``[P_max, W]``.
        decode_context_lens: int32 ``[D_max]``; 0 for unused entries.
        decode_block_tables: int32 ``[D_max, W]``.
        decode_row0: int32 ``[1]``; the row of the first decode query (the prefill token count).
        decode_splits: key splits of every decode's context (fixed per captured graph).
        decode_partials: with ``decode_splits > 1``, the float32 split partials
            ``(part_o [D_max, num_heads, decode_splits, head_dim], part_lse [D_max, num_heads, decode_splits])``.
    """

    prefill_cu_seqlens_q: torch.Tensor
    prefill_context_lens: torch.Tensor
    prefill_block_tables: torch.Tensor
    decode_context_lens: torch.Tensor
    decode_block_tables: torch.Tensor
    decode_row0: torch.Tensor
    decode_splits: int = 1
    decode_partials: Optional[tuple[torch.Tensor, torch.Tensor]] = None
