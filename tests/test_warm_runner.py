"""scripts/warm_runner.py: a script forked from a warm interpreter prints what ``bash -c`` would."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("warm_runner", ROOT / "scripts" / "warm_runner.py")
warm_runner = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = warm_runner
spec.loader.exec_module(warm_runner)

SCRIPT = """\
import os, sys
import helper                      # found in the script's own directory, as python SCRIPT would
STATE = helper.bump()             # module state: a fresh fork sees 1 every time
print("argv", sys.argv[1:], "state", STATE, "cwd", os.path.basename(os.getcwd()), "hash", hash("kvrl"))
print("stdin empty", sys.stdin.read() == "")
print("to stderr", file=sys.stderr)
if "--fail" in sys.argv:
    sys.exit(3)
if "--raise" in sys.argv:
    raise KeyError("boom")
"""


@pytest.fixture()
def tree(tmp_path):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "show.py").write_text(SCRIPT)
    (tmp_path / "bin" / "helper.py").write_text("COUNT = 0\ndef bump():\n    global COUNT\n    COUNT += 1\n    return COUNT\n")
    return tmp_path


def _bash(command: str, root: Path) -> subprocess.CompletedProcess:
    import os
    return subprocess.run(["bash", "-c", command], cwd=root, capture_output=True, text=True,
                          env={**os.environ, "PYTHONHASHSEED": "0"})


def test_a_warm_script_prints_what_bash_prints_and_keeps_no_state(tree):
    commands = ["python bin/show.py a 'b c' --x=1", "python bin/show.py 'fixed(fraction=0.01)' d"]
    with warm_runner.WarmRunner(tree, workers=2) as runner:
        first = runner.run_all(commands)
        again = runner.run_all(commands)      # the same workers: module state did not carry over
    for command in commands:
        assert first[command] == again[command] == _bash(command, tree).stdout
    assert "state 1" in first[commands[0]] and "['a', 'b c', '--x=1']" in first[commands[0]]


def test_failures_name_the_command_its_status_and_stderr(tree):
    with warm_runner.WarmRunner(tree, workers=1) as runner:
        with pytest.raises(RuntimeError, match=r"`python bin/show.py --fail` exited 3:\nto stderr"):
            runner.run("python bin/show.py --fail")
        with pytest.raises(RuntimeError, match=r"exited 1:(.|\n)*KeyError: 'boom'"):
            runner.run("python bin/show.py --raise")
        assert "state 1" in runner.run("python bin/show.py")      # the worker survives its children's failures


def test_shell_commands_go_to_the_fallback(tree):
    seen = []
    with warm_runner.WarmRunner(tree, workers=1, fallback=lambda c: seen.append(c) or _bash(c, tree).stdout) as runner:
        assert runner.run("python bin/show.py x | head -1").startswith("argv ['x']")
        assert runner.run("echo $HOME") != ""
    assert seen == ["python bin/show.py x | head -1", "echo $HOME"]
    with warm_runner.WarmRunner(tree, workers=1) as runner:
        with pytest.raises(ValueError, match="not a plain python script call"):
            runner.run("ls bin")


@pytest.mark.parametrize("command, argv", [
    ("python scripts/a.py --x 1", ["scripts/a.py", "--x", "1"]),
    ("python scripts/a.py 'fixed(fraction=0.01)' --f 'p,q'", ["scripts/a.py", "fixed(fraction=0.01)", "--f", "p,q"]),
    ("python scripts/a.py *.csv", None),
    ("python scripts/a.py > out", None),
    ("python scripts/a.py \"$X\"", None),
    ("python -m kvrl", None),
    ("bash scripts/a.sh", None),
    ("python scripts/a.py 'unclosed", None),
])
def test_which_commands_are_plain_script_calls(command, argv):
    assert warm_runner.script_argv(command) == argv
