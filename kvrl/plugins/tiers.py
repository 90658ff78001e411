"""The ``tier`` plugin kind (issue #20) and its built-ins: ``none``, ``offload_all``, ``cost_aware``
(``prefetch`` lives in :mod:`kvrl.plugins.prefetch`).

A tier policy decides, for every evictable cached block the GPU prefix cache reclaims, whether
its KV is offloaded to the CPU tier (``engine.cpu_tier_blocks`` blocks) or dropped. The engine
carries the decision out (:mod:`kvrl.engine.tiers`): the tier keeps the block's identity and
identity record, a later prefix match continues into the tier with the same check as on the GPU,
and hit blocks are loaded back into fresh GPU blocks instead of being recomputed. Replacement
inside the tier is least recently stored first (a tier block leaves the tier when it is loaded
back, so its last use is its store).

Why a fifth kind and not a parameter of ``prefix_cache``: the prefix-cache policy answers
*which* evictable block goes first; the tier policy answers *what happens to it* (offload or
drop). The two are independent choices (any reclaim order with any offload rule), so they are
swept and learnt independently; folding the tier into ``prefix_cache`` would multiply every
prefix-cache plugin by every offload rule. The kind is optional in configs (absent = ``none``),
so every existing config and result is unchanged (docs/tiers.md).
"""
from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Optional

from kvrl.plugins.base import Policy, check_range
from kvrl.plugins.registry import register


@dataclass(frozen=True)
class ReclaimedBlock:
    """A GPU prefix block being reclaimed: its position in its chain (``index``: 0 = the first
    block of a prompt, so ``index * block_size`` tokens precede it) and the tier's state."""

    index: int
    block_size: int
    tier_free_blocks: int     # CPU tier blocks free now (0: an offload replaces the oldest tier block)
    tier_blocks: int          # the tier's size


@dataclass(frozen=True)
class DemotedBlock:
    """A CPU tier block being replaced (the tier is full): its chain ``index`` and ``block_size``
    as in :class:`ReclaimedBlock`, the disk tier's state, and ``disk_read_s``: seconds to read it
    back from disk (the disk bandwidth model: the profile's measurement or the documented default)."""

    index: int
    block_size: int
    disk_free_blocks: int
    disk_blocks: int
    disk_read_s: float


@dataclass(frozen=True)
class PrefetchChain:
    """A finished sequence's prefix chain that a prefetch may bring
    back: an opaque ``handle``, the request's ``tenant`` and ``prefix_group`` (a conversation or
    shared-prompt group, when the workload names one), when it was freed (``freed_s``, engine
    clock) and its full blocks (``num_blocks``). No token ids or identities."""

    handle: int
    tenant: str
    prefix_group: Optional[str]
    freed_s: float
    num_blocks: int


@dataclass(frozen=True)
class PrefetchState:
    """What :meth:`TierPolicy.prefetch` sees once per step: the remembered chains (oldest first),
    free GPU blocks (never reclaimed for a prefetch), the pool's size and the engine clock."""

    chains: tuple
    free_gpu_blocks: int
    gpu_blocks: int
    now_s: float


class TierPolicy(Policy):
    """Offload-or-drop decisions for reclaimed GPU prefix blocks (see module doc).

    Contract: :meth:`offload` returns a bool; a raise or a non-bool is a policy error
    (``engine.policy_errors``) and the block is dropped, as without a tier. The policy never sees
    token ids or identities (tenant isolation is the allocator's check, the same on every tier).
    """

    @abc.abstractmethod
    def offload(self, block: ReclaimedBlock) -> bool:
        """True: copy the block's KV to the CPU tier; False: drop it."""

    def demote(self, block: DemotedBlock) -> bool:
        """With a disk tier (``engine.disk_tier_blocks``): True writes a replaced CPU tier block to
        disk, False drops it. Same contract as :meth:`offload`. Default: False (a policy that does
        not know the disk tier leaves it empty)."""
        return False

    def prefetch(self, state: PrefetchState) -> tuple:
        """Once per step, before it runs: ``(handles, max_blocks)``: which remembered chains
        (:class:`PrefetchChain`) to bring back now, in order, and at most how many blocks in all.
        The engine loads each chain's tier-held blocks after its GPU-cached head into free GPU
        blocks (disk blocks staged through the CPU tier) as cached, evictable blocks, on the copy
        stream before the step's forward pass; a chosen chain is forgotten. A raise is a policy
        error (nothing prefetched). Default: nothing (loads happen at admission only)."""
        return (), 0


@register("tier", "none")
class NoTier(TierPolicy):
    """Drop every reclaimed block (the engine without a tier). No parameters."""

    def offload(self, block):
        return False


@register("tier", "offload_all")
class OffloadAll(TierPolicy):
    """Offload every reclaimed block; the tier replaces its least recently stored block when
    full; with a disk tier, every block the CPU tier replaces is demoted to disk (LRU per tier).
    No parameters. The plain policy of a CPU tier, as the CPU KV offloading of vLLM and SGLang's
    HiCache provide it (issue #20)."""

    def offload(self, block):
        return True

    def demote(self, block):
        return True


