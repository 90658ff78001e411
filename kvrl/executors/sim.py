"""The simulated executor: a cost model of one engine step on a virtual clock.

The cost model is a measured step-time profile of the live executor when one matches the device
and model shape (:mod:`kvrl.executors.profile`, written by ``kvrl-profile``; ``profile="auto"``
finds shipped ones), else the roofline below. Which one is used is logged and kept in
:attr:`SimExecutor.cost_source`.

Roofline step time = ``step_overhead_s`` + max(FLOPs / (matmul_flops * matmul_efficiency),
bytes / (hbm_bw * bandwidth_efficiency)) + block copies and the swap-out gather over HBM.

Swap transfers (PCIe time in the roofline, measured transfer times with a profile) run on a
modelled swap stream as they do live (:class:`SwapStream`): one after another in issue order,
overlapping compute; the step after a swap waits for it where live does.

Counted per step: weights read once; K/V of every scheduled sequence's context read once and
its new tokens written once; 2 FLOPs per weight per token, causal attention FLOPs, and the LM
head only for rows that are sampled.
"""
from __future__ import annotations

import logging
import math
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Union

from kvrl.engine.batch import DecodeTokens, ScheduledBatch, StepOutput
from kvrl.executors.base import Executor
from kvrl.executors.fingerprint import staleness
from kvrl.executors.hardware import DeviceSpec, ModelShape

if TYPE_CHECKING:
    from kvrl.executors.profile import StepProfile

log = logging.getLogger(__name__)
_WARNED_STALE: set = set()     # profiles already warned about in this process


@dataclass
class SwapStream:
    """The live executor's swap stream on the sim's clock (seconds since the executor's pool was
    allocated): transfers run one at a time in issue order. A swap-in is issued during its step
    and the next step's forward pass waits for it; a swap-out is issued at the end of its step and
    the next step's end (its sampled tokens come back over the same copy engine) waits for it."""

    busy_until: float = 0.0      # when the last issued transfer ends
    swap_in_ready: float = 0.0   # when the last issued swap-in has landed
    swap_out_done: float = 0.0   # when the last issued swap-out has reached the host

    def step_s(self, now: float, compute_s: float, forward_s: float) -> float:
        """A step starting at ``now`` whose compute stream takes ``compute_s`` (``forward_s`` of
        it the forward pass, which cannot start before the pending swap-ins have landed)."""
        end = now + compute_s
        if self.swap_in_ready > now:
            end = max(end, self.swap_in_ready + forward_s)
        if self.swap_out_done > now:
            end = max(end, self.swap_out_done)
        return end - now

    def issue(self, now: float, end: float, swap_out_s: float, swap_in_s: float) -> None:
        """Queue the swap-in of a step running from ``now`` to ``end``, and its swap-out at ``end``."""
        if swap_in_s:
            self.busy_until = max(self.busy_until, now) + swap_in_s
            self.swap_in_ready = self.busy_until
        if swap_out_s:
            self.busy_until = max(self.busy_until, end) + swap_out_s
            self.swap_out_done = self.busy_until


