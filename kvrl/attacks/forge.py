"""Forging a prefix-cache block identity under ``engine.prefix_hash=xxh3`` (the attack of issue #14).

For a 128-byte input (a block of 16 int64 token ids) XXH3-64 with a seed is::

    xxh3(x, seed) = avalanche(128 * PRIME64_1 + sum_k mix_k(chunk_k, seed))   (mod 2**64)

where ``chunk_k`` is the k-th 16-byte chunk (two token ids), each ``mix_k`` uses its own 16 bytes
of XXH3's public default secret, and ``avalanche`` is a bijection. So the hash is a sum of eight
independent functions of two tokens each: finding a block with a *chosen* hash (the identity of a
victim's block) is an 8-sum problem mod 2**64, which Wagner's k-tree algorithm (Wagner, "A
Generalized Birthday Problem", CRYPTO 2002) solves with lists of about 2**(64/4) = 2**16 entries:
three rounds of sort-and-join, each fixing 16 more low bits of the sum to zero. This takes a
fraction of a second in numpy. Keyed BLAKE2b and SHA-256 have no such structure (and a keyed
hash gives no target to aim at), which is why they are the engine's choices.

:func:`xxh3_block_hash` is the vectorised hash (checked against the ``xxhash`` library in the
tests); :func:`forge_block` returns token ids whose block identity, chained from the attacker's
own root, equals a target identity.
"""
from __future__ import annotations

from typing import Any

import numpy as np

_M64 = (1 << 64) - 1
PRIME64_1 = 0x9E3779B185EBCA87
PRIME_MX1 = 0x165667919E3779F9
# The first 128 bytes of XXH3's default secret (XXH3_kSecret, public, in xxhash.h).
_SECRET = bytes.fromhex(
    "b8fe6c3923a44bbe7c01812cf721ad1cded46de9839097db7240a4a4b7b3671f"
    "cb79e64eccc0e578825ad07dccff7221b8084674f743248ee03590e6813a264c"
    "3c2852bb91c300cb88d0658b1b532ea371644897a20df94e3819ef46a9deacd8"
    "a8fa763fe39c343ff9dcbbc7c70b4f1d8a51e04bcdb45931c89f7ec9d9787364")
# XXH3_len_17to128_64b at len = 128: input chunk k (bytes 16k..16k+15) is mixed with these secret bytes.
_SECRET_OFFSET = (0, 32, 64, 96, 112, 80, 48, 16)
_SECRET_WORDS = [(int.from_bytes(_SECRET[o:o + 8], "little"), int.from_bytes(_SECRET[o + 8:o + 16], "little"))
                 for o in _SECRET_OFFSET]
BLOCK_TOKENS = 16     # tokens per block this construction covers (16 int64 = 128 bytes)


