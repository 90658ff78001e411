"""Adversarial workloads for robustness and isolation experiments.

* :func:`fill_and_squeeze`: an attacker tenant probes, floods the KV cache with max-length
  requests, then sends a stream of tiny requests, alongside a benign tenant.
* :func:`prefix_probe`: an attacker tenant sends candidate prefixes of a victim tenant's system
  prompt (some correct, some wrong) to learn from prefix-cache timing whether a candidate is cached.
  Each probe is labelled in its request id (``...-correct`` / ``...-wrong``) so a harness can score
  the attack; :func:`probe_label` reads the label back.
"""
from __future__ import annotations

import math
from typing import Mapping, Optional

import numpy as np

from kvrl.engine.request import Request

from ._rng import make_rng
from .generators import TenantSpec, sort_by_arrival, tenant_stream
from .tokens import check_vocab_size, random_ids, readonly

#: Model length assumed for flood requests when neither ``flood_prompt_len`` nor a
#: ``max_model_len`` is given.
DEFAULT_MAX_MODEL_LEN = 4096
WRONG_MODES = ("random", "perturb", "perturb_last")


def _pos(name: str, v: float) -> float:
    if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {v!r}")
    return float(v)


def _nonneg_int(name: str, v: int) -> int:
    if isinstance(v, bool) or int(v) != v or v < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {v!r}")
    return int(v)


def _phase(name: str, tenant: str, phase: str, start_s: float, count: int, rate: float,
           prompt_len: int, output_len: int, priority: int, rng: np.random.Generator,
           vocab_size: int) -> list[Request]:
    if count and (prompt_len < 1 or output_len < 1):
        raise ValueError(f"{name}: prompt and output lengths must be >= 1 "
                         f"(got {prompt_len} and {output_len})")
    return [Request(request_id=f"{tenant}-{phase}-{i:04d}", arrival_s=start_s + i / rate,
                    prompt_token_ids=readonly(random_ids(rng, prompt_len, vocab_size)),
                    output_len=output_len, tenant=tenant, priority=priority)
            for i in range(count)]


def fill_and_squeeze(*, vocab_size: int, seed: int = 0, horizon_s: float = 120.0,
                     benign: "TenantSpec | Mapping" = TenantSpec(name="benign"),
                     attacker: str = "attacker", attacker_priority: int = 0,
                     attack_start_s: float = 20.0,
                     probe_count: int = 8, probe_rate: float = 1.0, probe_prompt_len: int = 256,
                     probe_output_len: int = 16,
                     flood_count: int = 32, flood_rate: float = 20.0,
                     flood_prompt_len: Optional[int] = None, flood_output_len: int = 256,
                     squeeze_delay_s: float = 1.0, squeeze_count: int = 200,
                     squeeze_rate: float = 20.0, squeeze_prompt_len: int = 8,
                     squeeze_output_len: int = 8,
                     max_model_len: Optional[int] = None) -> list[Request]:
    """Fill-and-squeeze attack next to a benign tenant.

    The benign tenant (``benign``, a :class:`TenantSpec`) sends requests over ``[0, horizon_s)``.
    From ``attack_start_s`` the attacker sends, at constant rates:

    1. ``probe_count`` probes (``probe_prompt_len`` + ``probe_output_len``), ids ``<attacker>-probe-NNNN``;
    2. right after, ``flood_count`` max-length requests, ids ``<attacker>-flood-NNNN``, with prompt
       ``flood_prompt_len`` (None = ``max_model_len - flood_output_len``, the longest request the
       model accepts; ``max_model_len`` defaults to 4096) to fill the KV cache;
    3. ``squeeze_delay_s`` after the last flood request, ``squeeze_count`` tiny requests
       (``squeeze_prompt_len`` + ``squeeze_output_len``), ids ``<attacker>-squeeze-NNNN``, that keep
       the cache occupied and compete for admission.
    """
    vocab_size = check_vocab_size(vocab_size)
    spec = TenantSpec.from_spec(benign)
    if spec.name == attacker:
        raise ValueError(f"the benign tenant and the attacker must differ (both {attacker!r})")
    for name in ("horizon_s", "probe_rate", "flood_rate", "squeeze_rate"):
        _pos(name, locals()[name])
    if not (math.isfinite(attack_start_s) and attack_start_s >= 0):
        raise ValueError(f"attack_start_s must be >= 0, got {attack_start_s!r}")
    if not (math.isfinite(squeeze_delay_s) and squeeze_delay_s >= 0):
        raise ValueError(f"squeeze_delay_s must be >= 0, got {squeeze_delay_s!r}")
    for name in ("probe_count", "flood_count", "squeeze_count"):
        _nonneg_int(name, locals()[name])
    model_len = max_model_len or DEFAULT_MAX_MODEL_LEN
    if flood_prompt_len is None:
        flood_prompt_len = model_len - flood_output_len
    reqs = tenant_stream(spec, spec.arrivals(horizon_s, make_rng(seed, "benign", "arrivals")),
                         vocab_size=vocab_size, seed=seed, key=("benign",), id_prefix=spec.name)
    rng = make_rng(seed, "attacker")
    t = float(attack_start_s)
    reqs += _phase("probe", attacker, "probe", t, probe_count, probe_rate, probe_prompt_len,
                   probe_output_len, attacker_priority, rng, vocab_size)
    t += probe_count / probe_rate
    reqs += _phase("flood", attacker, "flood", t, flood_count, flood_rate, int(flood_prompt_len),
                   flood_output_len, attacker_priority, rng, vocab_size)
    t += max(flood_count - 1, 0) / flood_rate + squeeze_delay_s
    reqs += _phase("squeeze", attacker, "squeeze", t, squeeze_count, squeeze_rate,
                   squeeze_prompt_len, squeeze_output_len, attacker_priority, rng, vocab_size)
    return sort_by_arrival(reqs)