class SimExecutor(Executor):
    """Cost-model executor; sampled tokens are deterministic pseudo-random ids (seeded).

    Args:
        profile: ``"auto"`` (a matching profile from the shipped ones and ``$KVRL_PROFILE_PATH``,
            else the roofline), ``"none"`` (roofline), a profile file path, or a loaded
            :class:`~kvrl.executors.profile.StepProfile`. A profile for another device or model
            shape is never used (roofline, with a warning naming the mismatch).
        cuda_graphs: with a profile, whether the modelled live executor replays decode steps as
            CUDA graphs (``backend.cuda_graphs`` of the live backend).
        step_graphs: whether the modelled live executor replays whole-step graphs
            (``backend.step_graphs``): ``profile="auto"`` picks a profile measured in that mode, and
            an explicit profile of the other mode is used with a warning.
        host_speed: with a profile, the factor on its host terms (the engine's own time between
            steps): how much slower the modelled live host runs Python than the profiling one
            (:func:`~kvrl.executors.host_speed.host_speed_ratio`; 1.0: the profile's host as is).
        host_cpus: the CPU count of the live host this sim stands beside (sim-beside-live), for
            ``profile="auto"``'s preference of a profile of that host class
            (:func:`~kvrl.executors.profile.resolve_profile`); None for a sim of its own.
        step_noise: per-step jitter, the log-standard deviation of an independent mean-one lognormal
            factor on every step's time (``exp(s z - s^2 / 2)``, z standard normal), as live step
            times scatter around their median (a profile's :attr:`~kvrl.executors.profile.StepProfile.step_noise`
            measures it); 0: deterministic, the default.
        noise_seed: the seed of that jitter's generator (one stream per executor).
    """

    name = "sim"

    def __init__(self, model: ModelShape, device: DeviceSpec, seed: int = 0,
                 profile: Union[str, "StepProfile", None] = "auto", cuda_graphs: bool = True,
                 step_graphs: bool = True, host_speed: float = 1.0, host_cpus: Optional[int] = None,
                 step_time_scale: float = 1.0, step_noise: float = 0.0, noise_seed: int = 0) -> None:
        if not (host_speed > 0 and host_speed < float("inf")):
            raise ValueError(f"host_speed={host_speed}: give a positive factor on the profile's host terms")
        if not (step_time_scale > 0 and step_time_scale < float("inf")):
            raise ValueError(f"backend.step_time_scale={step_time_scale}: give a positive factor on every step's time")
        if not 0.0 <= step_noise < 1.0:
            raise ValueError(f"step_noise={step_noise}: give the log-standard deviation of the per-step jitter, in [0, 1)")
        self.model = model
        self.device = device
        self.seed = seed
        self.cuda_graphs = bool(cuda_graphs)
        self.step_graphs = bool(step_graphs)
        #: the configured factor on every step's time (``backend.step_time_scale``: a host known to be
        #: that much slower or faster than the profile's, or a sensitivity check; 1.0 = the cost model as is)
        self.base_step_time_scale = float(step_time_scale)
        #: multiplies every step's compute time: the base, times the RL environments' per-episode
        #: domain randomisation (``env.episode.step_time_sigma``) where they draw one
        self.step_time_scale = self.base_step_time_scale
        #: the per-step jitter's log-standard deviation (0: none) and its generator
        self.step_noise = float(step_noise)
        self._noise = random.Random(noise_seed) if step_noise else None
        self.host_speed = float(host_speed)
        self._block_bytes = 0
        self._clock = 0.0
        self._swaps = SwapStream()
        self._last_pre_tok = 0
        self._decode_rule: Optional[DecodeTokens] = None
        self.profile = None
        self._step_model = None
        self.cost_source = "roofline"
        #: None, or why the profile may not describe this tree's live executor (see kvrl.executors.fingerprint)
        self.profile_staleness: Optional[str] = None
        if profile is not None and not (isinstance(profile, str) and profile.lower() in ("none", "roofline", "off", "")):
            from kvrl.executors.profile import resolve_profile
            from kvrl.executors.profile.registry import profiled_step_graphs
            prof, why = resolve_profile(profile, model, device, step_graphs=self.step_graphs, host_cpus=host_cpus)
            if prof is not None and profiled_step_graphs(prof.meta) != self.step_graphs:
                log.warning("sim profile %s measured the live executor with step_graphs=%s, this sim models "
                            "step_graphs=%s", prof.path or "<in memory>", profiled_step_graphs(prof.meta),
                            self.step_graphs)
            if prof is not None:
                self.profile, self._step_model = prof, prof.model
                self.cost_source = f"profile:{prof.path or '<in memory>'}"
                log.info("sim cost model: profile %s", prof.describe())
                self.profile_staleness = staleness(prof.meta)
                if self.profile_staleness and prof.path not in _WARNED_STALE:
                    _WARNED_STALE.add(prof.path)
                    log.warning("sim profile %s %s", prof.path or "<in memory>", self.profile_staleness)
            elif why != "auto" and not (isinstance(profile, str) and profile.lower() == "auto"):
                log.warning("sim cost model: roofline; %s", why)
            else:
                log.info("sim cost model: roofline; %s", why)
        else:
            log.info("sim cost model: roofline (profile=none)")
        m = model
        self._kv_tok = m.kv_bytes_per_token
        self._attn_flops_per_pair = 4 * m.num_layers * m.num_heads * m.head_dim
        self._flop_s = device.matmul_flops * device.matmul_efficiency
        self._byte_s = device.hbm_bw * device.bandwidth_efficiency
        self._layer_flops_per_token = 2 * m.layer_params
        self._head_flops_per_row = 2 * m.lm_head_params
        self._weight_bytes_read = (m.layer_params + m.lm_head_params) * m.dtype_bytes

    @property
    def vocab_size(self) -> int:
        return self.model.vocab_size

    @property
    def max_model_len(self) -> int:
        return self.model.max_model_len

    def kv_block_bytes(self, block_size: int) -> int:
        return self._kv_tok * block_size

    def kv_capacity_blocks(self, block_size: int, gpu_memory_utilization: float) -> int:
        activations = 2 * 2**30  # reserve for activations and the sampler's logits
        free = self.device.memory_bytes * gpu_memory_utilization - self.model.weight_bytes - activations
        return max(int(free // self.kv_block_bytes(block_size)), 0)

    def allocate_kv(self, num_blocks: int, num_cpu_blocks: int, block_size: int) -> None:
        self._block_bytes = self.kv_block_bytes(block_size)
        self._clock, self._swaps = 0.0, SwapStream()
        self._tier_s = [0.0, 0.0]
        self._last_pre_tok = 0     # the previous step's prefill tokens (a host-work term, fit version 9)

    def allocate_tier(self, num_blocks: int, block_size: int) -> None:
        self._tier_s = [0.0, 0.0]
        self._disk_busy, self._disk_write_busy, self._disk_bw = 0.0, 0.0, None   # disk-tier queues (_issue_disk)
        self._disk_ready = 0.0     # read-ahead reads the next step's tier loads wait for (await_disk_reads)

    def tier_transfer_s(self) -> tuple[float, float]:
        return self._tier_s[0], self._tier_s[1]

    def _issue_tier(self, batch: ScheduledBatch) -> None:
        """CPU-tier transfers (kvrl.engine.tiers) on the swap stream at the step's start, priced as
        swaps (profile transfer terms, else PCIe): the loads first, which this step's forward pass
        waits for, then the stores, which only occupy the stream (their blocks were gathered)."""
        n_out, n_in = len(batch.tier_out), len(batch.tier_in)
        if self._step_model is not None:
            out_s, in_s = self._step_model.swap_out_xfer(n_out), self._step_model.swap_in_xfer(n_in)
        else:
            pcie = self._block_bytes / self.device.pcie_bw
            out_s, in_s = n_out * pcie, n_in * pcie
        swaps = self._swaps
        start = self._clock
        if batch.disk_out or batch.disk_in:     # disk tier (kvrl.engine.disk_tier): see _issue_disk
            start = self._issue_disk(len(batch.disk_out), len(batch.disk_in))
        if self._disk_ready:
            start, self._disk_ready = max(start, self._disk_ready), 0.0
        swaps.busy_until = max(swaps.busy_until, start) + in_s
        if in_s:
            swaps.swap_in_ready = max(swaps.swap_in_ready, swaps.busy_until)
        swaps.busy_until += out_s
        self._tier_s[0] += in_s
        self._tier_s[1] += out_s

    def _issue_disk(self, n_out: int, n_in: int) -> float:
        """Disk-tier I/O of a step, priced from the profile's measured disk bandwidth
        (``meta["disk"]``, else :data:`~kvrl.engine.disk_tier.DEFAULT_DISK_BANDWIDTH`): reads and
        writes on separate queues, as the store runs them (separate reader and writer threads),
        each one transfer after another from the step's start or when its queue is free; reads
        never wait behind queued demotion writes. Returns when the reads have landed (the tier
        loads wait for them)."""
        if self._disk_bw is None:
            from kvrl.engine.disk_tier import DiskBandwidth
            self._disk_bw = DiskBandwidth.from_meta(self.profile.meta if self.profile is not None else None)
        bw = self._disk_bw
        if n_out:
            self._disk_write_busy = max(self._disk_write_busy, self._clock) + bw.write_s(n_out * self._block_bytes)
        if not n_in:
            return self._clock
        self._disk_busy = max(self._disk_busy, self._clock) + bw.read_s(n_in * self._block_bytes)
        return self._disk_busy

    def issue_disk_read_ahead(self, num_blocks: int) -> float:
        """Disk-tier reads issued ahead of the step that loads them (kvrl.engine.tier_read_ahead):
        queued now on the read queue (:meth:`_issue_disk`); returns when they land (this clock)."""
        return self._issue_disk(0, num_blocks)

    def await_disk_reads(self, ready_s: float) -> float:
        """The next step's tier loads wait until ``ready_s`` (read-ahead reads they use); returns
        the part of that wait past now (seconds)."""
        self._disk_ready = max(self._disk_ready, ready_s)
        return max(0.0, ready_s - self._clock)

    def _step_scale(self) -> float:
        """The factor on this step's time: :attr:`step_time_scale`, times a fresh draw of the jitter
        (:attr:`step_noise`) where there is one."""
        if self._noise is None:
            return self.step_time_scale
        s = self.step_noise
        return self.step_time_scale * math.exp(s * self._noise.gauss(0.0, 1.0) - 0.5 * s * s)

    def _timed(self, compute_s: float, forward_s: float, swap_out_s: float, swap_in_s: float) -> float:
        """The step's duration on the swap-stream timeline; advances the clock."""
        now = self._clock
        elapsed = self._swaps.step_s(now, compute_s, forward_s)
        self._swaps.issue(now, now + elapsed, swap_out_s, swap_in_s)
        self._clock = now + elapsed
        return elapsed

    def step_time(self, num_tokens: int, num_sampled: int, kv_read_tokens: int, attn_pairs: int) -> float:
        """Roofline seconds of a forward pass over ``num_tokens`` tokens with ``num_sampled``
        LM-head rows, reading ``kv_read_tokens`` tokens of K/V and ``attn_pairs`` causal
        (query, key) pairs."""
        flops = num_tokens * self._layer_flops_per_token + num_sampled * self._head_flops_per_row + \
            self._attn_flops_per_pair * attn_pairs
        bytes_moved = self._weight_bytes_read + (kv_read_tokens + num_tokens) * self._kv_tok
        return self.device.step_overhead_s + max(flops / self._flop_s, bytes_moved / self._byte_s)

    def execute(self, batch: ScheduledBatch) -> StepOutput:
        if batch.tier_out or batch.tier_in:
            self._issue_tier(batch)
        if self._step_model is not None:
            return self._execute_profiled(batch)
        num_tokens = num_sampled = kv_read = pairs = 0
        sampled: list[list[int]] = []
        vocab, seed = self.model.vocab_size, self.seed
        for item in batch.seqs:
            k, start = item.num_tokens, item.start
            num_tokens += k
            kv_read += start + k
            pairs += k * start + k * (k + 1) // 2
            if item.num_samples:
                num_sampled += item.num_samples
                base = item.seq.seq_id * 2654435761 + (start + k) * 40503 + seed
                sampled.append([(base + j * 97) % vocab for j in range(item.num_samples)])
            else:
                sampled.append([])
        forward = self.step_time(num_tokens, num_sampled, kv_read, pairs) if batch.seqs else 0.0
        compute = forward + 2 * (len(batch.copies) + len(batch.swap_out)) * self._block_bytes / self.device.hbm_bw
        scale = self._step_scale()
        forward, compute = forward * scale, compute * scale
        pcie = self._block_bytes / self.device.pcie_bw
        return StepOutput(sampled, self._timed(compute, forward, len(batch.swap_out) * pcie,
                                               len(batch.swap_in) * pcie))

    def _execute_profiled(self, batch: ScheduledBatch) -> StepOutput:
        """Step time from the profile's fitted model (same sampled ids as the roofline path). The
        plain decodes of a batch with the planner's summary (``batch.plain``) are priced from it and
        their tokens left to the returned :attr:`~StepOutput.decode_tokens` (``None`` entries of
        ``sampled``); every other item is looked at one by one."""
        n_pre = pre_tok = pre_pairs = pre_ctx = pre_max_ctx = pre_max_q = rows = other = 0
        vocab, seed = self.model.vocab_size, self.seed
        # a decode's id, ``(seq_id * 2654435761 + (start + 1) * 40503 + seed) % vocab``, computed as
        # ``(seq_id * (2654435761 % vocab) + start * 40503 + seed + 40503) % vocab``: the same residue
        # with smaller integers
        decode_token = self._decode_rule          # one per vocabulary and seed (it keeps per-sequence offsets)
        if decode_token is None or decode_token.m != vocab or decode_token.c != seed + 40503:
            decode_token = self._decode_rule = DecodeTokens(2654435761 % vocab, 40503, seed + 40503, vocab)
        items = batch.seqs
        sampled: list = [None] * len(items)
        plain = batch.plain
        co_read = self._step_model.co_read     # the shared KV tokens priced: co-read ones (fit version 12) or all
        if plain is None:
            indices = range(len(items))
            dec_kv = dec_shared = 0
            dec_last = -1             # the largest decode start (dec_max is one more)
        else:
            indices = [*plain.others, *range(plain.end, len(items))]
            dec_kv, dec_shared, dec_last = plain.kv, plain.co_read if co_read else plain.shared, plain.last
        for i in indices:
            item = items[i]
            k, start, seq = item.num_tokens, item.start, item.seq
            if k == 1:                # a decode; n_dec and its own rows are counted after the loop
                dec_kv += start
                if start > dec_last:
                    dec_last = start
                cached = seq.co_read_prefix_tokens if co_read else seq.shared_prefix_tokens
                if cached:
                    dec_shared += cached if cached <= start else start + 1
                if item.num_samples == 1:      # a decode's one token (the general case below, simplified)
                    sampled[i] = [decode_token.token(item)]
                    continue
                other += 1
            else:
                n_pre += 1
                pre_tok += k
                pre_pairs += k * start + k * (k + 1) // 2
                pre_ctx += start + k
                if start + k > pre_max_ctx:
                    pre_max_ctx = start + k
                if k > pre_max_q:
                    pre_max_q = k
            if item.num_samples:
                rows += 1
                base = seq.seq_id * 2654435761 + (start + k) * 40503 + seed
                sampled[i] = [(base + j * 97) % vocab for j in range(item.num_samples)]
            else:
                sampled[i] = []
        n_dec = len(items) - n_pre
        dec_kv += n_dec
        dec_max = dec_last + 1
        rows += n_dec - other
        m = self._step_model
        n_out, n_in = len(batch.swap_out), len(batch.swap_in)
        compute = m.predict(n_pre, pre_tok, pre_pairs, pre_ctx, pre_max_ctx, n_dec, dec_kv, dec_max, dec_shared, rows,
                            len(batch.copies), n_out, n_in, self.cuda_graphs, host_scale=self.host_speed,
                            pre_max_q=pre_max_q)
        if n_pre or n_dec:
            swaps = n_out + n_in
            compute += self.host_speed * m.host_work_s(batch.num_admitted, batch.num_preempted, batch.num_finished, batch.num_waiting,
                                     pre_tok, self._last_pre_tok, swaps, 1 if swaps else 0)
        self._last_pre_tok = pre_tok
        scale = self.step_time_scale if self._noise is None else self._step_scale()   # no call on the hot path
        compute *= scale
        rule = None if plain is None else decode_token
        if not (n_out or n_in or self._swaps.busy_until > self._clock):
            self._clock += compute     # the common step: no swap stream involved
            return StepOutput(sampled, compute, decode_tokens=rule)
        forward = scale * m.forward_s(n_pre, pre_tok, pre_pairs, pre_ctx, pre_max_ctx, n_dec, dec_kv,
                                      dec_max, dec_shared, rows, self.cuda_graphs, pre_max_q)
        return StepOutput(sampled, self._timed(compute, forward, m.swap_out_xfer(n_out), m.swap_in_xfer(n_in)),
                          decode_tokens=rule)

    def estimate_prefill_s(self, num_tokens: int) -> float:
        if num_tokens <= 0:
            return 0.0
        if self._step_model is not None:
            return self._step_model.forward_s(1, num_tokens, num_tokens * (num_tokens + 1) // 2, num_tokens,
                                              num_tokens, 0, 0, 0, 0, 1, self.cuda_graphs)
        return self.step_time(num_tokens, 1, num_tokens, num_tokens * (num_tokens + 1) // 2)

    def estimate_swap_s(self, num_blocks: int) -> float:
        if self._step_model is not None:
            return self._step_model.swap_s(num_blocks)
        return num_blocks * self._block_bytes / self.device.pcie_bw
