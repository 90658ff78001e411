"""The step shapes ``kvrl-profile`` times: the grid presets (:data:`GRIDS`), the batches built
directly on the live executor's KV pool (:class:`BatchFactory`), the grid's points and random
engine-like steps.
"""
from __future__ import annotations

from typing import Any

import numpy as np


GRIDS: dict[str, dict[str, Any]] = {
    "gpu": dict(
        decode_batch=[1, 2, 4, 8, 16, 32, 64, 128, 256],
        decode_ctx=[128, 512, 1024, 2048, 4096],
        eager_decode=True,
        ragged_batch=[8, 64, 256], ragged_ctx=[512, 2048],
        prefill_tokens=[16, 64, 256, 512, 1024, 2048, 4096, 8192],
        prefill_seqs=[1, 4, 16],
        prefix_query=[16, 128, 512, 2048], prefix_cached=[1024, 4096, 16384],
        mixed_batch=[16, 64, 256], mixed_ctx=[512, 2048], mixed_prefill=[256, 2048],
        mixed_long_batch=[8, 32, 96], mixed_long_ctx=[1024, 4096], mixed_long_prefill=[32, 256],
        mixed_long_cached=[0, 1024],
        split_batch=[4, 16, 64], split_ctx=[1024, 2048, 8192], split_prefill=[64, 256],
        scatter_batch=[16, 64], scatter_ctx=[1024, 2048],
        shared_batch=[16, 64], shared_ctx=[1024, 2048], shared_prefix=[512, 1024], shared_mixed_prefill=256,
        copies=[1, 16, 128, 1024],
        swaps=[1, 4, 16, 64, 128, 256, 512, 1024],
        overlap_batch=64, overlap_ctx=1024, overlap_swap_in=[16, 256],
        random=160, holdout=40,
        host_requests=192, host_prompt=[32, 1024], host_output=[16, 256], host_rate=60.0,
        host_shared_prefix=[4, 256, 768], host_pressure_fraction=0.5, host_lengths="uniform", kv_fill="zeros",
        warmup=3, reps=7, point_budget_s=1.0, fit_stat="median", interleave=True,
    ),
    "cpu": dict(
        decode_batch=[1, 2, 4, 8, 16, 32],
        decode_ctx=[16, 64, 256, 512],
        eager_decode=True,
        ragged_batch=[4, 16], ragged_ctx=[64, 256],
        prefill_tokens=[2, 8, 32, 64, 128, 256],
        prefill_seqs=[1, 4],
        prefix_query=[8, 64], prefix_cached=[64, 512],
        mixed_batch=[4, 16], mixed_ctx=[64, 256], mixed_prefill=[32, 128],
        mixed_long_batch=[4, 16], mixed_long_ctx=[256], mixed_long_prefill=[8, 32],
        mixed_long_cached=[0, 64],
        split_batch=[2, 8], split_ctx=[64, 256], split_prefill=[8],
        scatter_batch=[8], scatter_ctx=[256],
        shared_batch=[8], shared_ctx=[256], shared_prefix=[64, 128], shared_mixed_prefill=32,
        copies=[1, 4, 16, 64],
        swaps=[1, 4, 16, 64],
        overlap_batch=8, overlap_ctx=64, overlap_swap_in=[4, 32],
        random=24, holdout=24,
        host_requests=24, host_prompt=[8, 128], host_output=[4, 32], host_rate=None,
        host_shared_prefix=[2, 16, 48], host_pressure_fraction=0.5, host_lengths="uniform", kv_fill="zeros",
        warmup=1, reps=7, point_budget_s=0.25, fit_stat="min", interleave=True,
    ),
}