@register("tier", "cost_aware")
class CostAwareTier(TierPolicy):
    """Offload a block when moving it out and back (2 x the executor's per-block transfer
    estimate, amortised over ``batch_blocks`` blocks per transfer) is cheaper than recomputing it,
    priced as a busy engine pays for it: the block's share of a ``chunk_tokens``-token prefill
    chunk at the block's depth (``block_size x (prefill(before + chunk) - prefill(before)) /
    chunk`` with the executor's prefill estimate, ``before = index x block_size`` tokens ahead of
    it). Deep blocks (long attention context) and large models favour offloading; with a slow
    host link or a small model, shallow blocks are dropped. A replaced CPU tier block is demoted
    to disk when its disk read plus PCIe load beats recomputing it (same recompute price). Parameters: ``batch_blocks`` (default
    16), ``chunk_tokens`` (default 2048), ``margin`` (offload when transfer < margin x recompute,
    default 1.0)."""

    @dataclass
    class Params:
        batch_blocks: int = 16
        chunk_tokens: int = 2048
        margin: float = 1.0

        def __post_init__(self):
            check_range("batch_blocks", self.batch_blocks, 1)
            check_range("chunk_tokens", self.chunk_tokens, 1)
            check_range("margin", self.margin, 0.0)

    def recompute_s(self, block: ReclaimedBlock) -> float:
        """Seconds the engine would spend recomputing ``block`` (see class doc)."""
        engine, chunk = self.engine, self.params.chunk_tokens
        before = block.index * block.block_size
        return block.block_size * (engine.estimate_recompute_s(before + chunk)
                                   - engine.estimate_recompute_s(before)) / chunk

    def transfer_s(self) -> float:
        """Seconds to move one block out and back in (batched estimate)."""
        n = self.params.batch_blocks
        return 2.0 * self.engine.estimate_swap_s(n) / n

    def offload(self, block):
        return self.transfer_s() < self.params.margin * self.recompute_s(block)

    def demote(self, block):
        """Demote when reading the block back (disk read + PCIe load) beats recomputing it."""
        load_s = block.disk_read_s + self.engine.estimate_swap_s(self.params.batch_blocks) / self.params.batch_blocks
        return load_s < self.params.margin * self.recompute_s(block)


@register("tier", "prefetch")
class PrefetchTier(OffloadAll):
    """``offload_all`` plus loading ahead of need: each step, while more than ``reserve`` of the
    GPU pool is free, bring back the most recently freed chain of each conversation or tenant
    (``prefix_group``, else tenant: the next turn of a conversation extends the previous prompt
    and answer; a tenant's system prompt heads every chain of that tenant), newest first, at most
    ``max_blocks`` blocks per step and never into the last ``reserve`` x the pool's free blocks.
    Only chains freed within ``window_s`` seconds are brought back. Parameters: ``max_blocks``
    (default 32), ``reserve`` (fraction of the pool, default 0.25), ``window_s`` (default 30.0)."""

    @dataclass
    class Params:
        max_blocks: int = 32
        reserve: float = 0.25
        window_s: float = 30.0
        max_chains: int = 8

        def __post_init__(self):
            check_range("max_chains", self.max_chains, 1)
            check_range("max_blocks", self.max_blocks, 0)
            check_range("reserve", self.reserve, 0.0, 1.0)
            check_range("window_s", self.window_s, 0.0)

    def prefetch(self, state):
        p = self.params
        room = state.free_gpu_blocks - int(p.reserve * state.gpu_blocks)
        if room <= 0 or not p.max_blocks:
            return (), 0
        handles, seen = [], set()
        for chain in reversed(state.chains):
            if state.now_s - chain.freed_s > p.window_s:
                break
            key = chain.prefix_group if chain.prefix_group is not None else ("tenant", chain.tenant)
            if key not in seen:
                seen.add(key)
                handles.append(chain.handle)
                if len(handles) == p.max_chains:
                    break
        return handles, min(p.max_blocks, room)


@register("tier", "agent")
class AgentTier(PrefetchTier):
    """The tier mode an RL agent sets (``kvrl/Tier-v0``, envs/tier_env.py) through :attr:`mode`:
    0 drop every reclaimed block, 1 offload and demote (``offload_all``), 2 also prefetch (the
    ``prefetch`` policy with this plugin's parameters). Parameters: ``mode`` (before the agent's
    first decision, default 1) and those of ``prefetch``."""

    @dataclass
    class Params(PrefetchTier.Params):
        mode: int = 1

        def __post_init__(self):
            super().__post_init__()
            check_range("mode", self.mode, 0, 2)

    def __init__(self, params=None) -> None:
        super().__init__(params)
        self.mode = self.params.mode

    def offload(self, block):
        return self.mode >= 1

    def demote(self, block):
        return self.mode >= 1

    def prefetch(self, state):
        return super().prefetch(state) if self.mode == 2 else ((), 0)
