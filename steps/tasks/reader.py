"""Data as it comes: the rows of JSONL, JSON, CSV and parquet files, one at a time, each with its file and line.

- ``.jsonl``: one JSON object a line, read as bytes line by line so memory stays flat in file size; a line
  longer than :data:`MAX_LINE_BYTES` is skipped in bounded chunks and reported rather than loaded;
- ``.json``: a list of objects (``[{...}, {...}]``), or JSON Lines under a ``.json`` name (what Hugging Face's
  ``Dataset.to_json`` writes); a list is parsed whole, as any JSON document must be;
- ``.csv``: a header row naming the fields, then one row a record (every value text);
- ``.parquet``: read through pyarrow, one record batch in memory at a time. pyarrow is already installed (MLflow
  depends on it), so reading parquet adds no dependency; it is the format verl trains from and the one the
  Hugging Face hub serves every dataset in. A row's "line" is its number in the file, from 1.

Every reader yields :class:`RawLine`: the row as a dict, or the reason it is unusable. Values keep their types
(a parquet or JSON integer stays an int): the task decides what it accepts (steps/tasks/task.py).
"""
from __future__ import annotations

import codecs
import csv
import io
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator, Sequence

from steps.cli import Refused

# A GSM8K row is a few KB; anything near this is not a training example.
MAX_LINE_BYTES = 1 << 20
PARQUET_BATCH_ROWS = 1024

# Why a row is rejected. These exact strings are the keys of the counts in validation.json, so they are part of
# the output format.
INVALID_JSON = "invalid JSON"
INVALID_CSV = "invalid CSV"
NOT_UTF8 = "not UTF-8"
NOT_OBJECT = "not a JSON object"
LINE_TOO_LONG = "line too long"
MISSING_QUESTION = "missing question"
MISSING_ANSWER = "missing answer"
QUESTION_NOT_STRING = "question not a string"
ANSWER_NOT_STRING = "answer not a string"
EMPTY_QUESTION = "empty question"
PROMPT_TOO_LONG = "prompt too long for the model"


class DataError(Refused, ValueError):
    """An input path that cannot be read; the message names it and the fix."""


