"""A task's examples, and which field of a row is the question, the answer and the choices.

Field names come from the ``task`` section (``question_field``, ``answer_field``, ``choices_field``) or,
left null, are found per file from its first row: the first of the common pairs (:data:`COMMON_PAIRS`, the
order a format prefers first: steps/tasks/formats.py) whose two fields the row has, ignoring case.
validation.json says which were used, and how. A field a file lacks is named with the file's own fields and
the closest of them (:func:`field_problem`).
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any, Mapping

from steps.config.models import TaskConfig

DEFAULT_CHOICES_FIELD = "choices"
#: The (question, answer) field pairs datasets use, found without a setting: GSM8K, MATH, verl and TRL's
#: prompt-only and prompt-completion layouts, and the instruction-tuning sets'.
COMMON_PAIRS: tuple[tuple[str, str], ...] = (
    ("question", "answer"), ("problem", "solution"), ("prompt", "target"), ("prompt", "completion"),
    ("input", "output"), ("query", "response"), ("instruction", "output"))


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
    pair of ``pairs`` the row has, ignoring case (else the first pair: its rows are then rejected naming the
    field, and :func:`field_problem` says which fields the file has)."""
    choices = (cfg.choices_field or DEFAULT_CHOICES_FIELD) if needs_choices else None
    if cfg.question_field and cfg.answer_field:
        return Fields(cfg.question_field, cfg.answer_field, choices, "setting")
    keys = {k.lower(): k for k in (row or ()) if isinstance(k, str)}
    found = [(keys[q], keys[a]) for q, a in pairs if q in keys and a in keys
             and (not cfg.question_field or keys[q] == cfg.question_field)
             and (not cfg.answer_field or keys[a] == cfg.answer_field)]
    question, answer = found[0] if found else pairs[0]
    source = "setting and auto-detected" if cfg.question_field or cfg.answer_field else "auto-detected"
    return Fields(cfg.question_field or question, cfg.answer_field or answer, choices, source)


SETTING = {"question": "task.question_field", "answer": "task.answer_field", "choices": "task.choices_field"}


def field_problem(row: Mapping[str, Any] | None, fields: Fields, file: str) -> str | None:
    """What a file whose first row is ``row`` lacks of ``fields``, with its own fields and "did you mean"; None
    when it has them all."""
    keys = [k for k in (row or ()) if isinstance(k, str)]
    wanted = {"question": fields.question, "answer": fields.answer, "choices": fields.choices}
    missing = {role: name for role, name in wanted.items() if name and name not in keys}
    if not missing:
        return None
    lowered = {k.lower(): k for k in keys}
    guesses = {}
    for role, name in missing.items():
        close = difflib.get_close_matches(name.lower(), list(lowered), n=1, cutoff=0.6)
        if close:
            guesses[role] = lowered[close[0]]
    names = " and ".join(f"'{name}' ({SETTING[role]})" for role, name in missing.items())
    auto = ("; auto-detected: none of the pairs " + ", ".join("/".join(p) for p in COMMON_PAIRS) + " is in it"
            if "auto" in fields.source else "")
    text = f"{file} has no field {names}{auto}; its fields: {', '.join(keys) or 'none'}"
    if guesses:
        text += "; did you mean " + " and ".join(f"{SETTING[r]}: {g}" for r, g in guesses.items()) + "?"
    else:
        text += "; name them in the config's task section: " + ", ".join(f"{SETTING[r]}: <field>" for r in missing)
    return text
