"""Documented numbers cannot rot: every generated block of README.md and docs/ (between
``<!-- BEGIN GENERATED: <command> | <kind> -->`` and ``<!-- END GENERATED -->``, see
scripts/docs_tables.py) is re-run here when it is cheap, and a committed number that differs from
what its command prints now fails the suite."""
from __future__ import annotations

import csv
import importlib.util
import json
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("docs_tables", ROOT / "scripts" / "docs_tables.py")
docs_tables = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = docs_tables      # dataclasses look their module up
spec.loader.exec_module(docs_tables)


def test_markers_are_balanced_and_name_their_command_and_kind(tmp_path):
    text = ("intro\n<!-- BEGIN GENERATED: echo 1 | cheap -->\nold\n<!-- END GENERATED -->\n"
            "<!-- BEGIN GENERATED: scripts/x.sh | sim -->\n<!-- END GENERATED -->\n")
    text += "```\n<!-- BEGIN GENERATED: shown in a code block | cheap -->\n<!-- END GENERATED -->\n```\n"
    blocks = docs_tables.find_blocks(text, Path("f.md"))
    assert [(b.line, b.command, b.kind, text[b.start:b.end]) for b in blocks] == [
        (2, "echo 1", "cheap", "old\n"), (5, "scripts/x.sh", "sim", "")]
    for bad, message in (("<!-- BEGIN GENERATED: a | cheap -->\n", "f.md:1: BEGIN GENERATED without an END"),
                         ("<!-- END GENERATED -->\n", "f.md:1: END GENERATED without a BEGIN"),
                         ("<!-- BEGIN GENERATED: a | gpu -->\n<!-- END GENERATED -->\n", "unknown kind 'gpu'"),
                         ("<!-- BEGIN GENERATED: a | sim -->\n<!-- BEGIN GENERATED: b | sim -->\n",
                          "f.md:2: BEGIN GENERATED inside the block opened at line 1")):
        with pytest.raises(ValueError, match=re.escape(message)):
            docs_tables.find_blocks(bad, Path("f.md"))


