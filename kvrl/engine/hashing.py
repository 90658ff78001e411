"""Block identity for prefix caching: chained hashes of full KV blocks and the cache salt.

A full block's identity is ``hash(parent identity, the block's token ids)``, and the chain starts
at ``root(salt)``, where the salt (:func:`encode_salt`) carries every extra key that changes the
KV or limits who may share it: the tenant (``engine.prefix_cache_scope=tenant``) and the
request's ``cache_salt``. Equal identities therefore mean equal token prefixes under equal salts,
as far as the hash is collision resistant. ``engine.prefix_hash`` picks the hash:

* ``blake2b`` (default): BLAKE2b-256 keyed with a per-engine secret (:func:`hash_key`: 32 bytes
  from ``os.urandom`` at start-up, unless ``engine.prefix_hash_key=seed``). Collision resistant,
  and keyed, so nobody outside the engine can even compute an identity: a forger has no target.
  Chosen over SHA-256 for that second property at the same price: each block costs the same four
  calls into hashlib's C code either way (docs/security.md §1b measures both on a full trace).
* ``sha256``: unkeyed SHA-256 (vLLM's choice since CVE-2025-25183). Collision resistant; its
  identities are computable by anyone, which matters only if they leak.
* ``xxh3``: the pre-#14 identity, unkeyed 64-bit XXH3. Fast but forgeable: a generalized-birthday
  search finds a block with a chosen identity in well under a second
  (:mod:`kvrl.attacks.forge`). It is kept only as the vulnerable baseline of ``kvrl-attack`` and for
  the speed comparison, and it is never checked on a hit (see :attr:`BlockHasher.checked`).

Block identities are internal: with a collision-resistant hash no result depends on their values,
so a random key leaves sim runs bit-for-bit reproducible (a hit is decided by equality only, and
no cache iterates in identity order). ``engine.prefix_hash_key=seed`` derives the key from
``engine.seed`` for runs that must reproduce the identities themselves (debugging); any key that
can be guessed is weaker, since it gives a forger its target back.
"""
from __future__ import annotations

import hashlib
import os
import struct
from typing import Optional, Union

import numpy as np
import xxhash

HASHES = ("blake2b", "sha256", "xxh3")
KEY_MODES = ("random", "seed")
BlockHash = Union[bytes, int]      # bytes (32) for blake2b and sha256, int (64-bit) for xxh3

_XXH3_ROOT_SEED = 0x9E3779B97F4A7C15


def encode_salt(*fields: Optional[str]) -> bytes:
    """Unambiguous byte encoding of a tuple of optional strings: each field is ``0x00`` (None) or
    ``0x01`` + its UTF-8 length (4 bytes, big endian) + its UTF-8 bytes, so distinct tuples never
    encode alike (tenant ``"a"`` + salt ``"bc"`` differs from tenant ``"ab"`` + salt ``"c"``)."""
    out = bytearray()
    for value in fields:
        if value is None:
            out += b"\x00"
        else:
            raw = value.encode("utf-8")
            out += b"\x01" + struct.pack(">I", len(raw)) + raw
    return bytes(out)


def hash_key(mode: str, seed: int) -> bytes:
    """The 32-byte secret of the keyed hash: random (``mode="random"``) or derived from ``seed``."""
    if mode == "random":
        return os.urandom(32)
    if mode == "seed":
        return hashlib.sha256(b"kvrl prefix-hash key\x00" + str(int(seed)).encode()).digest()
    raise ValueError(f"engine.prefix_hash_key must be one of {list(KEY_MODES)}, got {mode!r}")


#: bytes per token id in the identity encoding of each hash (:func:`block_bytes`). Little-endian
#: int32 for the collision-resistant hashes: token ids lie in ``[0, vocab_size)`` (the engine
#: rejects any other, and needs ``vocab_size <= 2**31``), so the encoding is exact, and a 16-token
#: block with its parent identity fits one 128-byte BLAKE2b compression. int64 for ``xxh3``, the
#: pre-#14 identity that :mod:`kvrl.attacks.forge` forges (blocks of 16 int64 ids).
TOKEN_WIDTH = {"blake2b": 4, "sha256": 4, "xxh3": 8}
_DTYPE = {4: "<i4", 8: "<i8"}


def block_bytes(tokens: np.ndarray, width: int = 4) -> bytes:
    """The bytes that identify token ids: little-endian integers of ``width`` bytes (4 or 8; see
    :data:`TOKEN_WIDTH`), concatenated."""
    return np.ascontiguousarray(tokens, dtype=_DTYPE[width]).tobytes()


