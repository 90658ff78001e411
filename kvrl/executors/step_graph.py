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
  leaves most SMs idle while a few programs walk the context (H200, ``benchmarks/step_graph_ab.py``:
  Qwen3-0.6B, a 64-token prefill beside 4 decodes at 8,192 tokens took 8.0 ms whole-step against
  5.1 ms piecewise; at contexts of 1-2k the whole-step graph was 1.1-2.6x faster).
* so, per bucket of up to ``split_max_tokens`` tokens, a second graph whose decodes split their
  keys ``decode_splits`` ways (up to ``split_decodes`` decodes; a short context fills fewer
  splits, the empty ones exit at once) serves the steps whose decodes want splits: on the eager
  path (such steps used to run piecewise, whose launch-bound small steps took 1.1-1.9x their
  back-to-back time inside serving; docs/fidelity.md, session 37), and, since session 39, wherever
  few decodes read long contexts (:meth:`~kvrl.executors.step_rule.StepRule.split_pays`).

Which graph a step takes is :class:`~kvrl.executors.step_rule.StepRule` (the sim prices the same
rule). A step with more prefill items than ``max_prefills``, more decodes than ``max_decodes``, more
tokens than ``max_tokens``, a long prefill context that wants key splits, or decodes that want the
eager path's splits beyond the split graphs (more tokens than ``split_max_tokens`` or more decodes
than ``split_decodes``) runs piecewise. Padding rows hold token 0 at position 0, write no K/V
and are never sampled. Without ``capture`` (CPU, tests) the same body runs eagerly on the same
buffers.
"""
from __future__ import annotations

import logging
import time
from typing import Optional, Sequence

import numpy as np
import torch

from kvrl.executors.piecewise import TOKEN_SIZES
from kvrl.executors.step_inputs import fill_step_inputs
from kvrl.executors.step_rule import StepKey, StepRule
from kvrl.model import CausalLM, PaddedAttentionMetadata

log = logging.getLogger(__name__)


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
                 split_max_tokens: int = 512, split_decodes: int = 128, decode_splits: int = 8,
                 split_where_pays: bool = True, capture: bool = True) -> None:
        cfg = model.config
        self.model = model
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.sizes = tuple(sorted(int(s) for s in sizes if s <= max_tokens))
        if not self.sizes:
            raise ValueError(f"no token bucket up to max_tokens={max_tokens}")
        self.max_prefills = max_prefills
        self.max_decodes = min(max_decodes, self.sizes[-1])
        #: the split graphs (see the module doc): their buckets, decode capacity and key splits (none: 0 or 1)
        self.split_decodes = min(int(split_decodes), self.max_decodes) if decode_splits > 1 else 0
        self.decode_splits = int(decode_splits) if self.split_decodes else 1
        self.split_sizes = tuple(s for s in self.sizes if s <= split_max_tokens) if self.split_decodes else ()
        #: which graph serves a step (the sim's step model reads the same rule from the profile)
        self.rule = StepRule(self.sizes, max_prefills, self.max_decodes, cfg.num_heads, cfg.num_kv_heads, split_context,
                             self.split_sizes, self.split_decodes, self.decode_splits, split_where_pays)
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
        S = self.decode_splits
        self._partials = (torch.zeros(self.split_decodes, cfg.num_heads, S, cfg.head_dim, dtype=torch.float32, device=dev),
                          torch.zeros(self.split_decodes, cfg.num_heads, S, dtype=torch.float32, device=dev))
        #: steps served by a split graph so far (tests and benchmarks check that a scenario took them)
        self.split_steps = 0
        self._graphs: dict[StepKey, torch.cuda.CUDAGraph] = {}
        self._hidden: dict[StepKey, torch.Tensor] = {}
        self.capture_s = 0.0
        if capture:
            self._capture(dev)

    def _views(self, buf):
        P, D, W, s = self.max_prefills, self.max_decodes, self.width, self._starts
        cu, pre_ctx, row0, rows, dec_ctx = (buf[s[i]:s[i] + n] for i, n in enumerate((P + 1, P, 1, P + D, D)))
        return cu, pre_ctx, row0, rows, dec_ctx, buf[s[5]:s[5] + P * W].reshape(P, W), buf[s[6]:s[6] + D * W].reshape(D, W)

    # ----------------------------------------------------------------- buckets
    def bucket(self, order: Sequence, num_prefills: int) -> Optional[StepKey]:
        """The graph that serves a step of the items ``order`` (prefill items first), or None (the
        step runs piecewise): :meth:`StepRule.key_of <kvrl.executors.step_rule.StepRule.key_of>`."""
        return self.rule.key_of(order, num_prefills)

    def _meta(self, key: StepKey) -> PaddedAttentionMetadata:
        d = min(key.tokens, self.split_decodes if key.split else self.max_decodes)
        return PaddedAttentionMetadata(
            prefill_cu_seqlens_q=self._cu, prefill_context_lens=self._pre_ctx, prefill_block_tables=self._pre_tab,
            decode_context_lens=self._dec_ctx[:d], decode_block_tables=self._dec_tab[:d], decode_row0=self._row0,
            decode_splits=self.decode_splits if key.split else 1, decode_partials=self._partials if key.split else None)

    # ----------------------------------------------------------------- the step
    def _body(self, key: StepKey) -> torch.Tensor:
        size = key.tokens
        m, caches, meta = self.model, self.kv_caches, self._meta(key)
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
        keys = [StepKey(s, False) for s in self.sizes] + [StepKey(s, True) for s in self.split_sizes]
        for key in sorted(keys, reverse=True):   # largest first: the smaller ones reuse its pool memory
            size = key.tokens
            self.i64[:2 * size].zero_()
            self.i64[2 * size:3 * size].fill_(-1)
            side.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(side), torch.inference_mode():
                self._body(key)         # Triton compilation, cuBLAS handles and workspaces outside the capture
            torch.cuda.current_stream(dev).wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.inference_mode(), torch.cuda.graph(g, pool=pool):
                self._hidden[key] = self._body(key)
            self._graphs[key] = g
        torch.cuda.synchronize(dev)
        self.capture_s = time.perf_counter() - t0
        log.info("captured whole-step graphs for %d token sizes (%d..%d; %d with %d decode key splits) in %.1f s",
                 len(self.sizes), self.sizes[0], self.sizes[-1], len(self.split_sizes), self.decode_splits,
                 self.capture_s)

    def run(self, key: StepKey, order: Sequence, num_prefills: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Serve the items ``order`` (prefill items first) on the graph :meth:`bucket` chose for them.
        Returns ``(hidden, rows)``: the final-norm hidden states ``[key.tokens, hidden]`` and the
        device rows (int32) of the items that sample, in order."""
        size = key.tokens
        self.split_steps += key.split
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
        graph = self._graphs.get(key)
        if graph is None:               # not captured (CPU): the same body, now
            hidden = self._body(key)
        else:
            graph.replay()
            hidden = self._hidden[key]
        return hidden, self._rows[:num_rows]
