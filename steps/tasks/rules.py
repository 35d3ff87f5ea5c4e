"""Which rows a dataset may train on: row rules, duplicates, train/eval overlap, prompts the model
cannot take, and when to refuse.

Rows are read line by line. Per row only an 8-byte digest of the normalised
question is kept (for duplicates and train/eval overlap), so memory grows by
about 8 bytes per row, not with the size of the rows.
"""
from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence, TextIO

import numpy as np

from steps.cli import parameter
from steps.gsm8k.prompt import render_prompt
from steps.tasks.reader import PROMPT_TOO_LONG, DataError, RawLine, RowError, data_files, iter_lines

DUPLICATE_QUESTION = "duplicate question"
GRADER_DISAGREES = "the grader does not agree with the gold answer"
# A split where the task's grader reads fewer than this share of the gold answers is refused: the task or
# its fields do not fit the data (a few unreadable rows are dropped, as any bad row is).
MIN_AGREEMENT = 0.5
FIRST_N = 20  # rejected / overlapping rows listed in validation.json
SHOWN = 5  # rejected rows quoted in a refusal message
# Reused: json.dumps builds one per call. ``default=str``: a parquet row may hold a date or a decimal, which the
# cleaned JSONL keeps as text.
_ENCODER = json.JSONEncoder(ensure_ascii=False, default=str)


def normalize_question(question: str) -> str:
    """Key for duplicate and train/eval overlap detection: case and spacing ignored."""
    return " ".join(question.lower().split())


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
class PromptBudget:
    """A question fits the model when its prompt tokens plus ``max_tokens`` fit the model's context.

    The prompt is rendered exactly as the training step renders it (the base model's chat
    template with ``chat_template_kwargs``), so the count is the one the service will see.
    """

    tokenizer: Any
    chat_template_kwargs: Mapping[str, Any]
    max_tokens: int
    context_tokens: int
    source: str  # where context_tokens comes from, quoted in every rejection

    def check(self, question: str, task: Any = None, example: Any = None) -> None:
        """``task``: the prompt is the task's for ``example`` (default: GSM8K's for ``question``)."""
        n = len(task.prompt(example, self.tokenizer, self.chat_template_kwargs) if task is not None
                else render_prompt(self.tokenizer, question, self.chat_template_kwargs))
        if n + self.max_tokens > self.context_tokens:
            raise RowError(PROMPT_TOO_LONG, f"{n} prompt tokens + max_tokens {self.max_tokens} = "
                                            f"{n + self.max_tokens} > {self.context_tokens}, the context of "
                                            f"{self.source}")


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
    fields: dict[str, Any] = field(default_factory=dict)  # per file: the task's Fields (steps/tasks/rows.py)
    checked: int = 0  # rows whose gold answer the task's grader was given
    agreed: int = 0  # ... and graded its reference answer right
    first_disagreements: list[Rejection] = field(default_factory=list)
    hint: list[str] = field(default_factory=list)  # built-in tasks that read a gold answer this task could not
    first_by_reason: dict[str, Rejection] = field(default_factory=dict)  # each reason's first row (the drop report)
    field_problems: dict[str, str] = field(default_factory=dict)  # per file: a field its first row lacks, and help

    @property
    def rejected(self) -> int:
        return sum(self.by_reason.values())

    @property
    def dropped(self) -> int:
        """Rows read and not kept: rejected, or (train) asking a held-out question."""
        return self.rejected + self.overlap

    def reject(self, line: RawLine, reason: str, detail: str = "") -> None:
        self.by_reason[reason] += 1
        self.first_by_reason.setdefault(reason, Rejection(line.file, line.line_no, reason, detail))
        if len(self.first_rejected) < FIRST_N:
            self.first_rejected.append(Rejection(line.file, line.line_no, reason, detail))

    def disagree(self, line: RawLine, reason: str, detail: str) -> None:
        if len(self.first_disagreements) < FIRST_N:
            self.first_disagreements.append(Rejection(line.file, line.line_no, reason, detail))

    def agreement_json(self) -> dict[str, Any]:
        return {"checked": self.checked, "agreed": self.agreed,
                "first_disagreements": [vars(r) for r in self.first_disagreements]}

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
            "fields": {file: f.to_json() for file, f in self.fields.items()},
            "grader_agreement": self.agreement_json(),
        }


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def read_example(task: Any, scan: SplitScan, line: RawLine) -> Any:
    """The row's example, its gold answer checked by the task's grader (steps/tasks/task.py): a row whose gold
    cannot be read, or whose own reference answer the grader does not give full marks, is a disagreement."""
    fields = scan.fields.get(line.file)
    if fields is None:  # found from each file's first row
        fields, problem = task.fields_of(line.row, Path(line.file).name)
        scan.fields[line.file] = fields
        if problem:
            scan.field_problems[line.file] = problem
    try:
        example = task.read(line.row, fields)
    except RowError as exc:
        answer = line.row.get(fields.answer)
        if exc.reason in task.no_gold_reasons:
            scan.checked += 1
            scan.disagree(line, exc.reason, exc.detail)
        if not scan.hint and isinstance(answer, (str, int, float)) and not isinstance(answer, bool):
            # A bare number is no string to the text tasks, yet the number task reads it: say so.
            scan.hint = task.readers_of(str(answer), line.row.get(fields.choices or "choices"))
        raise
    scan.checked += 1
    agreed, why = task.check_gold(example)
    if not agreed:
        scan.disagree(line, GRADER_DISAGREES, why)
        raise RowError(GRADER_DISAGREES, why)
    scan.agreed += 1
    return example


