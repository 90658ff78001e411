"""CUDA-graph decode steps of the live executor (:mod:`kvrl.executors.live`): one captured graph
per padded batch size (``LiveExecutor.GRAPH_BATCH_SIZES``), sharing one memory pool; the other
steps replay piecewise graphs (:mod:`kvrl.executors.piecewise`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from kvrl.engine.batch import ScheduledBatch
from kvrl.model import AttentionMetadata

if TYPE_CHECKING:
    from kvrl.executors.live import LiveExecutor


class DecodeGraph:
    """A captured decode step for a fixed (padded) batch size; padding rows write nowhere."""

    def __init__(self, ex: "LiveExecutor", size: int, pool) -> None:
        dev = ex.device
        self.size = size
        width = ex.max_blocks_per_seq
        # inputs live in two device buffers filled by one host->device copy each per step
        self.i64 = torch.zeros(3 * size, dtype=torch.int64, device=dev)
        self.i32 = torch.zeros(size * (1 + width), dtype=torch.int32, device=dev)
        self.host_i64 = torch.zeros(3 * size, dtype=torch.int64, pin_memory=True)
        self.host_i32 = torch.zeros(size * (1 + width), dtype=torch.int32, pin_memory=True)
        self.ids, self.pos, self.slots = self.i64.view(3, size)
        self.ctx = self.i32[:size]
        self.tables = self.i32[size:].view(size, width)
        self.slots.fill_(-1)
        self.ctx.fill_(1)
        empty_i32 = torch.zeros(0, dtype=torch.int32, device=dev)
        self.meta = AttentionMetadata(
            slot_mapping=self.slots, num_prefill_tokens=0, prefill_cu_seqlens_q=torch.zeros(1, dtype=torch.int32, device=dev),
            prefill_context_lens=empty_i32, prefill_block_tables=torch.zeros((0, ex.max_blocks_per_seq), dtype=torch.int32, device=dev),
            max_prefill_q_len=0, decode_context_lens=self.ctx, decode_block_tables=self.tables, block_size=ex.block_size)
        stream = torch.cuda.Stream(dev)
        stream.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(stream):
            for _ in range(2):   # warm up (Triton compilation, cuBLAS handles) outside the capture
                self._body(ex)
        torch.cuda.current_stream(dev).wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        self.pool = pool if pool is not None else torch.cuda.graph_pool_handle()
        with torch.cuda.graph(self.graph, pool=self.pool):
            self.logits = self._body(ex)

    def _body(self, ex: "LiveExecutor") -> torch.Tensor:
        hidden = ex.model(self.ids, self.pos, ex.kv_caches, self.meta)
        return ex.model.compute_logits(hidden)

    def run(self, ex: "LiveExecutor", batch: ScheduledBatch):
        n, size, bs = len(batch.seqs), self.size, ex.block_size
        i64 = self.host_i64.numpy().reshape(3, size)
        i32 = self.host_i32.numpy()
        ctx, tables = i32[:size], i32[size:].reshape(size, -1)
        i64[2].fill(-1)      # padding rows write no K/V ...
        ctx.fill(1)          # ... and attend to one (arbitrary) slot
        tables.fill(0)
        for i, item in enumerate(batch.seqs):
            seq, p = item.seq, item.start
            table = seq.block_table
            i64[0, i] = seq.output_token_ids[p - seq.prompt_len] if p >= seq.prompt_len else seq.request.prompt_token_ids[p]
            i64[1, i] = p
            i64[2, i] = table[p // bs] * bs + p % bs
            ctx[i] = p + 1
            tables[i, :len(table)] = table
        self.i64.copy_(self.host_i64, non_blocking=True)
        self.i32.copy_(self.host_i32, non_blocking=True)
        self.graph.replay()
        return self.logits[:n]
