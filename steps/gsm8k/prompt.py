"""The GSM8K prompt: the question and the instruction, in the model's chat template.

The instruction asks for the instructed answer forms the strict grader reads (steps/gsm8k/answer.py);
the chat template gets the run's ``session.chat_template_kwargs`` (steps/dapo/chat.py).
"""
from __future__ import annotations

from typing import Any, Mapping

from steps.dapo.chat import render_messages

INSTRUCTION = "Solve the problem. Write the final answer as #### followed by the number."


def build_messages(question: str) -> list[dict]:
    return [{"role": "user", "content": question + "\n" + INSTRUCTION}]


def render_prompt(tokenizer: Any, question: str, chat_template_kwargs: Mapping[str, Any] | None = None) -> list[int]:
    """Prompt token ids of a question, as training, evaluation and validation's prompt budget see them."""
    return render_messages(tokenizer, build_messages(question), chat_template_kwargs)
