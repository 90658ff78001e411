"""Small builders shared by the engine tests."""
from __future__ import annotations

import logging

import numpy as np
import pytest

from kvrl import plugins
from kvrl.engine.config import EngineConfig
from kvrl.engine.engine import Engine
from kvrl.engine.request import Request
from kvrl.executors.hardware import DEVICES, MODEL_SHAPES
from kvrl.executors.sim import SimExecutor


def make_engine(num_blocks=64, block_size=4, num_cpu_blocks=64, scheduler="fcfs", watermark="fixed",
                eviction="lifo", prefix_cache="hash_lru", watermark_params=None, eviction_params=None,
                scheduler_params=None, **engine_kw):
    cfg = EngineConfig(num_blocks=num_blocks, block_size=block_size, num_cpu_blocks=num_cpu_blocks,
                       max_model_len=engine_kw.pop("max_model_len", 4096), **engine_kw)
    return Engine(cfg, SimExecutor(MODEL_SHAPES["qwen3-0.6b"], DEVICES["h200"]),
                  plugins.create("scheduler", scheduler, **(scheduler_params or {})),
                  plugins.create("watermark", watermark, **(watermark_params or {})),
                  plugins.create("eviction", eviction, **(eviction_params or {})),
                  plugins.create("prefix_cache", prefix_cache))


def make_request(rid, prompt_len=None, output_len=4, arrival_s=0.0, tokens=None, seed=None, **kw):
    if tokens is None:
        rng = np.random.default_rng(seed if seed is not None else hash(rid) % 2**32)
        tokens = rng.integers(0, 1000, prompt_len, dtype=np.int32)
    return Request(rid, arrival_s, np.asarray(tokens, dtype=np.int32), output_len, **kw)


def run_triton_checks(test_file: str, timeout: int) -> dict:
    """Run ``test_file --triton-checks`` in a subprocess with Triton's CPU interpreter forced on
    (TRITON_INTERPRET must be set before triton is imported) and return its JSON results."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "TRITON_INTERPRET": "1", "KVRL_FORCE_TRITON": "1"}
    proc = subprocess.run([sys.executable, os.path.abspath(test_file), "--triton-checks"],
                          env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"triton checker failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def quiet_kvrl_logs(level: int):
    """A module-scoped autouse fixture that sets the ``kvrl`` logger to ``level`` for the tests of
    the module that assigns it (``_quiet = quiet_kvrl_logs(logging.ERROR)``) and restores it after.
    Set at import instead, it silenced every later module's kvrl.* warnings (caplog saw nothing)."""
    @pytest.fixture(autouse=True, scope="module")
    def _quiet():
        logger = logging.getLogger("kvrl")
        before = logger.level
        logger.setLevel(level)
        yield
        logger.setLevel(before)
    return _quiet


def step_features(dec=(), pre=(), copies=0, swap_out=0, swap_in=0, shared=0) -> dict:
    """The step-model features (:data:`kvrl.executors.profile.FEATURES` and ``dec_coread``) of a
    synthetic batch: decodes of the KV lengths in ``dec`` (each with ``min(shared, L)`` tokens from a
    prefix-cache hit on one common prefix, which every decode but the first reads with another),
    prefill chunks ``(tokens, start)`` in ``pre``, and the step's block copies and swaps."""
    from kvrl.executors import profile as P
    from kvrl.executors.profile.features import CO_READ

    f = dict.fromkeys((*P.FEATURES, CO_READ), 0)
    for i, L in enumerate(dec):
        f["n_dec"] += 1
        f["dec_kv"] += L
        f["dec_max"] = max(f["dec_max"], L)
        f["dec_shared"] += min(shared, L)
        f[CO_READ] += min(shared, L) if i else 0
        f["rows"] += 1
    for k, start in pre:
        f["n_pre"] += 1
        f["pre_tok"] += k
        f["pre_pairs"] += k * start + k * (k + 1) // 2
        f["pre_ctx"] += start + k
        f["pre_max_ctx"] = max(f["pre_max_ctx"], start + k)
        f["rows"] += 1
    f.update(copies=copies, swap_out=swap_out, swap_in=swap_in)
    return f


def known_eager_model(coef: dict | None = None, host: dict | None = None):
    """A small known eager step model (no CUDA graphs) whose fit terms the profile tests recover:
    fixed dense and KV curves, these per-feature ``coef`` (over defaults with no shared-token,
    mixed or host-work price) and host terms ``host`` (over a base and per-sequence cost)."""
    from kvrl.executors import profile as P

    return P.StepModel(
        [], None,
        {"dense": {"knots": [1, 64, 256, 1024], "values": [2e-3, 2.2e-3, 3e-3, 8e-3]},
         "kv": {"knots": [1, 8, 64], "values": [5e-8, 4e-8, 3e-8]},
         "kvmax": {"knots": [1, 8, 64], "values": [0.0, 0.0, 0.0]},
         "coef": {"pre_pairs": 1e-10, "pre_ctx": 2e-8, "pre_max_ctx": 0.0, "n_pre": 5e-5, "has_pre": 3e-4,
                  "has_dec": 2e-4, "rows": 1e-6, "n_dec": 1e-5, "dec_shared": 0.0, "mixed_dec": 0.0, **(coef or {})}},
        {op: [0.0, 0.0] for op in P.StepModel.OPS},
        {"base": 5e-5, "per_seq": 3e-6, "per_prefill": 0.0, **(host or {})})
