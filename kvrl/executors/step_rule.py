"""Which graph the live executor runs a step with prefill chunks on, from the step's shape alone
(:class:`StepRule`): the rule of :class:`~kvrl.executors.step_graph.StepGraphs`, here so that the
sim's step model (:mod:`kvrl.executors.profile`) can price the path the executor takes.

The paths (docs/fidelity.md, sessions 37-39):

* a **whole-step graph** of the step's token bucket, one key split for prefill and decode attention;
* a **split graph** of that bucket (at most ``split_max_tokens`` tokens and ``split_decodes``
  decodes): its decode attention splits every context ``decode_splits`` ways. It serves the steps
  whose decodes would split their keys on the eager path (a context past ``split_context``), and,
  with ``split_where_pays``, those whose longest decode reads at least ``split_min_context`` keys and
  ``split_keys_per_decode`` per decode: few decodes over long contexts leave most SMs idle on one
  split. On an H200 the split graph took 0.55-0.91 of the plain graph's time for 4-16 decodes whose
  longest read 1,024-3,584 tokens, 0.95 for 64 decodes at 2,048 and 1.06-1.10 for 64 at 1,024
  (Qwen3-0.6B; Llama-3-8B 0.69-0.94 and 0.98-0.99; ``benchmarks/step_path_probe.py``, session 38).
  With the longest decode at 512-768 keys and the others at 128 (session 40), the split graph took
  0.83-0.99 of the plain graph's time on the steps the rule sends to it (Llama-3-8B 0.93-1.01), and
  0.91-1.09 on those it keeps on the plain graph (0.97-1.03): the threshold sits at break-even;
* **piecewise** (None): more prefill items, decodes or tokens than the graphs hold, a long prefill
  context whose keys the eager path splits, or decodes that want the eager path's key splits beyond
  the split graphs' limits.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import NamedTuple, Optional, Sequence

#: streaming multiprocessors assumed by the rule (an H100 / H200), so that the rule, and the sim's
#: reading of it, do not depend on the machine
SMS = 132


class StepKey(NamedTuple):
    """One captured whole-step graph: its token bucket, and whether its decodes split their keys."""

    tokens: int
    split: bool


@dataclass(frozen=True)
class StepRule:
    """The graph a step runs on (see the module doc). ``sizes``: the whole-step graphs' token
    buckets; ``split_sizes``: those with a split graph (empty: none); ``heads`` / ``kv_heads``: the
    model's attention heads, which the eager path's split pickers read."""

    sizes: tuple[int, ...]
    max_prefills: int
    max_decodes: int
    heads: int
    kv_heads: int
    split_context: int = 4096
    split_sizes: tuple[int, ...] = ()
    split_decodes: int = 0
    decode_splits: int = 1
    split_where_pays: bool = True
    split_min_context: int = 512
    split_keys_per_decode: int = 32

    @classmethod
    def from_dict(cls, d: dict) -> "StepRule":
        return cls(**{**d, "sizes": tuple(d["sizes"]), "split_sizes": tuple(d.get("split_sizes", ()))})

    def to_dict(self) -> dict:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}

    def split_pays(self, n_dec: int, dec_max: int) -> bool:
        """Whether a split graph is faster than the plain one for ``n_dec`` decodes whose longest
        context is ``dec_max`` tokens (``split_where_pays``; see the module doc)."""
        return (self.split_where_pays and n_dec > 0
                and dec_max >= max(self.split_min_context, self.split_keys_per_decode * n_dec))

    def key(self, num_tokens: int, n_pre: int, pre_max_q: int, pre_max_ctx: int, n_dec: int,
            dec_max: int) -> Optional[StepKey]:
        """The graph of a step of ``num_tokens`` tokens: ``n_pre`` prefill items, the largest of
        ``pre_max_q`` query tokens, the longest prefill context ``pre_max_ctx`` tokens (cached and
        new), ``n_dec`` decodes, the longest of ``dec_max`` tokens. None: piecewise."""
        if n_pre > self.max_prefills or n_dec > self.max_decodes or num_tokens <= 0:
            return None
        i = bisect.bisect_left(self.sizes, num_tokens)
        if i == len(self.sizes):
            return None
        if pre_max_ctx > self.split_context and _prefill_splits(self.heads, pre_max_q, n_pre, pre_max_ctx) > 1:
            return None
        eager_split = dec_max > self.split_context and _decode_splits(n_dec, self.kv_heads, dec_max) > 1
        if (self.split_sizes and num_tokens <= self.split_sizes[-1] and n_dec <= self.split_decodes
                and (eager_split or self.split_pays(n_dec, dec_max))):
            return StepKey(self.sizes[i], True)
        return None if eager_split else StepKey(self.sizes[i], False)

    def split_piece(self, num_tokens: int, n_pre: int, pre_max_q: int, pre_max_ctx: int, n_dec: int,
                    dec_max: int) -> int:
        """For a step that prefills beside decodes (:meth:`key`'s arguments), on a split graph: the longest
        of its longest decode context's ``decode_splits`` pieces, in tokens; otherwise 0. What the sim's
        step model prices that step's longest key walk by (fit version 13)."""
        if not (n_pre and n_dec) or dec_max < self._split_from:
            return 0
        key = self.key(num_tokens, n_pre, pre_max_q, pre_max_ctx, n_dec, dec_max)
        return -(-dec_max // self.decode_splits) if key is not None and key.split else 0

    @property
    def _split_from(self) -> int:
        """No step whose longest decode is shorter runs on a split graph (:meth:`split_piece`'s first test)."""
        eager = self.split_context + 1
        return min(self.split_min_context, eager) if self.split_where_pays else eager

    def key_of(self, order: Sequence, n_pre: int) -> Optional[StepKey]:
        """:meth:`key` of the scheduled items ``order`` (prefill items first)."""
        pre = order[:n_pre]
        return self.key(sum(item.num_tokens for item in order), n_pre,
                        max((item.num_tokens for item in pre), default=0),
                        max((item.start + item.num_tokens for item in pre), default=0), len(order) - n_pre,
                        max((item.start + 1 for item in order[n_pre:]), default=0))


def _prefill_splits(heads: int, max_q: int, n_pre: int, ctx: int) -> int:
    """The eager prefill kernel's key splits (its own picker, 64-row query tiles)."""
    from kvrl.kernels.triton_prefill import pick_prefill_splits

    return pick_prefill_splits(heads, max_q, n_pre, ctx, 64, SMS)


def _decode_splits(n_dec: int, kv_heads: int, ctx: int) -> int:
    """The eager decode kernel's key splits (its own picker)."""
    from kvrl.kernels.triton_decode import pick_num_splits

    return pick_num_splits(n_dec, kv_heads, ctx, SMS)
