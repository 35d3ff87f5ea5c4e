"""Reading an answer out of text, in each built-in format, and comparing two answers.

Every reader takes an *answer region* (steps/dapo/chat.py's :func:`answer_region`: never a reasoning
block) or a gold answer field, and returns the answer's text or None. Readers are whitespace-tolerant
and case-insensitive where a format has words: the local toy's tokenizer lowercases and joins tokens
with spaces (``the answer is : 7``, ``\\ boxed { 7 }``).

Two answers are the same (:func:`same`) as exact decimals when the gold one is a number (GSM8K's
:func:`canonical`: ``"1,000"`` = ``"1000.0"``), else as text with spacing, case, ``$`` signs and a
final period ignored (``\\frac{1}{2}`` = ``\\frac {1} {2}``).
"""
from __future__ import annotations

import re
from decimal import Decimal
from fractions import Fraction
from typing import Sequence

from steps.gsm8k.answer import NUMBER, canonical

_NUMBER_RE = re.compile(NUMBER)
# '#### N' (GSM8K's final-answer line); what may sit between: "#### $18", "#### **42**".
_HASH_RE = re.compile(rf"####[\s:=*$]*(?P<v>{NUMBER})")
_BOXED_RE = re.compile(r"\\\s*boxed\s*\{")
# "The answer is: X" to the end of its line; the colon makes it the instructed form.
_ANSWER_IS_RE = re.compile(r"the\s+answer\s+is\s*:\s*(?P<v>[^\n]*)", re.IGNORECASE)
# Lenient: "answer is X", "answer: X", "answer = X".
_SAID_RE = re.compile(r"answer\s*(?:is|:|=)\s*:?\s*(?P<v>[^\n]*)", re.IGNORECASE)
# Special tokens a completion keeps (steps/dapo/chat.py decodes with them): <eos>, <|im_end|>, <|return|> ...
_SPECIAL_RE = re.compile(r"<\|?/?[A-Za-z_]+\|?>")
# A choice letter, alone or in parentheses: "B", "(B)", "B)", "B." (the whole text).
_LETTER_RE = re.compile(r"\(?\s*([A-Za-z])\s*\)?\s*\.?")
_LATEX_NOISE_RE = re.compile(r"\\left|\\right|\\!|\\,|\\;|\\ |\$")


def clean(value: str) -> str:
    """A read value without special tokens, surrounding space, ``**`` emphasis or a final period."""
    value = _SPECIAL_RE.sub(" ", value).strip().strip("*").strip()
    return value[:-1].rstrip() if value.endswith(".") else value


def last_hash(text: str) -> str | None:
    """The number of the last '#### N'."""
    found = _HASH_RE.findall(text)
    return found[-1] if found else None


def _boxed_at(text: str, m: re.Match) -> str | None:
    """The contents of the ``\\boxed{`` matched at ``m``, braces balanced; None when it is left open."""
    depth, start = 1, m.end()
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start:i].strip()
    return None


def boxed_values(text: str) -> list[str]:
    r"""The contents of every ``\boxed{...}``, braces balanced (``\boxed{\frac{1}{2}}`` -> ``\frac{1}{2}``);
    one left open (cut off) is not an answer."""
    return [v for v in (_boxed_at(text, m) for m in _BOXED_RE.finditer(text)) if v is not None]


def last_boxed(text: str) -> str | None:
    values = boxed_values(text)
    return values[-1] if values else None


def last_answer_is(text: str) -> str | None:
    """What follows the last 'The answer is:' on its line (cleaned), or None."""
    found = [clean(v) for v in _ANSWER_IS_RE.findall(text)]
    found = [v for v in found if v]
    return found[-1] if found else None


def last_said(text: str) -> str | None:
    """Lenient: what follows the last 'answer is', 'answer:' or 'answer =' on its line."""
    found = [clean(v) for v in _SAID_RE.findall(text)]
    found = [v for v in found if v]
    return found[-1] if found else None


def last_number(text: str) -> str | None:
    found = _NUMBER_RE.findall(text)
    return found[-1] if found else None


def first_number(text: str) -> str | None:
    m = _NUMBER_RE.search(text)
    return m.group(0) if m else None


