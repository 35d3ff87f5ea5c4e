"""GSM8K answers: the gold number of a row, the answer a completion commits to, and its grade.

Numbers are compared as exact decimals through one canonical string form
(``"+7.50"`` -> ``"7.5"``, ``"1,000"`` -> ``"1000"``), so grading needs no float
rounding and a normalised answer can be stored, logged and compared as text.

An answer is read only in the completion's answer region (``steps/dapo/chat.py``: after a
reasoning block, in harmony's ``final`` channel); a completion cut off inside its reasoning has no
answer. :func:`grade` is the task's grader: both readings (strict and lenient) of one completion.
"""
from __future__ import annotations

import re

from steps.dapo.chat import answer_region
from steps.dapo.task import Grade

# A number as a model writes it: optional sign, digits with optional thousands
# separators, optional decimals. The sign only counts when it is not the minus
# of a subtraction ("10-5" ends in 5, not -5).
_NUMBER = r"(?:(?<![\w)])[-+])?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|(?:(?<![\w)])[-+])?\.\d+"
_NUMBER_RE = re.compile(_NUMBER)
NUMBER = _NUMBER  # the pattern, for the other numeric answer formats (steps/tasks/answers.py)
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


def grade(completion: str, gold: str) -> Grade:
    """Grade a completion against a gold number (any form: "7", "7.0", "1,000").

    Strict (``correct``): only an answer committed as '#### N' or '\\boxed{N}' in the answer region,
    as DAPO's rule-based reward does. Lenient (``correct_lenient``): also "the answer is N" or the
    last number there. Neither reads a reasoning block.
    """
    want = canonical(gold)
    if want is None:
        raise ValueError(f"gold answer {gold!r} is not a number; pass gold_answer(row['answer'])")
    extracted, formatted = extract_answer(completion)
    right = extracted == want
    return Grade(correct=right and formatted, formatted=formatted, extracted=extracted,
                 correct_unformatted=right and not formatted)
