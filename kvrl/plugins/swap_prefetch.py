"""Proactive swap-in of preempted requests (issue #20, the CPEN 511 prefetching question): the
``swap_prefetch`` watermark.

kvrl's engine swaps sequences back in strictly in swap-out order (FIFO) while the watermark
allows: the head of the swapped queue comes back once ``free - its blocks >= reserved``. A
*proactive* swap-in brings the sequence that will come back next in as soon as its blocks fit,
ignoring the reservation (its copy is issued in this step and overlaps the step's compute, so it
computes from the next step on). Which sequence comes next is what a predictor answers; the
plugin asks one of two rules (:mod:`kvrl.analysis.swap_predict` measures learned predictors
against them): ``fifo`` names the oldest swapped-out sequence (the engine's own order, so it is
always right), ``lifo`` the newest (wrong whenever more than one sequence is swapped out).
With ``predictor=none`` it is the ``fixed`` watermark.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kvrl.plugins.base import WatermarkPolicy, check_range
from kvrl.plugins.registry import register


@register("watermark", "swap_prefetch")
class SwapPrefetchWatermark(WatermarkPolicy):
    """Keep ``fraction`` of all GPU blocks free (as ``fixed``), except while sequences are swapped
    out and the predicted next one fits in the free blocks: then reserve only what leaves room for
    it (``free - its blocks``), so the engine swaps it in now (see module doc). Parameters:
    ``fraction`` in [0, 1) (default 0.1), ``predictor`` fifo | lifo | none (default fifo)."""

    @dataclass
    class Params:
        fraction: float = 0.1
        predictor: Literal["fifo", "lifo", "none"] = "fifo"

        def __post_init__(self):
            check_range("fraction", self.fraction, 0.0, 1.0, hi_inclusive=False)

    def reserved_blocks(self) -> int:
        view = self.engine
        base = int(self.params.fraction * view.num_blocks)
        if self.params.predictor == "none" or not view.num_swapped:
            return base
        swapped = view.swapped
        target = swapped[0] if self.params.predictor == "fifo" else swapped[-1]
        free = view.num_free_blocks
        need = target.num_cpu_blocks
        return min(base, free - need) if need <= free else base


def plugin_study(build_engine, make_requests, workloads, seeds, fraction: float = 0.1) -> tuple[str, list[dict]]:
    """``swap_prefetch`` (fifo, lifo) and ``fixed`` at ``fraction`` against ``fixed`` at the same
    fraction on every workload, paired over ``seeds``: TTFT p50/p99, TPOT p99 and throughput, with
    95% CIs and verdicts (:func:`kvrl.analysis.stats.paired_compare`). Returns (markdown, rows)."""
    from kvrl.analysis.stats import paired_compare
    settings = {"fixed": ("fixed", {"fraction": fraction}),
                "swap_prefetch fifo": ("swap_prefetch", {"fraction": fraction, "predictor": "fifo"}),
                "swap_prefetch lifo": ("swap_prefetch", {"fraction": fraction, "predictor": "lifo"})}
    metrics = ("ttft_p50_s", "ttft_p99_s", "tpot_p99_s", "throughput_tok_s", "preemptions")
    rows, lines = [], []
    for name in workloads:
        results = {s: {} for s in settings}
        for seed in seeds:
            for setting, (plugin, params) in settings.items():
                engine = build_engine(seed, watermark=plugin, **params)
                results[setting][seed] = engine.run(make_requests(name, seed, engine))
        lines += [f"**{name}** (fraction {fraction}, seeds {list(seeds)}; mean of fixed, then each setting's paired "
                  f"difference with its 95% CI, % change, p and verdict)", "",
                  "| setting | " + " | ".join(metrics) + " |", "|---|" + "---|" * len(metrics)]
        base = results["fixed"]
        lines.append("| fixed (mean) | " + " | ".join(
            f"{sum(base[s][m] for s in seeds) / len(seeds):.4g}" for m in metrics) + " |")
        for setting in list(settings)[1:]:
            cells = []
            for m in metrics:
                c = paired_compare({s: results[setting][s][m] for s in seeds}, {s: base[s][m] for s in seeds}, m)
                rows.append({"workload": name, "setting": setting, "metric": m, "delta": c.delta, "ci": c.delta_ci,
                             "pct": c.pct_change, "p": c.p_value, "verdict": c.verdict, "n": c.n})
                cells.append(f"{c.delta:+.3g} ± {c.delta_ci:.2g} ({c.pct_change:+.1f}%, p {c.p_value:.2g}, {c.verdict})")
            lines.append(f"| {setting} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines), rows
