"""A task's examples, and which field of a JSONL row is the question, the answer and the choices.

Field names come from the ``task`` section (``question_field``, ``answer_field``, ``choices_field``) or,
left null, are found per file from its first row: ``question``/``answer``, else ``problem``/``solution``
(the order a format prefers: steps/tasks/formats.py). validation.json says which were used, and how.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from steps.config.models import TaskConfig

DEFAULT_CHOICES_FIELD = "choices"


@dataclass(frozen=True)
class Example:
    """One row as a task sees it. ``question`` and ``gold`` are what the core reports (steps/dapo/task.py);
    ``row`` is the whole JSON row, for a user's grader that needs another field."""

    question: str
    gold: str
    choices: tuple[str, ...] = ()
    row: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    answer: str = field(default="", compare=False, repr=False)  # the row's answer field: validation grades it


@dataclass(frozen=True)
class Fields:
    question: str
    answer: str
    choices: str | None
    source: str  # "setting" or "auto-detected"

    def to_json(self) -> dict[str, Any]:
        return {"question": self.question, "answer": self.answer, "choices": self.choices, "source": self.source}


def fields_for(row: Mapping[str, Any] | None, cfg: TaskConfig, pairs: tuple[tuple[str, str], ...],
               needs_choices: bool) -> Fields:
    """The fields of a file whose first row is ``row``: the settings, and for those left null the first
    pair of ``pairs`` the row has (else the first pair: its rows are then rejected naming the field)."""
    choices = (cfg.choices_field or DEFAULT_CHOICES_FIELD) if needs_choices else None
    if cfg.question_field and cfg.answer_field:
        return Fields(cfg.question_field, cfg.answer_field, choices, "setting")
    keys = set(row or ())
    question, answer = next(((q, a) for q, a in pairs if q in keys and a in keys), pairs[0])
    source = "setting and auto-detected" if cfg.question_field or cfg.answer_field else "auto-detected"
    return Fields(cfg.question_field or question, cfg.answer_field or answer, choices, source)
