"""Figures a paper can take: one style, axis labels with units from the metric registry,
confidence bands clipped to the metric's range, a caption under the axes, and every figure saved
twice, ``<name>.png`` (raster, for Markdown) and ``<name>.pdf`` (vector) beside it, atomically.
"""
from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Any, Optional, Sequence

from kvrl.analysis.metrics import axis_label, clip_band
from kvrl.apps.outputs import atomic_write

STYLE = {"font.size": 8, "axes.titlesize": 9, "axes.labelsize": 8, "legend.fontsize": 7, "xtick.labelsize": 7,
         "ytick.labelsize": 7, "pdf.fonttype": 42, "ps.fonttype": 42, "axes.spines.top": False,
         "axes.spines.right": False, "savefig.bbox": "tight", "savefig.dpi": 150}


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend with the paper style applied."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    plt.rcParams.update(STYLE)
    return plt


def set_metric_label(ax: Any, metric: str, axis: str = "y", suffix: str = "") -> None:
    """Label ``ax``'s ``axis`` ("x" or "y") with the metric's registered label and unit."""
    text = axis_label(metric) + suffix
    (ax.set_ylabel if axis == "y" else ax.set_xlabel)(text)


def band(ax: Any, x: Sequence[float], mean: Sequence[float], half: Sequence[float], metric: str, **kwargs) -> None:
    """Fill ``mean ± half`` along ``x``, clipped to ``metric``'s range (NaN half-widths: no band)."""
    lo, hi = zip(*(clip_band(metric, m, h) for m, h in zip(mean, half))) if len(mean) else ((), ())
    ax.fill_between(list(x), lo, hi, **kwargs)


def error_bars(metric: str, mean: Sequence[float], half: Sequence[float]) -> list[list[float]]:
    """Asymmetric ``yerr`` for ``ax.bar``/``ax.errorbar``: ``[below, above]`` per value, each clipped
    to ``metric``'s range (NaN half-widths give none)."""
    below, above = [], []
    for m, h in zip(mean, half):
        if math.isnan(m):
            below.append(0.0)
            above.append(0.0)
            continue
        lo, hi = clip_band(metric, m, h)
        below.append(m - lo)
        above.append(hi - m)
    return [below, above]


def add_caption(fig: Any, text: str, width: int = 110) -> None:
    """``text`` as a caption under the figure, wrapped to ``width`` characters."""
    if text:
        fig.text(0.0, 0.0, "\n".join(textwrap.wrap(text, width)), ha="left", va="top", fontsize=7,
                 transform=fig.transFigure)


def save(fig: Any, png: Path, caption: Optional[str] = None) -> list[Path]:
    """Save ``fig`` as ``png`` and a vector PDF beside it (same stem), each atomically, and close it;
    returns both paths."""
    plt = pyplot()
    png = Path(png)
    if caption:
        add_caption(fig, caption)
    pdf = png.with_suffix(".pdf")
    atomic_write(png, lambda f: fig.savefig(f, format="png"), mode="wb")
    atomic_write(pdf, lambda f: fig.savefig(f, format="pdf"), mode="wb")
    plt.close(fig)
    return [png, pdf]
