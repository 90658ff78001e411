"""``kvrl-attack prefix-probe``: cross-tenant prefix-cache timing attack.

An attacker tenant sends candidate prefixes of a victim tenant's system prompt (the
``prefix_probe`` workload: some correct, some wrong) and infers "correct" from its own time to
first token (a prefix-cache hit is fast), once per cache scope, prefix hash and prober
(``plain``, ``forge``, ``salt_spoof``); scored by :mod:`kvrl.attacks.scoring`.
"""
from __future__ import annotations

import csv
import logging
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from kvrl.attacks.common import cost_note, fmt, plain, write_result
from kvrl.attacks.config import preset_config, with_policy
from kvrl.attacks.scoring import score_probes

log = logging.getLogger("kvrl.attack")


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
      attacker's own salt, equals that of the victim's first block (:mod:`kvrl.attacks.forge`), so
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
    from kvrl.attacks.forge import BLOCK_TOKENS, forge_prefix
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
    wl = plain(cfg.workload)
    if wl.get("name") != "prefix_probe":
        raise ValueError(f"kvrl-attack prefix-probe needs workload=prefix_probe, got workload={wl.get('name')!r}")
    executor = build_executor(cfg)
    rows, probe_rows = [], []
    forged: dict = {}
    for label, scope, prefix_hash, prober in _probe_runs(opts, cfg):
        run_cfg = with_policy(cfg, {"engine": {"prefix_cache_scope": scope, "prefix_hash": prefix_hash}})
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
    write_result(out_dir, "prefix_probe", result, probe_markdown(result))
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

    from kvrl.files import atomic_write

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
                     f"{fmt(r['fisher_p'])} | {fmt(1e3 * r['ttft_correct_mean_s'])} / "
                     f"{fmt(1e3 * r['ttft_wrong_mean_s'])} | {fmt(1e3 * r['gap_s'])} "
                     f"({fmt(1e3 * glo)} to {fmt(1e3 * ghi)}) | {fmt(r['gap_perm_p'])} | {fmt(r['auc'])} |")
    return "\n".join(lines) + cost_note(result)
