"""Writing a run's results: atomic files, metrics.json (both from :mod:`kvrl.files`), the summary
table, and plots."""
from __future__ import annotations

import os

from kvrl.files import atomic_write, write_json  # noqa: F401  (the apps' writers, defined below the layers)


def summary_table(title: str, metrics: dict[str, float]) -> str:
    """The run summary as a rich table rendered to text."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, show_header=True)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key in ("requests", "finished", "rejected", "aborted", "clipped", "dropped", "policy_errors",
                "policy_time_s", "output_tokens", "duration_s", "throughput_tok_s",
                "goodput_tok_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "kv_utilization",
                "kv_occupancy", "preemptions", "swapped_out_blocks", "swapped_in_blocks", "recomputed_tokens",
                "prefix_hit_rate"):
        if key not in metrics:
            continue
        value = metrics[key]
        text = f"{value:.4g}" if isinstance(value, float) else str(value)
        table.add_row(key, text)
    console = Console(width=80, record=True, force_terminal=False)
    with console.capture() as cap:
        console.print(table)
    return cap.get()


def plot_steps(steps_csv: os.PathLike, out_png: os.PathLike, title: str = "") -> None:
    """KV usage, queue lengths and throughput over engine time from a steps.csv."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    data = np.genfromtxt(steps_csv, delimiter=",", names=True)
    if data.size < 2:
        return
    t = data["time_s"]
    fig, axes = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    axes[0].plot(t, data["kv_occupancy"], label="occupancy (used / total blocks)")
    axes[0].plot(t, data["kv_utilization"], label="utilization (tokens / slots in used blocks)", alpha=0.7)
    reserved = data["reserved_blocks"] / max(data["used_blocks"].max() + data["free_blocks"].max(), 1)
    axes[0].plot(t, np.minimum(reserved, 1.0), label="watermark (reserved / total)", alpha=0.7)
    axes[0].set_ylabel("fraction")
    axes[0].set_ylim(0, 1.05)
    axes[0].legend(loc="lower right", fontsize=8)
    for col in ("num_running", "num_waiting", "num_swapped"):
        axes[1].plot(t, data[col], label=col.replace("num_", ""))
    axes[1].set_ylabel("sequences")
    axes[1].legend(loc="upper right", fontsize=8)
    window = max(1, len(t) // 200)
    tokens = data["prefill_tokens"] + data["decode_tokens"]
    kernel = np.ones(window)
    rate = np.convolve(tokens, kernel, "same") / np.maximum(np.convolve(data["duration_s"], kernel, "same"), 1e-12)
    axes[2].plot(t, rate)
    axes[2].set_ylabel("tokens/s computed")
    axes[2].set_xlabel("engine time (s)")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    atomic_write(out_png, lambda f: fig.savefig(f, format="png", dpi=110), mode="wb")
    plt.close(fig)
