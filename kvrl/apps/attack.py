"""``kvrl-attack``: isolation experiments against the engine (docs/security.md).

Commands (the first argument; the rest are Hydra overrides of ``conf/attack.yaml``)::

    kvrl-attack prefix-probe [backend=live model=tiny] [workload.num_probes=200] ...
    kvrl-attack fill-squeeze [attack.only=[undefended,all]] [engine.num_blocks=2048] ...
    kvrl-attack benign-cost  [workload=multi_tenant] [engine.num_blocks=1024] ...

* ``prefix-probe``: an attacker tenant sends candidate prefixes of a victim tenant's system prompt
  (the ``prefix_probe`` workload: some correct, some wrong) and infers "correct" from its own
  time to first token (a prefix-cache hit is fast). The attacker's threshold is chosen without
  the labels (2-means on the TTFTs, fast cluster = hit); the harness then scores it against the
  labels: reconstruction accuracy (Wilson 95% interval, Fisher's exact test of prediction vs
  label), the TTFT gap wrong - correct (mean, bootstrap 95% interval, permutation test) and the
  AUC, once per ``attack.scopes`` value of ``engine.prefix_cache_scope`` (tenant, global).
  By default every probe comes from its own attacker account (``attack.accounts=per_probe``), so
  a probe can only hit the victim's cache, never the attacker's own earlier probes.
* ``fill-squeeze``: the ``fill_and_squeeze`` workload (attack strength from ``attack.fill_squeeze``)
  with and without the attacker's requests, once per defence of ``attack.defences``; reports the
  benign tenants' goodput (SLO-meeting output tokens per second of their arrival span), its
  fraction of the undefended no-attack baseline, SLO attainment, p99 TTFT and preemptions per
  benign request, and plots them.
* ``benign-cost``: every defence on a workload without an attacker (default ``multi_tenant``):
  goodput, throughput, p99 TTFT and preemptions relative to the undefended engine.

Each writes ``<command>.json`` and ``<command>.md`` (and a PNG or CSV) into the Hydra run
directory, ``runs/attack/<command>/<date>/<time>`` by default, and prints the Markdown table.
"""
from __future__ import annotations

import copy
import csv
import json
import logging
import math
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np

from kvrl.analysis.stats import z_quantile

log = logging.getLogger("kvrl.attack")

COMMANDS = {"prefix-probe": "prefix_probe", "fill-squeeze": "fill_squeeze", "benign-cost": "benign_cost"}
DEFAULT_WORKLOAD = {"prefix_probe": "prefix_probe", "fill_squeeze": "fill_and_squeeze",
                    "benign_cost": "multi_tenant"}


# ============================================================================ statistics
def two_means_threshold(x: np.ndarray) -> float:
    """Threshold between the two clusters of an exact 1-D 2-means (k-means, k=2) of ``x``: the
    midpoint of the split that minimises the within-cluster sum of squares. Label-free. With no
    spread at all, returns the common value (every point is then "fast": ``x <= threshold``)."""
    xs = np.sort(np.asarray(x, dtype=np.float64))
    n = len(xs)
    if n < 2 or xs[-1] - xs[0] <= 1e-12 * max(abs(xs[-1]), 1e-300):
        return float(xs[-1]) if n else float("nan")
    z = xs - xs.mean()
    c, c2 = np.cumsum(z), np.cumsum(z * z)
    k = np.arange(1, n)
    left = c2[:-1] - c[:-1] ** 2 / k
    right = (c2[-1] - c2[:-1]) - (c[-1] - c[:-1]) ** 2 / (n - k)
    sse = left + right
    sse[xs[1:] == xs[:-1]] = np.inf          # split only between distinct values
    best = int(np.argmin(sse))
    return float((xs[best] + xs[best + 1]) / 2)


def fisher_exact_p(table: list[list[int]]) -> float:
    """Two-sided p-value of Fisher's exact test of a 2x2 table (``scipy.stats.fisher_exact``):
    the probability, under independence with the margins fixed (hypergeometric), of a table at
    most as likely as the observed one."""
    from scipy.stats import fisher_exact
    return float(fisher_exact(table, alternative="two-sided").pvalue)


def wilson_interval(successes: int, n: int, z: float = z_quantile()) -> tuple[float, float]:
    if n == 0:
        return float("nan"), float("nan")
    p = successes / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return max(0.0, mid - half), min(1.0, mid + half)


def mean_gap_stats(fast: np.ndarray, slow: np.ndarray, seed: int = 0, resamples: int = 2000) -> dict:
    """Mean of ``slow`` minus mean of ``fast`` with a percentile-bootstrap 95% interval (groups
    resampled separately) and a two-sided permutation-test p-value (``resamples`` each)."""
    fast, slow = np.asarray(fast, dtype=np.float64), np.asarray(slow, dtype=np.float64)
    if not len(fast) or not len(slow):
        return {"gap_s": float("nan"), "gap_ci_s": [float("nan")] * 2, "gap_perm_p": float("nan")}
    rng = np.random.default_rng(seed)
    gap = float(slow.mean() - fast.mean())
    boot = rng.choice(slow, (resamples, len(slow))).mean(1) - rng.choice(fast, (resamples, len(fast))).mean(1)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    pooled = np.concatenate([fast, slow])
    perm = np.empty(resamples)
    for i in range(resamples):
        p = rng.permutation(pooled)
        perm[i] = p[len(fast):].mean() - p[:len(fast)].mean()
    tol = 1e-12 * max(float(np.abs(pooled).max()), 1e-300)
    p_value = (1 + int(np.sum(np.abs(perm) >= abs(gap) - tol))) / (1 + resamples)
    return {"gap_s": gap, "gap_ci_s": [float(lo), float(hi)], "gap_perm_p": float(p_value)}


