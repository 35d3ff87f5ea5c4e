"""Streaming JSONL input: a ``.jsonl`` file or a directory of them.

Lines are read one at a time from binary files so memory stays flat in file
size; a line longer than :data:`MAX_LINE_BYTES` is skipped in bounded chunks
and reported rather than loaded, so even a file without newlines cannot
exhaust memory.
"""
from __future__ import annotations

import codecs
import json
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterator

from steps.cli import Refused
from steps.gsm8k.answer import gold_answer

# A GSM8K row is a few KB; anything near this is not a training example.
MAX_LINE_BYTES = 1 << 20

# Why a row is rejected. These exact strings are the keys of the counts in
# validation.json, so they are part of the output format.
INVALID_JSON = "invalid JSON"
NOT_UTF8 = "not UTF-8"
NOT_OBJECT = "not a JSON object"
LINE_TOO_LONG = "line too long"
MISSING_QUESTION = "missing question"
MISSING_ANSWER = "missing answer"
QUESTION_NOT_STRING = "question not a string"
ANSWER_NOT_STRING = "answer not a string"
EMPTY_QUESTION = "empty question"
NO_FINAL_ANSWER = "no '#### <number>' final answer"
PROMPT_TOO_LONG = "prompt too long for the model"


class DataError(Refused, ValueError):
    """An input path that cannot be read as JSONL; the message names it and the fix."""


class RowError(ValueError):
    """A row that is not a usable example; ``reason`` is one of the constants above."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason} ({detail})" if detail else reason)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class Example:
    question: str
    gold: str  # gold_answer(answer): the canonical reference number


@dataclass(frozen=True)
class RawLine:
    file: str
    line_no: int
    row: dict | None
    error: str | None  # one of the reason constants when the line is unusable
    detail: str = ""  # e.g. the JSON parser's message


def jsonl_files(path: str | Path) -> list[Path]:
    """The file itself, or every ``*.jsonl`` under a directory in sorted order."""
    p = Path(path)
    if p.is_file():
        return [p]
    if p.is_dir():
        files = sorted(f for f in p.rglob("*.jsonl") if f.is_file())
        if not files:
            raise DataError(f"{p}: directory contains no .jsonl files; put the data in <name>.jsonl files there")
        return files
    if p.exists():
        raise DataError(f"{p}: not a regular file or directory; pass a .jsonl file or a directory of them")
    raise DataError(f"{p}: no such file or directory; check the path")


def _bounded_lines(fh: BinaryIO) -> Iterator[bytes | None]:
    """Each line's bytes, or None for a line over MAX_LINE_BYTES (skipped in chunks)."""
    while True:
        line = fh.readline(MAX_LINE_BYTES + 1)
        if not line:
            return
        if len(line) <= MAX_LINE_BYTES:
            yield line
            continue
        while line and not line.endswith(b"\n"):
            line = fh.readline(MAX_LINE_BYTES)
        yield None


def _no_constants(name: str) -> None:
    # json.loads accepts NaN/Infinity, which no other JSON reader does.
    raise ValueError(f"{name} is not valid JSON")


# One decoder for all lines: json.loads would build a new one per call.
_DECODER = json.JSONDecoder(parse_constant=_no_constants)


def _parse(file: str, line_no: int, raw: bytes | None) -> RawLine:
    if raw is None:
        return RawLine(file, line_no, None, LINE_TOO_LONG, f"over {MAX_LINE_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return RawLine(file, line_no, None, NOT_UTF8, f"byte {exc.start}")
    try:
        row = _DECODER.decode(text)
    except ValueError as exc:  # JSONDecodeError, or NaN/Infinity
        return RawLine(file, line_no, None, INVALID_JSON, str(exc))
    if not isinstance(row, dict):
        return RawLine(file, line_no, None, NOT_OBJECT, f"got {type(row).__name__}")
    return RawLine(file, line_no, row, None)


def iter_lines(path: str | Path) -> Iterator[RawLine]:
    """Every non-blank line of every JSONL file under ``path``, parsed, in order.

    Raises DataError for a path with no files or an unreadable file.
    """
    for f in jsonl_files(path):
        try:
            fh = open(f, "rb")
        except OSError as exc:
            raise DataError(f"{f}: cannot read ({exc.strerror}); check the file and its permissions") from None
        with fh:
            for line_no, raw in enumerate(_bounded_lines(fh), start=1):
                if raw is not None:
                    if line_no == 1:
                        raw = raw.removeprefix(codecs.BOM_UTF8)  # editors on Windows add one
                    if not raw.strip():
                        continue
                yield _parse(str(f), line_no, raw)


def parse_example(row: dict) -> Example:
    """The example in a parsed row; raises RowError saying what is wrong."""
    for field, missing, not_string in (
        ("question", MISSING_QUESTION, QUESTION_NOT_STRING),
        ("answer", MISSING_ANSWER, ANSWER_NOT_STRING),
    ):
        if field not in row:
            raise RowError(missing)
        if not isinstance(row[field], str):
            raise RowError(not_string, f"got {type(row[field]).__name__}")
    if not row["question"].strip():
        raise RowError(EMPTY_QUESTION)
    gold = gold_answer(row["answer"])
    if gold is None:
        tail = row["answer"].rsplit("\n", 1)[-1][-40:]
        raise RowError(NO_FINAL_ANSWER, f"answer ends {tail!r}")
    return Example(question=row["question"], gold=gold)


def load_examples(path: str | Path) -> list[Example]:
    """Examples from CLEANED files (ValidateData's output); a bad row is an error naming file:line."""
    examples = []
    for line in iter_lines(path):
        try:
            if line.error:
                raise RowError(line.error, line.detail)
            examples.append(parse_example(line.row))
        except RowError as exc:
            raise DataError(f"{line.file}:{line.line_no}: {exc}; run steps.validate on this data first") from None
    return examples