def test_update_then_check_round_trip(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("# t\n\n<!-- BEGIN GENERATED: printf '| a |\\n|---|\\n| 41 |\\n' | cheap -->\n"
                   "stale\n<!-- END GENERATED -->\ntail\n")
    assert docs_tables.check([doc]) != []
    assert docs_tables.update([doc]) == [doc]
    assert "| 41 |" in doc.read_text() and doc.read_text().endswith("<!-- END GENERATED -->\ntail\n")
    assert docs_tables.check([doc]) == [] and docs_tables.update([doc]) == []


def _cheap_blocks():
    return docs_tables.selected(docs_tables.default_files(ROOT), ("cheap",))


def test_documented_numbers_have_not_drifted(tmp_path):
    """Re-run every cheap block's command once; the committed docs must match, and a copy with one
    number edited by hand must be flagged, naming the file and the command."""
    blocks = _cheap_blocks()
    assert blocks, "no cheap generated block in README.md or docs/"
    files = sorted({b.path for b, _ in blocks})
    run = docs_tables.warm_outputs(files, ("cheap",), ROOT, workers=2).__getitem__
    problems = docs_tables.check(files, ("cheap",), run)
    assert problems == [], "\n".join(problems) + "\n(regenerate: scripts/regen_docs.sh)"

    # edit one number of the first cheap block in a copy: the checker must flag exactly that block
    block, text = blocks[0]
    content = text[block.start:block.end]
    number = re.search(r"(?<![\w.])\d+\.\d+", content)
    assert number, f"no decimal number in the block at {block.where()}"
    edited = content[:number.start()] + str(round(float(number.group()) + 1, 6)) + content[number.end():]
    copy = tmp_path / block.path.name
    shutil.copy(block.path, copy)
    copy.write_text(text[:block.start] + edited + text[block.end:])
    flagged = docs_tables.check([copy], ("cheap",), run)
    assert len(flagged) == 1 and f"{copy}:{block.line}" in flagged[0] and block.command in flagged[0]
    assert f"-{edited.splitlines()[content[:number.start()].count(chr(10))]}" in flagged[0]

    # the same for a number quoted in prose (a fact span): edit its first digit in a copy
    facts = [(b, t) for b, t in blocks if b.fact]
    assert facts, "no fact span in README.md or docs/"
    fact, text = facts[0]
    quoted = text[fact.start:fact.end]
    digit = re.search(r"\d", quoted)
    assert digit, f"no digit in the fact span at {fact.where()}"
    wrong = quoted[:digit.start()] + str((int(digit.group()) + 1) % 10) + quoted[digit.end():]
    copy = tmp_path / f"fact_{fact.path.name}"
    copy.write_text(text[:fact.start] + wrong + text[fact.end:])
    flagged = docs_tables.check([copy], ("cheap",), run)
    assert len(flagged) == 1 and f"{copy}:{fact.line}: the fact {fact.fact!r}" in flagged[0], flagged
    assert repr(wrong) in flagged[0] and repr(quoted) in flagged[0]


def test_fact_spans_name_a_known_source_and_key(tmp_path):
    """A fact span is ``<!-- fact: <source>.<key> -->text<!-- /fact -->`` (scripts/docs_facts.py);
    spans shown in code blocks are not checked; a malformed, unclosed, nested or unknown one, or
    one inside a generated block, is an error naming the file and line."""
    text = ("a <!-- fact: tiers.llama_ttft_p99_drop -->21%<!-- /fact --> b\n"
            "```\n<!-- fact: nosuch.key -->shown<!-- /fact -->\n```\n"
            "c <!-- fact: tiers.gpu_hit -->0.49-\n0.55<!-- /fact -->\n"
            "shown inline: `<!-- fact: nosuch.key -->1<!-- /fact -->`\n")
    facts = docs_tables.find_facts(text, Path("f.md"))
    assert [(f.line, f.fact, f.kind, f.command, text[f.start:f.end]) for f in facts] == [
        (1, "llama_ttft_p99_drop", "cheap", "python scripts/docs_facts.py tiers", "21%"),
        (5, "gpu_hit", "cheap", "python scripts/docs_facts.py tiers", "0.49-\n0.55")]
    for bad, message in (("x\n<!-- fact: nosuch.k -->1<!-- /fact -->", "f.md:2: unknown fact source 'nosuch' (known: "),
                         ("<!-- fact: tiers -->1<!-- /fact -->", "f.md:1: fact name 'tiers' is not <source>.<key>"),
                         ("<!-- fact: tiers.gpu_hit -->1", "f.md:1: fact span without its <!-- /fact -->"),
                         ("<!-- fact: tiers.a --><!-- fact: tiers.b -->1<!-- /fact -->", "f.md:1: fact span inside a fact span")):
        with pytest.raises(ValueError, match=re.escape(message)):
            docs_tables.find_facts(bad, Path("f.md"))
    doc = tmp_path / "g.md"
    doc.write_text("<!-- BEGIN GENERATED: echo 1 | cheap -->\n<!-- fact: tiers.gpu_hit -->1<!-- /fact -->\n<!-- END GENERATED -->\n")
    with pytest.raises(ValueError, match=re.escape(f"{doc}:2: fact span inside the generated block at line 1")):
        docs_tables.selected([doc], ("cheap",))


def test_fact_spans_update_and_check_round_trip(tmp_path):
    """``update`` writes each span's fact from its source (a wrapped span whose words match is left
    alone), ``check`` then passes; a key the source lacks is an error listing the keys it has."""
    facts = json.loads(docs_tables.run_command("python scripts/docs_facts.py tiers", ROOT))
    doc = tmp_path / "doc.md"
    doc.write_text("p99 by <!-- fact: tiers.llama_ttft_p99_drop -->20-26%<!-- /fact -->, seeds\n"
                   "(<!-- fact: tiers.llama_ttft_p50_cpu -->" + facts["llama_ttft_p50_cpu"].replace(", ", ",\n", 1)
                   + "<!-- /fact --> ms)\n")
    problems = docs_tables.check([doc])
    assert len(problems) == 1 and "the text says '20-26%'" in problems[0]
    assert docs_tables.update([doc]) == [doc]
    assert f"p99 by <!-- fact: tiers.llama_ttft_p99_drop -->{facts['llama_ttft_p99_drop']}<!-- /fact -->" in doc.read_text()
    assert ",\n" in doc.read_text()          # the wrapped span was equal: left as written
    assert docs_tables.check([doc]) == [] and docs_tables.update([doc]) == []
    doc.write_text("<!-- fact: tiers.no_such_key -->1<!-- /fact -->\n")
    with pytest.raises(KeyError, match=re.escape("has no fact 'no_such_key' (it has: cpu_hit_pct, gpu_hit, ")):
        docs_tables.check([doc])


rl_spec = importlib.util.spec_from_file_location("rl_tables", ROOT / "scripts" / "rl_tables.py")
rl_tables = importlib.util.module_from_spec(rl_spec)
rl_spec.loader.exec_module(rl_tables)

_REF = "vs fixed(fraction=0.01)"
_LEADERBOARD_HEAD = ("rank,policy,kind,goodput_tok_s_mean,goodput_tok_s_ci95,slo_attainment_mean,preemptions_mean,"
                     f"Δgoodput_tok_s {_REF}_mean,Δgoodput_tok_s {_REF}_ci95,{_REF}_pct_change,{_REF}_p,{_REF}_verdict\n")


def test_verdict_compares_the_best_agent_with_the_strongest_other_policy(tmp_path):
    """The issue-17 table: the best agent on test against the best non-agent, non-oracle policy,
    paired over results.csv's test seeds (an oracle row by its plain constant), with the tally of
    every agent's verdict; without results.csv from the leaderboard's own columns, which must then
    have the strongest policy as a reference."""
    board = tmp_path / "leaderboard.csv"
    board.write_text("rank,policy,kind,runs,goodput_tok_s_mean,goodput_tok_s_ci95\n"
                     "1,fixed(fraction=0.0) [oracle: best constant on test],oracle,3,110,1\n"
                     "2,pi [val-tuned],val-tuned,3,104,1\n3,agent a,agent,3,103,1\n4,agent b,agent,3,90,1\n")
    results = tmp_path / "results.csv"
    pi = (100, 104, 98, 106, 102, 101)
    rows = {"fixed(fraction=0.0)": [v + d for v, d in zip(pi, (6, 7, 5, 8, 6, 7))], "pi [val-tuned]": pi,
            "agent a": [v + d for v, d in zip(pi, (1, -1, 0.5, -0.5, 0, -1))],       # a tie with pi
            "agent b": [v - d for v, d in zip(pi, (20, 22, 19, 21, 20, 23))]}        # worse than pi
    results.write_text("policy,split,seed,goodput_tok_s\n" + "".join(
        f"{policy},test,{seed},{value}\n" for policy, values in rows.items() for seed, value in enumerate(values))
        + "agent a,val,0,999\n")
    out = rl_tables.verdict([f"t={board}:{results}"]).splitlines()
    assert out[2] == ("| t | 3 | 2 | agent a (103) | pi [val-tuned] (104) | -0 ± 1 tok/s (-0.2%, p 0.64, n.s.) "
                      "| -7 ± 2 tok/s (-6.2%, p 0.00022, worse) | 0 / 1 / 1 "
                      "| no: 1 of 1 not beaten, e.g. pi [val-tuned]: -0 ± 1 tok/s (-0.2%, p 0.64, n.s.) |")
    assert out[-1] == ("1 leaderboard. The best agent against the strongest other policy: better on 0, tied (n.s.) "
                       "on 1, worse on 0. All 2 agent evaluations: 0 better, 1 tied, 1 worse. The best agent "
                       "significantly beats every other policy (issue 17's test) on 0.")
    # issue 17's test passes only where the best agent beats every other policy, the oracle row aside
    board2, results2 = tmp_path / "b2.csv", tmp_path / "r2.csv"
    board2.write_text("rank,policy,kind,runs,goodput_tok_s_mean,goodput_tok_s_ci95\n"
                      "1,fixed(fraction=0.0) [oracle: best constant on test],oracle,6,110,1\n"
                      "2,agent c,agent,6,107,1\n3,pi,heuristic,6,102,1\n4,fixed(fraction=0.01),heuristic,6,101,1\n")
    rows2 = {"fixed(fraction=0.0)": rows["fixed(fraction=0.0)"], "pi": pi,
             "agent c": [v + d for v, d in zip(pi, (4, 5, 6, 5, 4, 6))],
             "fixed(fraction=0.01)": [v - d for v, d in zip(pi, (1, 0, 2, 1, 0, 1))]}
    results2.write_text("policy,split,seed,goodput_tok_s\n" + "".join(
        f"{policy},test,{seed},{value}\n" for policy, values in rows2.items() for seed, value in enumerate(values)))
    both = rl_tables.verdict([f"t={board}:{results}", f"u={board2}:{results2}"]).splitlines()
    assert both[3].endswith("| yes |") and both[-1].endswith("(issue 17's test) on 1.")
    with pytest.raises(KeyError, match=re.escape("'pi [val-tuned]' is not a reference of this leaderboard")):
        rl_tables.verdict([f"t={board}"])
    with pytest.raises(ValueError, match="label=leaderboard.csv"):
        rl_tables.verdict([str(board)])


def test_suite_table_renders_a_leaderboard_and_per_policy_means(tmp_path):
    """The task-suite shape: the reference's own row says so, every other row its paired Δ with CI,
    % change, p and verdict; a metric missing from the leaderboard comes from results.csv's test
    rows (an oracle row by its plain constant) or is an error naming it."""
    board = tmp_path / "leaderboard.csv"
    board.write_text(_LEADERBOARD_HEAD
                     + "1,fixed(fraction=0.0) [oracle: best constant on test],oracle,6449.47,563.6,0.99307,12.9,"
                       "5.37,18.99,0.0834,0.538,no significant difference\n"
                     + "2,fixed(fraction=0.01),heuristic,6444.1,565.5,0.9899,22.6,0,0,0,1,no significant difference\n"
                     + "3,pi,heuristic,5117.2,655.0,0.892,0.0,-1327.4,991.2,-20.6,0.014,worse\n")
    results = tmp_path / "results.csv"
    results.write_text("policy,split,seed,prefix_hit_rate\nfixed(fraction=0.0),test,0,0.7\nfixed(fraction=0.0),test,1,0.8\n"
                       "fixed(fraction=0.0),val,0,0.1\nfixed(fraction=0.01),test,0,0.5\npi,test,0,0.25\n")
    out = rl_tables.suite(str(board), ("slo_attainment", "preemptions", "prefix_hit_rate"), str(results)).splitlines()
    assert out[0] == ("| policy | goodput tok/s | SLO att. | preempt. | prefix hit rate | Δ vs fixed(fraction=0.01) |")
    assert out[2] == ("| fixed(fraction=0.0) [oracle: best constant on test] | 6,449 ± 564 | 0.993 | 12.9 | 0.750 "
                      "| +5 ± 19 (+0.1%, p 0.54, n.s.) |")
    assert out[3] == "| fixed(fraction=0.01) | 6,444 ± 566 | 0.990 | 22.6 | 0.500 | reference |"
    assert out[4] == "| pi | 5,117 ± 655 | 0.892 | 0.0 | 0.250 | -1327 ± 991 (-20.6%, p 0.014, worse) |"
    with pytest.raises(ValueError, match="no column prefix_hit_rate_mean: name kvrl-eval's results.csv"):
        rl_tables.suite(str(board), ("prefix_hit_rate",))
    with pytest.raises(ValueError, match=re.escape("unknown metric(s) ['goodput']")):
        rl_tables.suite(str(board), ("goodput",))
    results.write_text("policy,split,seed,prefix_hit_rate\nfixed(fraction=0.0),test,0,0.7\nfixed(fraction=0.01),test,0,0.5\n")
    with pytest.raises(KeyError, match=re.escape("no test-split rows of 'pi'")):
        rl_tables.suite(str(board), ("prefix_hit_rate",), str(results))


def test_leaderboard_table_marks_the_reference_row_even_though_the_csv_scores_it_against_itself(tmp_path):
    """kvrl-eval's leaderboard.csv gives the reference a verdict against itself (+0.0%, no
    significant difference); the ``leaderboard`` table says "reference" there, and only there."""
    board = tmp_path / "leaderboard.csv"
    board.write_text(_LEADERBOARD_HEAD
                     + "1,fixed(fraction=0.01),heuristic,2912.0,734.0,0.99,22.6,0,0,0.0,1,no significant difference\n"
                     + "2,fixed(fraction=0.01) [oracle: best constant on test],oracle,2912.0,734.0,0.99,22.6,0,0,0.0,1,"
                       "no significant difference\n")
    out = rl_tables.leaderboard(str(board)).splitlines()
    assert out[2] == "| 1 | fixed(fraction=0.01) | heuristic | 2,912 ± 734 | reference |"
    assert out[3] == "| 2 | fixed(fraction=0.01) [oracle: best constant on test] | oracle | 2,912 ± 734 | +0.0% n.s. |"


_SCENARIO = """scenario: model=qwen3-0.6b
| split | 0.0 | 0.1 |
|---|---|---|
| val | 7238.5 | **7287.5** |
| test | **8116.6** | 7871.7 |

per cell: SLO attainment / p50 TTFT s / p50 TPOT ms / preemptions / engine s
val: 0.0 0.99/0.01/2.3/89/8; 0.1 1.00/0.01/2.2/2/8
test: 0.0 0.98/0.06/2.4/80/7; 0.1 1.00/0.36/2.3/10/7
"""


def test_scenario_table_joins_task_outputs_with_preemptions(tmp_path):
    (tmp_path / "pressure.txt").write_text(_SCENARIO)
    (tmp_path / "phased.txt").write_text(_SCENARIO.replace("7238.5", "6581.7"))
    out = rl_tables.scenario([str(tmp_path / "pressure.txt"), str(tmp_path / "phased.txt")]).splitlines()
    assert out == ["| task, split | 0.0 | 0.1 |", "|---|---|---|",
                   "| pressure, val | 7,238.5 (89) | **7,287.5** (2) |", "| pressure, test | **8,116.6** (80) | 7,871.7 (10) |",
                   "| phased, val | 6,581.7 (89) | **7,287.5** (2) |", "| phased, test | **8,116.6** (80) | 7,871.7 (10) |"]
    (tmp_path / "bad.txt").write_text(_SCENARIO.split("per cell")[0])
    with pytest.raises(ValueError, match="bad.txt: not an rl_scenario_table.py output"):
        rl_tables.scenario([str(tmp_path / "bad.txt")])
    (tmp_path / "other.txt").write_text(_SCENARIO.replace("| 0.1 |\n", "| 0.2 |\n"))
    with pytest.raises(ValueError, match="other.txt: columns"):
        rl_tables.scenario([str(tmp_path / "pressure.txt"), str(tmp_path / "other.txt")])


def test_prose_numbers_lists_what_no_fact_span_checks():
    """``docs_tables.py numbers`` counts fact spans and, by a heuristic, the other numbers of the
    running prose: not code, generated blocks, tables, headings, link targets, dates or the digits
    of identifiers."""
    text = ("# Run 17 on 2 GPUs\n"
            "Goodput rose 12.5% to 6,449 tok/s (<!-- fact: tiers.gpu_hit -->0.49-0.55<!-- /fact -->) on H200 at 2520d47,\n"
            "2026-11-24 03:27-03:30 UTC, `kvrl-run engine.num_blocks=160`, [x](runs/3/a.md).\n"
            "| 1 | 2 |\n```\n99 bottles\n```\n"
            "<!-- BEGIN GENERATED: echo 5 | cheap -->\n5\n<!-- END GENERATED -->\n4-6x faster.\n")
    facts, loose = docs_tables.prose_numbers(text, Path("f.md"))
    assert [f.fact for f in facts] == ["gpu_hit"]
    assert loose == [(2, "12.5"), (2, "6,449"), (11, "4")]         # a range "4-6x" counts once


def test_cells_table_shows_one_splits_per_cell_fields(tmp_path):
    """``rl_tables.py cells``: a split's per-cell line as rows named by the file's legend; an unknown
    field or split is an error naming the file."""
    path = tmp_path / "tenants.txt"
    path.write_text(_SCENARIO.replace("/ engine s", "/ engine s [/ prefix hit rate]").replace("0.1 1.00/0.36/2.3/10/7", "0.1 1.00/0.36/2.3/10/7/0.7"))
    out = rl_tables.cells(str(path), "test", ["preemptions", "prefix hit rate"]).splitlines()
    assert out == ["| test | 0.0 | 0.1 |", "|---|---|---|", "| preemptions | 80 | 10 |", "| prefix hit rate |  | 0.7 |"]
    with pytest.raises(ValueError, match=re.escape("unknown field(s) ['hits']")):
        rl_tables.cells(str(path), "test", ["hits"])
    with pytest.raises(ValueError, match="no line of split 'train'"):
        rl_tables.cells(str(path), "train", ["preemptions"])


def test_per_seed_table_matches_a_relabelled_sim_policy_by_its_name(tmp_path):
    """``rl_tables.py per_seed``: live and sim goodput per test seed and their means, a row per live
    policy; the sim's "<name> [val-best, given]" serves a live plain "<name>"; a policy the sim
    lacks entirely is an error naming it."""
    head = "policy,kind,split,seed,goodput_tok_s\n"
    live = tmp_path / "live.csv"
    live.write_text(head + "fixed(fraction=0.01),heuristic,test,0,10\nfixed(fraction=0.01),heuristic,test,1,20\n"
                    "agent a,agent,test,0,30\nagent a,agent,test,1,50\nagent a,agent,val,0,99\n")
    sim = tmp_path / "sim.csv"
    sim.write_text(head + '"fixed(fraction=0.01) [val-best, given]",val-best,test,0,11\n'
                   '"fixed(fraction=0.01) [val-best, given]",val-best,test,1,13\nagent a,agent,test,0,31\nagent a,agent,test,1,33\n')
    out = rl_tables.per_seed(str(sim), str(live)).splitlines()
    assert out[2] == "| fixed(fraction=0.01) | 10.0 | 20.0 | 15.0 | 11.0 | 13.0 | 12.0 |"
    assert out[3] == "| agent a | 30.0 | 50.0 | 40.0 | 31.0 | 33.0 | 32.0 |"
    sim.write_text(head + "agent a,agent,test,0,31\n")
    with pytest.raises(KeyError, match=re.escape("no sim rows for 'fixed(fraction=0.01)'")):
        rl_tables.per_seed(str(sim), str(live))


def test_fact_sources_read_only_their_declared_committed_inputs(monkeypatch):
    """Every fact source (scripts/docs_facts.py) reads only the files it declares, and each of them
    is tracked by git: a prose number comes from committed data, never from a local run."""

    facts = docs_tables._facts_module()
    tracked = set(subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split())
    read: list[str] = []
    real = facts._text
    monkeypatch.setattr(facts, "_text", lambda path: read.append(path) or real(path))
    for name, src in facts.SOURCES.items():
        read.clear()
        assert src.facts(), f"source {name} gives no facts"
        assert set(read) <= set(src.inputs), f"source {name} read {sorted(set(read) - set(src.inputs))} it does not declare"
        assert set(src.inputs) <= tracked, f"source {name} reads untracked {sorted(set(src.inputs) - tracked)}"


def test_live_compare_joins_gpu_shares_and_takes_any_reference(tmp_path):
    """``rl_live_compare.py``: a live stage split over GPUs gives several results.csv (commas join
    them; a (policy, seed) in two of them is an error); ``reference`` picks the policy the paired
    differences are taken to: the exact label first, not a longer one that starts with it."""
    spec = importlib.util.spec_from_file_location("rl_live_compare", ROOT / "scripts" / "rl_live_compare.py")
    cmp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cmp)
    head = "policy,kind,split,seed,goodput_tok_s\n"
    rows = {"lifo(mode=swap) [val-tuned]": [0, 0, 0, 0], "lifo": [10, 20, 30, 40], "slo": [12, 23, 33, 44]}
    sim = tmp_path / "sim.csv"
    sim.write_text(head + "".join(f'"{p}",heuristic,test,{s},{v}\n' for p, vs in rows.items() for s, v in enumerate(vs)))
    shares = []
    for g, seeds in enumerate(([0, 2], [1, 3])):
        path = tmp_path / f"live_g{g}.csv"
        path.write_text(head + "".join(f'"{p}",heuristic,test,{s},{vs[s] + 1}\n' for p, vs in rows.items() for s in seeds))
        shares.append(str(path))
    live = cmp.load(",".join(shares))
    assert live["slo"] == {0: 13.0, 1: 24.0, 2: 34.0, 3: 45.0}
    out = cmp.render(cmp.load(str(sim)), live, "x", reference="lifo")
    assert "difference to lifo)" in out and "| lifo | 25.0 ± " in out and "| reference |" in out
    assert "| slo | 28.0 ± " in out and "4 seeds served live of 4" in out
    with pytest.raises(ValueError, match="seed 0 is in more than one results file"):
        cmp.load(f"{shares[0]},{shares[0]}")
    assert "Live seeds per policy" not in out
    del live["slo"][3]                        # a live stage stopped before its last run (results.partial.csv)
    assert "lifo 4, slo 3." in cmp.render(cmp.load(str(sim)), live, "x", reference="lifo")
    # the last column: only a significant sim difference is checked; one seed's pair is too few
    assert "| slo | " in out and out.split("| slo | ")[1].split("\n")[0].endswith("| yes |")
    one = {p: {0: v[0]} for p, v in cmp.load(str(sim)).items()}
    assert "(sim n.s.) |" in cmp.render(one, {p: {0: v[0] - 5} for p, v in one.items()}, "x", reference="lifo")
    flipped = {p: {s: -v for s, v in vs.items()} for p, vs in live.items()}
    assert "| **no** |" in cmp.render(cmp.load(str(sim)), flipped, "x", reference="lifo")


