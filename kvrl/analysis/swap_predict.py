"""Predictors of the next swapped-in sequence from a swap trace's recent history (issue #20, the
CPEN 511 prefetching question), on torch (CPU).

Four models over the ``window`` events before each swap-in (:func:`kvrl.analysis.swap_trace.next_swap_in_samples`):

* MLP and LSTM **regression** of the swapped-in sequence's id relative to the last event's id
  (mean squared error; a prediction counts as right when it rounds to the true id);
* MLP and LSTM **classification** of which event in the window is that sequence's swap-out
  (``window + 1`` classes, the last one "not in the window"; cross entropy; right when the class
  names the sequence's swap-out event).

Beside them two rules that see the whole history: FIFO (the oldest sequence still swapped out:
kvrl's engine swaps in in exactly this order) and LIFO (the newest). Accuracy = right predictions
/ swap-ins in the test traces; ``in_window`` = swap-ins whose sequence's swap-out is inside the
window (the most a window-limited classifier can get right).
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from kvrl.analysis.swap_trace import Samples, next_swap_in_samples, read_csv


def _net(kind: str, window: int, outputs: int, hidden: int = 32):
    import torch
    from torch import nn

    class LSTMHead(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(5, hidden, batch_first=True)
            self.head = nn.Linear(hidden, outputs)

        def forward(self, x):
            out, _ = self.lstm(x)
            return self.head(out[:, -1])

    if kind == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(window * 5, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                             nn.ReLU(), nn.Linear(hidden, outputs))
    if kind == "lstm":
        return LSTMHead()
    raise ValueError(f"predictor kind must be mlp or lstm, got {kind!r}")


def fit(kind: str, task: str, train: Samples, epochs: int = 100, seed: int = 0):
    """A trained ``kind`` (mlp | lstm) net for ``task`` (regression | classification): hidden width
    32 (two hidden layers for the MLP, one LSTM layer), ``epochs`` full-batch Adam steps (lr 3e-3),
    one torch thread."""
    import torch
    torch.manual_seed(seed)
    torch.set_num_threads(1)
    window = train.window
    outputs = 1 if task == "regression" else window + 1
    net = _net(kind, window, outputs)
    x = torch.from_numpy(train.x)
    if task == "regression":
        y = torch.from_numpy(train.offset / 100.0).unsqueeze(1)
        loss_fn = torch.nn.MSELoss()
    elif task == "classification":
        y = torch.from_numpy(train.label)
        loss_fn = torch.nn.CrossEntropyLoss()
    else:
        raise ValueError(f"task must be regression or classification, got {task!r}")
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    for _ in range(epochs):
        opt.zero_grad()
        loss = loss_fn(net(x), y)
        loss.backward()
        opt.step()
    return net


def accuracy(net, task: str, test: Samples) -> float:
    """Share of ``test`` swap-ins the net names correctly (see module doc)."""
    import torch
    if not len(test.label):
        return float("nan")
    with torch.no_grad():
        out = net(torch.from_numpy(test.x))
    if task == "regression":
        pred = np.rint(out.squeeze(1).numpy() * 100.0)
        return float(np.mean(pred == test.offset))
    pred = out.argmax(1).numpy()
    return float(np.mean((pred == test.label) & (test.label < test.window)))


def _samples(paths: Sequence[Path], window: int) -> Samples:
    parts = [next_swap_in_samples(read_csv(p), window) for p in paths]
    cat = lambda name: np.concatenate([getattr(s, name) for s in parts])
    return Samples(cat("x"), cat("offset"), cat("label"), cat("target_seq"), cat("fifo"), cat("lifo"), window)


def accuracy_table(trace_dir: Path, workloads: Sequence[str], seeds: Sequence[int],
                   windows: Sequence[int]) -> list[dict]:
    """Per workload and window: train on every seed's trace but the last, test on the last's."""
    if len(seeds) < 2:
        raise ValueError("the predictors need at least two seeds (train on all but the last, test on the last)")
    rows = []
    for name in workloads:
        train_paths = [trace_dir / f"{name}-{s}.csv" for s in seeds[:-1]]
        test_paths = [trace_dir / f"{name}-{seeds[-1]}.csv"]
        for window in windows:
            train, test = _samples(train_paths, window), _samples(test_paths, window)
            row = {"workload": name, "window": window, "train": len(train.label), "test": len(test.label),
                   "in_window": float(np.mean(test.label < window)) if len(test.label) else float("nan"),
                   "fifo": float(np.mean(test.fifo == test.target_seq)) if len(test.label) else float("nan"),
                   "lifo": float(np.mean(test.lifo == test.target_seq)) if len(test.label) else float("nan")}
            for kind in ("mlp", "lstm"):
                for task in ("regression", "classification"):
                    row[f"{kind}_{task[:3]}"] = accuracy(fit(kind, task, train), task, test)
            rows.append(row)
    return rows


def render(rows: list[dict]) -> str:
    cols = ("workload", "window", "train", "test", "mlp_reg", "lstm_reg", "mlp_cla", "lstm_cla", "in_window",
            "fifo", "lifo")
    head = ("workload", "window", "train swap-ins", "test swap-ins", "MLP regression", "LSTM regression",
            "MLP classification", "LSTM classification", "in window", "FIFO rule", "LIFO rule")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lines.append("| " + " | ".join(f"{r[c]:.3f}" if isinstance(r[c], float) else str(r[c]) for c in cols) + " |")
    return "\n".join(lines)
