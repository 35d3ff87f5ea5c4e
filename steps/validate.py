"""ValidateData step: check GSM8K JSONL data and write cleaned copies.

    python -m steps.validate --train PATH --eval PATH --batch-size N --output DIR [--on-overlap remove|fail]

Writes ``DIR/validation.json`` (accepted or refused) and, only when accepted,
``DIR/train.jsonl`` and ``DIR/eval.jsonl``: the rows that passed, in input
order, with all their fields (extra fields are kept), as compact JSON lines.
Exit codes: 0 trainable, 2 refused (the message says why and how to fix it),
1 crashed.

validation.json: ``status``, ``message``, ``batch_size``, ``on_overlap``,
``kept`` per split, ``overlap`` (count, action, first rows), ``splits`` (per
split: input files with sha256, rows read, kept, rejected counts by reason, the
first 20 rejected rows with file, line and reason) and ``outputs``.

Rows are read line by line. Per row only an 8-byte digest of the normalised
question is kept (for duplicates and train/eval overlap), so memory grows by
about 8 bytes per row, not with the size of the rows.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from steps.data import DataError, RawLine, RowError, iter_lines, jsonl_files, parse_example
from steps.gsm8k import normalize_question
from steps.versions import require_training_session_sdk

DUPLICATE_QUESTION = "duplicate question"
FIRST_N = 20  # rejected / overlapping rows listed in validation.json
SHOWN = 5  # rejected rows quoted in a refusal message
_ENCODER = json.JSONEncoder(ensure_ascii=False)  # reused: json.dumps builds one per call
OUTPUTS = ("validation.json", "train.jsonl", "eval.jsonl")


def question_digest(question: str) -> int:
    # 64 bits: a false duplicate among 10 million rows has probability ~3e-6.
    key = normalize_question(question).encode("utf-8")
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")


class DigestSet:
    """A set of 64-bit digests costing ~8 bytes each.

    A Python set of ints costs ~70 bytes per entry, about half the size of a
    short row; so digests live in a sorted numpy array, and the
    newest in a small set that is merged in once it holds MERGE_AT entries.
    """

    MERGE_AT = 32768

    def __init__(self) -> None:
        self._sorted = np.empty(0, dtype=np.uint64)
        self._recent: set[int] = set()

    def __len__(self) -> int:
        return len(self._sorted) + len(self._recent)

    def __contains__(self, digest: int) -> bool:
        if digest in self._recent:
            return True
        i = int(self._sorted.searchsorted(np.uint64(digest)))
        return i < len(self._sorted) and int(self._sorted[i]) == digest

    def add(self, digest: int) -> None:
        self._recent.add(digest)
        if len(self._recent) >= self.MERGE_AT:
            new = np.sort(np.fromiter(self._recent, dtype=np.uint64, count=len(self._recent)))
            self._sorted = np.insert(self._sorted, np.searchsorted(self._sorted, new), new)
            self._recent.clear()


@dataclass(frozen=True)
class Rejection:
    file: str
    line: int
    reason: str
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.reason}" + (f" ({self.detail})" if self.detail else "")


@dataclass
class SplitScan:
    """What streaming one split found; filled in as the rows go by."""

    name: str
    path: str
    inputs: list[dict[str, Any]]
    rows: int = 0
    kept: int = 0
    by_reason: Counter = field(default_factory=Counter)
    first_rejected: list[Rejection] = field(default_factory=list)
    overlap: int = 0
    first_overlap: list[Rejection] = field(default_factory=list)
    digests: DigestSet = field(default_factory=DigestSet)

    @property
    def rejected(self) -> int:
        return sum(self.by_reason.values())

    def reject(self, line: RawLine, reason: str, detail: str = "") -> None:
        self.by_reason[reason] += 1
        if len(self.first_rejected) < FIRST_N:
            self.first_rejected.append(Rejection(line.file, line.line_no, reason, detail))

    def reasons_text(self) -> str:
        return ", ".join(f"{reason} {n}" for reason, n in self.by_reason.most_common()) or "none"

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "inputs": self.inputs,
            "rows": self.rows,
            "kept": self.kept,
            "rejected": self.rejected,
            "rejected_by_reason": dict(self.by_reason.most_common()),
            "first_rejected": [vars(r) for r in self.first_rejected],
        }


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def scan_split(name: str, path: str, out: TextIO, eval_digests: DigestSet | None = None) -> SplitScan:
    """Stream one split, write its clean rows to ``out``, and count the rest.

    ``eval_digests`` (train only) are the eval questions: a train row asking one
    of them is an overlap, left out of ``out`` and counted separately.
    """
    try:
        inputs = [{"file": str(f), "sha256": sha256_file(f), "bytes": f.stat().st_size} for f in jsonl_files(path)]
    except OSError as exc:
        raise DataError(f"{exc.filename}: cannot read ({exc.strerror}); check the file and its permissions") from None
    scan = SplitScan(name=name, path=str(path), inputs=inputs)
    for line in iter_lines(path):
        scan.rows += 1
        try:
            if line.error:
                raise RowError(line.error, line.detail)
            digest = question_digest(parse_example(line.row).question)
            if digest in scan.digests:
                raise RowError(DUPLICATE_QUESTION, "an earlier row asks it, ignoring case and spacing")
        except RowError as exc:
            scan.reject(line, exc.reason, exc.detail)
            continue
        scan.digests.add(digest)
        if eval_digests is not None and digest in eval_digests:
            scan.overlap += 1
            if len(scan.first_overlap) < FIRST_N:
                scan.first_overlap.append(Rejection(line.file, line.line_no, "also in eval"))
            continue
        out.write(_ENCODER.encode(line.row) + "\n")
        scan.kept += 1
    return scan


def _describe(scan: SplitScan) -> str:
    files = len(scan.inputs)
    where = f"{scan.path}" + (f" ({files} files)" if files != 1 else "")
    return (
        f"{where}: {scan.rows} rows read, {scan.rejected} rejected ({scan.reasons_text()})"
        + (f", {scan.overlap} also in eval" if scan.overlap else "")
    )


def _first_problems(scan: SplitScan) -> list[str]:
    return [f"    {r}" for r in scan.first_rejected[:SHOWN]]


def refusal_problems(train: SplitScan, eval_: SplitScan, batch_size: int, on_overlap: str) -> list[str]:
    """Why this data cannot train (empty list: it can), each with counts and the fix."""
    problems = []
    if train.overlap and on_overlap == "fail":
        problems.append(
            f"{train.overlap} train question(s) in {train.path} also appear in eval {eval_.path} "
            "(compared ignoring case and whitespace), first:\n"
            + "\n".join(f"    {r.file}:{r.line}" for r in train.first_overlap[:SHOWN])
            + "\n  fix: remove them from the train data, or rerun with --on-overlap remove (the default)"
        )
    if eval_.kept == 0:
        problems.append(
            f"eval data has no usable rows: {_describe(eval_)}\n"
            + "\n".join(_first_problems(eval_))
            + "\n  fix: provide held-out rows {\"question\": ..., \"answer\": \"... #### <number>\"}"
        )
    if train.kept < batch_size:
        fix = f"or lower --batch-size to at most {train.kept}" if train.kept else "and check it is GSM8K JSONL"
        problems.append(
            f"train data has {train.kept} usable rows, fewer than --batch-size {batch_size}: {_describe(train)}\n"
            + "\n".join(_first_problems(train))
            + f"\n  fix: correct or drop the rejected rows, add rows, {fix}"
        )
    return problems


def build_report(status: str, message: str, batch_size: int, on_overlap: str, scans: dict[str, SplitScan]) -> dict:
    ordered = [name for name in ("train", "eval") if name in scans]
    train = scans.get("train")
    overlap = train.overlap if train else 0
    return {
        "status": status,
        "message": message,
        "batch_size": batch_size,
        "on_overlap": on_overlap,
        "kept": {name: scans[name].kept for name in ordered},
        "overlap": {
            "count": overlap,
            "action": "refused" if on_overlap == "fail" and overlap else "removed",
            "first_rows": [{"file": r.file, "line": r.line} for r in train.first_overlap] if train else [],
        },
        "splits": {name: scans[name].to_json() for name in ordered},
        "outputs": {name: f"{name}.jsonl" for name in ordered} if status == "accepted" else {},
    }


def summary(report: dict) -> str:
    parts = []
    for name, s in report["splits"].items():
        reasons = ", ".join(f"{r} {n}" for r, n in s["rejected_by_reason"].items())
        parts.append(f"{name} {s['kept']}/{s['rows']} rows kept" + (f" (rejected: {reasons})" if reasons else ""))
    if report["overlap"]["count"]:
        parts.append(f"{report['overlap']['count']} train rows also in eval removed")
    return "validation accepted: " + "; ".join(parts)


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _check_paths(train: str, eval_: str) -> None:
    """Name every unusable input path at once, not one per run."""
    problems = []
    for flag, path in (("--train", train), ("--eval", eval_)):
        try:
            jsonl_files(path)
        except DataError as exc:
            problems.append(f"{flag} {exc}")
    if problems:
        raise DataError("\n- ".join(problems))


def validate(train: str, eval_: str, batch_size: int, out_dir: Path, on_overlap: str = "remove") -> dict:
    """Validate, write the outputs, and return the report (status accepted/refused)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    # A result left by an earlier run must not pass for this run's.
    for name in OUTPUTS:
        (out_dir / name).unlink(missing_ok=True)
    tmp = {name: out_dir / f".{name}.jsonl.tmp" for name in ("eval", "train")}
    scans: dict[str, SplitScan] = {}
    try:
        try:
            _check_paths(train, eval_)
            with open(tmp["eval"], "w", encoding="utf-8") as out:
                scans["eval"] = scan_split("eval", eval_, out)
            with open(tmp["train"], "w", encoding="utf-8") as out:
                scans["train"] = scan_split("train", train, out, eval_digests=scans["eval"].digests)
            problems = refusal_problems(scans["train"], scans["eval"], batch_size, on_overlap)
        except DataError as exc:
            problems = [str(exc)]
        if problems:
            report = build_report("refused", "validation refused the data:\n- " + "\n- ".join(problems), batch_size, on_overlap, scans)
        else:
            report = build_report("accepted", "", batch_size, on_overlap, scans)
            report["message"] = summary(report)
            for name, path in tmp.items():
                os.replace(path, out_dir / f"{name}.jsonl")
    finally:  # refused or crashed: no half-written cleaned file may remain
        for path in tmp.values():
            path.unlink(missing_ok=True)
    _write_json(out_dir / "validation.json", report)
    return report


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m steps.validate", description=__doc__.split("\n\n")[0])
    p.add_argument("--train", required=True, help="a .jsonl file or a directory of them")
    p.add_argument("--eval", required=True, help="a .jsonl file or a directory of them")
    p.add_argument("--batch-size", required=True, type=_positive_int, help="prompts per step: the minimum train rows")
    p.add_argument("--output", required=True, help="directory for validation.json and the cleaned files")
    p.add_argument(
        "--on-overlap",
        choices=("remove", "fail"),
        default="remove",
        help="a train question also in eval: drop it from train (default) or refuse the data",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    require_training_session_sdk()
    try:
        args = parse_args(argv)
    except SystemExit as exc:  # argparse has printed the usage error (or --help)
        return int(exc.code or 0)
    out_dir = Path(args.output)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"error: --output {out_dir}: cannot create directory ({exc.strerror})", file=sys.stderr)
        return 2
    try:
        report = validate(args.train, args.eval, args.batch_size, out_dir, args.on_overlap)
    except Exception as exc:  # noqa: BLE001 - a bug or the machine, not the data: short message, exit 1
        print(f"error: validation crashed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    if report["status"] != "accepted":
        print(report["message"], file=sys.stderr)
        return 2
    print(report["message"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
