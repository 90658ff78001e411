"""Step-time profiles: live step times measured per (GPU, model shape), and the fitted step-time
model the sim uses instead of its roofline when a profile matches.

A profile is one JSON file (format ``kvrl-step-profile``, written by ``kvrl-profile``)::

    {"format": "kvrl-step-profile", "version": 1,
     "key":     {"device": "h200", "gpu_name": "NVIDIA H200", "num_layers": 28, "hidden_size": 1024,
                 "num_heads": 16, "num_kv_heads": 8, "head_dim": 128, "intermediate_size": 3072,
                 "vocab_size": 151936, "dtype": "bfloat16", "dtype_bytes": 2},
     "meta":    {block_size, cuda_graphs, graph_batch_sizes, torch/triton versions, host, created, ...},
     "samples": [{"group": "decode", "graph": true, <features>, "t": median s, "t_p10", "t_p90", "reps"}, ...],
     "host_samples": [[num_seqs, num_prefill_seqs, gap_s], ...],
     "engine_samples": [{"group": "engine", "graph": ..., <features>, "t": s}, ...],   # an engine run's steps
     "model":   StepModel.to_dict(),            # coefficients fitted from the samples
     "fit":     {"grid": {...}, "holdout": {...}, "host": {...}}}   # errors of the fit

The sim matches a profile on ``key``: the device name of its :class:`DeviceSpec` (``h200``,
``h100``, ``a100``, ``cpu`` or the slug of another GPU's name) and the model shape (layers,
hidden, heads, kv heads, head dim, intermediate, vocab, dtype width). See docs/fidelity.md.

Features of a step (:data:`FEATURES`), all computed from the :class:`ScheduledBatch` alone:
``n_pre`` prefill items (more than one query token), ``pre_tok`` their query tokens,
``pre_pairs`` their causal (query, key) pairs, ``pre_ctx`` the KV tokens they attend over,
``pre_max_ctx`` the longest of those contexts (prefill attention runs one program per query tile
and head, which walks its whole context: with few tiles the longest context is the critical path),
``n_dec`` decode items (one query token), ``dec_kv`` the KV tokens they read, ``dec_max`` the
longest decode context, ``dec_shared`` how many of ``dec_kv`` come from a prefix-cache hit (blocks
other sequences read too: served from L2 more often than from HBM; from fit version 12 only the hits
on blocks another sequence held when the decode's sequence was admitted, ``dec_coread``: a cached
block that one decode reads alone costs what a private one costs), ``rows`` items that sample
(LM-head rows), ``copies``, ``swap_out`` and ``swap_in`` block counts.

The model (:class:`StepModel`), all terms non-negative, fitted by non-negative least squares on
relative error (:func:`scipy.optimize.nnls`), prices the compute stream of a step::

    t = host(S, n_pre) + fwd + copy(copies) + swap_out(n) + swap_in(n)

    fwd (CUDA-graph decode) = G(Bpad) + a(B) * (dec_kv - dec_shared) + s * dec_shared + m(B) * B * dec_max
    fwd (eager)             = D(N) + a_e(B) * (dec_kv - dec_shared) + s_e * dec_shared + m_e(B) * B * dec_max
                              + c_pairs * pre_pairs + c_ctx * pre_ctx + c_pre * n_pre + c_dec * B
                              + c_has_pre * [n_pre > 0] + c_has_dec * [B > 0] + c_rows * rows
                              + c_mixed_dec * B * [n_pre > 0]          (fit version 9)

where, in a step that also prefills, a shared KV token costs ``s_mix`` instead of ``s_e``
(``mixed_shared``, fit version 10: fitted only where at least four fitted samples have both a
prefill and shared decode KV, as kvrl-profile's ``shared_mixed`` grid points; else, and in older
profiles, ``s_mix = s_e``)

with ``B = n_dec``, ``Bpad`` the captured graph size that serves B, ``N = pre_tok + n_dec``
padded to the token bucket of the live executor's piecewise graphs when the profile had them
(``token_sizes``; see :mod:`kvrl.executors.piecewise`);
``G, a, m, D, a_e, m_e`` piecewise linear between measured knots (linear "hat" bases, so the
fit stays one linear least-squares problem); block operations ``c0 * [n > 0] + c1 * n``, for swaps
the part on the compute stream (gather / launching the copies); ``host`` the engine's own Python
time between steps (live ``elapsed_s`` counts it), ``h0 + h1 * S + h2 * n_pre`` plus the host-work
terms (:data:`HOST_WORK_TERMS`: admissions, preemptions, finishes, queue length, prefill tokens of
this and the previous step, swapped blocks, swap steps; fit version 9 added the last three and
``c_mixed_dec``, the extra cost of each decode sequence in a step that also prefills) and, fit
version 11, a constant per step with any request queued (:data:`QUEUE_STEP_TERM`).

Swap transfers run on the live executor's swap stream, overlapping compute: their durations
``swap_out_xfer(n)`` and ``swap_in_xfer(n)`` (same linear form) drive the sim's
:class:`~kvrl.executors.sim.SwapStream`, which makes a step wait for the swap-ins issued before it.
Profiles of fit version 4 (synchronous swaps, before the swap stream) are refitted from their
samples when loaded: with no transfer timings, their swap terms become transfer times and the
compute-stream parts zero.

The package, by job: :mod:`~kvrl.executors.profile.format` (file format, key, errors),
:mod:`~kvrl.executors.profile.features` (what a batch is priced by),
:mod:`~kvrl.executors.profile.fit` (NNLS and the fitting helpers),
:mod:`~kvrl.executors.profile.model` (:class:`StepModel`), :mod:`~kvrl.executors.profile.registry`
(:class:`StepProfile` files and the lookup). Their public names are importable from here.
"""
from kvrl.executors.profile.features import (FEATURES, FORWARD_FEATURES, HOST_WORK, HOST_WORK_TERMS, QUEUE_STEP_TERM,
                                             batch_features, host_work, host_work_rows, prefill_tokens)
from kvrl.executors.profile.fit import (FLOOR_TERMS, HOST_TERMS, choose_knots, error_stats, fit_host, hat_basis, nnls,
                                        unidentified_host_terms)
from kvrl.executors.profile.format import (FIT_VERSION, FORMAT, LOADABLE_FIT_VERSIONS, SHAPE_FIELDS, VERSION,
                                           ProfileError, ProfileKey, device_key)
from kvrl.executors.profile.model import Linear1D, StepModel, fit_engine_factor, fit_errors, fit_model, refit_report
from kvrl.executors.profile.registry import (ENV_PATH, PACKAGED_DIR, StepProfile, clear_cache, load_cached,
                                             matching_profiles, now_stamp, profile_file, resolve_profile,
                                             search_paths)

__all__ = ["ENV_PATH", "FEATURES", "FIT_VERSION", "FLOOR_TERMS", "FORMAT", "FORWARD_FEATURES", "HOST_WORK",
           "HOST_TERMS", "HOST_WORK_TERMS", "LOADABLE_FIT_VERSIONS", "Linear1D", "PACKAGED_DIR", "QUEUE_STEP_TERM",
           "SHAPE_FIELDS", "VERSION",
           "ProfileError", "ProfileKey", "StepModel", "StepProfile", "batch_features", "choose_knots", "clear_cache",
           "device_key", "error_stats", "fit_engine_factor", "fit_errors", "fit_host", "fit_model", "hat_basis", "host_work",
           "load_cached", "matching_profiles", "nnls", "now_stamp", "prefill_tokens", "profile_file", "refit_report", "resolve_profile", "search_paths", "unidentified_host_terms"]