class RowError(ValueError):
    """A row that is not a usable example; ``reason`` is one of the constants above (or a task's own)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason} ({detail})" if detail else reason)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class RawLine:
    file: str
    line_no: int
    row: dict | None
    error: str | None  # one of the reason constants when the line is unusable
    detail: str = ""  # e.g. the JSON parser's message


# -- JSON Lines ----------------------------------------------------------------------------------------------
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


def _jsonl(f: Path, fh: BinaryIO) -> Iterator[RawLine]:
    for line_no, raw in enumerate(_bounded_lines(fh), start=1):
        if raw is not None:
            if line_no == 1:
                raw = raw.removeprefix(codecs.BOM_UTF8)  # editors on Windows add one
            if not raw.strip():
                continue
        yield _parse(str(f), line_no, raw)


# -- JSON: a list of objects ---------------------------------------------------------------------------------
_SPACE = re.compile(r"[\s,]*")


def _json(f: Path, fh: BinaryIO) -> Iterator[RawLine]:
    head = fh.read(64).removeprefix(codecs.BOM_UTF8).lstrip()
    fh.seek(0)
    if not head.startswith(b"["):  # JSON Lines under a .json name (Dataset.to_json's default)
        yield from _jsonl(f, fh)
        return
    try:
        text = fh.read().decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DataError(f"{f}: not UTF-8 (byte {exc.start}); save the file as UTF-8") from None
    # Item by item, so each row keeps the line it starts on (a refusal names file:line).
    pos, line_no = text.index("[") + 1, 1 + text.count("\n", 0, text.index("["))
    while True:
        skip = _SPACE.match(text, pos).end()
        line_no += text.count("\n", pos, skip)
        pos = skip
        if pos >= len(text) or text[pos] == "]":
            return
        try:
            row, end = _DECODER.raw_decode(text, pos)
        except ValueError as exc:
            raise DataError(f"{f}:{line_no}: not valid JSON ({exc}); a .json file holds one list of objects "
                            "[{...}, ...] (or one object a line)") from None
        yield (RawLine(str(f), line_no, row, None) if isinstance(row, dict)
               else RawLine(str(f), line_no, None, NOT_OBJECT, f"got {type(row).__name__}"))
        line_no += text.count("\n", pos, end)
        pos = end


# -- CSV -----------------------------------------------------------------------------------------------------
def _csv(f: Path, fh: BinaryIO) -> Iterator[RawLine]:
    text = io.TextIOWrapper(fh, encoding="utf-8-sig", newline="")
    reader = csv.DictReader(text)
    start = 2  # the header is line 1
    try:
        while True:
            try:
                record = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:
                yield RawLine(str(f), start, None, INVALID_CSV, str(exc))
                start = reader.line_num + 1
                continue
            # A short row's missing values are None, a long row's extra ones under the key None: neither is a field.
            row = {k: v for k, v in record.items() if k is not None and v is not None}
            yield RawLine(str(f), start, row, None)
            start = reader.line_num + 1
    except UnicodeDecodeError as exc:
        raise DataError(f"{f}: not UTF-8 after line {start - 1} ({exc.reason}); save the file as UTF-8") from None


# -- parquet -------------------------------------------------------------------------------------------------
def _parquet(f: Path, fh: BinaryIO) -> Iterator[RawLine]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        batches = pq.ParquetFile(fh).iter_batches(batch_size=PARQUET_BATCH_ROWS)
        line_no = 0
        for batch in batches:
            for row in batch.to_pylist():
                line_no += 1
                yield RawLine(str(f), line_no, row, None)
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{f}: not a readable parquet file ({exc}); write it with pyarrow or datasets' "
                        "to_parquet") from None


Reader = Callable[[Path, BinaryIO], Iterator[RawLine]]
#: The formats read, by file suffix: what a folder is searched for.
READERS: dict[str, Reader] = {".jsonl": _jsonl, ".json": _json, ".csv": _csv, ".parquet": _parquet}
FORMATS_READ = "JSONL (.jsonl), JSON (.json: a list of objects, or JSON Lines), CSV (.csv, a header row), parquet " \
               "(.parquet)"
SHOWN_FILES = 8  # files a refusal names


def _hidden(path: Path, root: Path) -> bool:
    # .cache/ of a hub download, .git/: never data.
    return any(part.startswith(".") for part in path.relative_to(root).parts)


def _named(files: list[Path], root: Path) -> str:
    names = [str(f.relative_to(root)) for f in files[:SHOWN_FILES]]
    more = f" and {len(files) - SHOWN_FILES} more" if len(files) > SHOWN_FILES else ""
    return ", ".join(names) + more if names else "no file"


def data_files(path: str | Path | Sequence[Path]) -> list[Path]:
    """The file itself, or every data file (by suffix: :data:`READERS`) under a directory, in sorted order; a list
    of files (a split: steps/tasks/splits.py) as it is."""
    if isinstance(path, (list, tuple)):
        return [Path(f) for f in path]
    p = Path(path)
    if p.is_file():
        if p.suffix.lower() not in READERS:
            raise DataError(f"{p}: a {p.suffix or 'suffix-less'} file; the formats read: {FORMATS_READ}")
        return [p]
    if p.is_dir():
        every = sorted(f for f in p.rglob("*") if f.is_file() and not _hidden(f, p))
        found = [f for f in every if f.suffix.lower() in READERS]
        if not found:
            raise DataError(f"{p}: no data file among {_named(every, p)}; the formats read: {FORMATS_READ}")
        return found
    if p.exists():
        raise DataError(f"{p}: not a regular file or directory; pass a data file or a directory of them")
    raise DataError(f"{p}: no such file or directory; check the path")


def iter_lines(path: str | Path | Sequence[Path]) -> Iterator[RawLine]:
    """Every row of every data file under ``path``, parsed, in order (blank JSONL lines skipped).

    Raises DataError for a path with no files, an unreadable file, or one that cannot be parsed at all.
    """
    for f in data_files(path):
        try:
            fh = open(f, "rb")
        except OSError as exc:
            raise DataError(f"{f}: cannot read ({exc.strerror}); check the file and its permissions") from None
        with fh:
            yield from READERS[f.suffix.lower()](f, fh)


def first_row(path: str | Path | Sequence[Path]) -> dict[str, Any] | None:
    """The first row that parses (its fields name the file's), or None."""
    return next((line.row for line in iter_lines(path) if line.row is not None), None)
