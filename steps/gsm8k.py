"""The GSM8K prompt and reward, shared by training and evaluation.

Numbers are compared as exact decimals through one canonical string form
(``"+7.50"`` -> ``"7.5"``, ``"1,000"`` -> ``"1000"``), so grading needs no float
rounding and a normalised answer can be stored, logged and compared as text.
"""
from __future__ import annotations

import operator
import re
from dataclasses import dataclass
from typing import Any

INSTRUCTION = "Solve the problem. Write the final answer as #### followed by the number."

# A number as a model writes it: optional sign, digits with optional thousands
# separators, optional decimals. The sign only counts when it is not the minus
# of a subtraction ("10-5" ends in 5, not -5).
_NUMBER = r"(?:(?<![\w)])[-+])?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|(?:(?<![\w)])[-+])?\.\d+"
_NUMBER_RE = re.compile(_NUMBER)
# What may sit between a marker and its number: "#### $18", "#### **42**",
# "answer is: 7", and the toy tokenizer's spaced-out "#### - 5".
_LEAD = r"[\s:=*$]*"
_AFTER_HASHES_RE = re.compile(rf"^{_LEAD}([-+]?\s*\$?(?:\d{{1,3}}(?:,\d{{3}})+|\d+)(?:\.\d+)?|[-+]?\.\d+)")
_BOXED_RE = re.compile(r"\\boxed\s*\{([^{}]*)\}")
_ANSWER_IS_RE = re.compile(rf"answer\s*(?:is|:|=){_LEAD}({_NUMBER})", re.IGNORECASE)
_CANONICAL_RE = re.compile(r"([-+]?)(\d*)(?:\.(\d*))?")
_GOLD_RE = re.compile(r"\$?([-+]?(?:\d+(?:\.\d+)?|\.\d+))")


@dataclass(frozen=True)
class Grade:
    correct: bool
    formatted: bool  # the answer was given in the instructed '#### N' form
    extracted: str | None


def _canonical(number: str) -> str | None:
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
    return _canonical(m.group(1)) if m else None


def extract_answer(completion: str) -> tuple[str | None, bool]:
    """(canonical number or None, whether it was given as '#### N').

    The last '####' is the answer the model committed to, so a number right
    after it wins even if reasoning follows. Without one, fall back to the last
    \\boxed{N}, then the last "the answer is N", then the last number at all.
    """
    if "####" in completion:
        m = _AFTER_HASHES_RE.match(completion.rsplit("####", 1)[1])
        if m:
            return _canonical(m.group(1)), True
    for boxed in reversed(_BOXED_RE.findall(completion)):
        m = _NUMBER_RE.search(boxed)
        if m:
            return _canonical(m.group(0)), False
    said = _ANSWER_IS_RE.findall(completion)
    if said:
        return _canonical(said[-1]), False
    numbers = _NUMBER_RE.findall(completion)
    return (_canonical(numbers[-1]) if numbers else None), False


def grade(completion: str, gold: str) -> Grade:
    """Grade a completion against a gold number (any form: "7", "7.0", "1,000")."""
    want = _canonical(gold)
    if want is None:
        raise ValueError(f"gold answer {gold!r} is not a number; pass gold_answer(row['answer'])")
    extracted, formatted = extract_answer(completion)
    return Grade(correct=extracted == want, formatted=formatted, extracted=extracted)


def reward(grade: Grade) -> float:
    """DAPO's rule-based reward: 1 for a correct answer, 0 otherwise."""
    return 1.0 if grade.correct else 0.0


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


def normalize_question(question: str) -> str:
    """Key for duplicate and train/eval overlap detection: case and spacing ignored."""
    return " ".join(question.lower().split())
