"""The task a run trains on, chosen by the ``task`` section: a built-in answer format, or the user's grader.

Both are tasks of the RL core (steps/dapo/task.py: ``prompt`` and ``grade``) with what the steps add around
it: which fields of a row to read and what makes a row usable (``read``), and the completion validation
grades to check the grader against each row's own gold answer (``reference``).
"""
from __future__ import annotations

import importlib
import os
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any, Mapping

from steps.cli import Refused
from steps.config.models import TaskConfig
from steps.dapo.chat import answer_region, render_messages
from steps.dapo.task import Grade
from steps.gsm8k import answer as gsm8k_answer
from steps.gsm8k.prompt import build_messages as gsm8k_messages
from steps.tasks import answers
from steps.tasks.formats import FORMATS, Format, Gsm8kFormat
from steps.tasks.reader import RowError
from steps.tasks.rows import COMMON_PAIRS, Example, Fields, field_problem, fields_for

EMPTY_ANSWER = "empty answer"
GRADER_REFUSED_ROW = "the grader's read_row refused it"
#: Where the step image keeps a user's task code (containers/Dockerfile; `make build-image TASK_CODE=<dir>`).
IMAGE_TASK_CODE = "/opt/program/task_code"


class TaskError(Refused, ValueError):
    """A task that cannot be built (an entry point that does not import); the message says what to do."""


def _text(row: Mapping[str, Any], name: str) -> str:
    if name not in row:
        raise RowError(f"missing {name}")
    if not isinstance(row[name], str):
        raise RowError(f"{name} not a string", f"got {type(row[name]).__name__}")
    return row[name]


def _number_as_text(value: Any) -> Any:
    """A bare number (a parquet or JSON integer, float or decimal) as its text; anything else as it is."""
    if isinstance(value, bool) or not isinstance(value, (int, float, Decimal)):
        return value
    return format(Decimal(repr(value)) if isinstance(value, float) else Decimal(value), "f")


def _question(row: Mapping[str, Any], fields: Fields, takes_numbers: bool = False) -> tuple[str, str]:
    if takes_numbers and fields.answer in row:
        row = {**row, fields.answer: _number_as_text(row[fields.answer])}
    question, answer = _text(row, fields.question), _text(row, fields.answer)
    if not question.strip():
        raise RowError(f"empty {fields.question}")
    return question, answer


def _choices(row: Mapping[str, Any], name: str) -> tuple[str, ...]:
    if name not in row:
        raise RowError(f"missing {name}")
    value = row[name]
    if not isinstance(value, list) or not all(isinstance(c, str) for c in value):
        raise RowError(f"{name} not a list of strings", f"got {type(value).__name__}")
    if not 2 <= len(value) <= 26:
        raise RowError(f"{name} not 2 to 26 options", f"got {len(value)}")
    return tuple(value)


def _tail(text: str) -> str:
    return repr(text.rstrip().rsplit("\n", 1)[-1][-40:])


class RowTask:
    """What every task offers the steps; subclasses give the prompt, the grader and the row rules."""

    name: str = ""
    #: Whether the local toy model can learn the format (it learns the built-in ones).
    toy_learns: bool = True
    #: The reasons of a row rejected because its gold answer cannot be read (counted as graded, not agreed).
    no_gold_reasons: frozenset[str] = frozenset()
    #: Whether the task reads the rows' question and answer fields (a grader's own read_row may not).
    reads_fields: bool = True

    def __init__(self, cfg: TaskConfig) -> None:
        self.cfg = cfg

    def fields_for(self, first_row: Mapping[str, Any] | None) -> Fields:
        raise NotImplementedError

    def fields_of(self, first_row: Mapping[str, Any] | None, file_name: str) -> tuple[Fields, str | None]:
        """The fields of a file whose first row is ``first_row``, and what is wrong with them (a field the task
        reads and the file lacks, with the file's own fields and a "did you mean"), or None."""
        fields = self.fields_for(first_row)
        return fields, field_problem(first_row, fields, file_name) if self.reads_fields else None

    def read(self, row: Mapping[str, Any], fields: Fields) -> Example:
        """The example of a parsed row; raises RowError saying what is wrong."""
        raise NotImplementedError

    def reference(self, example: Any) -> str:
        raise NotImplementedError

    def messages(self, example: Any) -> list[dict] | None:
        """The chat messages of the prompt (what `make check-task` shows), or None when the task renders its own."""
        return None

    def prompt(self, example: Any, tokenizer: Any, chat_template_kwargs: Mapping[str, Any]) -> list[int]:
        return render_messages(tokenizer, self.messages(example) or [], chat_template_kwargs)

    def grade(self, text: str, example: Any) -> Grade:
        raise NotImplementedError

    def check_gold(self, example: Any) -> tuple[bool, str]:
        """Whether the grader gives the row's own reference answer full marks (strict), and if not, why."""
        reference = self.reference(example)
        try:
            verdict = self.grade(reference, example)
        except Exception as exc:  # noqa: BLE001 - a user's grader that raises cannot read this gold answer
            return False, f"the grader raised {type(exc).__name__}: {exc}"
        if verdict.correct:
            return True, ""
        how = "not in the instructed form" if not verdict.formatted else "a different answer"
        return False, f"the grader read {verdict.extracted!r} ({how}) from {_tail(reference)}, gold {example.gold!r}"

    def describe(self) -> dict[str, Any]:
        return {"name": self.name}

    def readers_of(self, answer_text: str, choices: Any = ()) -> list[str]:
        """The built-in tasks that can read a gold answer in this text (a refusal's hint)."""
        return [name for name, fmt in FORMATS.items() if name != "gsm8k" and fmt.gold(answer_text, choices or ())]