def test_merge_eval_joins_shares_into_one_paired_leaderboard(tmp_path):
    """scripts/merge_eval.py: the shares' rows become one results.csv and one leaderboard whose
    paired differences span every share's seeds; a reference may be the start of a label; a
    (policy, split, seed) in two shares is kept once when both are the same run, and is an error when
    their values differ, as is a reference no label starts with."""
    head = "policy,kind,split,seed,goodput_tok_s,aborted,policy_errors,sim_cost_source\n"   # a live run's columns
    values = {"fixed(fraction=0.2) [val-best, given]": [100, 110, 120, 130], "rule": [103, 112, 124, 133]}
    shares = []
    for g, seeds in enumerate(([0, 2], [1, 3])):
        path = tmp_path / f"share{g}.csv"
        path.write_text(head + "".join(f'"{p}",{"val-best" if p.startswith("fixed") else "heuristic"},test,{s},{vs[s]},0,0,'
                                       f'profile:/p/h200.json\n' for p, vs in values.items() for s in seeds))
        shares.append(str(path))
    script = [sys.executable, str(ROOT / "scripts" / "merge_eval.py")]
    out = tmp_path / "merged"
    subprocess.run([*script, "--out", str(out), "--prefix", "live_", "--reference", "fixed(fraction=0.2)", *shares],
                   check=True, cwd=ROOT, capture_output=True, text=True)
    merged = list(csv.DictReader(open(out / "live_results.csv")))
    assert len(merged) == 8 and {r["seed"] for r in merged} == {"0", "1", "2", "3"}
    assert {r["sim_cost_source"] for r in merged} == {"profile:/p/h200.json"}
    board = {r["policy"]: r for r in csv.DictReader(open(out / "live_leaderboard.csv"))}
    ref = "vs fixed(fraction=0.2) [val-best, given]"
    assert board["rule"]["runs"] == "4" and float(board["rule"][f"Δgoodput_tok_s {ref}_mean"]) == pytest.approx(3.0)
    assert board["rule"][f"{ref}_verdict"] == "better"                # +3, +2, +4, +3: paired over all four seeds
    assert "4 seeds [0, 1, 2, 3]" in (out / "live_leaderboard.md").read_text()
    twice = tmp_path / "twice"
    subprocess.run([*script, "--out", str(twice), *shares, shares[0]], check=True, cwd=ROOT, capture_output=True, text=True)
    assert (twice / "results.csv").read_text() == (out / "live_results.csv").read_text()
    swept = tmp_path / "swept.csv"            # a sweep's run of the same label: in results.csv, not the leaderboard
    swept.write_text(head + '"rule",sweep,test,0,999,0,0,profile:/p/h200.json\n')
    subprocess.run([*script, "--out", str(twice), *shares, str(swept)], check=True, cwd=ROOT, capture_output=True, text=True)
    assert len(list(csv.DictReader(open(twice / "results.csv")))) == 9
    assert {r["policy"]: r["runs"] for r in csv.DictReader(open(twice / "leaderboard.csv"))}["rule"] == "4"
    other = tmp_path / "other.csv"
    other.write_text(Path(shares[0]).read_text().replace(",100,", ",101,"))
    clash = subprocess.run([*script, "--out", str(out), shares[0], str(other)], cwd=ROOT, capture_output=True, text=True)
    assert clash.returncode != 0 and "is also in" in clash.stderr and "other values" in clash.stderr
    missing = subprocess.run([*script, "--out", str(out), "--reference", "lifo", *shares], cwd=ROOT, capture_output=True, text=True)
    assert missing.returncode != 0 and "starts with 'lifo'" in missing.stderr
    only = tmp_path / "only"
    subprocess.run([*script, "--out", str(only), "--policy", "rule", *shares], check=True, cwd=ROOT, capture_output=True, text=True)
    assert {r["policy"] for r in csv.DictReader(open(only / "results.csv"))} == {"rule"}
    unknown = subprocess.run([*script, "--out", str(only), "--policy", "lifo", *shares], cwd=ROOT, capture_output=True, text=True)
    assert unknown.returncode != 0 and "starts with 'lifo'" in unknown.stderr
    learned = tmp_path / "learned"             # a tagged share of a learned scheduler: its rows are agent rows
    subprocess.run([*script, "--out", str(learned), "--learned", "mine", "--reference", "fixed(fraction=0.2)",
                    shares[0], f"mine={shares[1]}"], check=True, cwd=ROOT, capture_output=True, text=True)
    kinds = {(r["policy"], r["kind"]) for r in csv.DictReader(open(learned / "results.csv"))}
    assert ("agent mine [rule]", "agent") in kinds and ("rule", "heuristic") in kinds
    tagged = tmp_path / "tagged"           # TAG=path: the same labels served under another setting, rows of their own
    subprocess.run([*script, "--out", str(tagged), "--reference", "rule [a]", f"a={shares[0]}", f"b={shares[0]}"],
                   check=True, cwd=ROOT, capture_output=True, text=True)
    board = {r["policy"]: r for r in csv.DictReader(open(tagged / "leaderboard.csv"))}
    assert set(board) == {f"{p} [{t}]" for p in values for t in "ab"}
    assert float(board["rule [b]"]["Δgoodput_tok_s vs rule [a]_mean"]) == 0.0