def auc_fast(fast: np.ndarray, slow: np.ndarray) -> float:
    """P(a ``fast``-group value < a ``slow``-group value) + P(equal)/2 (Mann-Whitney AUC)."""
    fast, slow = np.asarray(fast, dtype=np.float64), np.asarray(slow, dtype=np.float64)
    if not len(fast) or not len(slow):
        return float("nan")
    less = (fast[:, None] < slow[None, :]).sum()
    equal = (fast[:, None] == slow[None, :]).sum()
    return float((less + 0.5 * equal) / (len(fast) * len(slow)))


THRESHOLDS = ("kmeans_log", "kmeans")


def score_probes(ttft_s: np.ndarray, correct: np.ndarray, seed: int = 0, resamples: int = 2000,
                 threshold: str = "kmeans_log") -> dict:
    """The attacker's label-free inference scored against the labels. The attacker calls a probe
    a hit ("correct") when its TTFT is at most a threshold from 2-means on the TTFTs
    (``kmeans``) or on their logarithms (``kmeans_log``, default: latency noise is multiplicative
    and its long tail would otherwise drag one cluster onto a few queueing outliers)."""
    ttft_s, correct = np.asarray(ttft_s, dtype=np.float64), np.asarray(correct, dtype=bool)
    if threshold not in THRESHOLDS:
        raise ValueError(f"attack.threshold must be one of {list(THRESHOLDS)}, got {threshold!r}")
    if threshold == "kmeans_log":
        thr = float(np.exp(two_means_threshold(np.log(np.maximum(ttft_s, 1e-12)))))
    else:
        thr = two_means_threshold(ttft_s)
    pred = ttft_s <= thr
    hits = int(np.sum(pred == correct))
    n = len(correct)
    table = [[int(np.sum(pred & correct)), int(np.sum(pred & ~correct))],
             [int(np.sum(~pred & correct)), int(np.sum(~pred & ~correct))]]
    out = {
        "probes": n, "correct_probes": int(correct.sum()), "threshold": threshold, "threshold_s": thr,
        "accuracy": hits / n if n else float("nan"), "accuracy_ci": list(wilson_interval(hits, n)),
        "fisher_p": fisher_exact_p(table) if n else float("nan"), "confusion": table,
        "ttft_correct_mean_s": float(ttft_s[correct].mean()) if correct.any() else float("nan"),
        "ttft_wrong_mean_s": float(ttft_s[~correct].mean()) if (~correct).any() else float("nan"),
        "auc": auc_fast(ttft_s[correct], ttft_s[~correct]),
    }
    out.update(mean_gap_stats(ttft_s[correct], ttft_s[~correct], seed=seed, resamples=resamples))
    return out


# ============================================================================ config
def _default_defences() -> dict:
    return {"undefended": {}}


@dataclass
class AttackOptions:
    """Options of the experiments (``attack.*``)."""

    scopes: List[str] = field(default_factory=lambda: ["tenant", "global"])
    probers: List[str] = field(default_factory=lambda: ["plain"])   # plain | forge | salt_spoof
    prefix_hashes: Optional[List[str]] = None   # engine.prefix_hash values to attack (null: the config's)
    accounts: str = "per_probe"        # per_probe | single: attacker accounts sending the probes
    threshold: str = "kmeans_log"      # the attacker's label-free rule: kmeans_log | kmeans
    resamples: int = 2000              # bootstrap and permutation resamples
    defences: Dict[str, Any] = field(default_factory=_default_defences)
    only: Optional[List[str]] = None   # run only these defences (names of attack.defences)
    baseline: str = "undefended"       # the defence whose no-attack run is the reference
    attacker: str = "attacker"         # tenant name of the attacker (fill-squeeze)
    fill_squeeze: Dict[str, Any] = field(default_factory=dict)   # workload preset of fill-squeeze
    prefix_probe: Dict[str, Any] = field(default_factory=dict)   # workload preset of prefix-probe
    benign_cost: Dict[str, Any] = field(default_factory=dict)    # workload preset of benign-cost
    plot_bin_s: float = 2.0            # time bin of the fill-squeeze goodput plot
    plot_defence: Optional[str] = "recommended"   # defence drawn over time (null or absent: the best)


def register_attack_schema() -> None:
    from hydra.core.config_store import ConfigStore

    from kvrl.apps.schema import RunSchema

    @dataclass
    class AttackSchema(RunSchema):
        command: str = "prefix_probe"
        attack: AttackOptions = field(default_factory=AttackOptions)

    ConfigStore.instance().store(name="attack_schema", node=AttackSchema)


def _plain(cfg: Any) -> Any:
    from omegaconf import DictConfig, ListConfig, OmegaConf
    if isinstance(cfg, (DictConfig, ListConfig)):
        return OmegaConf.to_container(cfg, resolve=True)
    return copy.deepcopy(cfg)


