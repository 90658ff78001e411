#!/usr/bin/env python
"""Generated tables in README.md and docs/: each sits between two markers naming the command that
prints it, so a number can be regenerated and checked instead of retyped.

    <!-- BEGIN GENERATED: scripts/docs_examples.sh readme-sweep | cheap -->
    (the command's stdout, then a one-line footer naming the command)
    <!-- END GENERATED -->

The command runs with ``bash -c`` from the repository root and must print the block's Markdown
(deterministic: no paths, dates or wall times). Kinds: ``cheap`` (seconds; re-run by the CI drift
test tests/test_docs.py), ``sim`` (minutes of simulation; re-run by scripts/regen_docs.sh, which
also re-runs the cheap ones). A GPU measurement is never re-run here: where its result files are
committed (docs/results/), a ``cheap`` block renders the table from them (scripts/rl_tables.py), and
the text names the device command, device, versions and commit; a table whose run output was never
committed says so in a note beside it.

Numbers quoted in running prose are inline fact spans, ``<!-- fact: <source>.<key> -->text<!-- /fact -->``
(scripts/docs_facts.py: each source computes its facts from committed result files; its kind is
the source's). They are checked and rewritten like blocks, by the command
``python scripts/docs_facts.py <source>``; a span's text may wrap across lines (whitespace is
compared collapsed).

    python scripts/docs_tables.py list                  # every block and fact span: file, line, kind, command
    python scripts/docs_tables.py check [--kind cheap]  # re-run and diff; exit 1 on drift (the commands run
                                                        # one per core, Python scripts forked warm: scripts/warm_runner.py)
    python scripts/docs_tables.py update [--kind sim] [FILE ...]   # re-run and rewrite in place
    python scripts/docs_tables.py numbers [--show] [FILE ...]      # prose numbers checked (fact spans) and not
"""
from __future__ import annotations

import argparse
import difflib
import functools
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence

ROOT = Path(__file__).resolve().parent.parent
KINDS = ("cheap", "sim")
BEGIN = re.compile(r"^<!-- BEGIN GENERATED: (?P<command>.+?) \| (?P<kind>\w+) -->[ \t]*$")
END = "<!-- END GENERATED -->"
FACT = re.compile(r"<!-- fact: (?P<name>[^ ]*?) -->(?P<text>.*?)<!-- /fact -->", re.S)
FACT_OPEN, FACT_CLOSE = "<!-- fact:", "<!-- /fact -->"
INLINE_CODE = re.compile(r"`[^`\n]*`")
FENCE = re.compile(r"^[ \t]*```.*?^[ \t]*```[^\n]*$", re.S | re.M)


@dataclass(frozen=True)
class Block:
    """A generated block: its file, the line of its BEGIN marker (1-based), command, kind, and the
    character span of its content (between the two marker lines) in the file's text. A fact span
    is a block too, with ``fact`` its key in the JSON its source's command prints and the span its
    text's."""

    path: Path
    line: int
    command: str
    kind: str
    start: int
    end: int
    fact: str = ""

    def where(self) -> str:
        return f"{self.path}:{self.line}"


def find_blocks(text: str, path: Path) -> list[Block]:
    """The generated blocks of ``text`` (markers inside fenced code blocks are not blocks); a marker
    without its partner, a nested BEGIN or an unknown kind raises ``ValueError`` naming ``path`` and
    the line."""
    blocks: list[Block] = []
    open_: Optional[tuple[int, re.Match, int]] = None
    offset, fenced = 0, False
    for number, line in enumerate(text.splitlines(keepends=True), 1):
        stripped = line.rstrip("\n")
        if stripped.lstrip().startswith("```") and not open_:
            fenced = not fenced          # markers shown inside a code block are examples, not blocks
        match = None if fenced else BEGIN.match(stripped)
        if match:
            if open_:
                raise ValueError(f"{path}:{number}: BEGIN GENERATED inside the block opened at line {open_[0]}")
            if match["kind"] not in KINDS:
                raise ValueError(f"{path}:{number}: unknown kind {match['kind']!r} (expected one of {', '.join(KINDS)})")
            open_ = (number, match, offset + len(line))
        elif stripped.strip() == END and not fenced:
            if not open_:
                raise ValueError(f"{path}:{number}: END GENERATED without a BEGIN")
            first, m, start = open_
            blocks.append(Block(path, first, m["command"], m["kind"], start, offset))
            open_ = None
        offset += len(line)
    if open_:
        raise ValueError(f"{path}:{open_[0]}: BEGIN GENERATED without an END")
    return blocks


