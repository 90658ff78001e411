"""The live executor: a real transformer over a paged KV cache (Triton kernels on CUDA, the torch
reference on CPU), with batched block copies, asynchronous swapping to a pinned CPU pool, CUDA-graph
decode (:mod:`kvrl.executors.decode_graph`), whole-step CUDA graphs for steps with prefill chunks
(:mod:`kvrl.executors.step_graph`), piecewise CUDA graphs for the steps too large for those
(:mod:`kvrl.executors.piecewise`: all but attention replayed per token bucket), and greedy or
seeded sampling (:mod:`kvrl.executors.sampling`). Built by :mod:`kvrl.executors.live_build`.

Swapping (CUDA): one side stream carries every swap transfer, so transfers run in issue order
(a block swapped out and later swapped in needs no other synchronisation). A copy engine serves
one transfer per direction at a time, so a step's own small copies (inputs up, sampled tokens
down) would wait behind a large swap issued before them: swaps are issued after them. Swap-out
gathers the blocks into a contiguous device buffer on the compute stream (before this step may
reuse them) and, once the step's sampled tokens are back, copies it to the pinned, block-major
CPU pool on the side stream; the next step's sampled tokens wait for that copy. Swap-in copies
pinned CPU blocks to the device on the side stream once the forward pass has uploaded its inputs
and scatters them into the pool; the next step's compute waits for it (prefetch for sequences that
compute from the next step on).

Timing: a step's ``elapsed_s`` is the wall time from the end of the previous step to the end of
this one's compute stream (synchronised), so the engine's own scheduling overhead is part of the
measured time and side-stream transfers are not, unless a later step waits for them; after an
idle gap longer than ``max_gap_s`` only this step's execution is counted. Every gap is reported
(``StepOutput.host_gap_s``, and whether it was counted), so the engine's metrics account for all
host time (``host_gap_s``, ``long_host_gaps``).

Faults: a scheduled sequence whose block table does not cover the tokens it computes (an engine
bug) is not run; it comes back as a per-sequence error, which aborts its request alone, and the
rest of the batch runs.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from typing import Optional, Sequence

import numpy as np
import torch

from kvrl import kernels
from kvrl.engine.batch import ScheduledBatch, StepOutput
from kvrl.executors.base import Executor
from kvrl.executors.decode_graph import DecodeGraph
from kvrl.executors.hardware import DEVICES, DeviceSpec, ModelShape
from kvrl.executors.piecewise import TOKEN_SIZES, PiecewiseGraphs
from kvrl.executors.sampling import SamplingConfig, sample
from kvrl.executors.sim import SimExecutor
from kvrl.executors.step_graph import StepGraphs
from kvrl.executors.step_inputs import fill_step_inputs
from kvrl.model import AttentionMetadata, CausalLM, ModelConfig

log = logging.getLogger(__name__)


def _shape_of(config: ModelConfig, dtype: torch.dtype) -> ModelShape:
    return ModelShape(name=config.architecture, num_layers=config.num_layers, hidden_size=config.hidden_size,
                      num_heads=config.num_heads, num_kv_heads=config.num_kv_heads, head_dim=config.head_dim,
                      intermediate_size=config.intermediate_size, vocab_size=config.vocab_size,
                      tie_word_embeddings=config.tie_word_embeddings,
                      max_model_len=config.max_position_embeddings, dtype_bytes=torch.empty((), dtype=dtype).element_size())


def _device_spec(device: torch.device) -> DeviceSpec:
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device).lower()
        for key in ("h200", "h100", "a100"):
            if key in name:
                return DEVICES[key]
        return DEVICES["h100"]
    # CPU: a rough ceiling, used only by cost-aware policies' estimates
    return DeviceSpec(name="cpu", memory_bytes=16e9, hbm_bw=20e9, matmul_flops=2e11, pcie_bw=20e9)


class LiveExecutor(Executor):
    """Runs the engine's batches on ``model`` (see module doc)."""

    name = "live"
    measures_host_time = True

    def __init__(self, model: CausalLM, config: ModelConfig, device: torch.device, dtype: torch.dtype,
                 sampling: SamplingConfig = SamplingConfig(), cuda_graphs: bool = True, seed: int = 0,
                 max_gap_s: float = 0.05, piecewise: Optional[bool] = None,
                 piecewise_sizes: Sequence[int] = TOKEN_SIZES, step_graphs: Optional[bool] = None,
                 step_graph_max_tokens: int = 2048) -> None:
        self.model = model.eval()
        self.config = config
        self.device = device
        self.dtype = dtype
        self.sampling = sampling
        self.use_cuda_graphs = cuda_graphs and device.type == "cuda"
        #: steps no decode graph serves replay piecewise graphs (None: with CUDA graphs on CUDA;
        #: True on CPU runs the same segments eagerly, for tests)
        self.use_piecewise = self.use_cuda_graphs if piecewise is None else bool(piecewise)
        self.piecewise_sizes = tuple(piecewise_sizes)
        self._piecewise: Optional[PiecewiseGraphs] = None
        #: steps with prefill chunks up to ``step_graph_max_tokens`` tokens replay whole-step graphs
        #: (None: with CUDA graphs on CUDA; True on CPU runs the same body eagerly, for tests)
        self.use_step_graphs = self.use_cuda_graphs if step_graphs is None else bool(step_graphs)
        self.step_graph_max_tokens = int(step_graph_max_tokens)
        self._step_graphs: Optional[StepGraphs] = None
        self._staging_bufs: dict[torch.dtype, torch.Tensor] = {}
        self.seed = seed
        self.max_gap_s = max_gap_s
        self.cost_model = SimExecutor(_shape_of(config, dtype), _device_spec(device), seed,
                                      cuda_graphs=self.use_cuda_graphs, step_graphs=self.use_step_graphs)
        self._generator = torch.Generator(device=device).manual_seed(seed)
        self._last_end: Optional[float] = None
        self._swap_done: Optional[torch.cuda.Event] = None
        self._swap_stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._graphs: dict[int, "DecodeGraph"] = {}
        self.kv_caches: list[tuple[torch.Tensor, torch.Tensor]] = []

    # ----------------------------------------------------------------- sizes
    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def max_model_len(self) -> int:
        return self.config.max_position_embeddings

    def kv_block_bytes(self, block_size: int) -> int:
        c = self.config
        return 2 * c.num_layers * block_size * c.num_kv_heads * c.head_dim * self.cost_model.model.dtype_bytes

    def kv_capacity_blocks(self, block_size: int, gpu_memory_utilization: float) -> int:
        if self.device.type != "cuda":
            raise ValueError("engine.num_blocks must be set explicitly for the live backend on CPU")
        free, total = torch.cuda.mem_get_info(self.device)
        if self.kv_caches:    # memory of this executor's own pool is available to a new engine
            free += self.kv.numel() * self.kv.element_size()
        activations = 4 * 2**30   # logits, graph pools and activations of the largest step
        budget = total * gpu_memory_utilization - (total - free) - activations
        return max(int(budget // self.kv_block_bytes(block_size)), 0)

    def allocate_kv(self, num_blocks: int, num_cpu_blocks: int, block_size: int) -> None:
        c = self.config
        shape = (c.num_layers, 2, num_blocks, block_size, c.num_kv_heads, c.head_dim)
        # block-major on the host: one CPU block is one contiguous range (a single DMA)
        cpu_shape = (max(num_cpu_blocks, 0), c.num_layers, 2, block_size, c.num_kv_heads, c.head_dim)
        self.sync_swaps()
        if self.kv_caches and tuple(self.kv.shape) == shape and tuple(self.cpu_pool.shape) == cpu_shape:
            return   # a new engine on the same executor reuses the pools (and the captured graphs)
        self._graphs.clear()
        self._piecewise = None
        self._step_graphs = None
        if self.kv_caches:    # release the previous pool before taking a new one
            del self.kv, self.kv_by_block, self.cpu_pool, self._all_caches
            self.kv_caches = []
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.kv = torch.empty(shape, dtype=self.dtype, device=self.device)
        self.kv_by_block = self.kv.permute(2, 0, 1, 3, 4, 5)   # a view: (block, layer, k/v, token, head, dim)
        self.kv_caches = [(self.kv[i, 0], self.kv[i, 1]) for i in range(c.num_layers)]
        self.cpu_pool = torch.empty(cpu_shape, dtype=self.dtype, pin_memory=self.device.type == "cuda")
        self._all_caches = [t for pair in self.kv_caches for t in pair]
        self.max_blocks_per_seq = -(-self.max_model_len // block_size)
        if self.device.type == "cuda":   # no step of the run stalls on a kernel compilation
            t0 = time.perf_counter()
            n = kernels.precompile_attention(self.kv[0, 0], self.kv[0, 1], c.num_heads, c.head_dim ** -0.5)
            torch.cuda.synchronize(self.device)
            log.info("precompiled %d attention kernel variants in %.1f s", n, time.perf_counter() - t0)
        if self.use_piecewise:
            self._piecewise = PiecewiseGraphs(self.model, self.kv_caches, self.piecewise_sizes,
                                              capture=self.device.type == "cuda")
        if self.use_step_graphs:
            self._step_graphs = StepGraphs(self.model, self.kv_caches, block_size, self.max_blocks_per_seq,
                                           self.piecewise_sizes, self.step_graph_max_tokens,
                                           capture=self.device.type == "cuda")

    # ----------------------------------------------------------------- block operations
    def _gather_swap_out(self, pairs: list[tuple[int, int]]):
        """GPU -> CPU, first half: gather the blocks on the compute stream, before this step may
        reuse them. Returns what :meth:`_transfer_swap_out` copies to the host (CPU: done here)."""
        pairs = sorted(pairs, key=lambda p: p[1])   # consecutive CPU blocks become one copy
        gpu = torch.tensor([g for g, _ in pairs], device=self.device)
        staged = self.kv_by_block.index_select(0, gpu)   # (n, layer, k/v, token, head, dim), contiguous
        if self._swap_stream is None:
            self.cpu_pool[torch.tensor([c for _, c in pairs])] = staged
            return None
        gathered = torch.cuda.Event()
        gathered.record(torch.cuda.current_stream(self.device))
        return staged, [c for _, c in pairs], gathered

    def _transfer_swap_out(self, pending) -> None:
        """GPU -> CPU, second half: the device-to-host copies on the swap stream, issued after
        this step's sampled tokens came back (a copy engine serves one transfer at a time, so the
        step's own small copy would otherwise wait behind the swap)."""
        staged, cpu_blocks, gathered = pending
        self._swap_stream.wait_event(gathered)
        with torch.cuda.stream(self._swap_stream):
            for first, cpu_first, n in _runs(cpu_blocks):
                self.cpu_pool[cpu_first:cpu_first + n].copy_(staged[first:first + n], non_blocking=True)
        staged.record_stream(self._swap_stream)   # not reused before the copies are done

    def _swap_in(self, pairs: list[tuple[int, int]], after: Optional["torch.cuda.Event"]) -> None:
        """CPU -> GPU on the swap stream, once the compute stream has passed ``after`` (this
        step's block operations; issued after the forward pass has uploaded its inputs, for the
        same reason as swap-out). The next step's compute waits for it (prefetch)."""
        pairs = sorted(pairs)
        gpu = torch.tensor([g for _, g in pairs], device=self.device)
        if self._swap_stream is None:
            self.kv_by_block.index_copy_(0, gpu, self.cpu_pool[torch.tensor([c for c, _ in pairs])])
            return
        self._swap_stream.wait_event(after)
        with torch.cuda.stream(self._swap_stream):
            staged = torch.empty((len(pairs), *self.cpu_pool.shape[1:]), dtype=self.dtype, device=self.device)
            for first, cpu_first, n in _runs([c for c, _ in pairs]):
                staged[first:first + n].copy_(self.cpu_pool[cpu_first:cpu_first + n], non_blocking=True)
            self.kv_by_block.index_copy_(0, gpu, staged)
            self._swap_done = torch.cuda.Event()
            self._swap_done.record(self._swap_stream)
        gpu.record_stream(self._swap_stream)

    def allocate_tier(self, num_blocks: int, block_size: int) -> None:
        """The CPU tier (kvrl.engine.tiers): block-major host blocks like the swap pool, pinned on CUDA."""
        self.sync_swaps()
        self.tier_pool = torch.empty((num_blocks, *self.cpu_pool.shape[1:]), dtype=self.dtype,
                                     pin_memory=self.device.type == "cuda")
        self._tier_s = [0.0, 0.0]
        self._tier_events: list = []     # CUDA: (start, loads done, stores done) per step, read lazily

    def tier_transfer_s(self) -> tuple[float, float]:
        if not hasattr(self, "_tier_s"):
            return 0.0, 0.0
        for start, loaded, stored in self._tier_events:     # CUDA events: elapsed times once they completed
            stored.synchronize()
            self._tier_s[0] += start.elapsed_time(loaded) / 1e3
            self._tier_s[1] += loaded.elapsed_time(stored) / 1e3
        self._tier_events = []
        return self._tier_s[0], self._tier_s[1]

    def _tier_ops(self, out: list[tuple[int, int]], into: list[tuple[int, int]]) -> None:
        """CPU-tier block operations, before anything else in the step: the offloaded blocks are
        gathered first (a load may target a block reclaimed in this step), then the loads (tier ->
        GPU) run, then the gathered blocks go to the tier. CUDA: the gather runs on the compute
        stream, the host copies on the swap stream, and the compute stream waits for the loads
        only. No tier block is read and written in one step (kvrl.engine.tiers)."""
        gpu_out = torch.tensor([g for g, _ in sorted(out, key=lambda p: p[1])], device=self.device) if out else None
        host_out = sorted(t for _, t in out)
        if self._swap_stream is None:
            t0 = time.perf_counter()
            staged_out = self.kv_by_block.index_select(0, gpu_out) if out else None
            if into:
                self.kv_by_block.index_copy_(0, torch.tensor([g for _, g in into], device=self.device),
                                             self.tier_pool[torch.tensor([t for t, _ in into])].to(self.device))
            t1 = time.perf_counter()
            if out:
                self.tier_pool[torch.tensor(host_out)] = staged_out.cpu()
            self._tier_s[0] += t1 - t0
            self._tier_s[1] += time.perf_counter() - t1
            return
        compute = torch.cuda.current_stream(self.device)
        staged_out = self.kv_by_block.index_select(0, gpu_out) if out else None   # consecutive tier blocks: one copy
        ready = torch.cuda.Event()
        ready.record(compute)
        self._swap_stream.wait_event(ready)
        start, loaded, stored = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        with torch.cuda.stream(self._swap_stream):
            start.record()
            if into:
                into = sorted(into)
                staged_in = torch.empty((len(into), *self.tier_pool.shape[1:]), dtype=self.dtype, device=self.device)
                for first, tier_first, n in _runs([t for t, _ in into]):
                    staged_in[first:first + n].copy_(self.tier_pool[tier_first:tier_first + n], non_blocking=True)
                gpu_in = torch.tensor([g for _, g in into], device=self.device)
                self.kv_by_block.index_copy_(0, gpu_in, staged_in)
                gpu_in.record_stream(self._swap_stream)
            loaded.record()
            if out:
                for first, tier_first, n in _runs(host_out):
                    self.tier_pool[tier_first:tier_first + n].copy_(staged_out[first:first + n], non_blocking=True)
                staged_out.record_stream(self._swap_stream)
            stored.record()
        compute.wait_event(loaded)
        self._tier_events.append((start, loaded, stored))

    def sync_swaps(self) -> None:
        """Block until every issued swap transfer has finished (for profiling and pool changes)."""
        if self._swap_stream is not None:
            self._swap_stream.synchronize()

    def reset_step_state(self) -> None:
        """Time and sample from here on as a new executor would, between runs (after a warm-up,
        :func:`kvrl.builder.warm_up`): every swap transfer finished, the next step counts no host
        gap before it, sampling restarts from ``seed``. Kept: the KV pool, graphs, compiled kernels."""
        self.sync_swaps()
        self._last_end = None
        self._generator.manual_seed(self.seed)

    def _copy(self, pairs: list[tuple[int, int]]) -> None:
        src = torch.tensor([s for s, _ in pairs], dtype=torch.int64, device=self.device)
        dst = torch.tensor([d for _, d in pairs], dtype=torch.int64, device=self.device)
        kernels.copy_blocks(self._all_caches, src, dst)

    # ----------------------------------------------------------------- forward inputs
    def _staging(self, dtype: torch.dtype, n: int) -> np.ndarray:
        """A host buffer of at least ``n`` elements (pinned on CUDA) as numpy; reused across steps
        (each step's uploads have finished when ``execute`` returns)."""
        buf = self._staging_bufs.get(dtype)
        if buf is None or buf.numel() < n:
            size = max(n, 2 * buf.numel() if buf is not None else 4096)
            buf = self._staging_bufs[dtype] = torch.empty(size, dtype=dtype, pin_memory=self.device.type == "cuda")
        return buf.numpy()

    def _upload(self, host: np.ndarray, dtype: torch.dtype, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Copy a prefix of a staging buffer to the device (into ``out`` when given)."""
        src = torch.from_numpy(host)
        if out is not None:
            return out.copy_(src, non_blocking=True)
        if self.device.type == "cpu":
            return src.clone()   # the staging buffer is overwritten by the next step
        return src.to(device=self.device, non_blocking=True)

    def _prepare(self, order: list, n_pre: int, padded: int = 0):
        """Inputs of an eager or piecewise forward pass over the items ``order`` (the first
        ``n_pre`` are prefill items), in two uploads (int64: token ids, positions, slots; int32:
        attention metadata and the rows to sample). ``padded``: the piecewise bucket the token
        arrays are padded to (0: not padded); its arrays go straight into the graphs' input buffer.
        Returns ``(ids, positions, metadata, rows)``: ``rows`` (device, int32) are the
        hidden-state rows of the items of ``order`` that sample, in order."""
        num_seqs = len(order)
        lens = [item.num_tokens for item in order]
        num_tokens = sum(lens)
        size = padded or num_tokens
        i64 = self._staging(torch.int64, 3 * size)[:3 * size]
        ids, pos, slots = i64[:size], i64[size:2 * size], i64[2 * size:]
        width = max(len(item.seq.block_table) for item in order)
        # int32 regions, each starting 16-byte aligned (Triton specialises kernels on pointer
        # alignment: an unaligned one would compile a new variant in the middle of a run)
        n_dec = num_seqs - n_pre
        sizes32 = (n_pre + 1, n_pre, n_dec, num_seqs, n_pre * width, n_dec * width)
        starts = np.cumsum([0] + [-(-n // 4) * 4 for n in sizes32])
        i32 = self._staging(torch.int32, int(starts[-1]))[:int(starts[-1])]
        cu, pre_ctx, dec_ctx, rows, pre_tab, dec_tab = (i32[a:a + n] for a, n in zip(starts, sizes32))
        pre_tab, dec_tab = pre_tab.reshape(n_pre, width), dec_tab.reshape(n_dec, width)
        pre_tab.fill(0)     # the reference kernels gather every row up to the batch's width
        dec_tab.fill(0)
        _, num_rows = fill_step_inputs(order, n_pre, self.block_size, ids, pos, slots, cu, pre_ctx, dec_ctx, pre_tab,
                                       dec_tab, rows)
        if size > num_tokens:   # padding rows: token 0 at position 0, no K/V written
            ids[num_tokens:] = 0
            pos[num_tokens:] = 0
            slots[num_tokens:] = -1
        dst = self._piecewise.inputs(size) if padded else None
        d64 = self._upload(i64, torch.int64, dst).view(3, size)
        d32 = self._upload(i32, torch.int32)
        d_cu, d_pre_ctx, d_dec_ctx, d_rows, d_pre_tab, d_dec_tab = (d32[a:a + n] for a, n in zip(starts, sizes32))
        meta = AttentionMetadata(
            slot_mapping=d64[2, :num_tokens],
            num_prefill_tokens=int(cu[n_pre]),
            prefill_cu_seqlens_q=d_cu,
            prefill_context_lens=d_pre_ctx,
            prefill_block_tables=d_pre_tab.view(n_pre, width),
            max_prefill_q_len=max(lens[:n_pre], default=0),
            decode_context_lens=d_dec_ctx,
            decode_block_tables=d_dec_tab.view(n_dec, width),
            block_size=self.block_size)
        return d64[0, :num_tokens], d64[1, :num_tokens], meta, d_rows[:num_rows]

    # ----------------------------------------------------------------- step
    def _uncovered(self, batch: ScheduledBatch) -> dict[int, str]:
        """Items whose block table does not cover the tokens they compute (index -> error)."""
        bs = self.block_size
        return {i: f"KV blocks missing: {len(item.seq.block_table)} block(s) for tokens up to "
                   f"{item.start + item.num_tokens} (engine bug)"
                for i, item in enumerate(batch.seqs) if len(item.seq.block_table) * bs < item.start + item.num_tokens}

    def _execute_covered(self, batch: ScheduledBatch, bad: dict[int, str]) -> StepOutput:
        """Run ``batch`` without the items in ``bad``; they come back with no tokens and their error."""
        good = [i for i in range(len(batch.seqs)) if i not in bad]
        out = self.execute(dataclasses.replace(batch, seqs=[batch.seqs[i] for i in good]))
        sampled: list[list[int]] = [[] for _ in batch.seqs]
        errors = dict(bad)
        for w, i in enumerate(good):
            sampled[i] = out.sampled[w]
            if out.errors and w in out.errors:
                errors[i] = out.errors[w]
        return dataclasses.replace(out, sampled=sampled, errors=errors)

    @torch.inference_mode()
    def execute(self, batch: ScheduledBatch) -> StepOutput:
        bad = self._uncovered(batch)
        if bad:
            return self._execute_covered(batch, bad)
        start = time.perf_counter()
        if self._swap_done is not None:
            torch.cuda.current_stream(self.device).wait_event(self._swap_done)
            self._swap_done = None
        if batch.tier_out or batch.tier_in:
            self._tier_ops(batch.tier_out, batch.tier_in)
        pending_out = self._gather_swap_out(batch.swap_out) if batch.swap_out else None
        if batch.copies:
            self._copy(batch.copies)
        block_ops_done = None
        if batch.swap_in and self._swap_stream is not None:
            block_ops_done = torch.cuda.Event()
            block_ops_done.record(torch.cuda.current_stream(self.device))
        forward = self._forward(batch) if batch.seqs else None
        if batch.swap_in:   # for sequences that compute from the next step on: overlaps this forward
            self._swap_in(batch.swap_in, block_ops_done)
        sampled, errors = self._sample_items(batch, *forward) if forward else ([], {})
        if pending_out is not None:
            self._transfer_swap_out(pending_out)
        if self.device.type == "cuda":   # the compute stream only: swap transfers may still be in flight
            torch.cuda.current_stream(self.device).synchronize()
        end = time.perf_counter()
        gap = None if self._last_end is None else start - self._last_end
        counted = gap is not None and gap < self.max_gap_s
        elapsed = end - self._last_end if counted else end - start
        self._last_end = end
        return StepOutput(sampled, elapsed, errors or None, host_gap_s=gap, host_gap_counted=counted)

    def _sample_items(self, batch: ScheduledBatch, logits: torch.Tensor, items: list) -> tuple[list[list[int]], dict[int, str]]:
        """Sampled tokens per scheduled sequence (aligned with ``batch.seqs``) and per-sequence
        errors, from :meth:`_forward`'s ``(logits, items)``."""
        sampled: list[list[int]] = [[] for _ in batch.seqs]
        errors: dict[int, str] = {}
        index = {id(item): i for i, item in enumerate(batch.seqs)}
        keep = [j for j, item in enumerate(items) if item.num_samples]
        if keep:
            if len(keep) != len(items):
                logits = logits[torch.tensor(keep, device=self.device)]
            tokens, errs = sample(logits, [items[j].num_samples for j in keep], self.sampling, self._generator)
            for w, j in enumerate(keep):
                sampled[index[id(items[j])]] = tokens[w]
                if w in errs:
                    errors[index[id(items[j])]] = errs[w]
        return sampled, errors

    def _forward(self, batch: ScheduledBatch):
        """Returns ``(logits, items)``: ``logits[i]`` are the fp32 logits of the last token of
        ``items[i]``; items that sample are always included (eager mode includes only those)."""
        if self.use_cuda_graphs and all(s.is_decode for s in batch.seqs):
            graph = self._graph_for(len(batch.seqs))
            if graph is not None:
                return graph.run(self, batch), list(batch.seqs)
        prefills = [s for s in batch.seqs if not s.is_decode]
        order = prefills + [s for s in batch.seqs if s.is_decode]
        n_pre, num_tokens = len(prefills), sum(item.num_tokens for item in order)
        step_key = self._step_graphs.bucket(order, n_pre) if self._step_graphs else None
        if step_key:
            return self._logits(*self._step_graphs.run(step_key, order, n_pre), order)
        size = self._piecewise.bucket(num_tokens) if self._piecewise is not None else None
        input_ids, positions, meta, rows = self._prepare(order, n_pre, size or 0)
        if size:
            hidden = self._piecewise.run(size, num_tokens, meta)
        else:
            hidden = self.model(input_ids, positions, self.kv_caches, meta)
        return self._logits(hidden, rows, order)

    def _logits(self, hidden: torch.Tensor, rows: torch.Tensor, order: list) -> tuple[torch.Tensor, list]:
        """``(logits, items)`` of the items of ``order`` that sample, from the hidden ``rows``."""
        items = [item for item in order if item.num_samples]
        if not items:
            return hidden.new_zeros((0, self.vocab_size), dtype=torch.float32), items
        return self.model.compute_logits(hidden[rows]), items

    # ----------------------------------------------------------------- CUDA graphs
    GRAPH_BATCH_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512)

    def uses_graph(self, num_prefills: int, num_decodes: int) -> bool:
        """Whether a step of this many prefill and decode items replays a CUDA graph."""
        return self.use_cuda_graphs and not num_prefills and 0 < num_decodes <= self.GRAPH_BATCH_SIZES[-1]

    def _graph_for(self, batch_size: int) -> Optional["DecodeGraph"]:
        size = next((b for b in self.GRAPH_BATCH_SIZES if b >= batch_size), None)
        if size is None:
            return None
        graph = self._graphs.get(size)
        if graph is None:
            pool = next(iter(self._graphs.values())).pool if self._graphs else None
            graph = self._graphs[size] = DecodeGraph(self, size, pool)
        return graph

    # ----------------------------------------------------------------- estimates
    def estimate_prefill_s(self, num_tokens: int) -> float:
        return self.cost_model.estimate_prefill_s(num_tokens)

    def estimate_swap_s(self, num_blocks: int) -> float:
        return self.cost_model.estimate_swap_s(num_blocks)


def _runs(cpu_blocks: list[int]) -> list[tuple[int, int, int]]:
    """Maximal runs of consecutive ids in ``cpu_blocks``: ``(first index, first id, length)``."""
    runs: list[tuple[int, int, int]] = []
    for i, c in enumerate(cpu_blocks):
        if runs and runs[-1][1] + runs[-1][2] == c:
            first, cpu_first, n = runs[-1]
            runs[-1] = (first, cpu_first, n + 1)
        else:
            runs.append((i, c, 1))
    return runs


