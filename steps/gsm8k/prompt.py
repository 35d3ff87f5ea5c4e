"""The GSM8K prompt: the question, the instruction, and the chat template of the model's tokenizer;
and the text of a completion the grader reads.

The chat template gets the run's ``session.chat_template_kwargs``: the switches a
model's template offers, such as ``enable_thinking`` (Qwen3-family) or
``reasoning_effort`` (gpt-oss). The completion ends where the model ends its turn:
the service stops a sample at the model's end-of-turn token and says so with the
sequence's ``stop_reason`` (``stop``; ``length`` when ``max_tokens`` cut it off),
which the loop reads to mask or punish truncated samples.
"""
from __future__ import annotations

import operator
from typing import Any, Mapping, Sequence

from steps.gsm8k.answer import THINK_CLOSE, THINK_OPEN

INSTRUCTION = "Solve the problem. Write the final answer as #### followed by the number."
# Enough of a prompt's end to hold its generation prompt, e.g. "<|im_start|>assistant\n<think>\n".
_PROMPT_TAIL_TOKENS = 16


def build_messages(question: str) -> list[dict]:
    return [{"role": "user", "content": question + "\n" + INSTRUCTION}]


def render_prompt(tokenizer: Any, question: str, chat_template_kwargs: Mapping[str, Any] | None = None) -> list[int]:
    """Prompt token ids from any tokenizer with a chat template.

    Hugging Face returns a list of ids, or (newer versions, return_dict) a
    BatchEncoding whose input_ids may be batched or a tensor; all become list[int].
    """
    out = tokenizer.apply_chat_template(build_messages(question), add_generation_prompt=True, tokenize=True,
                                        **(chat_template_kwargs or {}))
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


def opens_reasoning(tokenizer: Any, prompt: Sequence[int]) -> bool:
    """Whether the prompt leaves a reasoning block open: a generation prompt ending in ``<think>``
    (as thinking templates render it), so the completion starts inside the block without its tag."""
    tail = tokenizer.decode(list(prompt[-_PROMPT_TAIL_TOKENS:]), skip_special_tokens=False)
    return tail.rfind(THINK_OPEN) > tail.rfind(THINK_CLOSE)


def completion_text(tokenizer: Any, completion: Sequence[int], reasoning_open: bool = False) -> str:
    """The text the grader reads: the completion decoded with its special tokens kept.

    Kept, because gpt-oss's harmony channel markers are special tokens and the answer
    region is found by them. After a prompt that :func:`opens_reasoning`, the opening
    tag is put back, so a completion cut off mid-thought still reads as one.
    """
    text = tokenizer.decode(list(completion), skip_special_tokens=False)
    return THINK_OPEN + text if reasoning_open else text
