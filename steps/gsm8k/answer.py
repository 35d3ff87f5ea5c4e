"""Numbers in GSM8K answers: the gold answer of a row, and the answer a completion commits to.

Numbers are compared as exact decimals through one canonical string form
(``"+7.50"`` -> ``"7.5"``, ``"1,000"`` -> ``"1000"``), so grading needs no float
rounding and a normalised answer can be stored, logged and compared as text.

A reasoning model thinks before it answers, often for hundreds of tokens of
scratch numbers, so an answer is read only in the completion's *answer region*
(:func:`answer_region`): after a ``<think>...</think>`` block (Qwen3-family
templates), or in the ``final`` channel of gpt-oss's harmony format
(``<|channel|>analysis<|message|>...<|end|><|start|>assistant<|channel|>final<|message|>...<|return|>``).
A completion cut off inside its reasoning has no answer region, so no answer,
whatever numbers its thinking happened to write. The grader therefore reads
completions decoded WITH their special tokens: harmony's markers are special
tokens that ``skip_special_tokens=True`` would drop, leaving ``analysis...assistantfinal...``.
"""
from __future__ import annotations

import re

# A number as a model writes it: optional sign, digits with optional thousands
# separators, optional decimals. The sign only counts when it is not the minus
# of a subtraction ("10-5" ends in 5, not -5).
_NUMBER = r"(?:(?<![\w)])[-+])?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|(?:(?<![\w)])[-+])?\.\d+"
_NUMBER_RE = re.compile(_NUMBER)
# What may sit between a marker and its number: "#### $18", "#### **42**",
# "answer is: 7", and the toy tokenizer's spaced-out "#### - 5".
_LEAD = r"[\s:=*$]*"
# The instructed forms of a committed answer: '#### N' and '\boxed{N}'.
_COMMITTED_RE = re.compile(
    rf"####{_LEAD}(?P<hashes>[-+]?\s*\$?(?:\d{{1,3}}(?:,\d{{3}})+|\d+)(?:\.\d+)?|[-+]?\.\d+)"
    r"|\\boxed\s*\{(?P<boxed>[^{}]*)\}")
_ANSWER_IS_RE = re.compile(rf"answer\s*(?:is|:|=){_LEAD}({_NUMBER})", re.IGNORECASE)
_CANONICAL_RE = re.compile(r"([-+]?)(\d*)(?:\.(\d*))?")
_GOLD_RE = re.compile(r"\$?([-+]?(?:\d+(?:\.\d+)?|\.\d+))")
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
# One harmony message: its channel (the header may add e.g. ' to=functions.x' or '<|constrain|>json'),
# then its text up to the token that ends it, or to the end of a completion cut off inside it.
_HARMONY_CHANNEL = "<|channel|>"
_HARMONY_MESSAGE_RE = re.compile(r"<\|channel\|>\s*(\w+)[^<]*(?:<\|constrain\|>[^<]*)?<\|message\|>"
                                 r"(.*?)(?=<\|(?:end|return|call|start)\|>|\Z)", re.DOTALL)


def canonical(number: str) -> str | None:
    """Canonical decimal string of a number, or None if it is not one."""
    text = re.sub(r"[\s,$]", "", number)
    m = _CANONICAL_RE.fullmatch(text)
    if m is None or not (m.group(2) or m.group(3)):
        return None
    whole = m.group(2).lstrip("0") or "0"
    frac = (m.group(3) or "").rstrip("0")
    sign = "-" if m.group(1) == "-" and (whole != "0" or frac) else ""
    return sign + whole + ("." + frac if frac else "")


def gold_answer(answer_text: str) -> str | None:
    """The reference number after the final '####' of a GSM8K answer, or None."""
    if "####" not in answer_text:
        return None
    tail = answer_text.rsplit("####", 1)[1].replace(",", "").strip()
    m = _GOLD_RE.fullmatch(tail)
    return canonical(m.group(1)) if m else None


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


def committed_answer(region: str) -> str | None:
    """The number of the last '#### N' or '\\boxed{N}' in an answer region (the instructed forms), or None.

    A completion that commits twice ("#### 3 ... wait ... #### 4") means the last one, numbers
    written after it notwithstanding.
    """
    for m in reversed(list(_COMMITTED_RE.finditer(region))):
        number = m["hashes"] if m["hashes"] is not None else _first_number(m["boxed"])
        if number is not None:
            return canonical(number)
    return None


def _first_number(text: str) -> str | None:
    m = _NUMBER_RE.search(text)
    return m.group(0) if m else None


def extract_answer(completion: str) -> tuple[str | None, bool]:
    """(canonical number or None, whether it was committed as '#### N' or '\\boxed{N}').

    Read only in the :func:`answer_region`. Without a committed answer, fall back
    (the lenient reading) to the last "the answer is N", then the last number in the region.
    """
    region = answer_region(completion)
    if region is None:
        return None, False
    committed = committed_answer(region)
    if committed is not None:
        return committed, True
    said = _ANSWER_IS_RE.findall(region)
    if said:
        return canonical(said[-1]), False
    numbers = _NUMBER_RE.findall(region)
    return (canonical(numbers[-1]) if numbers else None), False
