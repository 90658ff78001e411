"""Planning one engine step (steps 1-3 of the algorithm in :mod:`kvrl.engine.engine`): the running
sequences' next tokens and block shortages, preemption (swap or recompute), swap-in, and admission
of waiting sequences under the token budget, ``max_num_seqs`` and the watermark.

:class:`PlanningMixin` is one of :class:`~kvrl.engine.engine.Engine`'s bases and holds no state of
its own: it reads and changes the engine's queues (``running``, ``swapped``, ``preempted``,
``waiting``), allocator, metrics and policies, and reports policy faults through the engine's
``_policy_failed``/``_timed``/``_run_hooks``.
"""
from __future__ import annotations

from sys import getrefcount as refcount
from time import perf_counter
from typing import Generator, Iterable, Optional

from kvrl.engine.batch import PlainDecodes, ScheduledBatch, ScheduledSeq
from kvrl.engine.decisions import Shortage
from kvrl.engine.request import Sequence, SeqStatus
from kvrl.engine.views import SeqView
from kvrl.plugins.base import PreemptionMode


class PlanningMixin:
    """The engine's step planner: :meth:`schedule`, :meth:`_plan` and the public :meth:`preempt`."""

    def _reserved_blocks(self) -> int:
        """Free blocks the watermark policy holds back: an integer count in ``[0, num_blocks]``
        (a float is truncated); anything else, or a raise, is a policy error and falls back to
        vLLM's ``int(0.01 * num_blocks)``."""
        if not self.running:
            return 0  # an idle engine admits regardless of the watermark, so it cannot stall
        timer = self.policy_timer                  # self._timed inlined: this runs once per step or more
        t0 = perf_counter()
        timer.depth += 1
        try:
            reserved = self.watermark.reserved_blocks()
            if type(reserved) is not int or not 0 <= reserved <= self.config.num_blocks:
                if isinstance(reserved, bool) or not 0 <= float(reserved) <= self.config.num_blocks:
                    raise ValueError(f"reserved_blocks() returned {reserved!r}, not a block count in "
                                     f"[0, num_blocks={self.config.num_blocks}]")
                reserved = int(reserved)
        except Exception as exc:
            error = exc
        else:
            return reserved
        finally:
            timer.depth -= 1
            if not timer.depth:
                timer.total_s += perf_counter() - t0
        self._policy_failed("watermark", error)
        return int(0.01 * self.config.num_blocks)

    def _admit_veto(self, seq: Sequence, blocks_needed: int) -> bool:
        """The watermark policy's per-request :meth:`~kvrl.plugins.base.WatermarkPolicy.admit` (True on
        failure); not called (no view, no timing) while the policy does not veto
        (:attr:`~kvrl.plugins.base.WatermarkPolicy.vetoes`)."""
        watermark = self.watermark
        try:
            if not watermark.vetoes:
                return True
            return bool(self._timed(watermark.admit, self.view_of(seq), blocks_needed))
        except Exception as exc:
            self._policy_failed("watermark", exc, "admit")
            return True

    def preempt(self, seq_id: int, mode: PreemptionMode | str) -> PreemptionMode:
        """Preempt the running sequence ``seq_id`` between steps, through the scheduler's own path
        (the eviction policy is not asked; its ``on_preempt`` hooks run). A swap that cannot happen
        (no CPU blocks, allocator without swap) becomes a recompute, as in a step. A swap-out runs on
        the executor at once and advances the engine clock by its ``elapsed_s``. Returns the mode
        applied; ``ValueError`` if ``seq_id`` is not running or ``mode`` is not a preemption mode."""
        seq = next((s for s in self.running if s.seq_id == seq_id), None)
        if seq is None:
            raise ValueError(f"preempt: sequence {seq_id} is not running (running: {[s.seq_id for s in self.running]})")
        batch = ScheduledBatch()
        self._preempt(seq, PreemptionMode(mode), batch)
        if not batch.is_empty:
            self.now += self.executor.execute(batch).elapsed_s
        return PreemptionMode.SWAP if seq.status is SeqStatus.SWAPPED else PreemptionMode.RECOMPUTE

    def _preempt(self, seq: Sequence, mode: PreemptionMode, batch: ScheduledBatch) -> None:
        self.running.remove(seq)
        seq.num_preemptions += 1
        self.metrics.preemptions += 1
        self._groups[seq.request.request_id].record.num_preemptions += 1
        if mode is PreemptionMode.SWAP and self.allocator.supports_swap and self.allocator.can_swap_out(seq):
            pairs = self.allocator.swap_out(seq)
            batch.swap_out.extend(pairs)
            self.metrics.swapped_out_blocks += len(pairs)
            seq.status = SeqStatus.SWAPPED
            seq.shared_prefix_tokens = seq.co_read_prefix_tokens = 0     # swapped back in to private blocks
            self.swapped.append(seq)
        else:
            mode = PreemptionMode.RECOMPUTE
            self.metrics.recomputed_tokens += seq.num_computed
            self.allocator.free(seq)
            seq.num_computed = 0
            seq.status = SeqStatus.WAITING
            self.preempted.push(seq)
        self._run_hooks(self._on_preempt, self.view_of(seq), mode)

    def _num_samples(self, seq: Sequence, upto: int) -> int:
        if upto < seq.num_tokens:
            return 0
        if seq.request.n > 1 and seq.parent_seq_id is None and seq.num_output == 0:
            return seq.request.n
        return 1

    def _schedule_running(self, batch: ScheduledBatch, budget: int) -> int:
        """Schedule the running sequences, into a new ``batch``, in order until the budget is
        spent, all are scheduled, or one needs more blocks than are free (no preemption here: most
        steps have no shortage); returns the budget left. ``batch.seqs[j].seq`` is ``running[j]``
        for every item added, so :meth:`_schedule_shortage` goes on from
        ``running[len(batch.seqs)]``. Sets ``batch.plain`` to the summary of the plain decodes
        among these items (see :class:`PlainDecodes`); the sim's per-item pass
        (``SimExecutor._execute_profiled``) sums the other decodes the same way, and
        tests/test_engine_speed.py checks that the two price a step alike.

        A decode's item is the sequence's own :attr:`~Sequence.decode_item`, updated in place when
        nothing but the sequence references it any more (the previous step's batch is gone, so no
        one can see the change; CPython's reference count tells), else a new one: a new object per
        decode and step was a third of this loop's cost."""
        alloc = self.allocator
        seqs = batch.seqs                              # new: no items yet
        needs_blocks, append = alloc.needs_blocks, seqs.append
        bs = self.config.block_size
        refs = getattr(alloc, "ref_counts", None)     # paged pools: a shared partial tail is copied first
        running = self.running
        copies = batch.copies
        others: list[int] = []                         # items that are not plain decodes
        kv = shared = co_read = 0                      # plain decodes: PlainDecodes
        last = -1
        for seq in running:   # until the first block shortage (most steps have none): no preemption here
            if budget <= 0:
                break
            computed = seq.num_computed
            outputs = seq.output_token_ids
            request = seq.request
            k = request.prompt_len + len(outputs) - computed
            if k == 1 and computed % bs and request.n == 1 and outputs:
                # the most common item: a plain decode inside its own partial block (the case below,
                # without its checks; an n == 1 request's decode items all sample once)
                kv += computed
                if computed > last:
                    last = computed
                cached = seq.shared_prefix_tokens
                if cached:
                    shared += cached if cached <= computed else computed + 1
                    cached = seq.co_read_prefix_tokens
                    if cached:
                        co_read += cached if cached <= computed else computed + 1
                item = seq.decode_item
                if item is not None and refcount(item) == 3:    # held by seq and here alone: reused
                    item.start = computed
                else:
                    item = seq.decode_item = ScheduledSeq(seq, computed, 1, 1)
                append(item)
                budget -= 1
                continue
            if k == 1:   # a decode (needs_blocks and blocks_to_extend inlined): a block at a boundary
                if computed % bs:    # a shared tail is copied first; only forks share a partial block
                    fits = request.n == 1 or refs is None or refs[seq.block_table[computed // bs]] == 1
                elif len(seq.block_table) * bs > computed:
                    fits = True
                elif refs is not None:         # a paged pool, the first token of a block: a new block, no copy
                    table = seq.block_table
                    if not alloc.append_blocks(table, computed // bs + 1 - len(table)):
                        break                  # a shortage: _schedule_shortage takes it from here
                    fits = True
                else:
                    fits = False
                if fits:
                    if outputs:                # a plain decode: one sample, after the first token
                        samples = 1
                        kv += computed
                        if computed > last:
                            last = computed
                        cached = seq.shared_prefix_tokens
                        if cached:
                            shared += cached if cached <= computed else computed + 1
                            cached = seq.co_read_prefix_tokens
                            if cached:
                                co_read += cached if cached <= computed else computed + 1
                    else:
                        samples = request.n if request.n > 1 and seq.parent_seq_id is None else 1
                        others.append(len(seqs))
                    item = seq.decode_item
                    if item is not None and refcount(item) == 3:    # held by seq and here alone: reused
                        item.start = computed
                        item.num_samples = samples
                    else:
                        item = seq.decode_item = ScheduledSeq(seq, computed, 1, samples)
                    append(item)
                    budget -= 1
                    continue
            elif k > budget:
                k = budget
            upto = computed + k
            if needs_blocks(seq, upto):
                if alloc.blocks_to_extend(seq, upto) > alloc.num_free_blocks:
                    break                      # a shortage: _schedule_shortage takes it from here
                copies.extend(alloc.extend(seq, upto))
            others.append(len(seqs))
            append(ScheduledSeq(seq, computed, k, self._num_samples(seq, upto)))
            budget -= k
        batch.plain = PlainDecodes(len(seqs), others, len(seqs) - len(others), kv, last, shared, co_read)
        return budget

    def _schedule_shortage(self, batch: ScheduledBatch, budget: int) -> Generator[Shortage, object, tuple[int, bool]]:
        """Go on scheduling from the first running sequence that found too few free blocks,
        yielding each shortage for a decision (preemption may remove sequences); returns the
        budget left and whether anything was preempted."""
        alloc = self.allocator
        running = self.running
        preempted = False
        i = len(batch.seqs)                    # batch.seqs[j].seq is running[j] for every j < i
        while i < len(running) and budget > 0:
            seq = running[i]
            k = min(seq.num_tokens - seq.num_computed, budget)
            upto = seq.num_computed + k
            while (need := alloc.blocks_to_extend(seq, upto)) > alloc.num_free_blocks:
                candidates = running[i:]
                decision = yield Shortage(self.view_of(seq), [self.view_of(s) for s in candidates], need,
                                          alloc.num_free_blocks)
                victim, mode = self._check_decision(decision, candidates)
                if victim is None:   # the policy failed: only the request that needed the block is aborted
                    budget += self._abort_planned(seq.request.request_id, mode, batch)
                    i = len(batch.seqs)   # batch.seqs[j].seq is running[j] for every j < i
                    break
                self._preempt(victim, mode, batch)
                preempted = True
                if victim is seq:
                    break
            if seq.status is not SeqStatus.RUNNING:
                continue
            batch.copies.extend(alloc.extend(seq, upto))
            batch.seqs.append(ScheduledSeq(seq, seq.num_computed, k, self._num_samples(seq, upto)))
            budget -= k
            i += 1
        return budget, preempted

    def _abort_planned(self, request_id: str, reason: str, batch: ScheduledBatch) -> int:
        """Abort a request while ``batch`` is being planned. Its sequences already in the batch
        (siblings of an ``n`` > 1 request) leave it, and so do swap-outs and copies into blocks
        it held, since those blocks are free again. Returns the token budget given back."""
        group = self._groups[request_id]
        gpu = {b for s in group.seqs for b in s.block_table}
        cpu = {b for s in group.seqs for b in s.cpu_block_table}
        self.abort(request_id, reason)
        self._planned_aborts += 1
        kept = [item for item in batch.seqs if item.seq.status is SeqStatus.RUNNING]
        freed = sum(item.num_tokens for item in batch.seqs) - sum(item.num_tokens for item in kept)
        batch.seqs = kept
        batch.plain = None                     # its indices no longer hold
        batch.swap_out = [pair for pair in batch.swap_out if pair[1] not in cpu]
        batch.copies = [pair for pair in batch.copies if pair[1] not in gpu]
        return freed

    def _check_decision(self, decision, candidates: list[Sequence]) -> tuple[Optional[Sequence], object]:
        """(victim, mode) of an eviction decision, or (None, error message) when it names no
        candidate or is an exception (the eviction policy failed)."""
        try:
            if isinstance(decision, Exception):
                raise decision
            victim = next((s for s in candidates if s.seq_id == decision.seq_id), None)
            if victim is None:
                raise ValueError(f"chose seq {decision.seq_id}, which is not a candidate "
                                 f"({[s.seq_id for s in candidates]})")
            return victim, PreemptionMode(decision.mode)
        except Exception as exc:
            return None, self._policy_failed("eviction", exc)

    def _answered(self, steps: Generator[Shortage, object, object]):
        """Run a generator of :meth:`step_iter`'s kind to its end, answering every shortage with
        the eviction plugin (its exception, if it raises, is the answer: a policy error); returns
        the generator's value."""
        try:
            point = next(steps)
            while True:
                try:
                    decision = self._timed(self.eviction.select, point.candidates)
                except Exception as exc:
                    decision = exc
                point = steps.send(decision)
        except StopIteration as stop:
            return stop.value

    def _schedule_swap_in(self, batch: ScheduledBatch) -> None:
        alloc = self.allocator
        while self.swapped and len(self.running) < self.config.max_num_seqs:
            seq = self.swapped[0]
            need = alloc.blocks_to_swap_in(seq)
            if alloc.num_free_blocks - need < self._reserved_blocks() or need > alloc.num_free_blocks:
                break
            self.swapped.pop(0)
            batch.swap_in.extend(alloc.swap_in(seq))
            self.metrics.swapped_in_blocks += need
            self._mark_running(seq)

    def _mark_running(self, seq: Sequence) -> None:
        seq.status = SeqStatus.RUNNING
        seq.admitted_s = self.now
        seq.admit_order = self._admit_counter
        self._admit_counter += 1
        self.running.append(seq)

    def _waiting_order(self) -> Iterable[Sequence]:
        """New arrivals in admission order: the sorted queue itself with a static key, else the
        policy's :meth:`~SchedulerPolicy.order` (which must return a permutation of the views)."""
        if self.scheduler.static_key:
            return self.waiting
        waiting = list(self.waiting)
        try:
            views = self._timed(self.scheduler.order, [self.view_of(s) for s in waiting])
            by_id = {s.seq_id: s for s in waiting}
            order = [by_id[v.seq_id] for v in views if isinstance(v, SeqView)]
            if len(order) != len(waiting) or len(set(map(id, order))) != len(waiting):
                raise ValueError("order() must return a permutation of the waiting sequences")
            return order
        except Exception as exc:
            self._policy_failed("scheduler", exc, "order")
            return sorted(waiting, key=lambda s: (s.request.arrival_s, s.seq_id))   # FCFS fallback

    def _schedule_waiting(self, batch: ScheduledBatch, budget: int) -> None:
        """Admit recompute-preempted sequences, then new arrivals in scheduler order (the scan stops
        at the first one that does not fit; a watermark veto skips one). Linear in the sequences
        scanned, not in the queue length: admitted ones leave their queue in O(1) each. The caller
        checks that one of the two queues is not empty."""
        cfg, alloc = self.config, self.allocator
        stop = False
        for queue, order in ((self.preempted, self.preempted), (self.waiting, self._waiting_order())):
            taken: list[Sequence] = []
            for seq in order:
                if budget <= 0 or len(self.running) >= cfg.max_num_seqs:
                    stop = True
                    break
                match = alloc.match_prefix(seq)
                start = match.num_tokens(cfg.block_size)
                remaining = seq.num_tokens - start
                if not cfg.chunked_prefill and remaining > budget:
                    stop = True
                    break
                k = min(remaining, budget)
                need = alloc.admission_blocks(seq, match)
                if self.running and not self._admit_veto(seq, need):
                    continue
                if alloc.num_free_blocks - need < self._reserved_blocks():
                    stop = True
                    break
                if not alloc.can_admit(seq, match, start + k):
                    stop = True
                    break
                batch.copies.extend(alloc.admit(seq, match, start + k))
                self.metrics.prefix_check_failures += match.check_failed
                if seq.num_preemptions == 0:
                    self.metrics.prompt_tokens_looked_up += seq.prompt_len
                    self.metrics.prompt_tokens_hit += start
                    seq.num_cached_prompt_tokens = start
                seq.shared_prefix_tokens = start
                seq.co_read_prefix_tokens = (len(match.block_ids) - match.num_evictable) * cfg.block_size
                self._mark_running(seq)
                taken.append(seq)
                batch.seqs.append(ScheduledSeq(seq, start, k, self._num_samples(seq, start + k)))
                budget -= k
            for seq in taken:
                queue.remove(seq)
            if stop:
                break

    def schedule(self) -> ScheduledBatch:
        """Plan one step (allocating blocks); the caller must execute it and call :meth:`apply`.
        The eviction plugin answers every shortage; without one, no generator is involved (the
        engine's per-step cost matters in sim)."""
        batch, budget, marks = self._plan_running()
        preempted = False
        if budget > 0 and len(batch.seqs) < len(self.running):
            budget, preempted = self._answered(self._schedule_shortage(batch, budget))
        return self._plan_rest(batch, budget, preempted, marks)

    def _plan(self) -> Generator[Shortage, object, ScheduledBatch]:
        """:meth:`schedule` as a generator of its block shortages (see :meth:`step_iter`)."""
        batch, budget, marks = self._plan_running()
        preempted = False
        if budget > 0 and len(batch.seqs) < len(self.running):
            budget, preempted = yield from self._schedule_shortage(batch, budget)
        return self._plan_rest(batch, budget, preempted, marks)

    def _plan_running(self) -> tuple[ScheduledBatch, int, tuple[int, int]]:
        """A new step's batch with the running sequences scheduled up to the first shortage
        (:meth:`_schedule_running`), the budget left, and the admission and preemption counters
        before it."""
        waiting, preempted = len(self.waiting), len(self.preempted)
        finished = len(self.metrics.finished_output_lens)
        batch = ScheduledBatch(copies=self._pending_copies, num_waiting=waiting + preempted,
                               num_finished=finished - self._finished_at_schedule)
        self._finished_at_schedule = finished
        self._pending_copies = []
        marks = (self._admit_counter, self.metrics.preemptions)
        return batch, self._schedule_running(batch, self.config.max_num_batched_tokens), marks

    def _plan_rest(self, batch: ScheduledBatch, budget: int, preempted: bool, marks: tuple[int, int]) -> ScheduledBatch:
        """Swap-ins and admissions (unless something was preempted) and the batch's host counts."""
        if not preempted:
            if self.swapped:
                self._schedule_swap_in(batch)
            if self.waiting or self.preempted:
                self._schedule_waiting(batch, budget)
        if self._tiered:
            batch.tier_out, batch.tier_in, batch.disk_out, batch.disk_in = self.allocator.take_tier_ops()
        batch.num_admitted = self._admit_counter - marks[0]
        batch.num_preempted = self.metrics.preemptions - marks[1]
        return batch
