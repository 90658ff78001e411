"""The paged serving engine: continuous batching with chunked prefill, policy plugins, preemption.

One :meth:`Engine.step`:
1. running sequences (oldest admission first) get their next tokens (1 for decode, a chunk for
   an unfinished prefill) while the token budget lasts; a sequence that needs a block when none
   is free triggers the eviction policy (swap or recompute a victim) until it fits or is itself
   the victim (:meth:`Engine.step_iter` yields each such shortage to its caller instead, see
   :mod:`kvrl.engine.decisions`);
2. if nothing was preempted: swapped sequences are swapped back in (FIFO) while the watermark
   allows; they compute from the next step on, so the copy overlaps this step (prefetch);
3. if nothing was preempted: waiting sequences (recompute-preempted ones first, then new arrivals
   in the scheduler policy's order) are admitted while the budget, ``max_num_seqs`` and the
   watermark allow; each admission reuses its cached prefix blocks;
4. the executor runs the batch and reports the step's duration; the clock advances by it (plus
   the policies' wall time since the previous step with ``engine.charge_policy_time``);
5. sampled tokens are appended, parallel-sampling requests fork (copy-on-write) after their
   prefill, finished sequences release their blocks.

Policy faults (``engine.policy_errors=isolate``, the default) stay with the request they concern.
A policy call that raises or returns something outside its contract is a *policy error*: it is
counted (``metrics.policy_errors``; one warning per policy kind and error type, with the counts
at the end of the run) and replaced by a fallback:

- scheduler ``key()``: the request is queued behind every request the policy could rank, in
  arrival order (FCFS); ``order()``: FCFS for that step;
- watermark ``reserved_blocks()`` (must be an integer count in ``[0, num_blocks]``): vLLM's
  ``int(0.01 * num_blocks)`` for that call; ``admit()``: admit;
- eviction ``select()`` (must name a candidate): the request whose sequence needed the block is
  aborted alone; its sequences already placed in this step's batch leave the batch with their
  block operations, so the executor never sees a sequence without blocks;
- prefix cache: see :mod:`kvrl.engine.guards` (no caching for that call, nothing aborted);
- event hooks: the event is dropped.

With ``engine.policy_errors=raise`` the first policy error stops the run (:class:`PolicyError`).
Every policy call is timed (``policy_time_s`` in :meth:`MetricsCollector.wall_clock` and
metrics.json: wall seconds, outermost calls only).

Cost: a step's work is linear in what it schedules and scans, never in the queue lengths: the
waiting queues (:class:`~kvrl.engine.queues.SeqQueue`) keep their order and drop admitted
sequences in O(1), so an offline batch of ``N`` requests costs O(N) overall, not O(N^2).

Where the code lives: steps 1-3 (planning, preemption, admission) in :mod:`kvrl.engine.planning`,
step 5 (applying the executed batch) in :mod:`kvrl.engine.accounting`; both are bases of
:class:`Engine`, which keeps the state, the requests, the policy-call guards and the driving loop.
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from time import perf_counter
from typing import TYPE_CHECKING, Generator, Iterable, Optional

import numpy as np

from kvrl.engine.accounting import AccountingMixin
from kvrl.engine.allocators import make_allocator, request_blocks
from kvrl.engine.batch import ScheduledBatch
from kvrl.engine.callbacks import StepEvent
from kvrl.engine.config import EngineConfig
from kvrl.engine.decisions import Shortage
from kvrl.engine.guards import guard_prefix_cache
from kvrl.engine.loop import ServingLoop
from kvrl.engine.metrics import MetricsCollector, RequestRecord
from kvrl.engine.planning import PlanningMixin
from kvrl.engine.queues import SeqQueue
from kvrl.engine.request import Request, RequestRejected, Sequence, SeqStatus
from kvrl.engine.views import EngineView, SeqView
from kvrl.plugins.base import EvictionPolicy, Policy, PrefixCachePolicy, SchedulerPolicy, WatermarkPolicy

if TYPE_CHECKING:   # executors sit above the engine (import-linter layers in pyproject.toml)
    from kvrl.executors.base import Executor

log = logging.getLogger(__name__)


class PolicyError(RuntimeError):
    """A policy plugin raised or returned an invalid decision."""


@dataclass
class _Group:
    """All sequences of one request (``n`` > 1 after the fork) and its metrics record."""

    request: Request
    record: RequestRecord
    seqs: list[Sequence] = field(default_factory=list)
    num_open: int = 1


class Engine(PlanningMixin, AccountingMixin):
    """Paged KV-cache engine driving an :class:`Executor` with four policy plugins."""

    def __init__(self, config: EngineConfig, executor: Executor, scheduler: SchedulerPolicy,
                 watermark: WatermarkPolicy, eviction: EvictionPolicy, prefix_cache: PrefixCachePolicy,
                 slo_ttft_s: Optional[float] = None, slo_tpot_s: Optional[float] = None,
                 record_steps: bool = True, tier: Optional[Policy] = None) -> None:
        config = self.resolve_config(config, executor)
        if config.num_blocks < 1:
            raise ValueError("engine.num_blocks resolved to 0: the KV cache does not fit in device memory")
        if executor.vocab_size > 2**31:     # block identities encode token ids as int32 (kvrl.engine.hashing)
            raise ValueError(f"the model's vocabulary ({executor.vocab_size} ids) exceeds 2**31 token ids")
        self.config = config
        self.executor = executor
        self.scheduler, self.watermark, self.eviction, self.prefix_cache = scheduler, watermark, eviction, prefix_cache
        self.now = 0.0
        self.step_index = 0
        self.metrics = MetricsCollector(config.num_blocks, config.block_size, slo_ttft_s, slo_tpot_s,
                                        record_steps=record_steps)
        self.policy_timer = self.metrics.policy_timer
        self._charged_s = 0.0                        # policy seconds already added to the clock
        self._planned_aborts = 0                     # requests aborted while planning a step
        guarded = guard_prefix_cache(prefix_cache, self.policy_timer,
                                     lambda call, exc: self._policy_failed("prefix_cache", exc, call))
        # CPU tier under the prefix cache (issue #20; kvrl.engine.tiers): only with engine.cpu_tier_blocks > 0
        self.tier = tier
        self._tiered = config.cpu_tier_blocks > 0
        if self._tiered:
            from kvrl.engine.tiers import make_tiered_allocator
            if tier is None:
                from kvrl import plugins
                self.tier = tier = plugins.create("tier", "offload_all")
            self.allocator = make_tiered_allocator(
                config, guarded, lambda: self.now, tier, executor.kv_block_bytes(config.block_size),
                self.policy_timer, lambda call, exc: self._policy_failed("tier", exc, call))
            self.metrics.extra_summary = self.allocator.summary
        else:
            self.allocator = make_allocator(config, guarded, clock=lambda: self.now)
        executor.allocate_kv(config.num_blocks, config.num_cpu_blocks, config.block_size)
        if self._tiered:
            executor.allocate_tier(config.cpu_tier_blocks, config.block_size)
            self.allocator.bind_executor(executor)
        self.running: list[Sequence] = []
        self.swapped: list[Sequence] = []
        self.preempted = SeqQueue()                  # recompute victims, served before new arrivals
        # new arrivals, sorted by (0, key) with a static key ((1, arrival, seq_id) if key() failed)
        self.waiting = SeqQueue(keyed=scheduler.static_key)
        self._groups: dict[str, _Group] = {}
        self._views: dict[int, SeqView] = {}
        self._next_seq_id = 0
        self._last_decode: list[int] = []         # by seq_id: where its last decode starts (apply's finish test)
        self._admit_counter = 0
        self._pending_copies: list[tuple[int, int]] = []   # fork copies for the next step
        self._finished_at_schedule = 0                     # finished sequences counted into a batch so far
        self.view = EngineView(self)
        for policy in (scheduler, watermark, eviction, prefix_cache, *([self.tier] if self._tiered else [])):
            policy.bind(self.view)
        # every policy's event hooks (prefix cache and tier included); only hooks a policy overrides
        # are called (the engine's per-step overhead matters in sim)
        hooked = (scheduler, watermark, eviction, prefix_cache, *([self.tier] if self._tiered else []))
        self._on_step_end = [p.on_step_end for p in hooked if type(p).on_step_end is not Policy.on_step_end]
        self._on_finish = [p.on_finish for p in hooked if type(p).on_finish is not Policy.on_finish]
        self._on_preempt = [p.on_preempt for p in hooked if type(p).on_preempt is not Policy.on_preempt]
        self._callbacks: list = []                   # kvrl.engine.callbacks: observers of every executed step
        self.stopped_by = None                       # the callback that asked the current run to stop

    @staticmethod
    def resolve_config(config: EngineConfig, executor: Executor) -> EngineConfig:
        """A new config with what ``config`` leaves to the executor filled in (``max_model_len``
        when None, ``num_blocks`` when 0: the KV capacity at ``gpu_memory_utilization``,
        ``num_cpu_blocks`` when None: ``swap_space_gb`` worth of blocks); always a new object, so the
        engine never shares or changes its caller's config."""
        resolved = {}
        if config.max_model_len is None:
            resolved["max_model_len"] = executor.max_model_len
        if config.num_blocks == 0:
            resolved["num_blocks"] = executor.kv_capacity_blocks(config.block_size, config.gpu_memory_utilization)
        if config.num_cpu_blocks is None:
            resolved["num_cpu_blocks"] = int(config.swap_space_gb * 2**30 // executor.kv_block_bytes(config.block_size))
        return dataclasses.replace(config, **resolved)

    def add_callback(self, callback):
        """Call ``callback.on_step(event)`` after every executed step (see :mod:`kvrl.engine.callbacks`);
        returns ``callback``. Raises ``TypeError`` if it has no callable ``on_step``."""
        if not callable(getattr(callback, "on_step", None)):
            raise TypeError(f"engine callback {callback!r} has no callable on_step(event) -> bool")
        self._callbacks.append(callback)
        return callback

    def remove_callback(self, callback) -> None:
        """Stop calling ``callback`` (``ValueError`` if it is not registered)."""
        self._callbacks.remove(callback)

    @property
    def callbacks(self) -> tuple:
        """The registered callbacks, in call order."""
        return tuple(self._callbacks)

    # ================================================================== requests
    def view_of(self, seq: Sequence) -> SeqView:
        view = self._views.get(seq.seq_id)
        if view is None:
            view = self._views[seq.seq_id] = SeqView(seq, self)
        return view

    def _new_seq(self, request: Request, parent: Optional[Sequence] = None) -> Sequence:
        seq = Sequence(self._next_seq_id, request, parent_seq_id=None if parent is None else parent.seq_id)
        self._next_seq_id += 1
        self._last_decode.append(request.prompt_len + request.output_len - 2)
        return seq

    def check_request(self, request: Request) -> None:
        """Raise :class:`RequestRejected` (with what to change) if ``request`` can never be served."""
        request.validate()
        cfg = self.config
        rid = request.request_id
        if rid in self._groups:
            raise RequestRejected(f"request {rid!r}: duplicate request_id")
        total = request.prompt_len + request.output_len
        if total > cfg.max_model_len:
            raise RequestRejected(
                f"request {rid!r}: prompt ({request.prompt_len}) + output ({request.output_len}) tokens exceed "
                f"max_model_len={cfg.max_model_len}; shorten the prompt, lower output_len, or raise engine.max_model_len")
        if int(np.maximum.reduce(request.prompt_token_ids)) >= self.executor.vocab_size:   # (ndarray.max, unwrapped)
            raise RequestRejected(f"request {rid!r}: token id {int(request.prompt_token_ids.max())} is outside the "
                                  f"model's vocabulary (size {self.executor.vocab_size})")
        if not cfg.chunked_prefill and total > cfg.max_num_batched_tokens:
            raise RequestRejected(
                f"request {rid!r}: {total} tokens cannot be (re)computed in one step of "
                f"engine.max_num_batched_tokens={cfg.max_num_batched_tokens} with engine.chunked_prefill=false; "
                f"raise the budget or enable chunked prefill")
        need = request_blocks(cfg, request)
        if need > cfg.num_blocks:
            raise RequestRejected(
                f"request {rid!r} needs {need} KV blocks alone but engine.num_blocks={cfg.num_blocks}; "
                f"raise engine.num_blocks (or use a smaller request)")

    def add_request(self, request: Request) -> None:
        """Queue ``request`` (its arrival time should not be in the future). Raises
        :class:`RequestRejected` if it can never be served; nothing else is affected."""
        self.check_request(request)
        seq = self._new_seq(request)
        self._groups[request.request_id] = _Group(request, self.metrics.add_request(request), [seq])
        self._enqueue_waiting(seq)

    def _enqueue_waiting(self, seq: Sequence) -> None:
        """Queue a new arrival; with a static key, at its key's place (a key that raises or cannot
        be compared with the others is a policy error: the sequence queues in the FCFS tail)."""
        seq.status = SeqStatus.WAITING
        if not self.scheduler.static_key:
            self.waiting.push(seq)
            return
        timer = self.policy_timer
        t0 = perf_counter()
        timer.depth += 1
        try:
            self.waiting.push(seq, (0, self.scheduler.key(self.view_of(seq))))
            return
        except Exception as exc:
            error = exc
        finally:
            timer.depth -= 1
            if not timer.depth:
                timer.total_s += perf_counter() - t0
        self._policy_failed("scheduler", error)
        self.waiting.push(seq, (1, seq.request.arrival_s, seq.seq_id))

    def abort(self, request_id: str, reason: str) -> bool:
        """Abort every unfinished sequence of a request, free its blocks, and record ``reason``.

        A request with no open sequence left (finished, or already aborted) is not changed: returns
        False. Raises ``KeyError`` for an unknown request id."""
        group = self._groups[request_id]
        if group.num_open <= 0:
            return False
        for seq in group.seqs:
            if not seq.is_finished:
                self._drop(seq)
                seq.status = SeqStatus.ABORTED
                seq.error = reason
        group.num_open = 0
        group.record.error = reason
        group.record.finish_s = self.now
        log.warning("aborted request %s: %s", request_id, reason)
        return True

    def _drop(self, seq: Sequence) -> None:
        """Remove ``seq`` from whichever queue holds it and free its blocks."""
        for queue in (self.running, self.swapped):
            if seq in queue:
                queue.remove(seq)
                break
        else:
            self.preempted.remove(seq) or self.waiting.remove(seq)
        self.allocator.free(seq)
        seq.decode_item = None          # no item <-> sequence cycle left behind

    def outputs(self, request_id: str) -> list[list[int]]:
        """Generated token ids of each sample of a request (in fork order)."""
        return [list(s.output_token_ids) for s in self._groups[request_id].seqs]

    def sequences(self, request_id: str) -> list[Sequence]:
        """The sequences of an added request (in fork order). ``KeyError`` naming the id if it was
        never added (or was rejected)."""
        group = self._groups.get(request_id)
        if group is None:
            raise KeyError(f"request {request_id!r} was not added to this engine")
        return list(group.seqs)

    def is_open(self, request_id: str) -> bool:
        """Whether ``request_id`` was added and still has a sequence that neither finished nor was
        aborted (False for an id never added or rejected)."""
        group = self._groups.get(request_id)
        return group is not None and group.num_open > 0

    @property
    def has_unfinished(self) -> bool:
        return bool(self.running or self.swapped or self.preempted or self.waiting)

    def live_sequences(self) -> list[Sequence]:
        return [*self.running, *self.swapped, *self.preempted, *self.waiting]

    def set_output_len(self, seq: Sequence, output_len: int) -> None:
        """Make the live sequence ``seq`` finish after ``output_len`` output tokens (more than it has
        generated): a what-if on a copied engine, e.g. a planner serving guessed output lengths
        (kvrl.envs.guess). ``ValueError`` if ``output_len`` is not above the tokens already generated."""
        if output_len <= len(seq.output_token_ids):
            raise ValueError(f"seq {seq.seq_id}: output_len {output_len} is not above the "
                             f"{len(seq.output_token_ids)} tokens it has generated")
        seq.request = dataclasses.replace(seq.request, output_len=output_len)
        self._last_decode[seq.seq_id] = seq.request.prompt_len + output_len - 2

    # ================================================================== policy calls
    def _policy_failed(self, kind: str, error: Exception | str, call: str = "") -> str:
        """Record a failing policy call and return its message; re-raise under
        ``engine.policy_errors=raise``. The first error of each (policy kind, call, error type) is
        logged; later ones are counted (``metrics.policy_error_counts``) and summed up by :meth:`run`."""
        detail = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        message = f"{kind} policy failed{f' in {call}' if call else ''}: {detail}"
        if self.config.policy_errors == "raise":
            raise PolicyError(message) from (error if isinstance(error, Exception) else None)
        self.metrics.policy_errors += 1
        key = f"{kind} {call}".strip() + f": {type(error).__name__ if isinstance(error, Exception) else 'invalid'}"
        count = self.metrics.policy_error_counts.get(key, 0) + 1
        self.metrics.policy_error_counts[key] = count
        if count == 1:
            log.warning("%s (step %d; further errors of this kind are counted, not logged)", message, self.step_index)
        return message

    def _timed(self, fn, *args):
        """``fn(*args)``, its wall time added to the policy timer (outermost calls only)."""
        timer = self.policy_timer
        t0 = perf_counter()
        timer.depth += 1
        try:
            return fn(*args)
        finally:
            timer.depth -= 1
            if not timer.depth:
                timer.total_s += perf_counter() - t0

    def _run_hooks(self, hooks, *args) -> None:
        for hook in hooks:
            try:
                self._timed(hook, *args)
            except Exception as exc:
                kind = getattr(getattr(hook, "__self__", None), "plugin_kind", "") or "policy"
                self._policy_failed(kind, exc, getattr(hook, "__name__", "hook"))

    # ================================================================== driving
    def step(self) -> ScheduledBatch:
        """Schedule, execute and apply one step, the eviction plugin answering every block
        shortage; returns the executed batch."""
        aborts = self._planned_aborts
        return self._execute(self.schedule(), aborts)

    def step_iter(self) -> Generator[Shortage, object, ScheduledBatch]:
        """One step as a generator: yields a :class:`~kvrl.engine.decisions.Shortage` each time
        a running sequence needs a block while none is free, and receives the decision through
        ``send`` (an :class:`~kvrl.plugins.base.EvictionDecision`; see :mod:`kvrl.engine.decisions`);
        returns the executed batch (``StopIteration.value``). :meth:`step` is this generator
        answered by the eviction plugin, so both compute the same step for the same decisions."""
        aborts = self._planned_aborts
        return self._execute((yield from self._plan()), aborts)

    def _execute(self, batch: ScheduledBatch, aborts: int) -> ScheduledBatch:
        """Execute a planned ``batch`` and apply it (``aborts``: :attr:`_planned_aborts` before
        planning it, to tell an empty batch that aborted requests from a stall)."""
        if batch.is_empty:
            if self.has_unfinished and self._planned_aborts == aborts:
                raise RuntimeError("engine made no progress although requests are pending (engine bug)")
            return batch
        callbacks = self._callbacks
        t0 = perf_counter() if callbacks else 0.0
        out = self.executor.execute(batch)
        execute_wall_s = perf_counter() - t0 if callbacks else 0.0
        batch.plain = None            # for this execute only (a kept batch is priced again from its items)
        if out.decode_tokens is not None and (callbacks or out.errors):
            out.resolve(batch)        # what callbacks see, and apply with errors, has every token
        if len(out.sampled) != len(batch.seqs):
            raise RuntimeError(f"executor returned {len(out.sampled)} samples for {len(batch.seqs)} sequences")
        duration = out.elapsed_s
        if self.config.charge_policy_time and not self.executor.measures_host_time:
            duration += self.policy_timer.total_s - self._charged_s    # policy time since the last step
            self._charged_s = self.policy_timer.total_s
        if out.host_gap_s is not None:
            self.metrics.record_host_gap(out.host_gap_s, out.host_gap_counted)
        self.now += duration
        self.step_index += 1
        prefill, decodes = self.apply(batch, out.sampled, out.errors, out.decode_tokens)
        metrics = self.metrics
        if metrics.record_steps:
            metrics.record_step(
                self.step_index, self.now, duration, len(self.running), len(self.waiting) + len(self.preempted),
                len(self.swapped), prefill, decodes, self.allocator.num_used_blocks,
                self.allocator.tokens_stored, self._reserved_blocks())
        else:
            metrics.record_occupancy(self.now, duration, self.allocator.num_used_blocks, self.allocator.tokens_stored)
        if self._on_step_end:
            self._run_hooks(self._on_step_end)
        if callbacks:
            event = StepEvent(self.step_index, self.now, batch, out, duration, execute_wall_s)
            for callback in list(callbacks):
                go_on = callback.on_step(event)
                if not isinstance(go_on, bool):
                    raise TypeError(f"engine callback {callback!r}: on_step returned {go_on!r}, not a bool "
                                    f"(True: go on, False: stop the run)")
                if not go_on and self.stopped_by is None:
                    self.stopped_by = callback
        return batch

    def run(self, requests: Iterable[Request], progress: bool = False, max_steps: Optional[int] = None,
            callbacks: Iterable = ()) -> dict:
        """Serve ``requests`` by arrival time until all finish (or ``max_steps``, or a callback's
        ``on_step`` returns False: ``self.stopped_by``); returns the summary. This is
        :meth:`ServingLoop.run <kvrl.engine.loop.ServingLoop.run>`: ``callbacks`` are registered
        for this run only (:mod:`kvrl.engine.callbacks`), every registered callback's
        ``on_run_start``/``on_run_end`` (where it has them) run around the loop, and with
        ``config.pause_gc`` the cyclic garbage collector is paused for the run (see
        :class:`EngineConfig`).

        Requests that can never be served are rejected (recorded with the reason in
        ``metrics.rejected``) and the others keep running.
        """
        return ServingLoop(self, requests, max_steps=max_steps).run(callbacks, progress=progress)

    def submit(self, request: Request) -> bool:
        """Add ``request``; a rejected one is recorded and logged instead of raising."""
        try:
            self.add_request(request)
            return True
        except RequestRejected as exc:
            self.metrics.rejected.append((request.request_id, str(exc)))
            log.warning("rejected: %s", exc)
            return False

    def check_invariants(self) -> None:
        """Assert the engine's invariants (used by the property tests)."""
        live = self.live_sequences()
        ids = [s.seq_id for s in live]
        assert len(ids) == len(set(ids)), "a sequence is queued twice"
        refs, bs = getattr(self.allocator, "ref_counts", None), self.config.block_size
        fill = self.allocator.block_fill if getattr(self.allocator, "exact_tail_fill", False) else None
        for s in self.running:
            assert s.status is SeqStatus.RUNNING and len(s.block_table) * bs >= s.num_computed
            if refs is not None and s.num_computed % bs and s.request.n == 1:   # the planner relies on it
                assert refs[s.block_table[s.num_computed // bs]] == 1, "a partial block shared outside forks"
            if fill is not None and s.num_computed % bs:    # its entry may lag behind, never run ahead
                assert fill[s.block_table[s.num_computed // bs]] <= s.num_computed % bs, \
                    f"seq {s.seq_id}: its partial block's fill exceeds its computed tokens"
        for s in self.swapped:
            assert s.status is SeqStatus.SWAPPED and not s.block_table and s.cpu_block_table
        for s in (*self.preempted, *self.waiting):
            assert s.status is SeqStatus.WAITING and not s.block_table and not s.cpu_block_table
        self.allocator.check_invariants(live)
