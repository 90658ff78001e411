"""Whole-step CUDA graphs for the steps a decode graph cannot serve (prefill chunks, alone or beside
decodes): embedding, every layer with its attention, and the final norm, replayed as one graph per
token bucket.

Why: piecewise graphs (:mod:`kvrl.executors.piecewise`) replay all but attention, which they launch
from Python per layer (2-4 Triton launches each, 20-70 us of host time apiece). A small model's
mixed step is then bound by the host: on an H200, Qwen3-0.6B took 4.6 ms for a 177-token prefill
beside one decode, against 2.0 ms for a graph decode of 32 sequences, and 1.6-1.8x longer in the
windows where the lent VM's vCPU ran slow (docs/fidelity.md, run 31). Here attention too is launched
from buffer shapes alone (:func:`kvrl.kernels.paged_step_attention`), so the whole step is one graph:

* per bucket ``Tp`` (:data:`~kvrl.executors.piecewise.TOKEN_SIZES` up to ``max_tokens``) the
  prefill kernel's grid covers ``Tp`` query rows of up to ``max_prefills`` sequences and the
  decode kernel's ``min(Tp, max_decodes)`` sequences; programs with nothing to do exit at once;
* inputs live in static buffers: token ids, positions and slots (int64, one upload), and the
  attention metadata (int32: a header of query offsets, context lengths, the first decode row and
  the rows to sample, then the used block-table rows; up to three uploads);
* the price: one key split for prefill and decode attention. Where the eager path would split a
  short query or a few decodes over a context of more than ``split_context`` tokens, one split
  leaves most SMs idle while a few programs walk the context, and the step runs piecewise instead
  (H200, ``benchmarks/step_graph_ab.py``: Qwen3-0.6B, a 64-token prefill beside 4 decodes at 8,192
  tokens took 8.0 ms whole-step against 5.1 ms piecewise; at contexts of 1-2k the whole-step graph
  was 1.1-2.6x faster).

A step with more prefill items than ``max_prefills``, more decodes than ``max_decodes``, more
tokens than ``max_tokens``, or long contexts that want key splits (above) runs piecewise. Padding rows hold token 0 at position 0, write no K/V
and are never sampled. Without ``capture`` (CPU, tests) the same body runs eagerly on the same
buffers.
"""
from __future__ import annotations

import bisect
import logging
import time
from typing import Optional, Sequence

import numpy as np
import torch

from kvrl.executors.piecewise import TOKEN_SIZES
from kvrl.executors.step_inputs import fill_step_inputs
from kvrl.model import CausalLM, PaddedAttentionMetadata

log = logging.getLogger(__name__)

#: streaming multiprocessors assumed by the split rule (an H100 / H200), so the rule, and the sim's
#: reading of it, do not depend on the machine
_SMS = 132