def _deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


PRESET_KEYS = ("workload", "engine", "slo")


def _explicit_keys() -> list[list[str]]:
    """Dotted keys under ``workload``/``engine``/``slo`` the user set on the command line."""
    try:
        from hydra.core.hydra_config import HydraConfig
        overrides = HydraConfig.get().overrides.task
    except Exception:
        return []
    keys = []
    for o in overrides:
        k = o.split("=", 1)[0].lstrip("+~")
        parts = k.split(".")
        if len(parts) > 1 and parts[0] in PRESET_KEYS:
            keys.append(parts)
    return keys


def preset_config(cfg: Any, command: str) -> Any:
    """``cfg`` with the command's preset ``attack.<command>`` (keys ``workload``, ``engine``, ``slo``)
    merged over it, except for the keys the user set explicitly on the command line. A workload
    preset applies only while ``workload`` is the command's default workload."""
    from omegaconf import OmegaConf
    preset = _plain(cfg.attack.get(command) or {})
    unknown = sorted(set(preset) - set(PRESET_KEYS))
    if unknown:
        raise ValueError(f"attack.{command}: unknown key(s) {unknown}; known: {list(PRESET_KEYS)}")
    if preset.get("workload") and cfg.workload.name != DEFAULT_WORKLOAD[command]:
        preset.pop("workload")
    out = OmegaConf.create(_plain(cfg))
    if not preset:
        return out
    before = _plain(cfg)
    merged = _deep_merge(before, preset)
    for path in _explicit_keys():
        src, dst = before, merged
        for part in path[:-1]:
            if not (isinstance(src, dict) and isinstance(dst, dict) and part in src and part in dst):
                break
            src, dst = src[part], dst[part]
        else:
            if isinstance(src, dict) and path[-1] in src and isinstance(dst, dict):
                dst[path[-1]] = src[path[-1]]
    return OmegaConf.create(merged)


def _with_policy(cfg: Any, overrides: dict) -> Any:
    """A copy of ``cfg`` with policy/engine nodes replaced (a node with ``name``) or merged."""
    from omegaconf import OmegaConf
    out = copy.deepcopy(cfg)
    OmegaConf.set_struct(out, False)
    for key, node in (overrides or {}).items():
        if key not in ("scheduler", "watermark", "eviction", "prefix_cache", "engine", "slo"):
            raise ValueError(f"attack.defences: unknown key {key!r} (known: scheduler, watermark, eviction, "
                             f"prefix_cache, engine, slo)")
        node = _plain(node)
        if isinstance(node, dict) and "name" in node and key != "engine":
            out[key] = node
        else:
            out[key] = _deep_merge(_plain(out[key]), node)
    return out


def _selected_defences(cfg: Any) -> dict:
    defences = _plain(cfg.attack.defences)
    only = _plain(cfg.attack.only)
    if only:
        unknown = [d for d in only if d not in defences]
        if unknown:
            raise ValueError(f"attack.only: unknown defence(s) {unknown}; known: {sorted(defences)}")
        defences = {k: defences[k] for k in only}
    base = cfg.attack.baseline
    if base not in defences:
        all_defences = _plain(cfg.attack.defences)
        if base not in all_defences:
            raise ValueError(f"attack.baseline={base!r} is not in attack.defences ({sorted(all_defences)})")
        defences = {base: all_defences[base], **defences}
    return defences


def _policy_label(cfg: Any) -> str:
    def one(node):
        node = _plain(node)
        name = node.pop("name")
        args = ", ".join(f"{k}={v}" for k, v in node.items() if v is not None)
        return f"{name}({args})" if args else name
    return f"{one(cfg.watermark)} / {one(cfg.eviction)}"


# ============================================================================ prefix probing
PROBERS = ("plain", "forge", "salt_spoof")


@dataclass
class ProbeContext:
    """What the probing attackers know: the victim's tenant name and first block of its system
    prompt (e.g. a public template), the engine's scope and block size, and the vocabulary."""

    victim: str
    victim_block: np.ndarray
    scope: str
    block_size: int
    vocab_size: int
    seed: int
    forged: dict = field(default_factory=dict)    # attacker salt -> forged first block (reused across runs)


def apply_prober(prober: str, request: Any, ctx: ProbeContext) -> Any:
    """The probe ``request`` as the ``prober`` attacker sends it.

    * ``plain``: unchanged (a prefix-cache timing probe).
    * ``salt_spoof``: ``cache_salt`` set to the victim's tenant name. Under the pre-#14 rule the salt
      replaced the tenant, which put the probe in the victim's cache; now it only narrows.
    * ``forge``: the first block replaced by one whose ``xxh3`` identity, chained from the
      attacker's own salt, equals that of the victim's first block (:mod:`kvrl.apps.forge`), so
      under ``engine.prefix_hash=xxh3`` the rest of the candidate has the identities the victim's
      tokens have. Against the keyed default the forger has no target it can compute; it forges
      against xxh3 anyway (its best guess), which gives an unrelated chain.
    """
    if prober == "plain":
        return request
    if prober == "salt_spoof":
        return replace(request, cache_salt=ctx.victim)
    if prober != "forge":
        raise ValueError(f"attack.probers: unknown prober {prober!r}; known: {list(PROBERS)}")
    from kvrl.apps.forge import BLOCK_TOKENS, forge_prefix
    from kvrl.engine.allocators import cache_salt
    if ctx.block_size != BLOCK_TOKENS:
        raise ValueError(f"attack.probers=forge needs engine.block_size={BLOCK_TOKENS}, got {ctx.block_size}")
    own = cache_salt(ctx.scope, request.tenant, request.cache_salt)
    block = ctx.forged.get(own)
    if block is None:
        victim_salt = cache_salt(ctx.scope, ctx.victim, None)
        block = ctx.forged[own] = forge_prefix(ctx.victim_block, victim_salt, own, ctx.vocab_size,
                                               seed=[ctx.seed, len(ctx.forged)])
    prompt = request.prompt_token_ids
    return replace(request, prompt_token_ids=np.concatenate([block.astype(prompt.dtype), prompt[BLOCK_TOKENS:]]))