def _mul128_fold64(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(a * b mod 2**128): low 64 bits XOR high 64 bits, for uint64 arrays."""
    m32 = np.uint64(0xFFFFFFFF)
    s32 = np.uint64(32)
    al, ah, bl, bh = a & m32, a >> s32, b & m32, b >> s32
    lo, mid1, mid2, hi = al * bl, al * bh, ah * bl, ah * bh
    cross = (lo >> s32) + (mid1 & m32) + (mid2 & m32)
    low64 = ((cross & m32) << s32) | (lo & m32)
    high64 = hi + (mid1 >> s32) + (mid2 >> s32) + (cross >> s32)
    return low64 ^ high64


def _mix(k: int, a: np.ndarray, b: np.ndarray, seed: int) -> np.ndarray:
    """XXH3_mix16B of chunk ``k`` holding token ids ``a`` (bytes 0-7) and ``b`` (bytes 8-15)."""
    s0, s1 = _SECRET_WORDS[k]
    with np.errstate(over="ignore"):
        return _mul128_fold64(a.astype(np.uint64) ^ np.uint64((s0 + seed) & _M64),
                              b.astype(np.uint64) ^ np.uint64((s1 - seed) & _M64))


def _unavalanche(h: int) -> int:
    h ^= h >> 32                                   # shifts >= 32 invert in one step
    h = (h * pow(PRIME_MX1, -1, 1 << 64)) & _M64
    return h ^ (h >> 37)


def xxh3_block_hash(tokens: np.ndarray, seed: int) -> np.ndarray:
    """XXH3-64 of blocks of 16 token ids (rows of ``tokens``, as little-endian int64) with ``seed``."""
    tokens = np.atleast_2d(np.asarray(tokens, dtype=np.int64))
    if tokens.shape[1] != BLOCK_TOKENS:
        raise ValueError(f"xxh3_block_hash: blocks of {BLOCK_TOKENS} tokens, got {tokens.shape[1]}")
    acc = np.full(len(tokens), (128 * PRIME64_1) & _M64, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for k in range(8):
            acc += _mix(k, tokens[:, 2 * k], tokens[:, 2 * k + 1], seed)
        acc ^= acc >> np.uint64(37)
        acc *= np.uint64(PRIME_MX1)
        acc ^= acc >> np.uint64(32)
    return acc


def _join(key_a: np.ndarray, key_b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """All index pairs (i, j) with ``key_a[i] == key_b[j]`` (sort-merge; needles sorted too,
    which keeps the binary searches cache-friendly)."""
    order_a = np.argsort(key_a, kind="stable")
    order_b = np.argsort(key_b, kind="stable")
    sorted_a, sorted_b = key_a[order_a], key_b[order_b]
    lo = np.searchsorted(sorted_b, sorted_a, "left")
    cnt = np.searchsorted(sorted_b, sorted_a, "right") - lo
    ia = np.repeat(order_a, cnt)
    within = np.arange(int(cnt.sum())) - np.repeat(np.cumsum(cnt) - cnt, cnt)
    return ia, order_b[np.repeat(lo, cnt) + within]


def forge_block(target: int, seed: int, vocab_size: int, rng: np.random.Generator,
                list_size: int = 1 << 16, max_tries: int = 30) -> np.ndarray:
    """Token ids (16, each in ``[0, vocab_size)``) whose XXH3-64 with ``seed`` is ``target``.

    Wagner's 8-list algorithm on ``list_size`` random chunks per list (expected solutions per try:
    ``(list_size / 2**16) ** 8``, 1 at the default, so a try fails with probability 1/e); raises
    ``RuntimeError`` after ``max_tries`` tries without one."""
    if vocab_size < 2:
        raise ValueError("forge_block: vocab_size must be >= 2")
    goal = (_unavalanche(int(target)) - 128 * PRIME64_1) & _M64   # sum of the 8 mixes
    m16, s16, s32 = np.uint64(0xFFFF), np.uint64(16), np.uint64(32)
    for _ in range(max_tries):
        chunks = rng.integers(0, vocab_size, size=(8, list_size, 2), dtype=np.int64)
        vals = [_mix(k, chunks[k, :, 0], chunks[k, :, 1], seed) for k in range(8)]
        with np.errstate(over="ignore"):
            vals[7] = vals[7] - np.uint64(goal)                     # now: sum of all eight == 0
            # round 1: pairs whose sum is 0 mod 2**16
            lvl1 = []
            for k in range(0, 8, 2):
                ia, ib = _join(((np.uint64(0) - vals[k]) & m16).astype(np.uint16), (vals[k + 1] & m16).astype(np.uint16))
                lvl1.append((vals[k][ia] + vals[k + 1][ib], ia, ib))
            # round 2: pairs of pairs whose sum is 0 mod 2**32
            lvl2 = []
            for k in range(0, 4, 2):
                (u, *_), (v, *_) = lvl1[k], lvl1[k + 1]
                ia, ib = _join((((np.uint64(0) - u) >> s16) & m16).astype(np.uint16), ((v >> s16) & m16).astype(np.uint16))
                lvl2.append((u[ia] + v[ib], ia, ib))
            # round 3: the two halves sum to 0 mod 2**64
            (u, *_), (v, *_) = lvl2
            ia, ib = _join(((np.uint64(0) - u) >> s32).astype(np.uint32), (v >> s32).astype(np.uint32))
        if not len(ia):
            continue
        picks = [0] * 8                                             # back-track one solution
        i2 = (int(ia[0]), int(ib[0]))
        for h in range(2):
            _, l2a, l2b = lvl2[h]
            i1 = (int(l2a[i2[h]]), int(l2b[i2[h]]))
            for q in range(2):
                _, l1a, l1b = lvl1[2 * h + q]
                k = 4 * h + 2 * q
                picks[k], picks[k + 1] = int(l1a[i1[q]]), int(l1b[i1[q]])
        block = np.concatenate([chunks[k, picks[k]] for k in range(8)])
        if int(xxh3_block_hash(block, seed)[0]) != int(target):
            raise AssertionError("forge_block: the solution does not hash to the target (model error)")
        return block
    raise RuntimeError(f"forge_block: no solution in {max_tries} tries of {list_size} entries per list")


def forge_prefix(victim_tokens: np.ndarray, victim_salt: bytes, attacker_salt: bytes, vocab_size: int,
                 seed: Any = 0) -> np.ndarray:
    """A first block for the attacker whose xxh3 identity, chained from the attacker's root
    (``attacker_salt``), equals that of the victim's first block (``victim_tokens``, 16 ids) under
    ``victim_salt``: every later block of the attacker's prompt then has the identity the same
    tokens have in the victim's chain. ``seed`` seeds the search (``numpy.random.default_rng``)."""
    from kvrl.engine.hashing import BlockHasher
    hasher = BlockHasher("xxh3")
    hashes: list = []
    hasher.extend(hashes, np.asarray(victim_tokens[:BLOCK_TOKENS]), BLOCK_TOKENS, 1, victim_salt)
    return forge_block(hashes[0], hasher.root(attacker_salt), vocab_size, np.random.default_rng(seed))
