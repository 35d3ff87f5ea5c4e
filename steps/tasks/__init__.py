"""The task a run trains on, chosen by the config's ``task`` section (and the ``Task`` pipeline parameter).

- ``formats``: the built-in answer formats (``gsm8k``, ``hash``, ``boxed``, ``answer_is``, ``choice``): the
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
from steps.gsm8k.data import DataError, RowError, iter_lines
from steps.tasks.formats import FORMATS
from steps.tasks.rows import Example, Fields
from steps.tasks.task import RowTask, TaskError, build_task

BUILTIN_TASKS = tuple(FORMATS)

__all__ = ["BUILTIN_TASKS", "Example", "Fields", "RowTask", "TaskError", "build_task", "default_task",
           "load_examples"]


def default_task() -> RowTask:
    """GSM8K, the task of a config that names none."""
    return build_task(TaskConfig())


def load_examples(path: str | Path, task: RowTask) -> list:
    """Examples from CLEANED files (ValidateData's output); a bad row is an error naming file:line."""
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
