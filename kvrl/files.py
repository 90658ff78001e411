"""Files that readers never see half-written: :func:`atomic_write` and :func:`write_json`.

A leaf module (it imports nothing from kvrl), so every layer may write its outputs with it.
"""
from __future__ import annotations

import json
import math
import os
import secrets
from pathlib import Path
from typing import Any, Callable


def atomic_write(path: os.PathLike, write: Callable[[Any], None], mode: str = "w") -> None:
    """Write ``path`` through a temporary file in the same directory and rename it into place,
    so readers never see a half-written file (a full disk leaves the old file, or none).

    The file gets mode 0666 less the process umask (0644 under the usual 022), like ``open``.
    Text is UTF-8; a character it cannot encode (a lone surrogate in a request id given through
    the Python API) is written as a backslash escape rather than losing the whole file.
    """
    path = Path(path)
    while True:
        tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)   # the umask applies
            break
        except FileExistsError:
            continue
    try:
        text = {} if "b" in mode else {"encoding": "utf-8", "errors": "backslashreplace"}
        with os.fdopen(fd, mode, **text) as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_json(path: os.PathLike, data: Any) -> None:
    def clean(x):
        return None if isinstance(x, float) and not math.isfinite(x) else x
    atomic_write(path, lambda f: json.dump({k: clean(v) for k, v in data.items()}, f, indent=2, sort_keys=True))
