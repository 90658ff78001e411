"""``kvrl-attack fill-squeeze``: the fill-and-squeeze memory attack against every defence.

The ``fill_and_squeeze`` workload with and without the attacker's requests, once per defence of
``attack.defences``: the benign tenants' goodput (SLO-meeting output tokens per second of their
arrival span), its fraction of the undefended no-attack baseline, SLO attainment, p99 TTFT and
preemptions per benign request, plotted over time.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Optional

import numpy as np

from kvrl.attacks.common import cost_note, fmt, plain, serve, write_result
from kvrl.attacks.config import policy_label, preset_config, selected_defences, with_policy

log = logging.getLogger("kvrl.attack")


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


def run_fill_squeeze(cfg: Any, out_dir: Path) -> dict:
    """Every defence with and without the attack; benign goodput relative to the undefended
    no-attack baseline."""
    from kvrl.builder import build_executor
    from kvrl.workloads import build_workload

    opts = cfg.attack
    cfg = preset_config(cfg, "fill_squeeze")
    wl = plain(cfg.workload)
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
    for name, overrides in selected_defences(cfg).items():
        run_cfg = with_policy(cfg, overrides)
        row = {"defence": name, "policies": policy_label(run_cfg)}
        for tag, reqs in (("no_attack", benign_only), ("attack", requests)):
            engine, wall = serve(run_cfg, reqs, executor)
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
              "device": cfg.device.name, "engine": plain(cfg.engine), "slo": plain(cfg.slo),
              "workload": wl, "baseline": opts.baseline, "benign_span_s": span, "rows": rows}
    write_result(out_dir, "fill_squeeze", result, fill_squeeze_markdown(result))
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
                     f"{a['benign_slo_attainment']:.3f} | {fmt(a['benign_ttft_p99_s'])} | "
                     f"{a['benign_max_preemptions']} ({a['benign_preemptions']}) | {a['attacker_output_tokens']} |")
    return "\n".join(lines) + cost_note(result)


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

    from kvrl.files import atomic_write

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