def prefix_probe(*, vocab_size: int, seed: int = 0, horizon_s: float = 60.0,
                 victim: "TenantSpec | Mapping" = TenantSpec(name="victim", system_prompt_len=512),
                 attacker: str = "attacker", attacker_priority: int = 0,
                 attack_start_s: float = 10.0, num_probes: int = 40, probe_rate: float = 2.0,
                 probe_len: Optional[int] = None, correct_fraction: float = 0.5,
                 wrong_mode: str = "perturb", probe_suffix_len: int = 1,
                 probe_output_len: int = 1) -> list[Request]:
    """Prefix-probing attack on a victim tenant's system prompt.

    The victim (``victim``, a :class:`TenantSpec` with ``system_prompt_len >= 1``) sends requests
    over ``[0, horizon_s)``, each = its system prompt + a random suffix (prefix group
    ``<victim>-system``). From ``attack_start_s`` the attacker sends ``num_probes`` probes at
    ``probe_rate``/s, each = a candidate of ``probe_len`` ids (None = the whole system prompt) +
    ``probe_suffix_len`` random ids, generating ``probe_output_len`` tokens. Exactly
    ``round(correct_fraction * num_probes)`` candidates (at random positions) are the true prefix;
    the others are wrong: ``random`` ids, the true prefix with one id changed at a random position
    (``perturb``) or at its last position (``perturb_last``, the hardest near miss).

    Labels: ids ``<attacker>-probe-NNNN-correct`` / ``-wrong``; correct probes also carry the
    victim's prefix group (they do share that prefix), wrong ones none.
    """
    vocab_size = check_vocab_size(vocab_size)
    spec = TenantSpec.from_spec(victim)
    if spec.name == attacker:
        raise ValueError(f"the victim and the attacker must differ (both {attacker!r})")
    if spec.system_prompt_len < 1:
        raise ValueError("prefix_probe needs a victim system prompt (victim.system_prompt_len >= 1)")
    if wrong_mode not in WRONG_MODES:
        raise ValueError(f"wrong_mode must be one of {WRONG_MODES}, got {wrong_mode!r}")
    if wrong_mode != "random" and vocab_size < 2:
        raise ValueError("perturbed wrong probes need vocab_size >= 2")
    _pos("horizon_s", horizon_s)
    _pos("probe_rate", probe_rate)
    num_probes = _nonneg_int("num_probes", num_probes)
    probe_suffix_len = _nonneg_int("probe_suffix_len", probe_suffix_len)
    if not 0.0 <= correct_fraction <= 1.0:
        raise ValueError(f"correct_fraction must be in [0, 1], got {correct_fraction!r}")
    if not (math.isfinite(attack_start_s) and attack_start_s >= 0):
        raise ValueError(f"attack_start_s must be >= 0, got {attack_start_s!r}")
    if probe_output_len < 1:
        raise ValueError(f"probe_output_len must be >= 1, got {probe_output_len!r}")
    plen = spec.system_prompt_len if probe_len is None else int(probe_len)
    if not 1 <= plen <= spec.system_prompt_len:
        raise ValueError(f"probe_len must be in [1, system_prompt_len={spec.system_prompt_len}], "
                         f"got {probe_len!r}")
    system = readonly(random_ids(make_rng(seed, "victim", "system-prompt"), spec.system_prompt_len,
                                 vocab_size))
    group = f"{spec.name}-system"
    reqs = tenant_stream(spec, spec.arrivals(horizon_s, make_rng(seed, "victim", "arrivals")),
                         vocab_size=vocab_size, seed=seed, key=("victim",), id_prefix=spec.name,
                         prefix=system, prefix_group=group)
    rng = make_rng(seed, "attacker")
    n_correct = int(round(correct_fraction * num_probes))
    correct = np.zeros(num_probes, dtype=bool)
    correct[rng.permutation(num_probes)[:n_correct]] = True
    for i in range(num_probes):
        cand = system[:plen].copy()
        if not correct[i]:
            if wrong_mode == "random":
                cand = random_ids(rng, plen, vocab_size)
                while np.array_equal(cand, system[:plen]):  # astronomically rare
                    cand = random_ids(rng, plen, vocab_size)
            else:
                pos = plen - 1 if wrong_mode == "perturb_last" else int(rng.integers(plen))
                cand[pos] = (int(cand[pos]) + int(rng.integers(1, vocab_size))) % vocab_size
        prompt = np.concatenate([cand, random_ids(rng, probe_suffix_len, vocab_size)])
        label = "correct" if correct[i] else "wrong"
        reqs.append(Request(request_id=f"{attacker}-probe-{i:04d}-{label}",
                            arrival_s=attack_start_s + i / probe_rate,
                            prompt_token_ids=readonly(prompt), output_len=int(probe_output_len),
                            tenant=attacker, priority=attacker_priority,
                            prefix_group=group if correct[i] else None))
    return sort_by_arrival(reqs)


def probe_label(request: Request) -> Optional[bool]:
    """True / False for a correct / wrong prefix probe, None for any other request."""
    rid = request.request_id
    if "-probe-" in rid:
        if rid.endswith("-correct"):
            return True
        if rid.endswith("-wrong"):
            return False
    return None
