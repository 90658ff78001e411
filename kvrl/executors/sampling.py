"""Sampling of the live executor (:mod:`kvrl.executors.live`): greedy, or seeded with temperature,
top-k and top-p, over the fp32 logits of the rows that sample.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kvrl.plugins.base import check_range


@dataclass
class SamplingConfig:
    """temperature 0 = greedy; top_k 0 = off; top_p 1 = off."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0

    def __post_init__(self) -> None:
        check_range("backend.temperature", self.temperature, 0.0)
        check_range("backend.top_p", self.top_p, 0.0, 1.0)
        check_range("backend.top_k", self.top_k, 0)


def sample(logits: torch.Tensor, counts: list[int], s: SamplingConfig,
           generator: torch.Generator) -> tuple[list[list[int]], dict[int, str]]:
    """Sample ``counts[i]`` tokens from row i of ``logits`` as ``s`` says (``generator`` draws
    them when ``s.temperature > 0``); returns the tokens per row and ``{row: error}``. A row
    holding a NaN or a non-finite maximum (torch's max propagates NaN) is an error; the check
    rides on the one reduction pass."""
    top, argmax = logits.max(dim=-1)
    finite = torch.isfinite(top)
    if s.temperature == 0.0:
        tokens = argmax[:, None].expand(-1, max(counts))
    else:
        scaled = torch.nan_to_num(logits / s.temperature, nan=-float("inf"))
        if s.top_k:
            kth = torch.topk(scaled, min(s.top_k, scaled.shape[-1]), dim=-1).values[:, -1:]
            scaled = scaled.masked_fill(scaled < kth, -float("inf"))
        probs = torch.softmax(scaled, dim=-1)
        if s.top_p < 1.0:
            sorted_p, idx = probs.sort(dim=-1, descending=True)
            drop = sorted_p.cumsum(-1) - sorted_p > s.top_p
            sorted_p = sorted_p.masked_fill(drop, 0.0)
            probs = torch.zeros_like(probs).scatter_(-1, idx, sorted_p)
        probs = torch.where(finite[:, None], probs, torch.full_like(probs, 1.0 / probs.shape[-1]))
        tokens = torch.multinomial(probs, max(counts), replacement=True, generator=generator)
    packed = torch.cat([tokens.to(torch.int64), finite[:, None].to(torch.int64)], dim=1).cpu().tolist()
    out, errors = [], {}
    for i, (row, c) in enumerate(zip(packed, counts)):
        if not row[-1]:
            errors[i] = "non-finite logits"
        out.append(row[:c])
    return out, errors
