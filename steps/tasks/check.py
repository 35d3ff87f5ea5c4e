"""``python -m steps.tasks --check`` (``make check-task``): a task against a data file, offline, in seconds.

Shows the first three usable rows as the prompt the model gets (the chat messages, before the model's chat
template) and the grader's verdict on each row's own gold answer, then the grader's agreement over the whole
file: what ValidateData will check before anything is billed. Exit 0 when the grader reads the gold answers,
2 when it cannot (the rows and the reason are named).
"""
from __future__ import annotations

import argparse
import textwrap
from pathlib import Path
from typing import Any, Sequence

from steps import terminal
from steps.cli import Refused, option, run_step
from steps.config import config_from_dict, load_yaml
from steps.config.load import task_name_problem
from steps.gsm8k.data import RawLine, RowError, iter_lines, jsonl_files
from steps.gsm8k.rules import GRADER_DISAGREES, MIN_AGREEMENT, SHOWN, SplitScan, agreement_problem, read_example
from steps.platform.versions import require_training_session_sdk
from steps.tasks.task import RowTask, build_task

SHOWN_PROMPTS = 3


def data_file(path: str) -> Path:
    """The file to check: ``path`` itself, or in a folder the train file (a .jsonl named with 'train'), else
    its first .jsonl."""
    files = jsonl_files(path)
    return next((f for f in files if "train" in f.name.lower()), files[0])


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


def check(path: str, task: RowTask, out: Any = print) -> int:
    """Print the check of ``task`` on ``path``; 0 when the grader reads the gold answers, else raise Refused."""
    file = data_file(path)
    scan = SplitScan(name=file.name, path=str(file), inputs=[])
    shown = 0
    # Quoted as written, not repr(): a repr doubles the backslash of '\boxed{}', which the prompt does not have.
    out(f"task {task.name}: " + ", ".join(f"{k} '{v}'" for k, v in task.describe().items() if k != "name" and v))
    for line in iter_lines(file):
        scan.rows += 1
        if line.error:
            scan.reject(line, line.error, line.detail)
            continue
        try:
            example = read_example(task, scan, line)
        except RowError as exc:
            scan.reject(line, exc.reason, exc.detail)
            continue
        if shown < SHOWN_PROMPTS:
            if not shown:
                fields = scan.fields[line.file]
                out(f"fields of {file.name}: question {fields.question!r}, answer {fields.answer!r}"
                    + (f", choices {fields.choices!r}" if fields.choices else "") + f" ({fields.source})")
            out("\n".join(show_example(task, example, line)))
            shown += 1
    out(f"grader agreement on {file}: {scan.agreed} of {scan.checked} gold answers read and graded right "
        f"({scan.rows} rows; rejected: {scan.reasons_text()})")
    problem = agreement_problem(scan, task.name)
    if problem or not scan.agreed:
        raise Refused(problem or f"{file}: no row the {task.name} task can read ({scan.reasons_text()})")
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
    p.add_argument("--data", required=True, help="a .jsonl file, or a folder (its train file is checked)")
    args = p.parse_args(argv)

    def run() -> int:
        section = dict(load_yaml(args.config).get("task") or {})
        if args.task:
            problem = task_name_problem(args.task, option("--task", args.task))  # named as typed: TASK= from make
            if problem:
                raise Refused(problem)
            section["name"] = args.task
        task = build_task(config_from_dict({"task": section}, source=args.config).task)
        return check(args.data, task, out=terminal.say)

    require_training_session_sdk()  # exits 2 naming the fix, before the step does anything
    return run_step(run, terminal=True)
