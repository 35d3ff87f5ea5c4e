"""``python -m steps.tasks --check`` (``make check-task``): a task against a data file, offline, in seconds.

Names the fields the task finds (a missing one is refused with the file's own fields and "did you mean"), shows
the first three usable rows as the prompt the model gets (the chat messages, before the model's chat template)
and the grader's verdict on each row's own gold answer, then the grader's agreement over the train split and each
split's drops by reason, as ValidateData prints them (steps/tasks/drops.py): what ValidateData will check before
anything is billed. Exit 0 when the grader reads the gold answers, 2 when it cannot (the rows, the reason and the
built-in task that does read them are named) or a split loses more than task.max_dropped_share of its rows.
"""
from __future__ import annotations

import argparse
import os
import textwrap
from pathlib import Path
from typing import Any, Sequence

from steps import terminal
from steps.cli import Refused, option, run_step
from steps.config import config_from_dict, load_yaml
from steps.config.load import task_name_problem
from steps.platform.versions import require_training_session_sdk
from steps.tasks.drops import drop_lines, too_many_dropped
from steps.tasks.reader import DataError, RawLine, RowError, data_files, first_row, iter_lines
from steps.tasks.rules import (
    GRADER_DISAGREES,
    MIN_AGREEMENT,
    SHOWN,
    SplitScan,
    agreement_problem,
    hint_text,
    read_example,
    scan_split,
)
from steps.tasks.splits import find_splits
from steps.tasks.task import RowTask, build_task

SHOWN_PROMPTS = 3


def data_file(path: str) -> Path:
    """A file on its own: ``path`` itself, or in a folder the train file (named with 'train'), else its first."""
    files = data_files(path)
    return next((f for f in files if "train" in f.name.lower()), files[0])


def split_paths(path: str) -> tuple[list[Path], list[Path]]:
    """(train files, held-out files): a folder's splits as the local run finds them (steps/tasks/splits.py), else
    the one file (no held-out split: no overlap to count)."""
    if Path(path).is_dir():
        try:
            splits = find_splits(path, "DATA=")
            return list(splits.train), list(splits.held_out)
        except DataError:
            pass
    return [data_file(path)], []


def _indent(text: str) -> str:
    return textwrap.indent(text, "    ")


def show_example(task: RowTask, example: Any, line: RawLine) -> list[str]:
    messages = task.messages(example)
    prompt = ("\n".join(f"[{m['role']}] {m['content']}" for m in messages) if messages
              else "(rendered by your grader's prompt())")
    reference = task.reference(example)
    verdict = task.grade(reference, example)
    mark = "right" if verdict.correct else "right, not in the instructed form" if verdict.correct_lenient else "WRONG"
    return [f"{Path(line.file).name}:{line.line_no}", "  prompt:", _indent(prompt),
            f"  gold answer: {example.gold!r}",
            f"  graded: its reference answer ...{reference[-60:]!r} reads {verdict.extracted!r}: {mark}"]


def check_fields(task: RowTask, files: list[Path]) -> str:
    """The fields of the first file, as the task finds them; refused, naming the file's own fields and the closest,
    when a file lacks one (before any row is read)."""
    described = ""
    for f in files:
        fields, problem = task.fields_of(first_row(f), f.name)
        if problem:
            raise Refused(f"{problem} (TASK={task.name})")
        choices = f", choices {fields.choices!r}" if fields.choices else ""
        described = described or (f"fields of {f.name}: question {fields.question!r}, answer {fields.answer!r}"
                                  f"{choices} ({fields.source})")
    return described


def show_examples(task: RowTask, files: list[Path], out: Any) -> None:
    scan = SplitScan(name="shown", path="", inputs=[])
    shown = 0
    for line in iter_lines(files):
        if shown == SHOWN_PROMPTS:
            return
        if line.error:
            continue
        try:
            example = read_example(task, scan, line)
        except RowError:
            continue
        out("\n".join(show_example(task, example, line)))
        shown += 1


def check(path: str, task: RowTask, out: Any = print, max_dropped_share: float = 0.5) -> int:
    """Print the check of ``task`` on ``path``; 0 when the grader reads the gold answers, else raise Refused. The
    drops are counted as ValidateData counts them (the held-out split first, then train with its overlap)."""
    train_files, held_out_files = split_paths(path)
    # Quoted as written, not repr(): a repr doubles the backslash of '\boxed{}', which the prompt does not have.
    out(f"task {task.name}: " + ", ".join(f"{k} '{v}'" for k, v in task.describe().items() if k != "name" and v))
    out(check_fields(task, train_files + held_out_files))
    show_examples(task, train_files, out)
    with open(os.devnull, "w") as nowhere:  # counted, and named, as ValidateData does; nothing is written
        held_out = scan_split("eval", held_out_files, nowhere, task=task) if held_out_files else None
        scan = scan_split("train", train_files, nowhere, held_out.digests if held_out else None, task=task)
    where = train_files[0] if len(train_files) == 1 else f"{train_files[0].parent} ({len(train_files)} files)"
    out(f"grader agreement on {where}: {scan.agreed} of {scan.checked} gold answers read and graded right "
        f"({scan.rows} rows; rejected: {scan.reasons_text()})")
    for s in (scan, held_out):
        for line in drop_lines(s) if s is not None else []:
            out(f"data: {line}")
    problem = agreement_problem(scan, task.name)
    if problem or not scan.agreed:
        raise Refused(problem or f"{where}: no row the {task.name} task can read ({scan.reasons_text()})"
                      + hint_text(scan))
    too_many = [p for p in (too_many_dropped(s, max_dropped_share) for s in (scan, held_out) if s) if p]
    if too_many:
        raise Refused("\n".join(too_many))
    for r in scan.first_disagreements[:SHOWN]:
        out(f"  {r}")
    if scan.by_reason.get(GRADER_DISAGREES):
        out(f"note: {scan.by_reason[GRADER_DISAGREES]} rows disagree; ValidateData drops them (it refuses a split "
            f"below {MIN_AGREEMENT:.0%} agreement)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m steps.tasks", description=__doc__.split("\n")[0])
    p.add_argument("--check", action="store_true", required=True, help="check the task against the data")
    p.add_argument("--config", default="config/default.yaml", help="the config whose task section is checked")
    p.add_argument("--task", help="the task instead of the config's task.name (the Task parameter)")
    p.add_argument("--data", required=True,
                   help="a data file (.jsonl, .json, .csv, .parquet), or a folder (its train and held-out files)")
    args = p.parse_args(argv)

    def run() -> int:
        section = dict(load_yaml(args.config).get("task") or {})
        if args.task:
            problem = task_name_problem(args.task, option("--task", args.task))  # named as typed: TASK= from make
            if problem:
                raise Refused(problem)
            section["name"] = args.task
        cfg = config_from_dict({"task": section}, source=args.config).task
        return check(args.data, build_task(cfg), out=terminal.say, max_dropped_share=cfg.max_dropped_share)

    require_training_session_sdk()  # exits 2 naming the fix, before the step does anything
    return run_step(run, terminal=True)