def _probe_runs(opts: Any, cfg: Any) -> list[tuple[str, str, str, str]]:
    """(label, scope, prefix_hash, prober) of each run: every scope x hash x prober."""
    scopes, probers = list(opts.scopes), list(opts.probers)
    hashes = list(opts.prefix_hashes) if opts.prefix_hashes else [cfg.engine.prefix_hash]
    for prober in probers:
        if prober not in PROBERS:
            raise ValueError(f"attack.probers: unknown prober {prober!r}; known: {list(PROBERS)}")
    if not scopes or not probers:
        raise ValueError("attack.scopes and attack.probers must not be empty")
    runs = []
    for k, scope in enumerate(scopes):
        label = scope if scopes.count(scope) == 1 else f"{scope}#{k}"   # a scope may be repeated
        for h in hashes:
            for prober in probers:
                parts = [label] + ([h] if len(hashes) > 1 else []) + ([prober] if len(probers) > 1 else [])
                runs.append(("/".join(parts), scope, h, prober))
    return runs


def run_prefix_probe(cfg: Any, out_dir: Path) -> dict:
    """Play the prefix-probing attackers once per cache scope, prefix hash and prober; returns
    (and writes) the results."""
    from kvrl.builder import build_engine, build_executor
    from kvrl.workloads import build_workload, probe_label

    opts = cfg.attack
    if opts.accounts not in ("per_probe", "single"):
        raise ValueError(f"attack.accounts must be per_probe or single, got {opts.accounts!r}")
    cfg = preset_config(cfg, "prefix_probe")
    wl = _plain(cfg.workload)
    if wl.get("name") != "prefix_probe":
        raise ValueError(f"kvrl-attack prefix-probe needs workload=prefix_probe, got workload={wl.get('name')!r}")
    executor = build_executor(cfg)
    rows, probe_rows = [], []
    forged: dict = {}
    for label, scope, prefix_hash, prober in _probe_runs(opts, cfg):
        run_cfg = _with_policy(cfg, {"engine": {"prefix_cache_scope": scope, "prefix_hash": prefix_hash}})
        engine = build_engine(run_cfg, executor=executor, record_steps=False)
        requests = build_workload(wl, vocab_size=executor.vocab_size, max_model_len=engine.config.max_model_len)
        victim_reqs = [r for r in requests if r.tenant == wl["victim"]["name"]]
        bs = engine.config.block_size
        if prober == "forge" and (not victim_reqs or victim_reqs[0].prompt_len < bs):
            raise ValueError("attack.probers=forge needs victim requests of at least one block "
                             "(workload.victim.system_prompt_len >= engine.block_size)")
        ctx = ProbeContext(victim=wl["victim"]["name"], scope=scope, block_size=bs, vocab_size=executor.vocab_size,
                           victim_block=victim_reqs[0].prompt_token_ids[:bs] if victim_reqs else np.zeros(0),
                           seed=int(cfg.seed), forged=forged)
        labels = {}
        for i, r in enumerate(requests):
            truth = probe_label(r)
            if truth is None:
                continue
            labels[r.request_id] = truth
            if opts.accounts == "per_probe":
                r = replace(r, tenant=f"{r.tenant}#{r.request_id.rsplit('-', 2)[-2]}")
            requests[i] = apply_prober(prober, r, ctx)
        if not labels:
            raise ValueError("the workload has no labelled probes (workload.num_probes=0?)")
        wall = time.perf_counter()
        summary = engine.run(requests)
        wall = time.perf_counter() - wall
        recs = engine.metrics.requests
        ids = [rid for rid in labels if rid in recs and recs[rid].ttft_s is not None]
        lost = len(labels) - len(ids)
        ttft = np.array([recs[rid].ttft_s for rid in ids])
        correct = np.array([labels[rid] for rid in ids])
        score = score_probes(ttft, correct, seed=int(cfg.seed), resamples=int(opts.resamples),
                             threshold=opts.threshold)
        pred = ttft <= score["threshold_s"]
        for rid, t, c, p in zip(ids, ttft, correct, pred):
            probe_rows.append((label, rid, bool(c), float(t), bool(p)))
        victim = [r for r in recs.values() if r.tenant == wl["victim"]["name"]]
        rows.append({"scope": scope, "run": label, "prefix_hash": prefix_hash, "prober": prober,
                     "accounts": opts.accounts, "backend": cfg.backend.name,
                     "probes_lost": lost, **score,
                     "victim_requests": len(victim), "prefix_hit_rate": summary["prefix_hit_rate"],
                     "prefix_check_failures": summary.get("prefix_check_failures"),
                     "wall_s": wall})
        log.info("%s: accuracy %.3f (Fisher p=%.3g), gap %.3g s", label, score["accuracy"], score["fisher_p"],
                 score["gap_s"])
    result = {"command": "prefix_probe", "backend": cfg.backend.name, "model": cfg.model.name,
              "cost_model": getattr(executor, "cost_source", executor.name),
              "device": cfg.device.name if cfg.backend.name == "sim" else None,
              "workload": wl, "rows": rows}
    _write(out_dir, "prefix_probe", result, probe_markdown(result))
    with open(out_dir / "probes.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(("run", "request_id", "correct", "ttft_s", "predicted_correct"))
        w.writerows(probe_rows)
    plot_probes(result, probe_rows, out_dir / "prefix_probe.png")
    return result


def plot_probes(result: dict, probe_rows: list, path: Path) -> None:
    """TTFT of correct vs wrong probes per scope, with the attacker's threshold."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter

    from kvrl.apps.outputs import atomic_write

    rows = result["rows"]
    fig, axes = plt.subplots(1, len(rows), figsize=(5.5 * len(rows), 3.8), squeeze=False, sharex=True)
    all_t = np.array([t for _, _, _, t, _ in probe_rows]) * 1e3
    log_bins = len(all_t) > 1 and all_t.min() > 0 and all_t.max() > all_t.min()
    bins = np.geomspace(all_t.min(), all_t.max() * 1.0001, 50) if log_bins else 20
    for ax, row in zip(axes[0], rows):
        pts = [(t, c) for run, _, c, t, _ in probe_rows if run == row["run"]]
        t = np.array([p[0] for p in pts]) * 1e3
        c = np.array([p[1] for p in pts], dtype=bool)
        ax.hist(t[c], bins=bins, alpha=0.6, label="correct prefix")
        ax.hist(t[~c], bins=bins, alpha=0.6, label="wrong prefix")
        ax.axvline(row["threshold_s"] * 1e3, color="k", ls="--", lw=1, label="attacker's threshold")
        if log_bins:
            ax.set_xscale("log")
            ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
            ax.xaxis.set_major_formatter(FormatStrFormatter("%g"))
            ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("attacker's TTFT (ms)")
        ax.set_title(f"scope={row['run']}: accuracy {row['accuracy']:.2f}, Fisher p={row['fisher_p']:.2g}",
                     fontsize=10)
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("probes")
    fig.suptitle(f"prefix probing, {result['backend']} {result['model']}", fontsize=10)
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=110), mode="wb")
    plt.close(fig)


def _fmt(x: Any, digits: int = 3) -> str:
    if isinstance(x, float):
        if not math.isfinite(x):
            return "n/a"
        return f"{x:.{digits}g}"
    return str(x)


def probe_markdown(result: dict) -> str:
    wl = result["workload"]
    lines = [f"Prefix probing ({result['backend']}, {result['model']}"
             + (f", {result['device']}" if result.get("device") else "") + f"): {wl['num_probes']} probes of "
             f"{wl.get('probe_len') or wl['victim']['system_prompt_len']} tokens, wrong_mode={wl['wrong_mode']}, "
             f"seed={wl['seed']}; attacker threshold: {result['rows'][0]['threshold'] if result['rows'] else ''}", "",
             "| scope | accounts | attacker | prefix_hash | accuracy (95% CI) | Fisher p | TTFT correct / wrong (ms) | gap wrong-correct (ms, 95% CI) | permutation p | AUC |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lo, hi = r["accuracy_ci"]
        glo, ghi = r["gap_ci_s"]
        lines.append(f"| {r['run']} | {r['accounts']} | {r['prober']} | {r['prefix_hash']} | "
                     f"{r['accuracy']:.3f} ({lo:.3f}-{hi:.3f}) | "
                     f"{_fmt(r['fisher_p'])} | {_fmt(1e3 * r['ttft_correct_mean_s'])} / "
                     f"{_fmt(1e3 * r['ttft_wrong_mean_s'])} | {_fmt(1e3 * r['gap_s'])} "
                     f"({_fmt(1e3 * glo)} to {_fmt(1e3 * ghi)}) | {_fmt(r['gap_perm_p'])} | {_fmt(r['auc'])} |")
    return "\n".join(lines) + _cost_note(result)


def _cost_note(result: dict) -> str:
    cost = result.get("cost_model")
    return f"\n\nStep times: {cost}.\n" if cost and result.get("backend") == "sim" else "\n"


# ============================================================================ fill and squeeze
def benign_stats(engine: Any, attacker: str, span_s: float) -> dict:
    """Per-tenant view of a run: the benign tenants (every tenant but ``attacker``) and the attacker."""
    recs = list(engine.metrics.requests.values())
    benign = [r for r in recs if r.tenant != attacker]
    bad = [r for r in recs if r.tenant == attacker]
    good = sum(r.output_tokens for r in benign if r.meets_slo)
    ttfts = [r.ttft_s for r in benign if r.ttft_s is not None and r.finish_s is not None and not r.error]
    pre = [r.num_preemptions for r in benign]
    all_pre = [r.num_preemptions for r in recs]
    return {
        "benign_requests": len(benign),
        "benign_good_tokens": good,
        "benign_goodput_tok_s": good / span_s if span_s > 0 else float("nan"),
        "benign_slo_attainment": (sum(r.meets_slo for r in benign) / len(benign)) if benign else float("nan"),
        "benign_ttft_p99_s": float(np.percentile(ttfts, 99)) if ttfts else float("nan"),
        "benign_preemptions": int(sum(pre)),
        "benign_max_preemptions": int(max(pre)) if pre else 0,
        "max_preemptions": int(max(all_pre)) if all_pre else 0,
        "attacker_requests": len(bad),
        "attacker_finished": sum(1 for r in bad if r.finish_s is not None and not r.error),
        "attacker_output_tokens": sum(r.output_tokens for r in bad),
        "aborted": sum(1 for r in recs if r.error),
        "rejected": len(engine.metrics.rejected),
        "policy_errors": engine.metrics.policy_errors,
        "finish_times": [(r.finish_s, r.output_tokens) for r in benign if r.meets_slo],
    }


def _serve(cfg: Any, requests: list, executor: Any) -> tuple[Any, float]:
    from kvrl.builder import build_engine
    engine = build_engine(cfg, executor=executor, record_steps=False)
    wall = time.perf_counter()
    engine.run(requests)
    return engine, time.perf_counter() - wall


def run_fill_squeeze(cfg: Any, out_dir: Path) -> dict:
    """Every defence with and without the attack; benign goodput relative to the undefended
    no-attack baseline."""
    from kvrl.builder import build_executor
    from kvrl.workloads import build_workload

    opts = cfg.attack
    cfg = preset_config(cfg, "fill_squeeze")
    wl = _plain(cfg.workload)
    attacker = wl.get("attacker", opts.attacker)
    executor = build_executor(cfg)
    requests = build_workload(wl, vocab_size=executor.vocab_size,
                              max_model_len=cfg.engine.max_model_len or executor.max_model_len)
    benign_only = [r for r in requests if r.tenant != attacker]
    if len(benign_only) == len(requests):
        raise ValueError(f"no request of the attacker tenant {attacker!r} in the workload")
    arrivals = [r.arrival_s for r in benign_only]
    span = max(arrivals) - min(arrivals) if len(arrivals) > 1 else 1.0
    rows, series = [], {}
    for name, overrides in _selected_defences(cfg).items():
        run_cfg = _with_policy(cfg, overrides)
        row = {"defence": name, "policies": _policy_label(run_cfg)}
        for tag, reqs in (("no_attack", benign_only), ("attack", requests)):
            engine, wall = _serve(run_cfg, reqs, executor)
            stats = benign_stats(engine, attacker, span)
            series[(name, tag)] = stats.pop("finish_times")
            row[tag] = stats
            row[f"{tag}_wall_s"] = wall
        rows.append(row)
        log.info("%s: benign goodput %.0f -> %.0f tok/s under attack", name, row["no_attack"]["benign_goodput_tok_s"],
                 row["attack"]["benign_goodput_tok_s"])
    ref = next(r for r in rows if r["defence"] == opts.baseline)["no_attack"]["benign_goodput_tok_s"]
    for r in rows:
        own = r["no_attack"]["benign_goodput_tok_s"]
        r["attack_fraction_of_baseline"] = r["attack"]["benign_goodput_tok_s"] / ref if ref else float("nan")
        r["attack_fraction_of_own"] = r["attack"]["benign_goodput_tok_s"] / own if own else float("nan")
        r["benign_cost"] = own / ref - 1 if ref else float("nan")
    result = {"command": "fill_squeeze", "backend": cfg.backend.name, "model": cfg.model.name,
              "cost_model": getattr(executor, "cost_source", executor.name),
              "device": cfg.device.name, "engine": _plain(cfg.engine), "slo": _plain(cfg.slo),
              "workload": wl, "baseline": opts.baseline, "benign_span_s": span, "rows": rows}
    _write(out_dir, "fill_squeeze", result, fill_squeeze_markdown(result))
    plot_fill_squeeze(result, series, out_dir / "fill_squeeze.png", bin_s=float(opts.plot_bin_s),
                      defence=opts.plot_defence)
    return result


def fill_squeeze_markdown(result: dict) -> str:
    eng = result["engine"]
    device = f"{result['device']}, " if result["backend"] == "sim" else ""
    lines = [f"Fill-and-squeeze ({result['backend']}, {result['model']}, {device}"
             f"{eng['num_blocks']} blocks of {eng['block_size']}, SLO TTFT {result['slo']['ttft_s']} s / "
             f"TPOT {result['slo']['tpot_s']} s): benign goodput = SLO-meeting output tokens of the benign "
             f"tenant(s) / their {result['benign_span_s']:.0f} s arrival span; fraction = under attack / "
             f"the `{result['baseline']}` engine without attack.", "",
             "| defence | watermark / eviction | benign goodput no attack (tok/s) | under attack (tok/s) | "
             "fraction of baseline | SLO attainment under attack | benign TTFT p99 under attack (s) | "
             "preemptions per benign request: max (total) | attacker tokens served |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        a, n = r["attack"], r["no_attack"]
        lines.append(f"| {r['defence']} | `{r['policies']}` | {n['benign_goodput_tok_s']:.0f} | "
                     f"{a['benign_goodput_tok_s']:.0f} | {r['attack_fraction_of_baseline']:.3f} | "
                     f"{a['benign_slo_attainment']:.3f} | {_fmt(a['benign_ttft_p99_s'])} | "
                     f"{a['benign_max_preemptions']} ({a['benign_preemptions']}) | {a['attacker_output_tokens']} |")
    return "\n".join(lines) + _cost_note(result)


def attack_window(wl: dict) -> Optional[tuple[float, float]]:
    """[start, end) of the attacker's arrivals in a fill_and_squeeze workload config."""
    try:
        t = float(wl["attack_start_s"]) + wl["probe_count"] / wl["probe_rate"]
        t += max(wl["flood_count"] - 1, 0) / wl["flood_rate"] + wl["squeeze_delay_s"]
        return float(wl["attack_start_s"]), t + wl["squeeze_count"] / wl["squeeze_rate"]
    except (KeyError, TypeError, ZeroDivisionError):
        return None


def plot_fill_squeeze(result: dict, series: dict, path: Path, bin_s: float = 2.0,
                      defence: Optional[str] = None) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from kvrl.apps.outputs import atomic_write

    rows = result["rows"]
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(13, 4.5), gridspec_kw={"width_ratios": [1, 1.4]})
    names = [r["defence"] for r in rows]
    no_attack = [r["no_attack"]["benign_goodput_tok_s"] for r in rows]
    attack = [r["attack"]["benign_goodput_tok_s"] for r in rows]
    x = np.arange(len(rows))
    ax0.bar(x - 0.2, no_attack, 0.4, label="no attack")
    ax0.bar(x + 0.2, attack, 0.4, label="under attack")
    for i, r in enumerate(rows):
        ax0.text(x[i] + 0.2, attack[i], f"{r['attack_fraction_of_baseline']:.2f}", ha="center", va="bottom",
                 fontsize=8)
    ax0.set_xticks(x, names, rotation=30, ha="right", fontsize=8)
    ax0.set_ylabel("benign goodput (tok/s)")
    ax0.set_title("benign goodput (label: fraction of baseline)", fontsize=10)
    ax0.legend(fontsize=8)
    base = result["baseline"]
    strongest = defence if defence in names else max(rows, key=lambda r: r["attack_fraction_of_baseline"])["defence"]
    end = max((t for s in series.values() for t, _ in s), default=1.0)
    edges = np.arange(0.0, end + bin_s, bin_s)
    for (name, tag), style in (((base, "no_attack"), "k-"), ((base, "attack"), "r-"), ((strongest, "attack"), "b-")):
        pts = series.get((name, tag), [])
        if not pts:
            continue
        t, tok = np.array(pts).T
        hist, _ = np.histogram(t, bins=edges, weights=tok)
        ax1.plot(edges[:-1], hist / bin_s, style, lw=1,
                 label=f"{name}, {'no attack' if tag == 'no_attack' else 'attack'}")
    window = attack_window(result["workload"])
    if window:
        ax1.axvspan(*window, color="grey", alpha=0.15, label="attacker sending")
    ax1.set_xlabel("engine time (s)")
    ax1.set_ylabel(f"benign SLO-meeting tokens / s ({bin_s:g} s bins, by finish)")
    ax1.legend(fontsize=8)
    fig.suptitle(f"fill-and-squeeze, {result['backend']} {result['model']}"
                 f"{' ' + result['device'] if result['backend'] == 'sim' else ''}, "
                 f"{result['engine']['num_blocks']} blocks", fontsize=10)
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=110), mode="wb")
    plt.close(fig)


