"""Chained hashes that identify full KV blocks for prefix caching.

``hash(block i) = xxh3_64(token ids of block i, seed=hash(block i-1))`` with
``hash(block -1) = xxh3_64(salt)``, so equal hashes mean equal token prefixes under the same salt
(up to 64-bit collisions). The salt carries the extra keys: the tenant's cache scope (and
anything else that changes the KV, e.g. a LoRA id).
"""
from __future__ import annotations

import numpy as np
import xxhash


def root_hash(salt: bytes) -> int:
    """The chain's starting value for a given salt."""
    return xxhash.xxh3_64_intdigest(salt, seed=0x9E3779B97F4A7C15)


def extend_hashes(hashes: list[int], tokens: np.ndarray, block_size: int, num_blocks: int, salt: bytes) -> None:
    """Append hashes to ``hashes`` until it covers ``num_blocks`` full blocks of ``tokens``.

    ``tokens`` are the sequence's token ids from position 0 (at least ``num_blocks * block_size``).
    """
    start = len(hashes)
    if start >= num_blocks:
        return
    parent = hashes[-1] if hashes else root_hash(salt)
    width = block_size * 8
    buf = memoryview(np.ascontiguousarray(tokens[start * block_size:num_blocks * block_size], dtype=np.int64))
    buf = buf.cast("B")
    digest = xxhash.xxh3_64_intdigest
    for i in range(num_blocks - start):
        parent = digest(buf[i * width:(i + 1) * width], seed=parent)
        hashes.append(parent)
