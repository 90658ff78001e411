"""kvrl-eval's leaderboard: one row per distinct policy, paired verdicts, invalid runs ranked last,
a terminal view that fits 120 columns, and plots without repeated panels or meaningless axes."""
from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from kvrl.apps import leaderboard
from kvrl.apps.leaderboard import build_rows, dedupe_policies, markdown, text_table


@dataclass(frozen=True)
class Policy:            # the shape of kvrl.apps.eval.Policy
    label: str
    kind: str
    plugin: dict


AGENT = "agent dqn (2026-11-24/02-41-07-123456-ab12/watermark-dqn-long-name/model.zip)"


def results(goodput: dict[str, list[float]], kinds: dict[str, str] | None = None, extra=None) -> list[dict]:
    out = []
    for policy, values in goodput.items():
        for seed, g in enumerate(values):
            out.append({"policy": policy, "kind": (kinds or {}).get(policy, "heuristic"), "seed": seed,
                        "goodput_tok_s": g, "throughput_tok_s": g, "slo_attainment": 0.9, "ttft_p99_s": 1000 / g,
                        "tpot_p99_s": 0.05, "preemptions": 3, "recomputed_tokens": 10,
                        **(extra or {}).get(policy, {})})
    return out


def test_a_val_tuned_heuristic_that_picked_its_defaults_is_its_default_row():
    policies = [Policy("cost_aware", "heuristic", {"name": "cost_aware"}),
                Policy("lifo", "heuristic", {"name": "lifo"}),
                Policy("cost_aware(victim=lifo) [val-tuned]", "val-tuned", {"name": "cost_aware", "victim": "lifo"}),
                Policy("lifo(mode=swap) [val-tuned]", "val-tuned", {"name": "lifo", "mode": "swap"})]
    merged = dedupe_policies(policies, "eviction")
    assert [p.label for p in merged] == ["cost_aware [val-tuned]", "lifo", "lifo(mode=swap) [val-tuned]"]
    assert len(dedupe_policies(policies)) == 4           # without the kind: configs compared as written


def test_the_val_picked_constant_equal_to_a_baseline_is_one_row():
    fixed = {"name": "fixed", "fraction": 0.01}
    policies = [Policy("fixed(fraction=0.01)", "heuristic", dict(fixed)), Policy("opt_factor", "heuristic",
                {"name": "opt_factor"}), Policy("fixed(fraction=0.01) [val-best]", "val-best", dict(fixed)),
                Policy(AGENT, "agent", {"name": "agent", "policy_path": "x"})]
    merged = dedupe_policies(policies)
    assert [(p.label, p.kind) for p in merged] == [("fixed(fraction=0.01) [val-best]", "val-best"),
                                                   ("opt_factor", "heuristic"), (AGENT, "agent")]
    # the references the evaluation passes (first baseline + val-best) name one policy: one Δ column
    base = [350.0, 420.0, 380.0, 400.0]
    rows = build_rows(results({"fixed(fraction=0.01) [val-best]": base, "opt_factor": [g - 1 for g in base],
                               AGENT: [g * 1.1 for g in base]}),
                      ["fixed(fraction=0.01) [val-best]", "fixed(fraction=0.01) [val-best]"])
    assert all(list(r.deltas) == ["fixed(fraction=0.01) [val-best]"] for r in rows)
    agent = rows[0]
    assert agent.policy == AGENT
    c = agent.comparisons["fixed(fraction=0.01) [val-best]"]
    assert c.verdict == "better" and c.pct_change == pytest.approx(10.0)
    assert rows[1].comparisons["fixed(fraction=0.01) [val-best]"].verdict == "no significant difference" or \
        rows[2].comparisons["fixed(fraction=0.01) [val-best]"].verdict == "worse"


