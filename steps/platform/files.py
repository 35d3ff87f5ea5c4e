"""Atomic file writes: the one way this project writes a file that a reader must never see half-written.

A file is written to a hidden temporary beside it (same folder, so the rename stays on one
filesystem), flushed and fsynced, then renamed over the target. A kill at any moment leaves
either the old file or the new one, never a cut one; a block that raises leaves the old one
and removes the temporary. Readers of ``checkpoint.json``, ``model.json``, ``evaluation.json``
and ``validation.json`` rely on this: the file's presence means its writer finished.
"""
from __future__ import annotations

import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Iterator


def temporary_of(path: Path) -> Path:
    """The hidden temporary ``path`` is written through (a stale one from a killed writer is simply overwritten)."""
    return path.with_name(f".{path.name}.tmp")


@contextmanager
def atomic_open(path: str | Path, encoding: str = "utf-8") -> Iterator[IO[str]]:
    """A text file that appears at ``path`` only when the ``with`` block completes."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_of(target)
    try:
        with open(tmp, "w", encoding=encoding) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def write_text(path: str | Path, text: str) -> Path:
    with atomic_open(path) as f:
        f.write(text)
    return Path(path)


def write_json(path: str | Path, payload: Any, indent: int | None = None) -> Path:
    return write_text(path, json.dumps(payload, indent=indent) + ("\n" if indent else ""))
