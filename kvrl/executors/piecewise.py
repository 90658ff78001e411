"""Piecewise CUDA graphs: steps that a full decode graph cannot serve (prefill chunks, mixed
prefill + decode batches), with everything but attention replayed from graphs.

Why: a small model's eager step is bound by the host that issues its kernels. On an H200, a
Qwen3-0.6B step of one 64-token prefill chunk and 32 decodes issued ~340 kernels from Python in
~29 ms while the GPU needed ~4 ms (``benchmarks/eager_overhead.py``): a Triton launch costs the
host 20-70 us, a cuBLAS GEMM ~20 us. Everything of a layer except attention has shapes that
depend only on the number of tokens ``T``; attention's grid depends on the batch's sequences.
So, per token bucket ``Tp`` (:data:`TOKEN_SIZES`), ``L + 1`` graphs are captured:

* ``0``: embedding + rotary tables + layer 0 up to attention (norm, QKV, q/k norm + rotary, K/V write);
* ``i`` in ``1..L-1``: layer ``i-1`` after attention (output projection, residual + norm, MLP)
  + layer ``i`` up to attention;
* ``L``: layer ``L-1`` after attention + the final norm;

and attention runs eagerly between them on the real rows only. A step of ``T`` tokens is padded
to the smallest bucket ``Tp >= T``: padding rows hold token 0 at position 0, write no K/V (slot
-1) and are never sampled; rows are independent in every captured op, so padding does not change
the real rows' values beyond what a different GEMM shape may round differently.

All graphs read and write static buffers sized for the largest bucket, so the buckets share them;
intermediates live in one graph memory pool. Without ``capture`` (CPU, tests) the very same
segment functions run eagerly on the same buffers.
"""
from __future__ import annotations

import bisect
import logging
import time
from typing import Callable, Optional, Sequence

import torch

from kvrl.model import AttentionMetadata, CausalLM

log = logging.getLogger(__name__)

#: token buckets (about 1.25-1.5x apart, so padding wastes at most a third of a step's dense work)
TOKEN_SIZES = (16, 32, 48, 64, 96, 128, 192, 256, 320, 384, 512, 640, 768, 1024, 1280, 1536, 2048,
               2560, 3072, 4096, 5120, 6144, 8192)


class PiecewiseGraphs:
    """The captured segments of one model over one KV pool, for every token bucket in ``sizes``.

    Use: fill :meth:`inputs` ``(ids, positions, slots)`` of the bucket (length ``Tp`` each,
    padding included), then :meth:`run` with the step's attention metadata; it returns the
    final-norm hidden states of the first ``num_tokens`` rows.
    """

    def __init__(self, model: CausalLM, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
                 sizes: Sequence[int] = TOKEN_SIZES, capture: bool = True) -> None:
        cfg = model.config
        self.model = model
        self.kv_caches = kv_caches
        self.sizes = tuple(sorted(int(s) for s in sizes))
        t_max = self.sizes[-1]
        p = next(model.parameters())
        dev, dtype = p.device, p.dtype
        #: per bucket Tp the graphs read ids, positions and slots from i64[0:3Tp] (one upload)
        self.i64 = torch.zeros(3 * t_max, dtype=torch.int64, device=dev)
        self.cos = torch.zeros(t_max, 1, cfg.head_dim, dtype=dtype, device=dev)
        self.sin = torch.zeros_like(self.cos)
        self.q = torch.zeros(t_max, cfg.num_heads, cfg.head_dim, dtype=dtype, device=dev)
        self.attn_out = torch.zeros_like(self.q)
        self.residual = torch.zeros(t_max, cfg.hidden_size, dtype=dtype, device=dev)
        self.hidden = torch.zeros_like(self.residual)
        self._segments: dict[int, list[Callable[[], None]]] = {}
        self.capture_s = 0.0
        if capture:
            self._capture(dev)

    # ----------------------------------------------------------------- buckets and inputs
    def bucket(self, num_tokens: int) -> Optional[int]:
        """The smallest bucket holding ``num_tokens`` tokens, or None (the step runs eagerly)."""
        i = bisect.bisect_left(self.sizes, num_tokens)
        return self.sizes[i] if i < len(self.sizes) and num_tokens > 0 else None

    def inputs(self, size: int) -> torch.Tensor:
        """The device buffer ``[3 * size]`` (ids, positions, slots) the bucket's graphs read."""
        return self.i64[:3 * size]

    # ----------------------------------------------------------------- segments
    def _segment_fns(self, size: int) -> list[Callable[[], None]]:
        m, n = self.model, size
        ids, pos, slots = self.i64[:3 * n].view(3, n)
        cos, sin, q, attn_out = self.cos[:n], self.sin[:n], self.q[:n], self.attn_out[:n]
        residual, hidden = self.residual[:n], self.hidden[:n]
        layers, caches = m.layers, self.kv_caches

        def first() -> None:
            h, c, s = m.embed(ids, pos)
            cos.copy_(c)
            sin.copy_(s)
            qq, r = layers[0].before_attention(h, None, cos, sin, caches[0], slots)
            q.copy_(qq)
            residual.copy_(r)

        def middle(i: int) -> Callable[[], None]:
            def run() -> None:
                h, r = layers[i - 1].after_attention(attn_out, residual)
                qq, r = layers[i].before_attention(h, r, cos, sin, caches[i], slots)
                q.copy_(qq)
                residual.copy_(r)
            return run

        def last() -> None:
            h, r = layers[-1].after_attention(attn_out, residual)
            hidden.copy_(m.final_norm(h, r))

        return [first, *(middle(i) for i in range(1, len(layers))), last]

    def _capture(self, dev: torch.device) -> None:
        t0 = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream(dev)
        for size in reversed(self.sizes):   # largest first: the smaller ones reuse its pool memory
            ids_pos, slots = self.i64[:2 * size], self.i64[2 * size:3 * size]
            ids_pos.zero_()
            slots.fill_(-1)   # warm-up and capture write no K/V
            fns = self._segment_fns(size)
            side.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(side), torch.inference_mode():
                for fn in fns:   # cuBLAS handles and workspaces outside the capture
                    fn()
            torch.cuda.current_stream(dev).wait_stream(side)
            graphs = []
            with torch.inference_mode():
                for fn in fns:
                    g = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(g, pool=pool):
                        fn()
                    graphs.append(g.replay)
            self._segments[size] = graphs
        torch.cuda.synchronize(dev)
        self.capture_s = time.perf_counter() - t0
        log.info("captured piecewise graphs for %d token sizes (%d..%d) in %.1f s",
                 len(self.sizes), self.sizes[0], self.sizes[-1], self.capture_s)

    def run(self, size: int, num_tokens: int, meta: AttentionMetadata) -> torch.Tensor:
        """One forward pass of the bucket ``size`` whose :meth:`inputs` are filled; attention over
        ``meta`` (``num_tokens`` real rows). Returns the final-norm hidden states ``[num_tokens, hidden]``."""
        segments = self._segments.get(size)
        if segments is None:   # eager mode (no capture): the same functions, run now
            segments = self._segments[size] = self._segment_fns(size)
        q, out = self.q[:num_tokens], self.attn_out[:num_tokens]
        segments[0]()
        for i, layer in enumerate(self.model.layers):
            layer.self_attn.attend(q, self.kv_caches[i], meta, out=out)
            segments[i + 1]()
        return self.hidden[:num_tokens]
