"""Applying an executed step (step 5 of the algorithm in :mod:`kvrl.engine.engine`): computed and
sampled tokens, copy-on-write forks of parallel-sampling requests, finishes (blocks released,
request metrics closed) and the aborts of items the executor reports as failed.

:class:`AccountingMixin` is one of :class:`~kvrl.engine.engine.Engine`'s bases and holds no state
of its own: it changes the engine's sequences, groups, allocator and metrics.
"""
from __future__ import annotations

from typing import Optional

from kvrl.engine.batch import DecodeTokens, ScheduledBatch
from kvrl.engine.request import Sequence, SeqStatus


class AccountingMixin:
    """The engine's bookkeeping after a step: :meth:`apply` and the finishes and forks it causes."""

    def _finish(self, seq: Sequence) -> None:
        self.allocator.free(seq)
        seq.decode_item = None          # no item <-> sequence cycle left behind
        seq.status = SeqStatus.FINISHED
        seq.finish_s = self.now
        self.metrics.finished_output_lens.append(seq.num_output)
        if self._on_finish:
            self._run_hooks(self._on_finish, self.view_of(seq))
        group = self._groups[seq.request.request_id]
        group.num_open -= 1
        rec = group.record
        rec.output_tokens += seq.num_output
        if group.num_open == 0:
            rec.finish_s = self.now
            tpots = [(s.finish_s - s.first_token_s) / (s.num_output - 1) for s in group.seqs if s.num_output > 1]
            rec.tpot_s = sum(tpots) / len(tpots) if tpots else None
            self.metrics.num_finished += 1
        self._views.pop(seq.seq_id, None)

    def _fork(self, seq: Sequence, tokens: list[int]) -> list[Sequence]:
        group = self._groups[seq.request.request_id]
        children = []
        for token in tokens:
            child = self._new_seq(seq.request, parent=seq)
            self._pending_copies.extend(self.allocator.fork(seq, child))
            child.output_token_ids.append(token)
            child.first_token_s = seq.first_token_s
            child.shared_prefix_tokens = seq.shared_prefix_tokens
            child.co_read_prefix_tokens = seq.co_read_prefix_tokens
            self._mark_running(child)
            group.seqs.append(child)
            group.num_open += 1
            children.append(child)
        return children

    def apply(self, batch: ScheduledBatch, sampled: list[Optional[list[int]]],
              errors: Optional[dict[int, str]] = None, decode_tokens: Optional[DecodeTokens] = None) -> tuple[int, int]:
        """Record the executed batch item by item: computed tokens (the block pool's bookkeeping),
        sampled tokens, forks, and the abort of each failed item's request (``errors``: item index
        -> reason) as it comes; then the finishes. Returns the batch's (prefill tokens, decode
        tokens), counting every item. A ``None`` entry of ``sampled`` is a plain decode whose token
        follows ``decode_tokens`` (see :class:`~kvrl.engine.batch.StepOutput`); with ``errors``
        there must be none.

        One loop for the whole batch, the per-step hot path of the engine: a decode token inside a
        block (most of them) is counted without a call (see ``on_computed`` of the allocators): on
        a pool with ``exact_tail_fill`` its block's :attr:`block_fill` entry is left to lag behind
        (the pool settles it from the sequence before reading it), on others it is raised here;
        everything else is handed to the pool in one ``on_computed_batch`` call, in batch order,
        before anything that could read or change the prefix cache (an abort, the finishes)."""
        alloc = self.allocator
        computed, fill, bs = [], alloc.block_fill, alloc.block_size
        failed = {id(batch.seqs[i]): reason for i, reason in errors.items()} if errors else None
        groups = self._groups
        done: list[Sequence] = []
        running, now = SeqStatus.RUNNING, self.now
        added = prefill = num_prefills = 0
        # a decode's partial block holds old % bs tokens; its fill entry may lag (see the pool)
        exact = getattr(alloc, "exact_tail_fill", False)
        if decode_tokens is not None:
            offsets, tb, tm = decode_tokens.seq_offsets(self._next_seq_id), decode_tokens.b, decode_tokens.m
            last_decode = self._last_decode
            if exact:
                added = sampled.count(None)    # a token each for the plain decodes (those that fill a block: below)
        for item, tokens in zip(batch.seqs, sampled):
            seq = item.seq
            if tokens is None:       # a plain decode (running: with no errors, no item aborts another)
                old = item.start
                new = old + 1
                tail = new % bs
                if not tail:
                    if exact:
                        added -= 1   # counted by on_computed_batch
                    computed.append((seq, old, new))
                elif not exact:
                    block = seq.block_table[old // bs]
                    f = fill[block]
                    if f < tail:
                        added += tail - f
                        fill[block] = tail
                seq.num_computed = new
                seq.output_token_ids.append((offsets[seq.seq_id] + old * tb) % tm)     # decode_tokens' rule
                if old >= last_decode[seq.seq_id]:      # its output_len-th token: one decode per token
                    done.append(seq)
                continue
            k = item.num_tokens
            if k == 1 and failed is None and seq.status is running:
                # a decode, the common item: the checks of the general case below skipped
                old = item.start
                new = old + 1
                tail = new % bs
                if tail:
                    if exact:
                        added += 1
                    else:
                        block = seq.block_table[old // bs]
                        if fill[block] < tail:
                            added += tail - fill[block]
                            fill[block] = tail
                else:
                    computed.append((seq, old, new))
            else:
                if k != 1:
                    prefill += k
                    num_prefills += 1
                if seq.status is not running:
                    continue
                if failed and id(item) in failed:
                    if computed:
                        alloc.on_computed_batch(computed)
                        computed = []
                    self.abort(seq.request.request_id, failed[id(item)])
                    continue
                old = item.start
                new = old + k
                if k == 1 and new % bs:
                    if exact:
                        added += 1
                    else:
                        block = seq.block_table[old // bs]
                        f = new % bs - fill[block]
                        if f > 0:
                            added += f
                            fill[block] += f
                else:
                    computed.append((seq, old, new))
            seq.num_computed = new
            if not tokens:
                continue
            if seq.first_token_s < 0.0:    # a float literal: Python compares two floats faster
                seq.first_token_s = now
                groups[seq.request.request_id].record.first_token_s = now
            outputs = seq.output_token_ids
            outputs.append(tokens[0])
            if len(outputs) >= seq.request.output_len:
                done.append(seq)
            if len(tokens) > 1:
                done += [c for c in self._fork(seq, tokens[1:]) if c.num_output >= c.request.output_len]
        alloc.add_stored_tokens(added)
        if computed:
            alloc.on_computed_batch(computed)
        for seq in done:
            if seq.status is running:     # not aborted by a later item's error
                self._finish(seq)
        if done:      # the finished leave the running list, in place (the same list a filter would give)
            remove = self.running.remove
            for seq in done:
                if seq.status is SeqStatus.FINISHED:
                    remove(seq)
        return prefill, len(batch.seqs) - num_prefills
