"""Grading a completion and DAPO's rule-based reward: the one place a reward is computed.

Training (every sampled completion) and evaluation (every greedy answer) both
grade through :func:`grade`, and :func:`reward` is the only place a grade becomes
a reward, so what is rewarded and what is reported as correct cannot drift apart.
"""
from __future__ import annotations

from dataclasses import dataclass

from steps.gsm8k.answer import canonical, extract_answer


@dataclass(frozen=True)
class Grade:
    correct: bool
    formatted: bool  # the answer was given in the instructed '#### N' form
    extracted: str | None


@dataclass(frozen=True)
class RewardShaping:
    """DAPO's soft overlong punishment (eq. 13): off while ``overlong_buffer`` is 0."""

    max_tokens: int
    overlong_buffer: int = 0
    overlong_penalty: float = 0.0


def grade(completion: str, gold: str) -> Grade:
    """Grade a completion against a gold number (any form: "7", "7.0", "1,000")."""
    want = canonical(gold)
    if want is None:
        raise ValueError(f"gold answer {gold!r} is not a number; pass gold_answer(row['answer'])")
    extracted, formatted = extract_answer(completion)
    return Grade(correct=extracted == want, formatted=formatted, extracted=extracted)


def overlong_penalty(length: int, shaping: RewardShaping) -> float:
    """0 up to ``max_tokens - overlong_buffer`` tokens, then falling linearly to ``-overlong_penalty``."""
    if shaping.overlong_buffer <= 0:
        return 0.0
    start = shaping.max_tokens - shaping.overlong_buffer
    if length <= start:
        return 0.0
    if length >= shaping.max_tokens:
        return -shaping.overlong_penalty
    return -shaping.overlong_penalty * (length - start) / shaping.overlong_buffer


def reward(result: Grade, length: int, shaping: RewardShaping) -> float:
    """1 for a correct answer, 0 otherwise, plus the overlong punishment of a ``length``-token completion."""
    return (1.0 if result.correct else 0.0) + overlong_penalty(length, shaping)
