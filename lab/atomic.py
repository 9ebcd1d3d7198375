"""Atomic file writes: a temporary file in the target's directory, fsynced, then ``os.replace``.

An interrupted or failed write leaves the previous file as it was and no temporary file
behind, so a later run never trusts a half-written file. ``os.replace`` within one directory
(one filesystem) is atomic on POSIX and Windows. The training loop (``lab.train``) and the
report writer (``lab.outputs``) write through here; neither needs the other.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from typing import IO, Any


@contextlib.contextmanager
def open_atomic(path: str, mode: str = "w") -> Iterator[IO]:
    """A file object whose content replaces ``path`` when the block exits without an error.

    ``mode`` is ``"w"`` (text, UTF-8) or ``"wb"``. The data are written to a temporary
    file beside ``path``, flushed and fsynced, then renamed over it; on any exception
    (``KeyboardInterrupt`` included) the temporary file is removed and ``path`` is untouched.
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"mode={mode!r}; expected 'w' or 'wb'")
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=os.path.basename(path))
    try:
        with os.fdopen(fd, mode, **({"encoding": "utf-8"} if mode == "w" else {})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_bytes(path: str, data: bytes) -> None:
    """Writes ``data`` to ``path`` atomically."""
    with open_atomic(path, "wb") as f:
        f.write(data)


def write_text(path: str, text: str) -> None:
    """Writes ``text`` (UTF-8) to ``path`` atomically."""
    with open_atomic(path, "w") as f:
        f.write(text)


def write_json(path: str, obj: Any, *, indent: int | None = 2) -> None:
    """Writes ``obj`` as JSON (strict: NaN and infinities are refused) to ``path`` atomically.

    The JSON is streamed into the temporary file, so an object that fails to serialise
    part-way (a value of no JSON type, a NaN) raises and leaves ``path`` as it was.
    """
    with open_atomic(path, "w") as f:
        json.dump(obj, f, indent=indent, allow_nan=False)
        f.write("\n")
