"""The chat template on both sides of a sample: a prompt's tokens, and a completion's text as a grader reads it.

These follow the model, not the task: any task renders its messages with the base model's chat
template (with the run's ``session.chat_template_kwargs``: ``enable_thinking`` for Qwen3-family
templates, ``reasoning_effort`` for gpt-oss), and any grader reads a completion the same way.

A reasoning model thinks before it answers, often for hundreds of tokens of scratch work, so a
grader reads only the completion's *answer region* (:func:`answer_region`): after a
``<think>...</think>`` block, or in the ``final`` channel of gpt-oss's harmony format
(``<|channel|>analysis<|message|>...<|end|><|start|>assistant<|channel|>final<|message|>...<|return|>``).
A completion cut off inside its reasoning has no answer region, so no answer. The text is therefore
decoded WITH its special tokens: harmony's markers are special tokens that ``skip_special_tokens=True``
would drop, leaving ``analysis...assistantfinal...``.

The completion ends where the model ends its turn: the service stops a sample at the model's
end-of-turn token and says so with the sequence's ``stop_reason`` (``stop``; ``length`` when
``max_tokens`` cut it off), which the loop reads to mask or punish truncated samples.
"""
from __future__ import annotations

import operator
import re
from typing import Any, Mapping, Sequence

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
# Enough of a prompt's end to hold its generation prompt, e.g. "<|im_start|>assistant\n<think>\n".
_PROMPT_TAIL_TOKENS = 16
# One harmony message: its channel (the header may add e.g. ' to=functions.x' or '<|constrain|>json'),
# then its text up to the token that ends it, or to the end of a completion cut off inside it.
_HARMONY_CHANNEL = "<|channel|>"
_HARMONY_MESSAGE_RE = re.compile(r"<\|channel\|>\s*(\w+)[^<]*(?:<\|constrain\|>[^<]*)?<\|message\|>"
                                 r"(.*?)(?=<\|(?:end|return|call|start)\|>|\Z)", re.DOTALL)


def render_messages(tokenizer: Any, messages: list[dict], chat_template_kwargs: Mapping[str, Any] | None = None
                    ) -> list[int]:
    """Prompt token ids from any tokenizer with a chat template, ending in the assistant's turn.

    Hugging Face returns a list of ids, or (newer versions, return_dict) a
    BatchEncoding whose input_ids may be batched or a tensor; all become list[int].
    """
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
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
    """The text a grader reads: the completion decoded with its special tokens kept.

    Kept, because gpt-oss's harmony channel markers are special tokens and the answer
    region is found by them. After a prompt that :func:`opens_reasoning`, the opening
    tag is put back, so a completion cut off mid-thought still reads as one.
    """
    text = tokenizer.decode(list(completion), skip_special_tokens=False)
    return THINK_OPEN + text if reasoning_open else text


def answer_region(completion: str) -> str | None:
    """The part of a completion that gives its answer; None when it was cut off inside its reasoning.

    - harmony (gpt-oss): the text of the last ``final``-channel message; without one (still in
      ``analysis``, or cut off before ``final`` began) there is no answer;
    - ``<think>``: what follows the last ``</think>``; a ``<think>`` opened after it and never
      closed means the completion stopped mid-thought;
    - otherwise, the whole completion.
    """
    if _HARMONY_CHANNEL in completion:
        finals = [text for channel, text in _HARMONY_MESSAGE_RE.findall(completion) if channel == "final"]
        return finals[-1] if finals else None
    opened, closed = completion.rfind(THINK_OPEN), completion.rfind(THINK_CLOSE)
    if opened > closed:
        return None
    return completion[closed + len(THINK_CLOSE):] if closed >= 0 else completion