class BlockHasher:
    """Computes chained block identities with one hash function.

    ``checked``: whether a prefix-cache hit must also show equal tokens, salt and parent (see
    :meth:`kvrl.engine.prefix_identity.PrefixIdentityMixin.match_prefix`); True for the
    collision-resistant hashes, False for ``xxh3``, which reproduces the pre-#14 engine.
    ``token_width``: bytes per token id in the data it hashes (:data:`TOKEN_WIDTH`).

    Immutable after construction (its hash states are only ever copied), so ``copy.deepcopy`` returns
    the hasher itself and pickling rebuilds it from ``(name, key)``: an engine with the default
    ``blake2b`` copies (the rollout planner) and pickles like one with ``xxh3``.
    """

    def __init__(self, name: str = "blake2b", key: Optional[bytes] = None) -> None:
        if name not in HASHES:
            raise ValueError(f"engine.prefix_hash must be one of {list(HASHES)}, got {name!r}")
        self.name = name
        self._key = key
        self.checked = name != "xxh3"
        self.token_width = TOKEN_WIDTH[name]
        if name == "blake2b":
            if key is None or len(key) != 32:
                raise ValueError("the blake2b prefix hash needs a 32-byte key (hash_key)")
            base = hashlib.blake2b(key=key, digest_size=32)
        elif name == "sha256":
            base = hashlib.sha256()
        else:
            base = None
        if base is not None:                       # domain separation: roots vs blocks
            self._root_state = base.copy()
            self._root_state.update(b"kvrl-root\x00")
            self._block_state = base.copy()
            self._block_state.update(b"kvrl-block\x00")

    def __deepcopy__(self, memo: dict) -> "BlockHasher":
        return self

    def __reduce__(self):
        return BlockHasher, (self.name, self._key)

    def root(self, salt: bytes) -> BlockHash:
        """The chain's starting value for ``salt``."""
        if self.name == "xxh3":
            return xxhash.xxh3_64_intdigest(salt, seed=_XXH3_ROOT_SEED)
        h = self._root_state.copy()
        h.update(salt)
        return h.digest()

    def chain(self, parent: BlockHash, data: bytes) -> BlockHash:
        """The identity of one block whose token ids have :func:`block_bytes` ``data`` (of
        :attr:`token_width`), after the
        block (or root) with identity ``parent``: what :meth:`extend` appends for it."""
        if self.name == "xxh3":
            return xxhash.xxh3_64_intdigest(data, seed=parent)
        h = self._block_state.copy()
        h.update(parent)
        h.update(data)
        return h.digest()

    def extend(self, hashes: list, tokens: Union[np.ndarray, bytes], block_size: int, num_blocks: int,
               salt: Optional[bytes], offset: int = 0) -> None:
        """Append identities to ``hashes`` until it covers ``num_blocks`` full blocks of the sequence
        whose token ids from position ``offset`` on are ``tokens`` (``offset`` at most
        ``len(hashes) * block_size``; ``tokens`` reach position ``num_blocks * block_size``):
        an array of ids, or their :func:`block_bytes` (of :attr:`token_width`) already. ``salt``
        is read only when ``hashes`` is empty (the chain's root); it may be None otherwise."""
        start = len(hashes)
        if start >= num_blocks:
            return
        if offset > start * block_size:
            raise ValueError(f"tokens start at position {offset}, after the first block to hash ({start * block_size})")
        first, end = start * block_size - offset, num_blocks * block_size - offset
        tw = self.token_width
        if isinstance(tokens, bytes):
            buf = memoryview(tokens)[first * tw:end * tw]
        else:
            buf = memoryview(block_bytes(tokens[first:end], tw))
        width = block_size * tw
        if len(buf) != (num_blocks - start) * width:
            raise ValueError(f"token ids reach position {offset + len(buf) // tw}, not {num_blocks * block_size}")
        parent = hashes[-1] if hashes else self.root(salt)
        append = hashes.append
        if self.name == "xxh3":
            digest = xxhash.xxh3_64_intdigest
            for i in range(num_blocks - start):
                parent = digest(buf[i * width:(i + 1) * width], seed=parent)
                append(parent)
            return
        copy = self._block_state.copy
        for off in range(0, len(buf), width):
            h = copy()
            h.update(parent)
            h.update(buf[off:off + width])
            parent = h.digest()
            append(parent)


def make_hasher(name: str, key_mode: str = "random", seed: int = 0) -> BlockHasher:
    """The hasher ``engine.prefix_hash`` / ``engine.prefix_hash_key`` / ``engine.seed`` select."""
    return BlockHasher(name, hash_key(key_mode, seed) if name == "blake2b" else None)
