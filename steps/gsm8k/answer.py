"""Numbers in GSM8K answers: the gold answer of a row, and the answer a completion commits to.

Numbers are compared as exact decimals through one canonical string form
(``"+7.50"`` -> ``"7.5"``, ``"1,000"`` -> ``"1000"``), so grading needs no float
rounding and a normalised answer can be stored, logged and compared as text.
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
_AFTER_HASHES_RE = re.compile(rf"^{_LEAD}([-+]?\s*\$?(?:\d{{1,3}}(?:,\d{{3}})+|\d+)(?:\.\d+)?|[-+]?\.\d+)")
_BOXED_RE = re.compile(r"\\boxed\s*\{([^{}]*)\}")
_ANSWER_IS_RE = re.compile(rf"answer\s*(?:is|:|=){_LEAD}({_NUMBER})", re.IGNORECASE)
_CANONICAL_RE = re.compile(r"([-+]?)(\d*)(?:\.(\d*))?")
_GOLD_RE = re.compile(r"\$?([-+]?(?:\d+(?:\.\d+)?|\.\d+))")


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


def extract_answer(completion: str) -> tuple[str | None, bool]:
    """(canonical number or None, whether it was given as '#### N').

    The last '####' is the answer the model committed to, so a number right
    after it wins even if reasoning follows. Without one, fall back to the last
    \\boxed{N}, then the last "the answer is N", then the last number at all.
    """
    if "####" in completion:
        m = _AFTER_HASHES_RE.match(completion.rsplit("####", 1)[1])
        if m:
            return canonical(m.group(1)), True
    for boxed in reversed(_BOXED_RE.findall(completion)):
        m = _NUMBER_RE.search(boxed)
        if m:
            return canonical(m.group(0)), False
    said = _ANSWER_IS_RE.findall(completion)
    if said:
        return canonical(said[-1]), False
    numbers = _NUMBER_RE.findall(completion)
    return (canonical(numbers[-1]) if numbers else None), False
