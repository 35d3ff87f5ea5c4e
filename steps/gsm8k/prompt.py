"""The GSM8K prompt: the question, the instruction, and the chat template of the model's tokenizer."""
from __future__ import annotations

import operator
from typing import Any

INSTRUCTION = "Solve the problem. Write the final answer as #### followed by the number."


def build_messages(question: str) -> list[dict]:
    return [{"role": "user", "content": question + "\n" + INSTRUCTION}]


def render_prompt(tokenizer: Any, question: str) -> list[int]:
    """Prompt token ids from any tokenizer with a chat template.

    Hugging Face returns a list of ids, or (newer versions, return_dict) a
    BatchEncoding whose input_ids may be batched or a tensor; all become list[int].
    """
    out = tokenizer.apply_chat_template(build_messages(question), add_generation_prompt=True, tokenize=True)
    ids = out["input_ids"] if not isinstance(out, (list, tuple)) and "input_ids" in out else out
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    if len(ids) == 1 and isinstance(ids[0], (list, tuple)):
        ids = ids[0]
    try:
        return [operator.index(t) for t in ids]
    except TypeError:
        raise TypeError(
            f"{type(tokenizer).__name__}.apply_chat_template(tokenize=True) returned "
            f"{type(out).__name__}, not token ids; use a tokenizer whose chat template tokenizes"
        ) from None
