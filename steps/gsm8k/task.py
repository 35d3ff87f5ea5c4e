"""GSM8K as a task of the RL core (steps/dapo/task.py): its prompt, and its grader.

The entry points (steps/train.py, steps/evaluate.py) choose it and load its examples
(steps/tasks/: any row with a question and a gold number); the loop, sampling and evaluation only ever call
these two methods.
"""
from __future__ import annotations

from typing import Any, Mapping, Protocol

from steps.dapo.task import Grade
from steps.gsm8k.answer import grade
from steps.gsm8k.prompt import render_prompt


class Example(Protocol):
    """What GSM8K reads of an example (steps/tasks/rows.py's Example has it): the question and the gold number."""

    question: str
    gold: str


class Gsm8k:
    """Grade-school maths: a question in, a number out, committed as '#### N' or '\\boxed{N}'."""

    def prompt(self, example: Example, tokenizer: Any, chat_template_kwargs: Mapping[str, Any]) -> list[int]:
        return render_prompt(tokenizer, example.question, chat_template_kwargs)

    def grade(self, text: str, example: Example) -> Grade:
        return grade(text, example.gold)


GSM8K = Gsm8k()