def test_invalid_runs_rank_last_and_are_flagged(tmp_path):
    rows = build_rows(results({"lifo": [100, 110], "broken": [200, 215]},
                              extra={"broken": {"aborted": 169, "policy_errors": 0}}), ["lifo"])
    assert [r.policy for r in rows] == ["lifo", "broken"] and rows[1].invalid == 2
    assert leaderboard.warnings(rows) == ["broken: 2 of 2 runs aborted requests or had policy errors "
                                          "(invalid: ranked after every clean policy)"]
    md = markdown(rows, "t")
    assert "**Warning:** broken" in md and "| 2 | broken | heuristic | 2 | 2 |" in md
    leaderboard.write_csv(rows, tmp_path / "l.csv")
    table = list(csv.DictReader(open(tmp_path / "l.csv")))
    assert table[1]["invalid_runs"] == "2" and table[1]["vs lifo_verdict"] == "better"
    assert "warning: broken" in text_table(rows, "t")


def test_terminal_view_fits_120_columns_and_prints_paths_whole(tmp_path):
    long = tmp_path / ("a-very-long-directory-name-" * 4) / "runs" / "eval" / "2026-11-24" / "02-41-07-123456"
    base = [350.0, 420.0, 380.0]
    labels = ["fixed(fraction=0.01) [val-best]", "opt_factor", "avg_block_len", "token_ratio", "past_future", AGENT]
    rows = build_rows(results({p: [g + i for g in base] for i, p in enumerate(labels)}),
                      ["fixed(fraction=0.01) [val-best]", "opt_factor"])
    text = text_table(rows, "kvrl-eval: kvrl/Watermark-v0 on split=test (3 seeds)",
                      files=[long / "leaderboard.md"])
    lines = text.splitlines()
    table = [line for line in lines if str(tmp_path) not in line]
    assert max(map(len, table)) <= 120, max(table, key=len)
    cells = [line.split("│") for line in table if line.count("│") >= 4]
    policies, current = [], ""
    for number, policy, *_ in cells[1:]:          # a row's policy cell, folded over lines, never cut
        if number.strip() and current:
            policies.append(current)
            current = ""
        current += policy.strip() if not current else " " * (not current.endswith(("/", "-"))) + policy.strip()
    policies.append(current)
    assert sorted(p.replace(" ", "") for p in policies) == sorted(p.replace(" ", "") for p in labels)
    assert "…" not in text
    assert f"  {long / 'leaderboard.md'}" in lines                    # a whole path on its own line
    assert "[1] fixed(fraction=0.01) [val-best]" in lines and "reference" in text


def test_traces_share_a_panel_when_identical_and_show_no_fake_preemption_axis(tmp_path, monkeypatch):
    t = np.linspace(0, 10, 50)
    quiet = {"time_s": t, "kv_occupancy": t / 20, "watermark": np.full_like(t, 0.01), "preemptions": np.zeros_like(t)}
    busy = {**quiet, "preemptions": np.arange(50.0)}
    saved = {}
    monkeypatch.setattr(leaderboard.figures, "save", lambda fig, path, caption=None: saved.update(fig=fig, cap=caption))
    leaderboard.plot_traces({"fixed(fraction=0.01)": quiet, "fixed(fraction=0.01) [val-best]": dict(quiet),
                             AGENT: busy}, tmp_path / "traces.png", caption="Task X")
    fig = saved["fig"]
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titles == ["fixed(fraction=0.01) = fixed(fraction=0.01) [val-best] (identical runs)", AGENT]
    twins = [ax for ax in fig.axes if ax.get_ylabel().startswith("preemptions")]
    assert twins[0].get_ylim() == (0.0, 1.0) and twins[1].get_ylim()[1] >= 49
    assert saved["cap"] == "Task X"


def test_bars_plot_is_png_and_pdf_with_a_unit(tmp_path):
    rows = build_rows(results({"a": [1.0, 50.0], "b": [3.0, 4.0]}), ["a"])
    leaderboard.plot_bars(rows, tmp_path / "goodput.png", caption="Task X")
    assert (tmp_path / "goodput.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "goodput.pdf").read_bytes()[:4] == b"%PDF"