class BuiltinTask(RowTask):
    """A built-in answer format (steps/tasks/formats.py)."""

    def __init__(self, cfg: TaskConfig) -> None:
        super().__init__(cfg)
        self.format: Format = FORMATS[cfg.name]
        self.name = cfg.name

    def fields_for(self, first_row: Mapping[str, Any] | None) -> Fields:
        return fields_for(first_row, self.cfg, self.format.field_pairs, self.format.needs_choices)

    def read(self, row: Mapping[str, Any], fields: Fields) -> Example:
        question, answer = _question(row, fields, self.format.takes_numbers)
        choices = _choices(row, fields.choices) if fields.choices else ()
        gold = self.format.gold(answer, choices)
        if gold is None:
            raise RowError(self.format.no_gold, f"{fields.answer} ends {_tail(answer)}")
        return Example(question, gold, choices, row, answer)

    def reference(self, example: Example) -> str:
        return self.format.reference(example.answer, example.gold)

    @property
    def no_gold_reasons(self) -> frozenset[str]:
        return frozenset({self.format.no_gold})

    def messages(self, example: Example) -> list[dict]:
        if isinstance(self.format, Gsm8kFormat) or self.name == "number":
            return gsm8k_messages(example.question)  # GSM8K's prompt, unchanged
        options = "".join(f"\n{letter}) {text}" for letter, text in zip(answers.letters(len(example.choices)),
                                                                         example.choices))
        return [{"role": "user", "content": f"{example.question}{options}\n{self.format.instruction}"}]

    def grade(self, text: str, example: Example) -> Grade:
        if self.name == "gsm8k":
            return gsm8k_answer.grade(text, example.gold)  # GSM8K's grader, unchanged
        region = answer_region(text)
        if region is None:  # cut off inside its reasoning: no answer
            return Grade(correct=False, formatted=False, extracted=None)
        reading = self.format.read(region, example.choices)
        value = reading.committed if reading.committed is not None else reading.found
        numeric = gsm8k_answer.canonical(example.gold) is not None and not self.format.takes_numbers
        # A number task's reading is already canonical (a fraction stays one: "1/3", not its first number).
        extracted = (answers.as_number(value) or value) if numeric and value is not None else value
        right = self.format.same(value, example.gold)
        formatted = reading.committed is not None
        return Grade(correct=right and formatted, formatted=formatted, extracted=extracted,
                     correct_unformatted=right and not formatted)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "instruction": self.format.instruction}


