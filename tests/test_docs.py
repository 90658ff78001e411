"""Documented numbers cannot rot: every generated block of README.md and docs/ (between
``<!-- BEGIN GENERATED: <command> | <kind> -->`` and ``<!-- END GENERATED -->``, see
scripts/docs_tables.py) is re-run here when it is cheap, and a committed number that differs from
what its command prints now fails the suite."""
from __future__ import annotations

import importlib.util
import re
import shutil
import sys
from pathlib import Path

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
    outputs: dict[str, str] = {}

    def run(command: str) -> str:
        if command not in outputs:
            outputs[command] = docs_tables.run_command(command, ROOT)
        return outputs[command]

    files = sorted({b.path for b, _ in blocks})
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
