"""Builds the allocator selected by ``engine.allocator`` and sizes requests for admission checks."""
from __future__ import annotations

from typing import Callable, Union

from kvrl.engine.config import EngineConfig
from kvrl.engine.contiguous_allocator import ContiguousAllocator, reserved_tokens
from kvrl.engine.paged_allocator import PagedAllocator
from kvrl.engine.request import Request, Sequence
from kvrl.plugins.base import PrefixCachePolicy

Allocator = Union[PagedAllocator, ContiguousAllocator]


def _salt_fn(scope: str) -> Callable[[Sequence], bytes]:
    """Cache salt of a sequence: its request's explicit salt, else its tenant (tenant scope)."""
    def salt(seq: Sequence) -> bytes:
        req = seq.request
        if req.cache_salt is not None:
            return req.cache_salt.encode()
        return req.tenant.encode() if scope == "tenant" else b""
    return salt


def make_allocator(config: EngineConfig, prefix_cache: PrefixCachePolicy, clock: Callable[[], float]) -> Allocator:
    if config.allocator == "contiguous":
        if prefix_cache.enabled:
            raise ValueError("engine.allocator=contiguous cannot share blocks: use prefix_cache=none with it")
        return ContiguousAllocator(config.num_blocks, config.block_size, config.contiguous_reserve,
                                   config.max_model_len, clock)
    return PagedAllocator(config.num_blocks, config.block_size, config.num_cpu_blocks, prefix_cache, clock,
                          _salt_fn(config.prefix_cache_scope))


def request_blocks(config: EngineConfig, request: Request) -> int:
    """GPU blocks ``request`` needs when it runs alone to completion (all ``n`` samples)."""
    bs = config.block_size
    if config.allocator == "contiguous":
        return request.n * -(-reserved_tokens(config.contiguous_reserve, request, config.max_model_len) // bs)
    total = request.prompt_len + request.output_len
    shared = request.prompt_len // bs
    return shared + request.n * (-(-total // bs) - shared)
