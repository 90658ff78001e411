"""Builds the allocator selected by ``engine.allocator`` and sizes requests for admission checks."""
from __future__ import annotations

from functools import lru_cache, partial
from typing import Callable, Optional, Union

from kvrl.engine.config import EngineConfig
from kvrl.engine.contiguous_allocator import ContiguousAllocator, reserved_tokens
from kvrl.engine.hashing import encode_salt, make_hasher
from kvrl.engine.paged_allocator import PagedAllocator
from kvrl.engine.request import Request, Sequence
from kvrl.plugins.base import PrefixCachePolicy

Allocator = Union[PagedAllocator, ContiguousAllocator]


def cache_salt(scope: str, tenant: str, salt: Optional[str]) -> bytes:
    """The salt that starts a request's block-identity chain (:mod:`kvrl.engine.hashing`).

    Scope ``tenant``: salt(tenant, cache_salt); scope ``global``: salt(cache_salt). An explicit
    ``cache_salt`` therefore only ever narrows sharing (requests share blocks only if they agree on
    the tenant, under tenant scope, *and* on the salt); it never replaces the tenant, so a request
    cannot join another tenant's cache by naming it. The fields are length-prefixed
    (:func:`encode_salt`), and the scope is part of the encoding."""
    if scope == "tenant":
        return b"tenant\x00" + encode_salt(tenant, salt)
    if scope == "global":
        return b"global\x00" + encode_salt(salt)
    raise ValueError(f"engine.prefix_cache_scope must be one of ['tenant', 'global'], got {scope!r}")


def _salt_fn(scope: str) -> Callable[[Sequence], bytes]:
    cache_salt(scope, "", None)                     # validates the scope once
    encoded = lru_cache(maxsize=4096)(partial(cache_salt, scope))   # the few (tenant, salt) pairs of a run
    def salt(seq: Sequence) -> bytes:
        req = seq.request
        return encoded(req.tenant, req.cache_salt)
    return salt


def make_allocator(config: EngineConfig, prefix_cache: PrefixCachePolicy, clock: Callable[[], float]) -> Allocator:
    if config.allocator == "contiguous":
        if prefix_cache.enabled:
            raise ValueError("engine.allocator=contiguous cannot share blocks: use prefix_cache=none with it")
        return ContiguousAllocator(config.num_blocks, config.block_size, config.contiguous_reserve,
                                   config.max_model_len, clock)
    return PagedAllocator(config.num_blocks, config.block_size, config.num_cpu_blocks, prefix_cache, clock,
                          _salt_fn(config.prefix_cache_scope),
                          make_hasher(config.prefix_hash, config.prefix_hash_key, config.seed))


def request_blocks(config: EngineConfig, request: Request) -> int:
    """GPU blocks ``request`` needs when it runs alone to completion (all ``n`` samples)."""
    bs = config.block_size
    if config.allocator == "contiguous":
        return request.n * -(-reserved_tokens(config.contiguous_reserve, request, config.max_model_len) // bs)
    total = request.prompt_len + request.output_len
    shared = request.prompt_len // bs
    return shared + request.n * (-(-total // bs) - shared)
