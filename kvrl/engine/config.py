"""Engine configuration."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from kvrl.engine.hashing import HASHES, KEY_MODES
from kvrl.plugins.base import check_choice, check_range


@dataclass
class EngineConfig:
    """Memory and batching limits of the paged engine.

    Attributes:
        num_blocks: GPU KV blocks; 0 = size the pool from the executor's free device memory
            times ``gpu_memory_utilization``.
        block_size: tokens per block.
        num_cpu_blocks: CPU swap-pool blocks; None = ``swap_space_gb`` worth of blocks.
        swap_space_gb: CPU swap pool size in GiB when ``num_cpu_blocks`` is None.
        gpu_memory_utilization: fraction of device memory the executor may use (weights + KV).
        max_num_batched_tokens: per-step token budget (prefill chunks + decodes).
        max_num_seqs: cap on running sequences.
        max_model_len: longest prompt + output accepted; None = the model's maximum.
        chunked_prefill: split long prompts over steps; if False a prompt must fit the budget.
        allocator: ``paged`` (block tables) or ``contiguous`` (pre-paging baseline: one first-fit
            range per request reserved at admission).
        contiguous_reserve: what the contiguous allocator reserves per request: ``max``
            (max_model_len tokens, as Orca/FasterTransformer without length knowledge), ``pow2``
            (prompt + output rounded up to a power of two) or ``oracle`` (exact prompt + output).
        prefix_cache_scope: ``tenant`` (each tenant's blocks match only its own requests; default,
            closes the cross-tenant timing side channel) or ``global`` (explicit opt-in to sharing).
            A request's ``cache_salt`` narrows either scope further; it never replaces the tenant.
        prefix_hash: block identity hash (:mod:`kvrl.engine.hashing`): ``blake2b`` (default:
            BLAKE2b-256 keyed with a per-engine secret, every hit checked against the cached
            block's tokens and salt), ``sha256`` (unkeyed, checked the same way) or ``xxh3``
            (the pre-#14 64-bit hash, unchecked and forgeable: attack baseline and speed reference).
        prefix_hash_key: key of the ``blake2b`` hash: ``random`` (default: ``os.urandom`` at start-up)
            or ``seed`` (derived from ``seed``, for reproducible identities; guessable). Results do
            not depend on it: identities are internal.
        policy_errors: ``isolate`` (default: a policy call that raises or breaks its contract is a
            counted policy error with a fallback that affects only the request concerned: an
            eviction failure aborts only the request that needed the block, a scheduler failure
            falls back to FCFS, a watermark failure to vLLM's 0.01, a prefix-cache failure to no
            caching for that call; see :mod:`kvrl.engine.engine`) or ``raise`` (stop, for debugging).
        charge_policy_time: add the wall time of the policies' calls (``metrics.policy_time_s``)
            to the engine clock, each step's share before it (default false: simulated time
            ignores how slow a policy is). Executors that measure host time themselves (live,
            whose step durations include the engine's time between steps) ignore it.
        cpu_tier_blocks: blocks of the CPU tier under the prefix cache (issue #20,
            :mod:`kvrl.engine.tiers`): reclaimed prefix blocks the ``tier`` policy offloads there are
            loaded back on a later hit instead of recomputed. 0 (default) = no tier, the engine as
            before. Needs a prefix cache and the paged allocator.
        disk_tier_blocks: blocks of the disk tier under the CPU tier (issue #20,
            :mod:`kvrl.engine.disk_tier`): CPU tier blocks the CPU tier replaces are demoted there
            when the ``tier`` policy says so and read back on a hit. 0 (default) = none; needs
            ``cpu_tier_blocks`` > 0.
        disk_tier_dir: directory of the disk tier's block files (one file per block); None
            (default) = a fresh temporary directory, removed when the engine is collected.
        disk_tier_threads: I/O threads of the disk tier (default 4).
        disk_tier_read_ahead_blocks: staging buffers (blocks) for disk-tier reads issued as soon as
            a prefix lookup finds a disk hit, so a queued request's reads overlap the running
            steps (:mod:`kvrl.engine.tier_read_ahead`); 0 (default) = off, each disk hit is read
            when its step is planned. Live: that many blocks of host memory.
        seed: seed for anything random in the engine and executors.
        pause_gc: during :meth:`Engine.run`, Python's cyclic garbage collector is paused: the
            objects alive at the start are frozen (``gc.freeze``) and automatic collections are
            off until the run ends, when both are undone (the objects made during the run join
            the oldest generation with the frozen ones, so that the first young collection after
            the run does not walk all of them: 0.4 s for 40,000 offline requests). A full
            collection otherwise walks every object of the process, and on an H200 one stalled a live step for 0.3-0.4 s about once
            per 10 s run (docs/fidelity.md). Cyclic garbage made during the run waits for its end, and
            the garbage of earlier runs for a run that starts when the heap has grown by a quarter since
            the last one collected it (so a process serving many runs stays bounded).
            When something else already froze objects, only the automatic collections are paused
            (its freeze is kept); when the collector is already disabled, nothing changes.
    """

    num_blocks: int = 0
    block_size: int = 16
    num_cpu_blocks: Optional[int] = None
    swap_space_gb: float = 4.0
    gpu_memory_utilization: float = 0.9
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    max_model_len: Optional[int] = None
    chunked_prefill: bool = True
    allocator: str = "paged"
    contiguous_reserve: str = "max"
    prefix_cache_scope: str = "tenant"
    prefix_hash: str = "blake2b"
    prefix_hash_key: str = "random"
    policy_errors: str = "isolate"
    charge_policy_time: bool = False
    cpu_tier_blocks: int = 0
    disk_tier_blocks: int = 0
    disk_tier_dir: Optional[str] = None
    disk_tier_threads: int = 4
    disk_tier_read_ahead_blocks: int = 0
    seed: int = 0
    pause_gc: bool = True

    def __post_init__(self) -> None:
        for name in ("num_blocks", "block_size", "max_num_batched_tokens", "max_num_seqs", "seed",
                     "num_cpu_blocks", "max_model_len", "cpu_tier_blocks", "disk_tier_blocks", "disk_tier_threads",
                     "disk_tier_read_ahead_blocks"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError(f"engine.{name} must be an integer, got {value!r}")
        for name in ("chunked_prefill", "pause_gc", "charge_policy_time"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"engine.{name} must be true or false, got {getattr(self, name)!r}")
        check_range("engine.num_blocks", self.num_blocks, 0)
        check_range("engine.block_size", self.block_size, 1)
        if self.num_cpu_blocks is not None:
            check_range("engine.num_cpu_blocks", self.num_cpu_blocks, 0)
        check_range("engine.cpu_tier_blocks", self.cpu_tier_blocks, 0)
        check_range("engine.disk_tier_blocks", self.disk_tier_blocks, 0)
        check_range("engine.disk_tier_threads", self.disk_tier_threads, 1)
        check_range("engine.disk_tier_read_ahead_blocks", self.disk_tier_read_ahead_blocks, 0)
        if self.disk_tier_read_ahead_blocks and not self.disk_tier_blocks:
            raise ValueError("engine.disk_tier_read_ahead_blocks > 0 needs engine.disk_tier_blocks > 0 (it reads "
                             "ahead from the disk tier)")
        if self.disk_tier_dir is not None and not isinstance(self.disk_tier_dir, str):
            raise ValueError(f"engine.disk_tier_dir must be a directory path or null, got {self.disk_tier_dir!r}")
        if self.disk_tier_blocks and not self.cpu_tier_blocks:
            raise ValueError("engine.disk_tier_blocks > 0 needs engine.cpu_tier_blocks > 0 (blocks reach the disk "
                             "tier through the CPU tier)")
        check_range("engine.swap_space_gb", self.swap_space_gb, 0.0)
        check_range("engine.gpu_memory_utilization", self.gpu_memory_utilization, 0.0, 1.0)
        check_range("engine.max_num_batched_tokens", self.max_num_batched_tokens, 1)
        check_range("engine.max_num_seqs", self.max_num_seqs, 1)
        if self.max_model_len is not None:
            check_range("engine.max_model_len", self.max_model_len, 2)
        check_choice("engine.allocator", self.allocator, ("paged", "contiguous"))
        check_choice("engine.contiguous_reserve", self.contiguous_reserve, ("max", "pow2", "oracle"))
        check_choice("engine.prefix_cache_scope", self.prefix_cache_scope, ("tenant", "global"))
        check_choice("engine.prefix_hash", self.prefix_hash, HASHES)
        check_choice("engine.prefix_hash_key", self.prefix_hash_key, KEY_MODES)
        check_choice("engine.policy_errors", self.policy_errors, ("isolate", "raise"))
