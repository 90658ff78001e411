"""Fingerprints of the code a step-time profile measured, so a profile cannot go stale unnoticed.

A profile times the live executor: its kernels, model code and executor. When any of them
changes, the profile's step times may no longer hold. :func:`code_fingerprint` hashes that code
(:data:`TIMING_SOURCES`) as source text without docstrings, comments and blank lines, so comment and
docstring edits do not count; :func:`profile_fingerprint` adds the package versions a profile records.

A profile stores its fingerprint in ``meta["fingerprint"]`` (written by ``kvrl-profile``). When
the tree's code hash differs, :func:`staleness` says so, unless the profile lists the tree's hash
in ``meta["fingerprint_accepted"]`` with the reason the change does not affect timing (entries
``{"code": <hash>, "why": <text>}``): re-profile, or record why.
"""
from __future__ import annotations

import ast
import hashlib
import importlib.util
import io
import tokenize
from functools import lru_cache
from pathlib import Path
from typing import Optional

#: the timing-relevant code: every module a live step runs (a package: all its modules). Loading
#: and configuration code (kvrl.model.loader, .config, .random_checkpoint) runs before timing starts.
TIMING_SOURCES = ("kvrl.kernels", "kvrl.model.layers", "kvrl.model.model", "kvrl.model.metadata",
                  "kvrl.executors.live", "kvrl.executors.decode_graph", "kvrl.executors.sampling",
                  "kvrl.executors.piecewise", "kvrl.executors.step_graph", "kvrl.executors.step_rule",
                  "kvrl.executors.step_inputs",
                  "kvrl.executors.base")


def _docstring_lines(tree: ast.AST) -> set[int]:
    """Line numbers of every module, class and function docstring."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                lines.update(range(first.lineno, first.end_lineno + 1))
    return lines


def source_digest(text: str) -> str:
    """SHA-256 (hex) of a module's source without docstrings, comments, blank lines and trailing
    spaces. Built on the source text, not on ``ast.dump`` (whose format changes between Python
    versions), so the GPU machine's Python and this one's agree."""
    drop = _docstring_lines(ast.parse(text))
    comment_at = {tok.start[0]: tok.start[1] for tok in tokenize.generate_tokens(io.StringIO(text).readline)
                  if tok.type == tokenize.COMMENT}
    kept = []
    for number, line in enumerate(text.splitlines(), 1):
        if number in drop:
            continue
        line = line[:comment_at.get(number, len(line))].rstrip()
        if line.strip():
            kept.append(line)
    return hashlib.sha256("\n".join(kept).encode()).hexdigest()


def _locate(name: str) -> tuple[Path, bool]:
    """(file, is_package) of module ``name``, without importing it or its parent package (whose
    ``__init__`` may import torch): the parent is found by its spec, the module in its folder."""
    parent, _, leaf = name.rpartition(".")
    spec = importlib.util.find_spec(parent) if parent else None
    folders = list(spec.submodule_search_locations or ()) if spec else []
    for folder in folders:
        pkg = Path(folder) / leaf
        if (pkg / "__init__.py").exists():
            return pkg / "__init__.py", True
        if pkg.with_suffix(".py").exists():
            return pkg.with_suffix(".py"), False
    spec = importlib.util.find_spec(name)        # a folder mapped by the installer (kvrl.kernels)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(f"timing-relevant module {name} not found")
    return Path(spec.origin), bool(spec.submodule_search_locations)


def _sources() -> list[tuple[str, Path]]:
    """(module name, file) of every module in :data:`TIMING_SOURCES`."""
    out: list[tuple[str, Path]] = []
    for name in TIMING_SOURCES:
        origin, is_package = _locate(name)
        if is_package:                              # every module below it
            pkg = origin.parent
            out += [(f"{name}." + ".".join(p.relative_to(pkg).with_suffix("").parts), p)
                    for p in sorted(pkg.rglob("*.py")) if "__pycache__" not in p.parts]
        else:
            out.append((name, origin))
    return out


@lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """Hash (16 hex digits) of the timing-relevant code of this kvrl."""
    h = hashlib.sha256()
    for name, path in _sources():
        h.update(name.encode())
        h.update(source_digest(path.read_text()).encode())
    return h.hexdigest()[:16]


def profile_fingerprint(device: str) -> dict:
    """What a new profile records: the code hash, kvrl/torch/triton versions and the device."""
    from importlib.metadata import PackageNotFoundError, version

    def ver(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    return {"code": code_fingerprint(), "kvrl": ver("kvrl"), "torch": ver("torch"), "triton": ver("triton"),
            "device": device}


def staleness(meta: dict, code: Optional[str] = None) -> Optional[str]:
    """None when ``meta`` (a profile's metadata) measured this code (or accepts its hash with a
    reason); otherwise a sentence saying what differs and what to do."""
    code = code or code_fingerprint()
    fp = meta.get("fingerprint")
    if not fp:
        return "records no code fingerprint (measured before fingerprints): re-profile with kvrl-profile"
    if fp.get("code") == code:
        return None
    for entry in meta.get("fingerprint_accepted", ()):
        if entry.get("code") == code and entry.get("why"):
            return None
    return (f"measured code {fp.get('code')} but this tree's timing-relevant code is {code} "
            f"({', '.join(TIMING_SOURCES)} changed): re-profile with kvrl-profile, or add "
            f'{{"code": "{code}", "why": "<why timing is unaffected>"}} to the profile\'s meta.fingerprint_accepted')