# ============================================================================ benign cost
def run_benign_cost(cfg: Any, out_dir: Path) -> dict:
    """Every defence on a workload without an attacker, relative to the baseline defence."""
    from kvrl.builder import build_executor
    from kvrl.workloads import build_workload

    opts = cfg.attack
    cfg = preset_config(cfg, "benign_cost")
    wl = _plain(cfg.workload)
    executor = build_executor(cfg)
    requests = build_workload(wl, vocab_size=executor.vocab_size,
                              max_model_len=cfg.engine.max_model_len or executor.max_model_len)
    rows = []
    for name, overrides in _selected_defences(cfg).items():
        run_cfg = _with_policy(cfg, overrides)
        engine, wall = _serve(run_cfg, requests, executor)
        s = engine.metrics.summary()
        recs = list(engine.metrics.requests.values())
        per_tenant = {}
        for t in sorted({r.tenant for r in recs}):
            tt = [r.ttft_s for r in recs if r.tenant == t and r.ttft_s is not None]
            per_tenant[t] = float(np.percentile(tt, 99)) if tt else float("nan")
        rows.append({"defence": name, "policies": _policy_label(run_cfg), "wall_s": wall,
                     "ttft_p99_by_tenant_s": per_tenant,
                     **{k: s[k] for k in ("finished", "aborted", "rejected", "goodput_tok_s", "throughput_tok_s",
                                          "slo_attainment", "ttft_p99_s", "tpot_p99_s", "preemptions",
                                          "policy_errors")},
                     "max_preemptions": max((r.num_preemptions for r in recs), default=0)})
    ref = next(r for r in rows if r["defence"] == opts.baseline)
    for r in rows:
        r["goodput_vs_baseline"] = r["goodput_tok_s"] / ref["goodput_tok_s"] - 1 if ref["goodput_tok_s"] else float("nan")
        r["throughput_vs_baseline"] = (r["throughput_tok_s"] / ref["throughput_tok_s"] - 1
                                       if ref["throughput_tok_s"] else float("nan"))
    result = {"command": "benign_cost", "backend": cfg.backend.name, "model": cfg.model.name,
              "cost_model": getattr(executor, "cost_source", executor.name),
              "device": cfg.device.name, "engine": _plain(cfg.engine), "slo": _plain(cfg.slo), "workload": wl,
              "baseline": opts.baseline, "rows": rows}
    _write(out_dir, "benign_cost", result, benign_cost_markdown(result))
    return result