class CustomTask(RowTask):
    """The user's grader (``task.grader``, an entry point): its ``grade`` and, if it has them, its ``prompt``
    (else the question and its ``instruction``), ``read_row`` (else question and answer fields, the whole
    answer as the gold) and ``reference`` (else the gold answer) are used."""

    toy_learns = False

    def __init__(self, cfg: TaskConfig, obj: Any) -> None:
        super().__init__(cfg)
        self.obj = obj
        self.name = "custom"
        self.reads_fields = getattr(obj, "read_row", None) is None

    def fields_for(self, first_row: Mapping[str, Any] | None) -> Fields:
        return fields_for(first_row, self.cfg, COMMON_PAIRS, False)

    def read(self, row: Mapping[str, Any], fields: Fields) -> Any:
        read_row = getattr(self.obj, "read_row", None)
        if read_row is not None:
            try:
                return read_row(dict(row))
            except (ValueError, KeyError, TypeError) as exc:
                raise RowError(GRADER_REFUSED_ROW, f"{type(exc).__name__}: {exc}") from None
        question, answer = _question(row, fields)
        if not answer.strip():
            raise RowError(EMPTY_ANSWER)
        choices = row.get(self.cfg.choices_field or "choices")
        choices = tuple(choices) if isinstance(choices, list) and all(isinstance(c, str) for c in choices) else ()
        return Example(question, answer.strip(), choices, row, answer)

    def reference(self, example: Any) -> str:
        reference = getattr(self.obj, "reference", None)
        return reference(example) if reference is not None else str(example.gold)

    def messages(self, example: Any) -> list[dict] | None:
        if hasattr(self.obj, "prompt"):
            return None
        instruction = getattr(self.obj, "instruction", "")
        return [{"role": "user", "content": example.question + (f"\n{instruction}" if instruction else "")}]

    def prompt(self, example: Any, tokenizer: Any, chat_template_kwargs: Mapping[str, Any]) -> list[int]:
        if hasattr(self.obj, "prompt"):
            return self.obj.prompt(example, tokenizer, chat_template_kwargs)
        return super().prompt(example, tokenizer, chat_template_kwargs)

    def grade(self, text: str, example: Any) -> Grade:
        return self.obj.grade(text, example)

    no_gold_reasons = frozenset({EMPTY_ANSWER, GRADER_REFUSED_ROW})

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "grader": self.cfg.grader, "code_dir": self.cfg.code_dir}


#: The task.code_dir folders graders were imported from in this process.
_CODE_DIRS: set[str] = set()


def _forget_user_modules(top: str) -> None:
    """Drop the cached modules ``top`` and ``top.*`` that came from a task.code_dir, so the grader is imported from
    the folder as it is now: an earlier run in this process (another folder, or an older version of the file) does
    not hand back its module. Modules from anywhere else (the project's own, installed packages) stay."""
    for name, module in list(sys.modules.items()):
        origin = getattr(module, "__file__", None) or ""
        if (name == top or name.startswith(top + ".")) and any(origin.startswith(d + os.sep) for d in _CODE_DIRS):
            del sys.modules[name]
    importlib.invalidate_caches()


def load_entry_point(spec: str, code_dir: str | None) -> Any:
    """The object ``package.module:attr`` names, imported with ``code_dir`` first on sys.path (when it exists
    here: in the step image the code is at IMAGE_TASK_CODE, on its PYTHONPATH); a class or a factory is called."""
    module_name, _, attr = spec.partition(":")
    where = [str(Path(code_dir).expanduser().resolve())] if code_dir and Path(code_dir).expanduser().is_dir() else []
    for path in where:  # first, even if an earlier import put it further back
        if path in sys.path:
            sys.path.remove(path)
        sys.path.insert(0, path)
        _CODE_DIRS.add(path)
    if where:
        _forget_user_modules(module_name.split(".")[0])
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        missing = f" (task.code_dir {code_dir} is not a folder here)" if code_dir and not where else ""
        looked = (", ".join([*where, IMAGE_TASK_CODE]) + missing) if code_dir else "sys.path (set task.code_dir)"
        raise TaskError(f"task.grader {spec}: cannot import {module_name} ({exc}); looked in {looked}. Put the "
                        "module in task.code_dir, and build the image with it: make build-image TASK_CODE=<dir>") \
            from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise TaskError(f"task.grader {spec}: {module_name} has no attribute {attr}") from None
    if isinstance(obj, type) or not hasattr(obj, "grade"):
        obj = obj() if callable(obj) else obj
    if not callable(getattr(obj, "grade", None)):
        raise TaskError(f"task.grader {spec}: {type(obj).__name__} has no grade(text, example) method; give an "
                        "object with the Task protocol of steps/dapo/task.py, or a factory returning one")
    return obj


def build_task(cfg: TaskConfig) -> RowTask:
    if cfg.name == "custom":
        return CustomTask(cfg, load_entry_point(cfg.grader or "", cfg.code_dir))
    return BuiltinTask(cfg)