def _aligned(n: int) -> int:
    """``n`` int32 entries rounded up to 16 bytes (Triton specialises kernels on pointer alignment)."""
    return -(-n // 4) * 4


class StepGraphs:
    """Captured whole steps of one model over one KV pool, one per token bucket (see module doc).

    Use: :meth:`bucket` picks the graph of a step (or None), :meth:`run` fills its inputs from the
    step's items, replays it and returns the final-norm hidden states and the rows to sample.
    """

    def __init__(self, model: CausalLM, kv_caches: list[tuple[torch.Tensor, torch.Tensor]], block_size: int,
                 max_blocks_per_seq: int, sizes: Sequence[int] = TOKEN_SIZES, max_tokens: int = 2048,
                 max_prefills: int = 16, max_decodes: int = 512, split_context: int = 4096,
                 capture: bool = True) -> None:
        cfg = model.config
        self.model = model
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.sizes = tuple(sorted(int(s) for s in sizes if s <= max_tokens))
        if not self.sizes:
            raise ValueError(f"no token bucket up to max_tokens={max_tokens}")
        self.max_prefills = max_prefills
        self.split_context = split_context
        self._heads = (cfg.num_heads, cfg.num_kv_heads)
        self.max_decodes = min(max_decodes, self.sizes[-1])
        p = next(model.parameters())
        dev, dtype = p.device, p.dtype
        pin = dev.type == "cuda"
        t_max, P, D, W = self.sizes[-1], max_prefills, self.max_decodes, max_blocks_per_seq
        self.width = W
        #: per bucket Tp: ids, positions, slots in i64[0:3Tp]
        self.i64 = torch.zeros(3 * t_max, dtype=torch.int64, device=dev)
        self.host_i64 = torch.zeros(3 * t_max, dtype=torch.int64, pin_memory=pin)
        # int32: header [cu (P+1) | prefill ctx (P) | decode row0 (1) | rows to sample (P+D) | decode ctx (D)],
        # then prefill tables [P, W], then decode tables [D, W]; each region 16-byte aligned
        regions = (P + 1, P, 1, P + D, D, P * W, D * W)
        self._starts = [int(x) for x in np.cumsum([0] + [_aligned(n) for n in regions])]
        self.header = self._starts[5]
        self.i32 = torch.zeros(self._starts[-1], dtype=torch.int32, device=dev)
        self.host_i32 = torch.zeros(self._starts[-1], dtype=torch.int32, pin_memory=pin)
        dv = self._views(self.i32)
        self._host = self._views(self.host_i32.numpy())
        self._cu, self._pre_ctx, self._row0, self._rows, self._dec_ctx, self._pre_tab, self._dec_tab = dv
        self.attn_out = torch.zeros(t_max, cfg.num_heads, cfg.head_dim, dtype=dtype, device=dev)
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._hidden: dict[int, torch.Tensor] = {}
        self.capture_s = 0.0
        if capture:
            self._capture(dev)

    def _views(self, buf):
        P, D, W, s = self.max_prefills, self.max_decodes, self.width, self._starts
        cu, pre_ctx, row0, rows, dec_ctx = (buf[s[i]:s[i] + n] for i, n in enumerate((P + 1, P, 1, P + D, D)))
        return cu, pre_ctx, row0, rows, dec_ctx, buf[s[5]:s[5] + P * W].reshape(P, W), buf[s[6]:s[6] + D * W].reshape(D, W)

    # ----------------------------------------------------------------- buckets
    def bucket(self, order: Sequence, num_prefills: int) -> Optional[int]:
        """The bucket whose graph serves a step of the items ``order`` (prefill items first), or
        None (the step runs piecewise; see the module doc)."""
        num_tokens = sum(item.num_tokens for item in order)
        num_decodes = len(order) - num_prefills
        if num_prefills > self.max_prefills or num_decodes > self.max_decodes or num_tokens <= 0:
            return None
        i = bisect.bisect_left(self.sizes, num_tokens)
        if i == len(self.sizes) or self._wants_splits(order, num_prefills):
            return None
        return self.sizes[i]

    def _wants_splits(self, order: Sequence, n_pre: int) -> bool:
        """Whether the eager path would split the keys of this step's attention over contexts
        longer than ``split_context`` (its split pickers, on the step's longest contexts)."""
        from kvrl.kernels.triton_decode import pick_num_splits
        from kvrl.kernels.triton_prefill import pick_prefill_splits

        heads, kv_heads = self._heads
        pre_ctx = max((item.start + item.num_tokens for item in order[:n_pre]), default=0)
        dec_ctx = max((item.start + 1 for item in order[n_pre:]), default=0)
        if pre_ctx > self.split_context:
            q_max = max(item.num_tokens for item in order[:n_pre])
            if pick_prefill_splits(heads, q_max, n_pre, pre_ctx, 64, _SMS) > 1:
                return True
        return dec_ctx > self.split_context and pick_num_splits(len(order) - n_pre, kv_heads, dec_ctx, _SMS) > 1

    def _meta(self, size: int) -> PaddedAttentionMetadata:
        d = min(size, self.max_decodes)
        return PaddedAttentionMetadata(
            prefill_cu_seqlens_q=self._cu, prefill_context_lens=self._pre_ctx, prefill_block_tables=self._pre_tab,
            decode_context_lens=self._dec_ctx[:d], decode_block_tables=self._dec_tab[:d], decode_row0=self._row0)

    # ----------------------------------------------------------------- the step
    def _body(self, size: int) -> torch.Tensor:
        m, caches, meta = self.model, self.kv_caches, self._meta(size)
        ids, pos, slots = self.i64[:3 * size].view(3, size)
        out = self.attn_out[:size]
        hidden, cos, sin = m.embed(ids, pos)
        residual = None
        for layer, cache in zip(m.layers, caches):
            q, residual = layer.before_attention(hidden, residual, cos, sin, cache, slots)
            hidden, residual = layer.after_attention(layer.self_attn.attend_padded(q, cache, meta, out), residual)
        return m.final_norm(hidden, residual)

    def _capture(self, dev: torch.device) -> None:
        t0 = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream(dev)
        self._cu.zero_()               # warm-up and capture: no prefill rows, no decodes, no K/V written
        self._dec_ctx.zero_()
        for size in reversed(self.sizes):   # largest first: the smaller ones reuse its pool memory
            self.i64[:2 * size].zero_()
            self.i64[2 * size:3 * size].fill_(-1)
            side.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(side), torch.inference_mode():
                self._body(size)        # Triton compilation, cuBLAS handles and workspaces outside the capture
            torch.cuda.current_stream(dev).wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.inference_mode(), torch.cuda.graph(g, pool=pool):
                self._hidden[size] = self._body(size)
            self._graphs[size] = g
        torch.cuda.synchronize(dev)
        self.capture_s = time.perf_counter() - t0
        log.info("captured whole-step graphs for %d token sizes (%d..%d) in %.1f s",
                 len(self.sizes), self.sizes[0], self.sizes[-1], self.capture_s)

    def run(self, size: int, order: Sequence, num_prefills: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Serve the items ``order`` (prefill items first; counts that :meth:`bucket` mapped to
        ``size``). Returns ``(hidden, rows)``: the final-norm hidden states ``[size, hidden]`` and the
        device rows (int32) of the items that sample, in order."""
        n_pre, n_dec = num_prefills, len(order) - num_prefills
        h64 = self.host_i64.numpy()[:3 * size]
        ids, pos, slots = h64[:size], h64[size:2 * size], h64[2 * size:]
        cu, pre_ctx, row0, rows, dec_ctx, pre_tab, dec_tab = self._host
        num_tokens, num_rows = fill_step_inputs(order, n_pre, self.block_size, ids, pos, slots, cu, pre_ctx,
                                                dec_ctx, pre_tab, dec_tab, rows)
        cu[n_pre + 1:] = cu[n_pre]      # unused prefill entries: no query rows
        row0[0] = cu[n_pre]
        dec_ctx[n_dec:] = 0             # unused decode entries: skipped
        ids[num_tokens:] = 0            # padding rows: token 0 at position 0, no K/V written
        pos[num_tokens:] = 0
        slots[num_tokens:] = -1
        self.i64[:3 * size].copy_(self.host_i64[:3 * size], non_blocking=True)
        self.i32[:self.header].copy_(self.host_i32[:self.header], non_blocking=True)
        W, s = self.width, self._starts
        if n_pre:
            self.i32[s[5]:s[5] + n_pre * W].copy_(self.host_i32[s[5]:s[5] + n_pre * W], non_blocking=True)
        if n_dec:
            self.i32[s[6]:s[6] + n_dec * W].copy_(self.host_i32[s[6]:s[6] + n_dec * W], non_blocking=True)
        graph = self._graphs.get(size)
        if graph is None:               # not captured (CPU): the same body, now
            hidden = self._body(size)
        else:
            graph.replay()
            hidden = self._hidden[size]
        return hidden, self._rows[:num_rows]
