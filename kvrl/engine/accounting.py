"""Applying an executed step (step 5 of the algorithm in :mod:`kvrl.engine.engine`): computed and
sampled tokens, copy-on-write forks of parallel-sampling requests, finishes (blocks released,
request metrics closed) and the aborts of items the executor reports as failed.

:class:`AccountingMixin` is one of :class:`~kvrl.engine.engine.Engine`'s bases and holds no state
of its own: it changes the engine's sequences, groups, allocator and metrics.
"""
from __future__ import annotations

from typing import Optional

from kvrl.engine.batch import ScheduledBatch
from kvrl.engine.request import Sequence, SeqStatus


class AccountingMixin:
    """The engine's bookkeeping after a step: :meth:`apply` and the finishes and forks it causes."""

    def _finish(self, seq: Sequence) -> None:
        self.allocator.free(seq)
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
            self._mark_running(child)
            group.seqs.append(child)
            group.num_open += 1
            children.append(child)
        return children

    def apply(self, batch: ScheduledBatch, sampled: list[list[int]], errors: Optional[dict[int, str]] = None) -> None:
        """Record the executed batch: computed tokens, sampled tokens, forks, finishes, failures."""
        if errors:
            self._apply_with_errors(batch, sampled, errors)
            return
        done: list[Sequence] = []
        running, now = SeqStatus.RUNNING, self.now
        # the block pool first, for the whole batch in one call (the order of its bookkeeping across
        # sequences does not matter: forks below only add references to blocks already held)
        self.allocator.on_batch_computed(batch.seqs)
        for item, tokens in zip(batch.seqs, sampled):
            seq = item.seq
            if seq.status is not running:
                continue
            seq.num_computed = item.start + item.num_tokens
            if not tokens:
                continue
            if seq.first_token_s < 0:
                seq.first_token_s = now
                self._groups[seq.request.request_id].record.first_token_s = now
            outputs = seq.output_token_ids
            outputs.append(tokens[0])
            if len(outputs) >= seq.request.output_len:
                done.append(seq)
            if len(tokens) > 1:
                done += [c for c in self._fork(seq, tokens[1:]) if c.num_output >= c.request.output_len]
        for seq in done:
            if seq.status is running:
                self._finish(seq)
        if done:
            self.running = [s for s in self.running if s.status is SeqStatus.RUNNING]

    def _apply_with_errors(self, batch: ScheduledBatch, sampled: list[list[int]], errors: dict[int, str]) -> None:
        """:meth:`apply` item by item, aborting the requests of failed items as they come."""
        done: list[Sequence] = []
        on_computed, running, now = self.allocator.on_computed, SeqStatus.RUNNING, self.now
        for idx, (item, tokens) in enumerate(zip(batch.seqs, sampled)):
            seq = item.seq
            if seq.status is not running:
                continue
            if errors and idx in errors:
                self.abort(seq.request.request_id, errors[idx])
                continue
            old = item.start
            new = old + item.num_tokens
            on_computed(seq, old, new)
            seq.num_computed = new
            if not tokens:
                continue
            if seq.first_token_s < 0:
                seq.first_token_s = now
                self._groups[seq.request.request_id].record.first_token_s = now
            outputs = seq.output_token_ids
            outputs.append(tokens[0])
            if len(outputs) >= seq.request.output_len:
                done.append(seq)
            if len(tokens) > 1:
                done += [c for c in self._fork(seq, tokens[1:]) if c.num_output >= c.request.output_len]
        for seq in done:
            if seq.status is SeqStatus.RUNNING:   # not aborted by a later item's error
                self._finish(seq)
        if done:
            self.running = [s for s in self.running if s.status is SeqStatus.RUNNING]
