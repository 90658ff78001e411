"""Prefetch for :class:`~kvrl.engine.tiers.TieredAllocator` (issue #20): the ``tier`` policy's
``prefetch(PrefetchState)`` picks remembered chains (finished sequences' full blocks, recorded by
``TieredAllocator.free``) whose tier-held blocks are loaded back to the GPU ahead of need.

:class:`TierPrefetchMixin` is a base of ``TieredAllocator`` and holds no state of its own: it uses
the allocator's tiers, chains, prefix cache, block pool, policy timer and pending ``tier_in``/
``disk_in`` operations.
"""
from __future__ import annotations

from time import perf_counter


def _base_prefetch():
    from kvrl.plugins.tiers import TierPolicy
    return TierPolicy.prefetch


class TierPrefetchMixin:
    """:meth:`_run_prefetch` (called by ``take_tier_ops`` after the step's admissions) and the
    loading of one chain."""

    def _run_prefetch(self) -> None:
        """Ask the policy which remembered chains to bring back now, and load their leading blocks
        held in a tier (CPU, or disk staged through the CPU tier) into GPU blocks (free ones, else
        reclaimed evictable ones, which the tier policy may offload as usual) as cached, evictable
        blocks, at most the policy's block count. The loaded blocks stay referenced until every
        chain is done (no block is reclaimed in the step that loads it) and are released at the
        end; this runs after the step's admissions."""
        policy = self.tier_policy
        if type(policy).prefetch is _base_prefetch() or not self.chains:
            return
        from kvrl.plugins.tiers import PrefetchState
        state = PrefetchState(tuple(c for c, _ in self.chains.values()), self.num_free_blocks, self.num_blocks,
                              self._clock())
        timer = self._timer
        t0 = perf_counter()
        timer.depth += 1
        try:
            wanted = policy.prefetch(state)
            handles = [int(h) for h in wanted[0]]
            budget = int(wanted[1])
        except Exception as exc:
            self._on_error("prefetch", exc)
            return
        finally:
            timer.depth -= 1
            if not timer.depth:
                timer.total_s += perf_counter() - t0
        held: list[int] = []
        budget = min(budget, self.num_free_blocks)
        try:
            for handle in handles:
                if budget <= len(held):
                    break
                chain = self.chains.get(handle)
                if chain is not None and self._prefetch_chain(chain[1], budget - len(held), held):
                    del self.chains[handle]
        finally:
            self._release(held, self._clock())
        self.stats.loaded_blocks += len(held)
        self.stats.prefetched_blocks += len(held)

    def _prefetch_chain(self, hashes: tuple, budget: int, held: list[int]) -> None:
        """Load the tier-held blocks of ``hashes`` that follow its GPU-cached head (at most
        ``budget``), appending the GPU blocks (referenced) to ``held``. True when the chain is
        done with (every block is back on the GPU, or the chain breaks: a block in no tier)."""
        tier, disk, cache = self.tier, self.disk, self.prefix_cache
        bs, now = self.block_size, self._clock()
        loaded = 0
        for i, h in enumerate(hashes):
            if cache.lookup(h) is not None:
                continue
            if loaded >= budget or not self.num_free_blocks:
                return False
            slot = tier.lookup(h)
            if slot is not None and not tier.stored_now(slot):
                entry = tier.take(slot)
                source = slot
            elif slot is not None:                 # written in this step: not before the next
                return False
            elif disk is not None and (slot := disk.lookup(h)) is not None:
                if disk.stored_now(slot) or not tier.num_free + tier.num_replaceable():
                    return False
                entry = disk.take(slot)
                source = tier.store(entry)
                tier.take(source)
                self._disk_in.append((slot, source, h))
                self.stats.disk_loaded_blocks += 1
            else:
                return True
            block = self._allocate()
            self._fill[block] = bs
            self._tokens_in_use += bs
            if cache.insert(h, hashes[i - 1] if i else None, block, now):
                self._cached[block] = True
                self._meta[block] = (h, i)
                self._prefetched[block] = True
                if self._checked:
                    self._identity[block] = (entry.parent, entry.tokens, entry.salt)
            self._tier_in.append((source, block))
            held.append(block)
            loaded += 1
        return True