class BatchFactory:
    """Builds :class:`ScheduledBatch` objects over minimal sequences whose block tables take
    blocks of the executor's pool in order (cyclically when a batch needs more than the pool)."""

    def __init__(self, num_blocks: int, block_size: int, vocab_size: int, max_len: int, seed: int = 0) -> None:
        self.num_blocks, self.block_size = num_blocks, block_size
        rng = np.random.default_rng(seed)
        self.tokens = rng.integers(0, vocab_size, max_len + 1, dtype=np.int32)
        #: a fixed permutation of the pool: ``scatter`` batches take their blocks in this order
        self._scattered = rng.permutation(num_blocks)
        self._order = None
        self._next_block = 0
        self._next_id = 0

    def _seq(self, length: int, shared: list[int] = ()):
        """A sequence of ``length`` tokens whose block table starts with the ``shared`` blocks (a
        prefix-cache hit: ``shared_prefix_tokens`` is set to the tokens they hold) and takes its
        other blocks in order."""
        from kvrl.engine.request import Request, Sequence

        req = Request(f"p{self._next_id}", 0.0, self.tokens[:length], 1)
        seq = Sequence(self._next_id, req)
        self._next_id += 1
        n = -(-length // self.block_size) - len(shared)
        own = [(self._next_block + i) % self.num_blocks for i in range(n)]
        if self._order is not None:
            own = [int(self._order[b]) for b in own]
        seq.block_table = [*shared, *own]
        seq.shared_prefix_tokens = len(shared) * self.block_size
        self._next_block = (self._next_block + n) % self.num_blocks
        return seq

    def batch(self, decode_lens=(), prefills=(), copies: int = 0, swap_out: int = 0, swap_in: int = 0,
              scatter: bool = False, shared_prefix: int = 0, prefix_groups: int = 1):
        """``decode_lens``: context length of each decode (its last token is computed);
        ``prefills``: ``(query_tokens, cached_tokens)`` pairs; ``scatter``: block tables take blocks
        spread over the whole pool in a random order (as after many preemptions, swaps and
        evictions) instead of consecutive ones; ``shared_prefix``: every decode's first
        ``shared_prefix`` tokens (whole blocks, rounded down) are prefix-cache hits, as on a
        common system prompt, held in ``prefix_groups`` sets of KV blocks: decode ``i`` reads set
        ``i % prefix_groups`` (1, the default: every decode reads the same blocks; as many as the
        decodes: each reads its own, each marked shared). The first reader of each set holds its
        prefix as shared, every later one also as co-read (``Sequence.co_read_prefix_tokens``), as
        the engine marks a sequence admitted onto blocks another one holds."""
        from kvrl.engine.batch import ScheduledBatch, ScheduledSeq

        self._next_block = 0
        self._order = self._scattered if scatter else None
        n_shared = shared_prefix // self.block_size
        groups = [list(range(g * n_shared, (g + 1) * n_shared)) for g in range(max(prefix_groups, 1))]
        self._next_block = len(groups) * n_shared
        items = []
        for k, start in prefills:
            items.append(ScheduledSeq(self._seq(start + k), start, k, 1))
        for i, length in enumerate(decode_lens):
            shared = groups[i % len(groups)] if length > n_shared * self.block_size else []
            seq = self._seq(length, shared)
            if i >= len(groups):       # a later reader of its prefix set (as admitted after the first)
                seq.co_read_prefix_tokens = seq.shared_prefix_tokens
            items.append(ScheduledSeq(seq, length - 1, 1, 1))
        self._order = None
        nb = self.num_blocks
        b = ScheduledBatch(seqs=items)
        # block operations use blocks from the top of the pool: disjoint src/dst for copies
        b.copies = [((nb - 1 - i) % nb, (nb - 1 - copies - i) % nb) for i in range(copies)]
        b.swap_out = [((nb - 1 - i) % nb, i) for i in range(swap_out)]
        b.swap_in = [(i, (nb - 1 - i) % nb) for i in range(swap_in)]
        return b


def ragged(batch: int, ctx: int) -> list[int]:
    """``batch`` lengths spread evenly over [ctx/8, 2 ctx - ctx/8] (mean ctx)."""
    lo, hi = max(ctx // 8, 1), max(2 * ctx - ctx // 8, 1)
    return [int(round(v)) for v in np.linspace(lo, hi, batch)] if batch > 1 else [ctx]


def grid_points(g: dict, graphs: bool, max_len: int) -> list[tuple[str, bool, dict]]:
    """(group, use_graph, batch kwargs) for every grid point."""
    pts: list[tuple[str, bool, dict]] = []
    modes = ([True] if graphs else []) + ([False] if (g["eager_decode"] or not graphs) else [])
    for graph in modes:
        for b in g["decode_batch"]:
            for L in g["decode_ctx"]:
                if L <= max_len:
                    pts.append(("decode", graph, {"decode_lens": [L] * b}))
        for b in g["ragged_batch"]:
            for L in g["ragged_ctx"]:
                if 2 * L <= max_len:
                    pts.append(("ragged", graph, {"decode_lens": ragged(b, L)}))
    for n in g["prefill_tokens"]:
        for s in g["prefill_seqs"]:
            if n // s >= 2 and n // s <= max_len:
                sizes = [n // s + (1 if i < n % s else 0) for i in range(s)]
                pts.append(("prefill", False, {"prefills": [(k, 0) for k in sizes]}))
    for q in g["prefix_query"]:
        for c in g["prefix_cached"]:
            if q >= 2 and q + c <= max_len:
                pts.append(("prefix", False, {"prefills": [(q, c)]}))
    for b in g["mixed_batch"]:
        for L in g["mixed_ctx"]:
            for n in g["mixed_prefill"]:
                if L <= max_len and n <= max_len:
                    pts.append(("mixed", False, {"decode_lens": [L] * b, "prefills": [(n, 0)]}))
    # small prefill chunks (fresh or over a cached prefix) beside many long decodes: the mixed steps
    # of a pressured engine (re-prefills, prefix hits) that fit version 9's mixed_dec prices
    for b in g.get("mixed_long_batch", ()):
        for L in g["mixed_long_ctx"]:
            for n in g["mixed_long_prefill"]:
                for c in g["mixed_long_cached"]:
                    if L <= max_len and n + c <= max_len:
                        pts.append(("mixed_long", False, {"decode_lens": [L] * b, "prefills": [(n, c)]}))
    # a small prefill beside a few decodes, one of them long, the rest at a quarter of it: the steps the live
    # executor runs on split whole-step graphs (kvrl.executors.step_rule), which fit version 13's path term prices
    for b in g.get("split_batch", ()):
        for L in g["split_ctx"]:
            for n in g["split_prefill"]:
                if L <= max_len:
                    pts.append(("split_mixed", False, {"decode_lens": [L] + [max(L // 4, 2)] * (b - 1),
                                                       "prefills": [(n, 0)]}))
    # diagnostic, never fitted: decode batches whose KV blocks are scattered over the pool; the fit
    # report's error on them is what scattering costs beyond the model (which has no such feature)
    for b in g.get("scatter_batch", ()):
        for L in g["scatter_ctx"]:
            if L <= max_len:
                pts.append(("scatter", graphs, {"decode_lens": [L] * b, "scatter": True}))
                pts.append(("scatter_ref", graphs, {"decode_lens": [L] * b}))
    # decodes over a common prefix held in the same KV blocks (prefix-cache hits on a shared system
    # prompt), alone and beside a prefill chunk: they identify the price of a shared KV token, which
    # the engine runs alone left to chance (fit 9 priced it at 3x an unshared one, 0 before)
    for b in g.get("shared_batch", ()):
        for L in g["shared_ctx"]:
            for s in g["shared_prefix"]:
                if s < L <= max_len:
                    for graph in modes:
                        pts.append(("shared", graph, {"decode_lens": [L] * b, "shared_prefix": s}))
                    pts.append(("shared_mixed", False, {"decode_lens": [L] * b, "shared_prefix": s,
                                                       "prefills": [(g["shared_mixed_prefill"], 0)]}))
    for n in g["copies"]:
        pts.append(("copy", False, {"copies": n}))
    for n in g["swaps"]:
        pts.append(("swap_out", False, {"swap_out": n}))
        pts.append(("swap_in", False, {"swap_in": n}))
    for n in g["overlap_swap_in"]:
        pts.append(("overlap", graphs, {"decode_lens": [g["overlap_ctx"]] * g["overlap_batch"], "swap_in": n}))
    return pts


def random_points(g: dict, n: int, graphs: bool, max_len: int, seed: int, group: str = "holdout") -> list[tuple[str, bool, dict]]:
    """``n`` random steps like the engine makes, inside the grid's ranges but off its points:
    decode batches with lognormal context lengths (coefficient of variation 0.2-1.5, so some
    batches are as ragged as a serving trace's), one to four prefills (fresh or over a cached
    prefix), or both. ``group="random"`` steps are fitted; ``holdout`` ones (another seed) never."""
    rng = np.random.default_rng(seed + (7919 if group == "holdout" else 104729))
    max_b, max_l = max(g["decode_batch"]), min(max(g["decode_ctx"]), max_len)
    min_l = min(g["decode_ctx"])
    max_n = max(g["prefill_tokens"])
    logu = lambda lo, hi: float(np.exp(rng.uniform(np.log(lo), np.log(hi))))
    pts = []
    for _ in range(n):
        r = rng.random()
        decodes, prefills = [], []
        if r < 0.8:
            b = max(1, int(round(logu(1, max_b))))
            mean, cv = logu(min_l, max_l), rng.uniform(0.2, 1.5)
            sigma = float(np.sqrt(np.log1p(cv * cv)))
            lens = rng.lognormal(np.log(mean) - sigma * sigma / 2, sigma, b)
            decodes = [int(v) for v in np.clip(lens, 2, min(4 * max_l, max_len))]
        if r >= 0.4 or not decodes:
            for _ in range(int(rng.integers(1, 5))):
                k = max(2, int(logu(2, max_n / 2)))
                start = 0 if rng.random() < 0.6 else int(logu(16, max_l))
                k = min(k, max_len - start)
                if k >= 2:
                    prefills.append((k, start))
        graph = graphs and not prefills and rng.random() < 0.85
        pts.append((group, graph, {"decode_lens": decodes, "prefills": prefills}))
    return pts
