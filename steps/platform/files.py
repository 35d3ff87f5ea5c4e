"""Atomic file writes: the one way this project writes a file that a reader must never see half-written.

A file is written to a hidden temporary beside it (same folder, so the rename stays on one
filesystem), flushed and fsynced, then renamed over the target. A kill at any moment leaves
either the old file or the new one, never a cut one; a block that raises leaves the old one
and removes the temporary. Readers of ``checkpoint.json``, ``model.json``, ``evaluation.json``
and ``validation.json`` rely on this: the file's presence means its writer finished.

Every file a later step, a retry or a resume reads is written here (or, if appended record by record, read
through :func:`read_records`). A file damaged anyway (emptied, cut or edited by hand, or left by an older
version that wrote in place) is named by :class:`Damaged`, one line, never a traceback; its reader either
carries on without it or refuses with that line.
"""
from __future__ import annotations

import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Iterator

from steps.cli import Refused


class Damaged(Refused):
    """A file a later step, a retry or a resume reads is not whole JSON: the message names it, what is wrong and
    what to do (a Refused: a step exits 2 with it, a local run prints it as its one ``refused:`` line)."""


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


def read_json(path: str | Path, what_to_do: str) -> Any:
    """The JSON document at ``path``; :class:`Damaged` naming the file and ``what_to_do`` when it is not one."""
    p = Path(path)
    text = p.read_text(encoding="utf-8", errors="replace")
    try:
        return json.loads(text)
    except ValueError as exc:
        wrong = "empty" if not text.strip() else f"not whole JSON: {exc}"
        raise Damaged(f"{p} is damaged ({wrong}). {what_to_do}") from None


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """The records of an append-only JSONL file (``metrics.jsonl``, ``rollouts.jsonl``). A kill during an append
    can cut its last line: that record, of the step the kill interrupted, is left out (the resumed step writes
    it again). A damaged line before the last is :class:`Damaged`."""
    p = Path(path)
    lines = [line for line in p.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    records = []
    for number, line in enumerate(lines, 1):
        try:
            records.append(json.loads(line))
        except ValueError:
            if number < len(lines):
                raise Damaged(f"{p}:{number} is damaged (not a JSON record). Delete that line, or the file, "
                              "and run again.") from None
    return records