def test_rerun_leaderboard_reads_the_recorded_command_and_compares_every_value(tmp_path):
    """scripts/rerun_leaderboard.py: the overrides come from the leaderboard's Command line; live
    commands and missing agent paths are skipped with a reason; the comparison is on (policy,
    split, seed) and every column, so one changed value or a missing row makes it differ."""
    spec = importlib.util.spec_from_file_location("rerun_leaderboard", ROOT / "scripts" / "rerun_leaderboard.py")
    rr = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rr)
    board = tmp_path / "x_leaderboard.md"
    board.write_text("## Leaderboard\n\nCommand: `kvrl-eval env=pressure 'seeds=[0,1]' 'agents=[docs/results/agents/pressure-dqn-seed0]' "
                     "workers=16 hydra.run.dir=/root/out/x`  \n")
    overrides = rr.recorded_command(board)
    assert overrides[:2] == ["env=pressure", "seeds=[0,1]"] and rr.committed_table(board) is None
    (tmp_path / "x_leaderboard.csv").write_text("policy,goodput_tok_s_mean\np,1.0\n")
    assert rr.committed_table(board)[1:] == ("leaderboard.csv", ("policy",))
    (tmp_path / "x_results.csv").write_text("policy,split,seed\n")
    assert rr.committed_table(board)[0].name == "x_results.csv"
    assert rr.skip_reason(overrides) is None
    assert "not in this checkout" in rr.skip_reason(["agents=[docs/results/agents/no-such-agent]"])
    device = ["env=x", "agents=[/root/out/agents/pressure-dqn-seed1,/root/out/agents/no-such-agent]"]
    assert rr.remap_agents(device) == (
        ["env=x", "agents=[docs/results/agents/pressure-dqn-seed1,/root/out/agents/no-such-agent]"],
        ["/root/out/agents/pressure-dqn-seed1"])
    assert "backend=live" in rr.skip_reason(["env=pressure", "backend=live"])
    plain = tmp_path / "plain_leaderboard.md"
    plain.write_text("## a table without its command\n")
    with pytest.raises(ValueError, match="no 'Command"):
        rr.recorded_command(plain)
    head = "policy,split,seed,goodput_tok_s,preemptions\n"
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    a.write_text(head + "p,test,0,100.0,3\np,test,1,200.0,4\n")
    b.write_text(head + "p,test,0,100.0,3\np,test,1,200.0,4\n")
    assert rr.compare(rr.read_rows(a), rr.read_rows(b))["verdict"] == "reproduces"
    b.write_text(head + "p,test,0,101.0,3\np,test,1,200.0,5\n")
    res = rr.compare(rr.read_rows(a), rr.read_rows(b))
    assert res["verdict"] == "differs" and res["differing"] == 2 and res["columns"] == ["goodput_tok_s", "preemptions"]
    assert res["max_goodput_rel_diff"] == pytest.approx(0.01)
    b.write_text(head + "p,test,0,100.0,3\n")
    assert rr.compare(rr.read_rows(a), rr.read_rows(b))["missing"] == 1
    # a column the re-run no longer writes is no difference where the committed file held no value in it
    a.write_text("policy,split,seed,goodput_tok_s,steps\np,test,0,100.0,nan\n")
    b.write_text("policy,split,seed,goodput_tok_s\np,test,0,100.0\n")
    assert rr.compare(rr.read_rows(a), rr.read_rows(b))["verdict"] == "reproduces"
    a.write_text("policy,split,seed,goodput_tok_s,steps\np,test,0,100.0,7\n")
    assert rr.compare(rr.read_rows(a), rr.read_rows(b))["columns"] == ["steps"]
    # --regenerate: where the command runs, and the committed files the run's replace (results.csv too,
    # where only the leaderboard was committed); a leaderboard named plain leaderboard.md keeps its names
    assert rr.regen_dir(tmp_path / "x_leaderboard.md") == f"runs/regen/{tmp_path.name}/x"
    assert rr.regen_dir(tmp_path / "leaderboard.md") == f"runs/regen/{tmp_path.name}/leaderboard"
    run = tmp_path / "run"
    run.mkdir()
    for name in rr.REGENERATED:
        (run / name).write_text(f"new {name}")
    written = rr.replace_committed(board, run)
    assert sorted(p.name for p in written) == ["x_leaderboard.csv", "x_leaderboard.md", "x_results.csv"]
    assert board.read_text() == "new leaderboard.md" and (tmp_path / "x_results.csv").read_text() == "new results.csv"
    assert [p.name for p in rr.replace_committed(tmp_path / "leaderboard.md", run)][2] == "results.csv"
    # --into: the same names under <into>/<the leaderboard's folder below docs/results>, the committed ones untouched
    committed = rr.RESULTS / "rl_sim_suite" / "pressure_leaderboard.md"
    before = committed.read_bytes()
    into = [p.relative_to(tmp_path) for p in rr.replace_committed(committed, run, tmp_path / "fit11")]
    assert into[0] == Path("fit11/rl_sim_suite/pressure_leaderboard.md") and committed.read_bytes() == before
    # a leaderboard whose recorded profile was since replaced re-runs on the archived one of its fit version
    fit11 = ROOT / "docs" / "results" / "fit11" / "rl_sim_suite" / "pressure_leaderboard.md"
    assert rr.recorded_profile(fit11) == "archive/h200_qwen3-0.6b_bfloat16_step_graphs_fit11.json"
    shipped = json.loads((ROOT / "kvrl/executors/profiles/h200_qwen3-0.6b_bfloat16_step_graphs.json").read_text())
    note = ("Sim cost model: profile kvrl/executors/profiles/h200_qwen3-0.6b_bfloat16_step_graphs.json "
            "(sha256 0123456789ab, fit version {})\n")
    (tmp_path / "now_leaderboard.md").write_text(note.format(shipped["model"]["fit_version"]))
    assert rr.recorded_profile(tmp_path / "now_leaderboard.md") is None        # still the shipped one
    (tmp_path / "old_leaderboard.md").write_text(note.format(7))
    assert rr.recorded_profile(tmp_path / "old_leaderboard.md") is None        # no such archive: as recorded