@functools.cache
def _facts_module():
    """scripts/docs_facts.py, loaded once (it only declares the sources; a fact's values come from its command)."""
    spec = importlib.util.spec_from_file_location("docs_facts", ROOT / "scripts" / "docs_facts.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)   # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def find_facts(text: str, path: Path) -> list[Block]:
    """The fact spans of ``text`` outside code (fenced blocks, inline code), as blocks whose command is their
    source's (scripts/docs_facts.py); an unknown source, a malformed name, an unclosed or nested
    span raises ``ValueError`` naming ``path`` and the line."""
    facts = _facts_module()
    fenced = [(m.start(), m.end()) for m in FENCE.finditer(text)] + [(m.start(), m.end()) for m in INLINE_CODE.finditer(text)]
    shown = lambda i: any(a <= i < b for a, b in fenced)      # noqa: E731  (a span shown as code)
    line = lambda i: text.count("\n", 0, i) + 1              # noqa: E731
    out, covered = [], []
    for m in FACT.finditer(text):
        if shown(m.start()):
            continue
        where = f"{path}:{line(m.start())}"
        if FACT_OPEN in m["text"]:
            raise ValueError(f"{where}: fact span inside a fact span (or one without its {FACT_CLOSE})")
        source, _, key = m["name"].partition(".")
        if not key:
            raise ValueError(f"{where}: fact name {m['name']!r} is not <source>.<key>")
        if source not in facts.SOURCES:
            raise ValueError(f"{where}: unknown fact source {source!r} (known: {', '.join(facts.SOURCES)})")
        out.append(Block(path, line(m.start()), facts.command(source), facts.SOURCES[source].kind,
                         m.start("text"), m.end("text"), key))
        covered.append((m.start(), m.end()))
    for i in (j for j in _all(text, FACT_OPEN) if not shown(j)):
        if not any(a <= i < b for a, b in covered):
            raise ValueError(f"{path}:{line(i)}: fact span without its {FACT_CLOSE} (or a malformed opening)")
    return out


def _all(text: str, needle: str) -> Iterable[int]:
    i = text.find(needle)
    while i >= 0:
        yield i
        i = text.find(needle, i + 1)


def fact_text(block: Block, output: str) -> str:
    """The fact ``block`` names, from its source's output (JSON); a missing key raises
    ``KeyError`` naming the span and the keys the source has."""
    values = json.loads(output)
    if block.fact not in values:
        raise KeyError(f"{block.where()}: `{block.command}` has no fact {block.fact!r} (it has: {', '.join(sorted(values))})")
    return values[block.fact]


def _collapse(text: str) -> str:
    return " ".join(text.split())


def footer(command: str) -> str:
    return f"<sub>Generated by `{command}`; regenerate with `scripts/regen_docs.sh`, checked by tests/test_docs.py.</sub>\n"


def render(command: str, output: str) -> str:
    """A block's content: the command's output and the footer naming it."""
    return output.rstrip("\n") + "\n\n" + footer(command)


def run_command(command: str, root: Path = ROOT, timeout: float = 3600) -> str:
    """The stdout of ``command`` (bash, from ``root``); a failure raises ``RuntimeError`` naming it."""
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    proc = subprocess.run(["bash", "-c", command], cwd=root, capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode:
        raise RuntimeError(f"`{command}` exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return proc.stdout


def warm_outputs(paths: Iterable[Path], kinds: Sequence[str] = KINDS, root: Path = ROOT, workers: int = 0) -> dict[str, str]:
    """The stdout of every distinct command of the blocks of ``kinds`` in ``paths``, run ``workers``
    at a time (default: one per core), the Python scripts forked from warm interpreters
    (scripts/warm_runner.py), the rest with :func:`run_command`; the first failure is raised."""
    spec = importlib.util.spec_from_file_location("warm_runner", ROOT / "scripts" / "warm_runner.py")
    warm_runner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(warm_runner)
    commands = [block.command for block, _ in selected(paths, kinds)]
    with warm_runner.WarmRunner(root, workers, fallback=lambda command: run_command(command, root)) as runner:
        return runner.run_all(commands)


def default_files(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def selected(paths: Iterable[Path], kinds: Sequence[str]) -> list[tuple[Block, str]]:
    """``(block, file text)`` of every block of ``kinds`` in ``paths``."""
    out = []
    for path in paths:
        text = Path(path).read_text()
        blocks, facts = find_blocks(text, Path(path)), find_facts(text, Path(path))
        for fact in facts:
            inside = next((b for b in blocks if b.start <= fact.start < b.end), None)
            if inside:
                raise ValueError(f"{fact.where()}: fact span inside the generated block at line {inside.line}")
        out += [(b, text) for b in blocks + facts if b.kind in kinds]
    return out


def check(paths: Iterable[Path], kinds: Sequence[str] = KINDS, run: Callable[[str], str] = run_command) -> list[str]:
    """Re-run each block's command (once per distinct command) and return one unified diff per
    block whose committed content differs (empty: no drift)."""
    outputs: dict[str, str] = {}
    problems = []
    for block, text in selected(paths, kinds):
        if block.command not in outputs:
            outputs[block.command] = run(block.command)
        if block.fact:
            want, have = fact_text(block, outputs[block.command]), text[block.start:block.end]
            if _collapse(have) != want:
                problems.append(f"{block.where()}: the fact {block.fact!r} of `{block.command}` drifted: "
                                f"the text says {have!r}, the source now gives {want!r}")
            continue
        want, have = render(block.command, outputs[block.command]), text[block.start:block.end]
        if want != have:
            diff = "".join(difflib.unified_diff(have.splitlines(True), want.splitlines(True),
                                                f"{block.where()} (committed)", f"`{block.command}` (now)"))
            problems.append(f"{block.where()}: the generated block of `{block.command}` drifted:\n{diff}")
    return problems


def update(paths: Iterable[Path], kinds: Sequence[str] = KINDS, run: Callable[[str], str] = run_command) -> list[Path]:
    """Re-run each block's command and rewrite the blocks in place (atomically per file); returns
    the files that changed."""
    changed = []
    outputs: dict[str, str] = {}
    for path in paths:
        path = Path(path)
        text = path.read_text()
        blocks = sorted((b for b, _ in selected([path], kinds)), key=lambda b: b.start)
        new = text
        for block in reversed(blocks):
            if block.command not in outputs:
                print(f"running {block.command}", file=sys.stderr)
                outputs[block.command] = run(block.command)
            if block.fact:
                want = fact_text(block, outputs[block.command])
                if _collapse(text[block.start:block.end]) != want:
                    new = new[:block.start] + want + new[block.end:]
                continue
            new = new[:block.start] + render(block.command, outputs[block.command]) + new[block.end:]
        if new != text:
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                f.write(new)
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
            changed.append(path)
    return changed


NUMBER = re.compile(r"(?<![\w.\-/#@])[−-]?\d(?:\d|,\d)*(?:\.\d+)?(?![\w.]*[A-Za-wyz_])")
_NOT_PROSE = (re.compile(r"<!--.*?-->", re.S), re.compile(r"`[^`\n]*`"), re.compile(r"\]\([^)]*\)"),
              re.compile(r"^\s*\|.*$", re.M), re.compile(r"^#.*$", re.M),
              re.compile(r"\d{4}-\d\d-\d\d( \d\d:\d\d(-\d\d:\d\d)?)?( UTC)?"))


def prose_numbers(text: str, path: Path) -> tuple[list[Block], list[tuple[int, str]]]:
    """The fact spans of ``text`` and, by a heuristic, the other numbers of its running prose:
    ``(line, number)`` outside code (fenced or inline), generated blocks, fact spans, tables,
    headings, comments, link targets and dates. An identifier's digits (``H200``, ``2520d47``,
    ``Qwen3``) are not numbers; config values and counts in prose are (so the count is an upper
    bound on the result numbers left unchecked)."""
    facts = find_facts(text, path)
    masked = list(text)
    spans = [(m.start(), m.end()) for m in FENCE.finditer(text)]
    spans += [(b.start, b.end) for b in find_blocks(text, path)] + [(f.start, f.end) for f in facts]
    spans += [(m.start(), m.end()) for pattern in _NOT_PROSE for m in pattern.finditer(text)]
    for a, b in spans:
        masked[a:b] = [c if c == "\n" else " " for c in masked[a:b]]
    plain = "".join(masked)
    return facts, [(plain.count("\n", 0, m.start()) + 1, m.group()) for m in NUMBER.finditer(plain)]


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("action", choices=("list", "check", "update", "numbers"))
    parser.add_argument("--show", action="store_true", help="numbers: list each unchecked prose number")
    parser.add_argument("files", nargs="*", type=Path, help="Markdown files (default: README.md and docs/**/*.md)")
    parser.add_argument("--kind", choices=(*KINDS, "all"), default="all")
    args = parser.parse_intermixed_args(argv)
    files = args.files or default_files()
    kinds = KINDS if args.kind == "all" else (args.kind,)
    if args.action == "list":
        for block, _ in selected(files, kinds):
            print(f"{block.where()}  [{block.kind}]  {block.command}" + (f"  fact {block.fact}" if block.fact else ""))
        return 0
    if args.action == "numbers":
        for path in files:
            facts, loose = prose_numbers(Path(path).read_text(), Path(path))
            print(f"{path}: {len(facts)} fact spans checked, {len(loose)} other numbers in prose (heuristic)")
            if args.show:
                for line, number in loose:
                    print(f"  {path}:{line}: {number}")
        return 0
    if args.action == "check":
        problems = check(files, kinds, warm_outputs(files, kinds).__getitem__)
        print("\n".join(problems) or "no drift", file=sys.stderr if problems else sys.stdout)
        return 1 if problems else 0
    for path in update(files, kinds):
        print(f"updated {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