def benign_cost_markdown(result: dict) -> str:
    wl, eng = result["workload"], result["engine"]
    device = f"{result['device']}, " if result["backend"] == "sim" else ""
    lines = [f"Benign cost ({result['backend']}, {result['model']}, {device}workload {wl['name']}, "
             f"{eng['num_blocks']} blocks of {eng['block_size']}): change relative to `{result['baseline']}`.", "",
             "| defence | watermark / eviction | goodput (tok/s) | vs baseline | throughput (tok/s) | vs baseline | "
             "SLO attainment | TTFT p99 (s) | TTFT p99 by tenant (s) | preemptions (max per request) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        by_tenant = ", ".join(f"{t} {_fmt(v, 2)}" for t, v in r["ttft_p99_by_tenant_s"].items())
        lines.append(f"| {r['defence']} | `{r['policies']}` | {r['goodput_tok_s']:.0f} | "
                     f"{100 * r['goodput_vs_baseline']:+.1f}% | {r['throughput_tok_s']:.0f} | "
                     f"{100 * r['throughput_vs_baseline']:+.1f}% | {r['slo_attainment']:.3f} | "
                     f"{_fmt(r['ttft_p99_s'])} | {by_tenant} | {r['preemptions']} ({r['max_preemptions']}) |")
    return "\n".join(lines) + _cost_note(result)


# ============================================================================ entry points
def _write(out_dir: Path, stem: str, result: dict, markdown: str) -> None:
    from kvrl.apps.outputs import atomic_write

    def clean(x):
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {str(k): clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        if isinstance(x, np.generic):
            return clean(x.item())
        return x

    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(out_dir / f"{stem}.json", lambda f: json.dump(clean(result), f, indent=2))
    atomic_write(out_dir / f"{stem}.md", lambda f: f.write(markdown))


RUNNERS = {"prefix_probe": run_prefix_probe, "fill_squeeze": run_fill_squeeze, "benign_cost": run_benign_cost}


def run(cfg: Any, out_dir: Path) -> dict:
    if cfg.command not in RUNNERS:
        raise ValueError(f"command must be one of {sorted(RUNNERS)}, got {cfg.command!r}")
    return RUNNERS[cfg.command](cfg, Path(out_dir))


def _hydra_entry() -> None:
    import hydra
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    from kvrl import plugins
    from kvrl.apps.outputs import atomic_write
    from kvrl.apps.schema import register_schemas

    plugins.load_entry_points()
    plugins.available("scheduler")
    register_schemas()
    register_attack_schema()

    @hydra.main(config_path="pkg://kvrl.conf", config_name="attack", version_base="1.3")
    def _main(cfg) -> None:
        out_dir = Path(HydraConfig.get().runtime.output_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        atomic_write(out_dir / "config.yaml", lambda f: f.write(OmegaConf.to_yaml(cfg, resolve=True)))
        run(cfg, out_dir)
        print((out_dir / f"{cfg.command}.md").read_text())
        print(f"-> {out_dir}")

    _main()


USAGE = """usage: kvrl-attack COMMAND [hydra overrides...]

commands:
  prefix-probe   cross-tenant prefix-cache timing attack, per engine.prefix_cache_scope
  fill-squeeze   fill-and-squeeze memory attack, benign goodput per defence
  benign-cost    the defences on a workload without an attacker

e.g.  kvrl-attack prefix-probe workload.num_probes=200
      kvrl-attack fill-squeeze attack.only=[undefended,all]
      kvrl-attack benign-cost workload=azure_code engine.num_blocks=1024
See docs/security.md and conf/attack.yaml."""


def main(argv: Optional[list[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0 if args else 2
    command = args.pop(0)
    if command not in COMMANDS:
        print(f"kvrl-attack: unknown command {command!r}; known commands: {', '.join(COMMANDS)}\n\n{USAGE}",
              file=sys.stderr)
        return 2
    key = COMMANDS[command]
    extra = [f"command={key}"]
    if not any(a.split("=", 1)[0].lstrip("+~") == "workload" for a in args):
        extra.append(f"workload={DEFAULT_WORKLOAD[key]}")
    sys.argv = [sys.argv[0], *extra, *args]
    _hydra_entry()
    return 0


if __name__ == "__main__":
    sys.exit(main())