def test_cem_table_lists_each_generation_and_the_fresh_window_mean(tmp_path):
    """scripts/rl_cem.py histories: one row per generation (the kept one starred), the per-job sd
    of the val gains, and the mean policy's fresh-window fitness pooled over generations 1 on."""
    paths = []
    for name, fresh in (("a", [0.0, 1.0, -1.0]), ("b", [0.0, 2.0, 0.0])):
        run = {"best": {"generation": 1 if name == "a" else -1},
               "history": [{"generation": g, "train_fitness_mean_policy": f, "val_gain_pct": 0.5 * g,
                            "val_gain_per_seed": [g, -g, 0.0]} for g, f in enumerate(fresh)]}
        (tmp_path / name).mkdir()
        (tmp_path / name / "cem.json").write_text(json.dumps(run))
        paths.append(str(tmp_path / name / "cem.json"))
    out = rl_tables.cem(paths).splitlines()
    assert out[2] == "| a | 0 | +0.00 | +0.00 | 0.00 |"
    assert out[3] == "| a | 1 * | +1.00 | +0.50 | 1.00 |"
    assert not any("*" in line for line in out[5:8])          # run b kept no generation
    mean, half = 0.5, 3.182446305284263 * np.std([1.0, -1.0, 2.0, 0.0], ddof=1) / 2
    assert out[-1] == (f"Mean policy on fresh training windows, every generation after the first of every run: "
                       f"+{mean:.2f}% (95% CI {mean - half:+.2f} to {mean + half:+.2f}, 4 generations).")


