"""The task a run trains on, chosen by the config's ``task`` section (and the ``Task`` pipeline parameter).

- ``reader``: the rows of JSONL, JSON, CSV and parquet files, each with its file and line; ``splits``: which files
  of a folder are the train and the held-out split (``train``; ``test``, ``validation``, ``eval``, ``val``, ``dev``);
- ``rules``: which rows a dataset may train on (duplicates, train/held-out overlap, refusals); ``drops``: the rows
  dropped, by reason, as check-task and ValidateData print them;
- ``formats``: the built-in answer formats (``gsm8k``, ``hash``, ``boxed``, ``answer_is``, ``choice``, ``number``): the
  instruction, the gold answer's reading, the strict and lenient readings of a completion;
- ``answers``: the readers and the comparison (numbers as exact decimals, text without spacing or case);
- ``rows``: the examples, and which fields of a row hold the question, the answer and the choices;
- ``task``: the task objects the steps use (the RL core's Task protocol plus the row rules), and the
  user's own grader as an entry point ``package.module:attr`` (``task.grader``);
- ``check``: ``python -m steps.tasks --check`` (``make check-task``): prompts and the grader's verdicts.
"""
from __future__ import annotations

from pathlib import Path

from steps.config.models import TaskConfig
from steps.tasks.formats import FORMATS
from steps.tasks.reader import DataError, RowError, iter_lines
from steps.tasks.rows import Example, Fields
from steps.tasks.task import RowTask, TaskError, build_task

BUILTIN_TASKS = tuple(FORMATS)

__all__ = ["BUILTIN_TASKS", "Example", "Fields", "RowTask", "TaskError", "build_task", "default_task",
           "load_examples"]


def default_task() -> RowTask:
    """GSM8K, the task of a config that names none."""
    return build_task(TaskConfig())


def load_examples(path: str | Path, task: RowTask | None = None) -> list:
    """Examples from CLEANED files (ValidateData's output); a bad row is an error naming file:line. ``task``:
    default GSM8K."""
    task = task or default_task()
    examples, fields = [], {}
    for line in iter_lines(path):
        try:
            if line.error:
                raise RowError(line.error, line.detail)
            if line.file not in fields:
                fields[line.file] = task.fields_for(line.row)
            examples.append(task.read(line.row, fields[line.file]))
        except RowError as exc:
            raise DataError(f"{line.file}:{line.line_no}: {exc}; run steps.validate on this data with this task "
                            f"({task.name}) first") from None
    return examples
