"""GSM8K as a task of the RL core (steps/dapo/task.py): its prompt, and its grader.

The entry points (steps/train.py, steps/evaluate.py) choose it and load its examples
(steps/gsm8k/data.py); the loop, sampling and evaluation only ever call these two methods.
"""
from __future__ import annotations

from typing import Any, Mapping

from steps.dapo.task import Grade
from steps.gsm8k.answer import grade
from steps.gsm8k.data import Example
from steps.gsm8k.prompt import render_prompt


class Gsm8k:
    """Grade-school maths: a question in, a number out, committed as '#### N' or '\\boxed{N}'."""

    def prompt(self, example: Example, tokenizer: Any, chat_template_kwargs: Mapping[str, Any]) -> list[int]:
        return render_prompt(tokenizer, example.question, chat_template_kwargs)

    def grade(self, text: str, example: Example) -> Grade:
        return grade(text, example.gold)


GSM8K = Gsm8k()
