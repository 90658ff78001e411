"""Token ids for traces that only record lengths, and the prefix structure of prompts' ids.

Prompts are filled with seeded random ids in ``[0, vocab_size)``. Requests of one prefix group share
their leading ids (the group's prefix), so the prefix cache sees the reuse the trace describes.
:func:`prefix_block_ids` numbers prompts' blocks so that equal numbers mean equal prefixes.
"""
from __future__ import annotations

from typing import Callable, Hashable, Iterable, Optional, Sequence

import numpy as np

from ._rng import make_rng

_MAX_VOCAB = 1 << 31


def check_vocab_size(vocab_size) -> int:
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer)) \
            or not 1 <= vocab_size <= _MAX_VOCAB:
        raise ValueError(f"vocab_size must be an integer in [1, 2**31], got {vocab_size!r}")
    return int(vocab_size)


def random_ids(rng: np.random.Generator, n: int, vocab_size: int) -> np.ndarray:
    """``n`` uniform token ids in ``[0, vocab_size)`` as int32."""
    return rng.integers(0, vocab_size, size=int(n), dtype=np.int32)


def readonly(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


def fill_prompts(prompt_lens: Sequence[int] | np.ndarray, *, vocab_size: int, seed: int = 0,
                 prefix_groups: Optional[Sequence[Optional[str]]] = None,
                 prefix_lens: Optional[Sequence[Optional[int]]] = None,
                 purpose: str = "prompt-ids") -> list[np.ndarray]:
    """Random prompts of the given lengths (read-only int32 arrays).

    Args:
        prompt_lens: one length per request.
        vocab_size: ids are drawn uniformly from ``[0, vocab_size)``.
        seed: the same (lengths, groups, seed) always give the same ids.
        prefix_groups: optional group name per request (None = no group). Members of a group start
            with the same ids: the first ``prefix_len`` ids of the group's prefix.
        prefix_lens: optional shared-prefix length per request; where None, a member shares
            ``min(prompt_len)`` over the group's members, i.e. as much as all of them can.
    """
    vocab_size = check_vocab_size(vocab_size)
    lens = np.asarray(prompt_lens, dtype=np.int64).reshape(-1)
    if lens.size and lens.min() < 0:
        raise ValueError("prompt lengths must be non-negative")
    rng = make_rng(seed, purpose)
    flat = random_ids(rng, int(lens.sum()), vocab_size)
    prompts = np.split(flat, np.cumsum(lens)[:-1]) if lens.size else []
    if prefix_groups is not None:
        if len(prefix_groups) != lens.size:
            raise ValueError("prefix_groups must have one entry per prompt")
        if prefix_lens is not None and len(prefix_lens) != lens.size:
            raise ValueError("prefix_lens must have one entry per prompt")
        members: dict[str, list[int]] = {}
        for i, g in enumerate(prefix_groups):
            if g is not None:
                members.setdefault(g, []).append(i)
        for group, idx in members.items():  # first-appearance order: deterministic
            default = int(min(lens[i] for i in idx))
            want = [default if prefix_lens is None or prefix_lens[i] is None else int(prefix_lens[i])
                    for i in idx]
            prefix = random_ids(rng, max(want), vocab_size)
            for i, k in zip(idx, want):
                k = min(k, int(lens[i]))
                prompts[i][:k] = prefix[:k]
    for p in prompts:
        p.flags.writeable = False
    return prompts


def prefix_block_ids(requests: Iterable, block_tokens: int, *, full_blocks_only: bool = False,
                     scope: Callable[[object], Hashable] = lambda r: None) -> list[list[int]]:
    """Each request's prompt blocks of ``block_tokens`` ids, numbered as a chain: a block's number
    stands for its ids, every block before it and the request's ``scope(r)``, so two equal numbers
    mean two equal prefixes in one scope. New numbers are 0, 1, ... in order of first appearance, so
    the largest is the count of distinct prefixes less one. ``full_blocks_only`` leaves out a last
    block shorter than ``block_tokens``."""
    known: dict[tuple, int] = {}
    out = []
    for r in requests:
        ids: list[int] = []
        parent: Hashable = ("scope", scope(r))
        toks = np.asarray(r.prompt_token_ids, dtype=np.int32)
        end = toks.size - toks.size % block_tokens if full_blocks_only else toks.size
        for start in range(0, end, block_tokens):
            parent = known.setdefault((parent, toks[start:start + block_tokens].tobytes()), len(known))
            ids.append(parent)
        out.append(ids)
    return out
