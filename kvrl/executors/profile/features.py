"""What the step model reads from a :class:`~kvrl.engine.batch.ScheduledBatch`: the forward-pass
features (:data:`FEATURES`, defined in :mod:`kvrl.executors.profile`) and the host-work counters.
"""
from __future__ import annotations


FEATURES = ("n_pre", "pre_tok", "pre_pairs", "pre_ctx", "pre_max_ctx", "n_dec", "dec_kv", "dec_max", "dec_shared",
            "rows", "copies", "swap_out", "swap_in")


#: of ``dec_shared``, the KV tokens in blocks another sequence held when the decode's sequence was
#: admitted (``Sequence.co_read_prefix_tokens``): blocks that more than one decode of a batch reads.
#: From fit version 12 the step model prices these as shared and the rest of ``dec_shared`` as private:
#: on an H200 a prefix-cache block that one decode reads alone costs what a private block costs, and
#: one that two or more read costs about what the grid's shared points (every decode reads one prefix)
#: measure (``benchmarks/shared_degree_probe.py``, docs/fidelity.md, session 37). Not a forward
#: feature argument: :meth:`StepModel.forward_args` picks the one a model prices.
CO_READ = "dec_coread"


#: the longest prefill chunk's query tokens: with the longest prefill context, what decides whether
#: the live executor's eager path splits a prefill's keys, and so which graph a step runs on
#: (:class:`~kvrl.executors.step_rule.StepRule`). Not a forward feature argument: recorded since fit
#: version 13 (older samples: ``pre_tok``, exact for one chunk).
PRE_MAX_Q = "pre_max_q"


#: the features of the forward pass (the arguments of :meth:`StepModel.forward_s`)
FORWARD_FEATURES = FEATURES[:10]


#: what the engine did on the host around a step (the :class:`~kvrl.engine.batch.ScheduledBatch`
#: counters): priced by the host model, not the forward pass. Fit version 9 adds the last three
#: (from the residuals of recorded live runs under pressure, ``scripts/fidelity_residuals.py``):
#: ``pre_tok_prev``, the previous step's prefill tokens (their full blocks are hashed and registered
#: after that step, in this step's gap); ``swap_blocks``, blocks swapped out or in by this step, and
#: ``swap_step``, 1 if it swaps at all (the engine's and executor's swap bookkeeping)
HOST_WORK = ("n_admit", "n_preempt", "n_finish", "n_wait", "pre_tok", "pre_tok_prev", "swap_blocks", "swap_step")


HOST_WORK_TERMS = ("per_admit", "per_preempt", "per_finish", "per_waiting", "per_prefill_token",
                   "per_prev_prefill_token", "per_swap_block", "per_swap_step")


#: fit version 11: a constant for each step in which any request waits (``n_wait > 0``), derived from
#: ``n_wait``, not a counter of its own. The engine's admission pass (kvrl.engine.planning) scans
#: the waiting queue only until the first request that does not fit, so a queue costs the same
#: few tens of microseconds per step whatever its length: live under pressure (runs 42-52, 100-200
#: waiting) a per-request price fits at 0-0.2 us, a per-step one at 21-53 us, while fit version 10
#: priced 1.3-1.5 us per queued request and so charged a 150-request queue some 200 us a step
QUEUE_STEP_TERM = "per_wait_step"


def batch_features(batch) -> dict[str, int]:
    """The :data:`FEATURES`, :data:`CO_READ` and :data:`PRE_MAX_Q` of a :class:`~kvrl.engine.batch.ScheduledBatch`."""
    f = dict.fromkeys((*FEATURES, CO_READ, PRE_MAX_Q), 0)
    for item in batch.seqs:
        k, start = item.num_tokens, item.start
        if k == 1:
            f["n_dec"] += 1
            f["dec_kv"] += start + 1
            f["dec_max"] = max(f["dec_max"], start + 1)
            f["dec_shared"] += min(item.seq.shared_prefix_tokens, start + 1)
            f[CO_READ] += min(item.seq.co_read_prefix_tokens, start + 1)
        else:
            f["n_pre"] += 1
            f["pre_tok"] += k
            f["pre_pairs"] += k * start + k * (k + 1) // 2
            f["pre_ctx"] += start + k
            f["pre_max_ctx"] = max(f["pre_max_ctx"], start + k)
            f[PRE_MAX_Q] = max(f[PRE_MAX_Q], k)
        if item.num_samples:
            f["rows"] += 1
    f["copies"], f["swap_out"], f["swap_in"] = len(batch.copies), len(batch.swap_out), len(batch.swap_in)
    return f


def prefill_tokens(batch) -> int:
    """Prefill (more than one query token) tokens of a :class:`~kvrl.engine.batch.ScheduledBatch`."""
    return sum(s.num_tokens for s in batch.seqs if s.num_tokens > 1)


def host_work(batch, pre_tok_prev: int = 0) -> dict[str, int]:
    """The :data:`HOST_WORK` counters of a :class:`~kvrl.engine.batch.ScheduledBatch` (``pre_tok``,
    the prefill tokens whose full blocks the engine hashes after the step, as in :func:`batch_features`);
    ``pre_tok_prev`` is the previous step's ``pre_tok`` (the batch does not know it: the caller,
    which sees the steps in order, passes it)."""
    swaps = len(batch.swap_out) + len(batch.swap_in)
    return {"n_admit": batch.num_admitted, "n_preempt": batch.num_preempted, "n_finish": batch.num_finished,
            "n_wait": batch.num_waiting, "pre_tok": prefill_tokens(batch), "pre_tok_prev": int(pre_tok_prev),
            "swap_blocks": swaps, "swap_step": int(swaps > 0)}


def host_work_rows(batches) -> list[dict[str, int]]:
    """:func:`host_work` of consecutive batches of one engine run, in order (each sees the previous
    one's prefill tokens)."""
    rows, prev = [], 0
    for b in batches:
        rows.append(host_work(b, prev))
        prev = rows[-1]["pre_tok"]
    return rows


#: the profile grid's groups whose decodes all read one common prefix (kvrl.profiling.batches)
ONE_PREFIX_GROUPS = ("shared", "shared_mixed")


def pre_max_q_of(sample: dict) -> int:
    """:data:`PRE_MAX_Q` of a feature dict (samples recorded before fit version 13: ``pre_tok``)."""
    return int(sample.get(PRE_MAX_Q, sample.get("pre_tok", 0)))


def co_read_of(sample: dict) -> float:
    """:data:`CO_READ` of a feature dict. Samples recorded before fit version 12 lack it: on the grid's
    :data:`ONE_PREFIX_GROUPS` every decode but the first reads blocks another one reads; any other
    sample's shared tokens count as co-read, as they were priced then."""
    if CO_READ in sample:
        return float(sample[CO_READ])
    shared, n_dec = float(sample.get("dec_shared", 0)), int(sample.get("n_dec", 0))
    if sample.get("group") in ONE_PREFIX_GROUPS and n_dec:
        return shared * (n_dec - 1) / n_dec
    return shared
