"""The host side of a forward pass's inputs: one scheduled batch written into flat numpy arrays
(views of pinned staging buffers), in the layout of :mod:`kvrl.model.metadata` (prefill items
first, then one token per decode). Shared by the eager / piecewise path and the whole-step graphs.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np


def fill_step_inputs(order: Sequence, n_pre: int, block_size: int, ids: np.ndarray, pos: np.ndarray,
                     slots: np.ndarray, cu: np.ndarray, pre_ctx: np.ndarray, dec_ctx: np.ndarray,
                     pre_tab: np.ndarray, dec_tab: np.ndarray, rows: np.ndarray) -> tuple[int, int]:
    """Write the items of ``order`` (``ScheduledSeq``; the first ``n_pre`` compute prefill chunks,
    the rest one decode token each) into the arrays.

    Writes ``ids``/``pos``/``slots`` (token ids, positions, cache slots: one entry per token),
    ``cu[0 .. n_pre]`` (cumulative prefill query lengths), ``pre_ctx``/``dec_ctx`` (KV length after
    this step per prefill / decode item), block-table rows ``pre_tab[i]``/``dec_tab[j]`` up to each
    sequence's block count (entries past it are left as they are; no kernel reads a block past a
    context), and ``rows`` (the token row whose logits each sampling item needs, in order).

    Returns ``(num_tokens, num_rows)``: entries written to ``ids`` and to ``rows``.
    """
    bs = block_size
    c = num_rows = 0
    cu[0] = 0
    for i, item in enumerate(order):
        seq, start, k = item.seq, item.start, item.num_tokens
        p = np.arange(start, start + k)
        table = seq.block_table
        t = np.asarray(table, dtype=np.int64)
        ids[c:c + k] = seq.token_slice(start, start + k)
        pos[c:c + k] = p
        slots[c:c + k] = t[p // bs] * bs + p % bs
        c += k
        if i < n_pre:
            pre_tab[i, :len(table)] = table
            pre_ctx[i] = start + k
            cu[i + 1] = c
        else:
            dec_tab[i - n_pre, :len(table)] = table
            dec_ctx[i - n_pre] = start + k
        if item.num_samples:
            rows[num_rows] = c - 1
            num_rows += 1
    return c, num_rows