def test_live_tables_adjust_for_host_speed_and_put_merged_rows_back_in_run_order(tmp_path):
    """rl_tables host_adjusted: the raw paired difference and the one at equal host speed (each run's
    sim_replay_error); job_position: a merged file's rows back in kvrl-eval's listed order by kind (heuristics
    first, agents last), or in the order its seed_position column records, and the later jobs' host slowness
    against the first's."""
    head = "policy,kind,split,seed,goodput_tok_s,throughput_tok_s,sim_throughput_tok_s,sim_replay_error\n"
    rows = []
    for seed, (host_f, host_a) in enumerate([(0.0, -0.01), (-0.01, -0.03), (0.01, 0.0), (0.0, -0.02)]):
        # the agent is the same policy: its goodput differs only by the host (200 tok/s per point of replay error)
        rows.append(f"agent dqn (agents/x/best_model.zip),agent,test,{seed},{3000 + 20000 * host_a},100,100,{host_a}")
        rows.append(f"fixed(fraction=0.01),heuristic,test,{seed},{3000 + 20000 * host_f},100,100,{host_f}")
    path = tmp_path / "live_results.csv"
    path.write_text(head + "\n".join(rows) + "\n")
    table = rl_tables.host_adjusted(str(path)).splitlines()
    assert len(table) == 3 and table[2].startswith("| x | 4 | -300 ± ")
    assert "| 20,000 | 1.00 | +0 ± 0 " in table[2]
    per_seed = rl_tables.host_adjusted(str(path), per_seed=True).splitlines()
    assert "3,000 (+0.0%)" in per_seed[3] and "2,800 (-1.0%)" in per_seed[2]
    position = rl_tables.job_position([str(path)]).splitlines()
    # listed order puts fixed first although the merged file has the agent first: later (agent) slower by 1.5 points
    assert position[2].startswith("| ") and "| 4 | 2 | +1.50% ± " in position[2] and position[2].endswith("| 4 of 4 |")
    assert position[-1].startswith("| all |")
    # a recorded seed_position (rotated order) wins over the listed order: here the agent ran first in every seed
    lines = path.read_text().splitlines()
    recorded = [lines[0].replace(",seed,", ",seed,seed_position,")]
    for line in lines[1:]:
        cells = line.split(",")
        recorded.append(",".join(cells[:4] + ["0" if cells[1] == "agent" else "1"] + cells[4:]))
    path.write_text("\n".join(recorded) + "\n")
    position = rl_tables.job_position([str(path)]).splitlines()
    assert "| 4 | 2 | -1.50% ± " in position[2] and position[2].endswith("| 0 of 4 |")