def as_number(value: str | None) -> str | None:
    """A read value as a canonical number: the value itself if it is one, else its first number
    ("$18 dollars" -> "18")."""
    if value is None:
        return None
    number = canonical(clean(value))
    if number is not None:
        return number
    first = first_number(value)
    return canonical(first) if first is not None else None


def normalize_text(value: str) -> str:
    """Text answers compared without spacing, case, ``$``, ``\\left``/``\\right`` or a final period."""
    value = clean(value).replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    return "".join(_LATEX_NOISE_RE.sub("", value).split()).lower()


def same(extracted: str | None, gold: str) -> bool:
    """Whether a read answer is the gold answer: as numbers when the gold is one, else as text."""
    if extracted is None:
        return False
    want = canonical(gold)
    if want is not None:
        return as_number(extracted) == want
    return normalize_text(extracted) == normalize_text(gold)


def letter(value: str | None, n_choices: int) -> str | None:
    """A choice letter (upper case) of the first ``n_choices``, when ``value`` is one ("b", "(B)", "B.")."""
    if value is None:
        return None
    m = _LETTER_RE.fullmatch(clean(value))
    if m is None:
        return None
    found = m.group(1).upper()
    return found if ord(found) - ord("A") < n_choices else None


def letters(n_choices: int) -> Sequence[str]:
    return [chr(ord("A") + i) for i in range(n_choices)]


# -- bare numbers and fractions (the number task) ------------------------------------------------------------
_UNSIGNED = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+"
# "3/4", "-3.5", "1,000", "- 5" (the toy tokenizer's spaced sign), "$18".
_FRACTION = rf"(?:(?<![\w)])[-+]\s*)?\$?(?:{_UNSIGNED})(?:\s*/\s*(?:{_UNSIGNED}))?"
_FRACTION_RE = re.compile(_FRACTION)
_WHOLE_RE = re.compile(rf"([-+]?)({_UNSIGNED})(?:/({_UNSIGNED}))?")
_COMMITTED_NUMBER_RE = re.compile(rf"####[\s:=*$]*(?P<v>{_FRACTION})")
_LATEX_FRAC_RE = re.compile(r"\\\s*[dt]?frac\s*\{\s*(\d+)\s*\}\s*\{\s*(\d+)\s*\}")


def as_fraction(value: str | None) -> Fraction | None:
    """The exact value of a number or fraction written whole ("1,000", "-3.5", "3/4", "$5", "\\frac{3}{4}")."""
    if value is None:
        return None
    text = _LATEX_FRAC_RE.sub(r"\1/\2", clean(value))
    m = _WHOLE_RE.fullmatch(re.sub(r"[\s$]", "", text))
    if m is None:
        return None
    number = Fraction(Decimal(m.group(2).replace(",", "")))
    if m.group(3) is not None:
        denominator = Fraction(Decimal(m.group(3).replace(",", "")))
        if denominator == 0:
            return None
        number /= denominator
    return -number if m.group(1) == "-" else number


def fraction_text(value: Fraction) -> str:
    """A canonical text of an exact value: a decimal when it has one ("0.75", "-3.5", "1000"), else "p/q"."""
    den = value.denominator
    for prime in (2, 5):
        while den % prime == 0:
            den //= prime
    if den != 1:
        return f"{value.numerator}/{value.denominator}"
    text = format(Decimal(value.numerator) / Decimal(value.denominator), "f")
    return canonical(text) or text


def number_text(value: str | None) -> str | None:
    """The canonical text of a value that is a number or a fraction as a whole, else None."""
    found = as_fraction(value)
    return fraction_text(found) if found is not None else None


def last_fraction(text: str) -> str | None:
    """The last number or fraction in a text, canonical."""
    found = _FRACTION_RE.findall(text)
    return number_text(found[-1]) if found else None


def committed_number(region: str) -> str | None:
    """The last '#### N' or '\\boxed{N}' (N a number or a fraction), canonical: the number task's strict form."""
    hashed = [(m.start(), m.group("v")) for m in _COMMITTED_NUMBER_RE.finditer(region)]
    boxed = [(m.start(), _boxed_at(region, m)) for m in _BOXED_RE.finditer(region)]
    committed = hashed + [(start, v) for start, v in boxed if v is not None]
    for _, value in sorted(committed, reverse=True):
        found = number_text(value) or (last_fraction(value) if value else None)
        if found is not None:
            return found
    return None