def scan_split(name: str, path: str | Sequence[Path], out: TextIO, eval_digests: DigestSet | None = None,
               budget: PromptBudget | None = None, *, task: Any, overlap_reason: str = "also in eval") -> SplitScan:
    """Stream one split, write its clean rows to ``out``, and count the rest.

    ``eval_digests`` (train only) are the eval questions: a train row asking one
    of them is an overlap, left out of ``out`` and counted separately. With a
    ``budget``, a question the model cannot take with ``max_tokens`` to answer is rejected.
    ``task`` (a steps/tasks RowTask, which the caller builds: steps/tasks lies above this module) reads the rows
    and grades each one's gold answer.
    ``overlap_reason`` names an overlap in ``first_overlap`` (a re-evaluation's held-out split: "trained on").
    """
    try:
        inputs = [{"file": str(f), "sha256": sha256_file(f), "bytes": f.stat().st_size} for f in data_files(path)]
    except OSError as exc:
        raise DataError(f"{exc.filename}: cannot read ({exc.strerror}); check the file and its permissions") from None
    where = str(path) if isinstance(path, (str, Path)) else str(Path(path[0]).parent)  # a split's files: one folder
    scan = SplitScan(name=name, path=where, inputs=inputs)
    for line in iter_lines(path):
        scan.rows += 1
        try:
            if line.error:
                raise RowError(line.error, line.detail)
            example = read_example(task, scan, line)
            digest = question_digest(example.question)
            if digest in scan.digests:
                raise RowError(DUPLICATE_QUESTION, "an earlier row asks it, ignoring case and spacing")
            if budget is not None:
                budget.check(example.question, task, example)
        except RowError as exc:
            scan.reject(line, exc.reason, exc.detail)
            continue
        scan.digests.add(digest)
        if eval_digests is not None and digest in eval_digests:
            scan.overlap += 1
            if len(scan.first_overlap) < FIRST_N:
                scan.first_overlap.append(Rejection(line.file, line.line_no, overlap_reason))
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
    return [f"    {r}" for r in scan.first_rejected[:SHOWN]] + [f"    {p}" for p in scan.field_problems.values()]


def hint_text(scan: SplitScan) -> str:
    """'; these answers read as the built-in task X (TASK=X, ...)' when another built-in task reads the gold answers
    this one could not (a bare number: the number task), else ''."""
    if not scan.hint:
        return ""
    name = scan.hint[0]
    return (f"; these answers read as the built-in task {' or '.join(scan.hint)} (TASK={name}, --task {name}, "
            f"task.name: {name})")


def agreement_problem(scan: SplitScan, task_name: str) -> str | None:
    """The task's grader cannot read most of a split's gold answers: the task or its fields do not fit the data."""
    if not scan.checked or scan.agreed >= MIN_AGREEMENT * scan.checked:
        return None
    fields = "; ".join(f"{Path(f).name}: question {v.question!r}, answer {v.answer!r}"
                       + (f", choices {v.choices!r}" if v.choices else "") + f" ({v.source})"
                       for f, v in scan.fields.items())
    hint = (hint_text(scan)[2:] if scan.hint else
            "choose the task whose answer format the data has (task.name, the Task parameter, TASK=)")
    return (f"the {task_name} task's grader cannot read the gold answers of {scan.name}: it agreed with "
            f"{scan.agreed} of {scan.checked} rows in {scan.path} (fields of {fields}), first:\n"
            + "\n".join(f"    {r}" for r in scan.first_disagreements[:SHOWN])
            + f"\n  fix: {hint}, or name the answer field (task.answer_field)")


def refusal_problems(train: SplitScan, eval_: SplitScan, batch_size: int, on_overlap: str,
                     task_name: str = "gsm8k") -> list[str]:
    """Why this data cannot train (empty list: it can), each with counts and the fix."""
    problems = [p for p in (agreement_problem(eval_, task_name), agreement_problem(train, task_name)) if p]
    if train.overlap and on_overlap == "fail":
        problems.append(
            f"{train.overlap} train question(s) in {train.path} also appear in eval {eval_.path} "
            "(compared ignoring case and whitespace), first:\n"
            + "\n".join(f"    {r.file}:{r.line}" for r in train.first_overlap[:SHOWN])
            + "\n  fix: remove them from the train data, or rerun with --on-overlap remove (the default)"
        )
    if eval_.kept == 0:
        problems.append(
            f"eval data has no usable rows: {_describe(eval_)}{hint_text(eval_)}\n"
            + "\n".join(_first_problems(eval_))
            + ("\n  fix: provide held-out rows {\"question\": ..., \"answer\": \"... #### <number>\"}"
               if task_name == "gsm8k" else f"\n  fix: provide held-out rows the {task_name} task can read "
                                            f"(make check-task DATA=<dir> TASK={task_name} shows how it reads them)")
        )
    if train.kept < batch_size:
        kind = "GSM8K JSONL" if task_name == "gsm8k" else f"JSONL the {task_name} task reads"
        # Named as the user set it: PARAMS="BatchSize=N" from make, --batch-size N for the step by hand (steps/cli.py).
        fix = (f"or lower the batch size to at most {train.kept} ({parameter('BatchSize', train.kept, '--batch-size')})"
               if train.kept else f"and check it is {kind}")
        problems.append(
            f"train data has {train.kept} usable rows, fewer than the batch size "
            f"({parameter('BatchSize', batch_size, '--batch-size')}): {_describe(train)}{hint_text(train)}\n"
            + "\n".join(_first_problems(train))
            + f"\n  fix: correct or drop the rejected rows, add rows, {fix}"
        )
    return problems