def test_beside_error_gives_the_per_run_error_as_priced_calibrated_and_at_host_speed(tmp_path):
    """rl_tables beside_error: per metric the median per-run error of the sim beside each live run, of the sim
    calibrated on the process's earlier runs (where the file has it: none for the first job) and of the same run at
    its host speed, with the median absolute error and the runs counted; a run whose live value is 0 is left out."""
    metrics = rl_tables.BESIDE_METRICS
    head = ["policy", "kind", "split", "seed", "sim_replay_error"] + [p + m for p in ("", "sim_", "sim_cal_", "sim_host_")
                                                                        for m in metrics]
    rows = []
    for seed, (priced, cal, host) in enumerate([(0.10, None, 0.00), (0.20, 0.04, -0.02), (0.30, 0.08, 0.02)]):
        rows.append(["fixed(fraction=0.01)", "heuristic", "test", str(seed), str(-priced / 2)]
                    + ["100"] * len(metrics) + [str(100 * (1 + priced))] * len(metrics)
                    + ["" if cal is None else str(100 * (1 + cal))] * len(metrics) + [str(100 * (1 + host))] * len(metrics))
    rows[0][5 + 3] = "0"                     # seed 0's live tpot is 0: left out of that metric
    path = tmp_path / "live_results.csv"
    path.write_text("\n".join(",".join(r) for r in [head] + rows) + "\n")
    line = rl_tables.beside_error([str(path)]).splitlines()[2]
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[1:3] == ["3", "-10.0%"]
    # throughput: as priced, calibrated (seeds 1 and 2), at host speed
    assert cells[3:6] == ["+20.0% (20.0%, 3)", "+6.0% (6.0%, 2)", "+0.0% (2.0%, 3)"]
    assert cells[12:15] == ["+25.0% (25.0%, 2)", "+6.0% (6.0%, 2)", "+0.0% (2.0%, 2)"]          # tpot: seeds 1 and 2
    plain = tmp_path / "plain.csv"               # a file without sim_cal_ columns: no calibrated column
    plain.write_text("\n".join(",".join(c for i, c in enumerate(r) if not 5 + len(metrics) * 2 <= i < 5 + len(metrics) * 3)
                               for r in [head] + rows) + "\n")
    assert len(rl_tables.beside_error([str(plain)]).splitlines()[2].strip("|").split("|")) == 3 + 2 * len(metrics)
    with pytest.raises(SystemExit, match="no test run with sim_host_"):
        path.write_text("policy,split,goodput_tok_s\nx,test,1\n")
        rl_tables.beside_error([str(path)])


def test_host_scaled_reserves_each_live_policy_and_compares_per_run(tmp_path):
    """scripts/rl_host_scaled.py: a live run's policy is re-served alone (a fixed watermark, or a committed agent
    by its directory); the table gives the per-run goodput errors of the plain and the host-speed sim and the
    paired live and sim differences with their residual."""
    spec = importlib.util.spec_from_file_location("rl_host_scaled", ROOT / "scripts" / "rl_host_scaled.py")
    hs = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(ROOT / "scripts"))         # as when run as a script: it imports rl_tables
    try:
        spec.loader.exec_module(hs)
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    assert hs.policy_overrides("fixed(fraction=0.0100001)") == [
        "agents=[]", "baselines.watermark=[{name: fixed, fraction: 0.0100001}]"]
    assert hs.policy_overrides("agent dqn (agents/pressure-dqn-seed0/best_model.zip)")[0] == \
        "agents=[docs/results/agents/pressure-dqn-seed0]"
    assert hs.policy_overrides("pi") == ["agents=[]", "baselines.watermark=[{name: pi}]"]
    assert hs.policy_overrides("bandit(epoch_s=4.0, exploration=0.2)")[1] == \
        "baselines.watermark=[{name: bandit, epoch_s: 4.0, exploration: 0.2}]"
    with pytest.raises(SystemExit, match="only watermark baselines"):
        hs.policy_overrides("Fixed 0.01")
    # the scale of each run: its own replay error, or (a prediction) the mean of the earlier runs' of its process
    rows = [{"sim_replay_error": e} for e in ("-0.1", "-0.3", "0.0")]
    assert hs.scales(rows, "own") == pytest.approx([1 / 0.9, 1 / 0.7, 1.0])
    earlier = hs.scales(rows, "earlier")
    assert np.isnan(earlier[0]) and earlier[1:] == pytest.approx([1 / 0.9, 1 / 0.8])
    lines = []
    for seed in range(3):
        for policy, live, host in (("fixed(fraction=0.01)", 1000.0, 1010.0), ("fixed(fraction=0.02)", 900.0 + seed, 905.0 + 2 * seed)):
            lines.append(json.dumps({"results": "x/live_results.csv", "policy": policy, "seed": seed, "scale": 1.0,
                                     "live_goodput_tok_s": live, "beside_goodput_tok_s": 1.2 * live,
                                     "host_goodput_tok_s": host}))
    path = tmp_path / "hs.jsonl"
    path.write_text("\n".join(lines) + "\n")
    # targets: per-run errors and the policies whose mean meets every target, as priced and re-served
    runs = []
    for seed in range(2):
        for policy, priced, served in (("a", 1.05, 1.01), ("b", 1.02, 1.0)):
            run = {"policy": policy, "seed": seed}
            for m in hs.TARGET_METRICS:
                run.update({f"live_{m}": 100.0, f"beside_{m}": 100.0 * priced, f"host_{m}": 100.0 * served})
            runs.append(json.dumps(run))
    task = tmp_path / "task" / "calibrated.jsonl"
    task.parent.mkdir()
    task.write_text("\n".join(runs) + "\n")
    row = hs.targets([task]).splitlines()[2]
    assert row.startswith("| task | 4 | 3.5% | 0.5% | ") and row.endswith("| 1 of 2 | 2 of 2 |")
    table = hs.table(path).splitlines()
    assert len(table) == 3 and table[2].startswith("| x | 6 | 20.0% | ")
    assert "| fixed(fraction=0.02) | -99 | -103 | 1.00 | " in table[2] and table[2].endswith("| +4 ± 2 |")


