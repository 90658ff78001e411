"""Run many short ``python <script>.py ARGS`` commands without paying the interpreter's start each time.

The drift check of the documented numbers (scripts/docs_tables.py, tests/test_docs.py) runs about
two hundred commands, most of them a Python script that imports numpy and scipy.stats and then
reads a few committed files: the imports are most of each command's second. A :class:`WarmRunner`
starts ``workers`` interpreters once, with the environment ``bash -c`` would give (``PYTHONHASHSEED=0``
as :func:`docs_tables.run_command` sets it), each importing :data:`PRELOAD` once; every command then
runs in a child forked from one of them, as ``python SCRIPT ARGS`` would: ``sys.argv`` is
``[SCRIPT, *ARGS]``, the script's directory is first on ``sys.path``, it runs as ``__main__`` from the
root, its stdin is empty and its stdout and stderr are captured at the file-descriptor level. A
fresh fork per command keeps one script's module state from reaching the next.

A command that is not a plain Python script call (a pipe, a redirection, a glob, a variable, another
program) runs with ``bash -c`` as before. Contract of :meth:`WarmRunner.run`: the command's stdout,
or ``RuntimeError`` naming it with its exit status and the end of its stderr, as
:func:`docs_tables.run_command`.
"""
from __future__ import annotations

import json
import os
import queue
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterable, Optional

PRELOAD = ("numpy", "scipy.stats", "kvrl.analysis.stats")
_SHELL = re.compile(r"[|&;<>()$`*?~{}\[\]!\\\n]")   # anything bash would read as more than words

# The worker: imports PRELOAD, then for each JSON request on stdin ({"argv": [...], "out": path,
# "err": path}) forks a child that runs the script, and answers {"rc": status} on stdout.
_WORKER = r"""
import importlib, json, os, runpy, sys, traceback
for name in sys.argv[1:]:
    importlib.import_module(name)
channel = os.fdopen(os.dup(1), "w")
for line in sys.stdin:
    req = json.loads(line)
    sys.stdout.flush(); sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            for fd, path in ((1, req["out"]), (2, req["err"])):
                f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                os.dup2(f, fd)
                os.close(f)
            script = req["argv"][0]
            sys.argv = list(req["argv"])
            sys.path[0] = os.path.dirname(os.path.abspath(script))
            try:
                runpy.run_path(script, run_name="__main__")
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
                if not isinstance(e.code, (int, type(None))):
                    print(e.code, file=sys.stderr)
            except BaseException:
                traceback.print_exc()
                code = 1
        finally:
            try:
                sys.stdout.flush(); sys.stderr.flush()
            finally:
                os._exit(code)
    _, status = os.waitpid(pid, 0)
    rc = os.waitstatus_to_exitcode(status)
    channel.write(json.dumps({"rc": rc}) + "\n"); channel.flush()
"""


def script_argv(command: str) -> Optional[list[str]]:
    """``[SCRIPT, *ARGS]`` of a plain ``python SCRIPT.py ARGS`` command, else None. Single-quoted
    words may hold anything (bash reads them as text); outside them, no shell syntax."""
    outside = re.sub(r"'[^']*'", "", command)
    if _SHELL.search(outside) or "'" in outside or '"' in outside:
        return None
    words = shlex.split(command)
    if len(words) < 2 or words[0] != "python" or not words[1].endswith(".py"):
        return None
    return words[1:]


class WarmRunner:
    """``workers`` warm interpreters (see the module docstring); a context manager that stops them."""

    def __init__(self, root: Path, workers: int = 0, fallback: Optional[Callable[[str], str]] = None) -> None:
        self.root = Path(root)
        self.workers = workers or os.cpu_count() or 1
        self.fallback = fallback
        self._idle: "queue.Queue[subprocess.Popen]" = queue.Queue()
        self._procs: list[subprocess.Popen] = []
        self._tmp = Path(tempfile.mkdtemp(prefix="warm-runner-"))   # each command's captured stdout and stderr
        python = shutil.which("python") or sys.executable
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        for _ in range(self.workers):
            proc = subprocess.Popen([python, "-c", _WORKER, *PRELOAD], cwd=self.root, env=env, text=True,
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            self._procs.append(proc)
            self._idle.put(proc)

    def __enter__(self) -> "WarmRunner":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                proc.stdin.close()
                proc.wait(timeout=60)
        self._procs.clear()
        shutil.rmtree(self._tmp, ignore_errors=True)

    def run(self, command: str) -> str:
        """The stdout of ``command`` (see the module docstring)."""
        argv = script_argv(command)
        if argv is None:
            if self.fallback is None:
                raise ValueError(f"`{command}` is not a plain python script call and no fallback was given")
            return self.fallback(command)
        proc = self._idle.get()
        out = self._tmp / f"{proc.pid}.out"
        err = out.with_suffix(".err")
        try:
            proc.stdin.write(json.dumps({"argv": argv, "out": str(out), "err": str(err)}) + "\n")
            proc.stdin.flush()
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError(f"`{command}`: the warm interpreter {proc.pid} died (exit {proc.wait()})")
            rc = json.loads(line)["rc"]
            stdout, stderr = out.read_text(), err.read_text()
        finally:
            self._idle.put(proc)
            for path in (out, err):
                path.unlink(missing_ok=True)
        if rc:
            raise RuntimeError(f"`{command}` exited {rc}:\n{stderr[-3000:]}")
        return stdout

    def run_all(self, commands: Iterable[str]) -> dict[str, str]:
        """Each distinct command's stdout, run ``workers`` at a time; the first failure is raised."""
        distinct = list(dict.fromkeys(commands))
        with ThreadPoolExecutor(self.workers) as pool:
            return dict(zip(distinct, pool.map(self.run, distinct)))