def test_fidelity_calibrated_rescores_a_recorded_live_run_as_committed():
    """scripts/fidelity_calibrated.py --live: a run's calibrated sims as kvrl-fidelity recorded them, scored again,
    give the committed line; the replay spread is the per-share standard deviation and the two policies' difference."""
    spec = importlib.util.spec_from_file_location("fidelity_calibrated", ROOT / "scripts" / "fidelity_calibrated.py")
    fc = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(ROOT / "scripts"))         # as when run as a script: it imports its siblings
    try:
        spec.loader.exec_module(fc)
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    committed = {r["run"]: r for r in map(json.loads, (ROOT / "docs/results/fidelity_same_host/calibrated_live_s34.jsonl")
                                          .read_text().splitlines()) if "run" in r}
    row = fc.score("run57", *fc.recorded(ROOT / "docs/results/fidelity_same_host/run57_llama_pressure"))
    assert json.loads(json.dumps(row)) == committed["run57"] and row["shape"] == "llama-3-8b"
    replay = lambda e: {"replay": {"total_rel_err": e, "by_kind": {"decode": {"live_s": 3.0}, "host": {"live_s": 1.0}}}}
    spread = fc.replay_spread({"pressure_0": {"a/x": replay(0.0), "a/y": replay(0.04), "b/x": replay(-0.02)}})
    assert spread["replay_sd"] == pytest.approx([statistics.pstdev([0.0, 0.04, -0.02])])
    assert spread["policy_diff"] == pytest.approx([0.04]) and spread["decode_share"] == pytest.approx(0.75)


def test_fidelity_calibrated_rescores_an_ensemble_run_with_its_deterministic_sim(tmp_path):
    """A live run recorded with sim_ensemble=16 (run 59): re-simulated with the profile it chose and sim_ensemble=1
    (--resim-ensemble 1), every pair's sim is the deterministic run kvrl-fidelity kept beside the ensemble
    (sim_deterministic); --compare lays two --out files' totals side by side."""
    spec = importlib.util.spec_from_file_location("fidelity_calibrated", ROOT / "scripts" / "fidelity_calibrated.py")
    fc = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        spec.loader.exec_module(fc)
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    run = ROOT / "docs/results/fidelity_same_host/run59_llama_ensemble"
    shape, recorded = fc.recorded(run)
    again_shape, again = fc.rerun_recorded("run59", run, tmp_path, 1)
    assert shape == again_shape == "llama-3-8b"
    for share, results in recorded.items():
        assert all(len(r["sim_runs"]) == 16 for r in results.values())
        assert {p: r["sim"] for p, r in again[share].items()} == {p: r["sim_deterministic"] for p, r in results.items()}
    before, after = tmp_path / "before.jsonl", tmp_path / "after.jsonl"
    for path, shares in ((before, again), (after, recorded)):
        rows = [fc.score("run59", shape, shares)]
        path.write_text("".join(json.dumps(r) + "\n" for r in [*rows, fc.totals(rows, shape)]))
    table = fc.compare(before, after).splitlines()
    assert table[0].startswith("| shape | as priced: every target | as priced: throughput within 3% |")
    cells = {r["total"]: r for r in map(json.loads, after.read_text().splitlines()) if "total" in r}["llama-3-8b"]
    assert table[2].startswith("| llama-3-8b | ") and f" -> {cells['own speed']['every_target']} |" in table[2]


def test_fidelity_live_ceiling_reproduces_its_committed_counts():
    """scripts/fidelity_live_ceiling.py: recomputed from the committed runs, the couples equal the committed file; a
    run's live mean as its own sim meets every target and reverses no order; a pair served with other requests is not
    matched."""
    spec = importlib.util.spec_from_file_location("fidelity_live_ceiling", ROOT / "scripts" / "fidelity_live_ceiling.py")
    ceiling = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ceiling)
    runs = ceiling.load_runs()
    committed = json.loads((ROOT / "docs/results/fidelity_same_host/live_ceiling_s36.json").read_text())
    assert json.loads(json.dumps(ceiling.couples(runs))) == committed["couples"]
    pairs = runs["run58"][1]
    itself = ceiling.predict(pairs, pairs)
    assert itself["every_target"] == itself["throughput_within"] == itself["pairs"] == len(pairs)
    assert itself["reversed"] == 0 and itself["resolved"] > 0
    other = {p: json.loads(json.dumps(r)) for p, r in pairs.items()}
    first = next(iter(other))
    other[first]["live"]["output_tokens"] += 1
    assert ceiling.predict(other, pairs)["pairs"] == len(pairs) - 1
    totals = ceiling.shape_totals(committed["couples"], {})
    assert set(totals["qwen3-0.6b"]) == {"another VM's live mean", "the same VM's live mean"}


def test_fidelity_host_cpu_times_the_engine_between_steps_and_tables_relative_ratios(tmp_path):
    """scripts/fidelity_host_cpu.py: a committed run's config serves a pair in the sim with the engine timed between
    steps and priced by the host terms; the table divides each column by its median over the pairs."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        spec = importlib.util.spec_from_file_location("fidelity_host_cpu", ROOT / "scripts" / "fidelity_host_cpu.py")
        hc = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(hc)
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    cfg = hc.run_config(ROOT / "docs/results/fidelity_same_host/run61_qwen_fwd")
    timed = hc.time_pair(cfg, "code_trace_tight", "vllm")
    assert timed["steps"] > 100 and timed["cpu_host_s"] > 0 and timed["price_s"] > 0
    pairs = {"a/x": {"cpu_ratio": 0.2, "live_ratio": {"r1": 1.0, "r2": 2.0}},
             "b/x": {"cpu_ratio": 0.4, "live_ratio": {"r1": 2.0}},
             "c/x": {"cpu_ratio": 0.8, "live_ratio": {"r1": 3.0, "r2": 4.0}}}
    path = tmp_path / "host.json"
    path.write_text(json.dumps({"runs": ["r1", "r2"], "repeats": 1, "pairs": pairs}))
    rows = hc.table(path).splitlines()
    assert rows[2] == "| c/x | 2.00 | 1.50 | 1.33 |" and rows[3] == "| b/x | 1.00 | 1.00 | - |"
    assert rows[4] == "| a/x | 0.50 | 0.50 | 0.67 |"
