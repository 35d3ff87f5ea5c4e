"""Grading a completion and DAPO's rule-based reward: the one place a reward is computed.

Training (every sampled completion) and evaluation (every greedy answer) both
grade through :func:`grade`, and :func:`reward` is the only place a grade becomes
a reward, so what is rewarded and what is reported as correct cannot drift apart.

A grade carries both readings of a completion. **Strict** (``correct``): only an
answer committed in the instructed form, ``#### N`` or ``\\boxed{N}``, in the answer
region, as DAPO's rule-based reward does; the reward a run trains on by default,
and the accuracy the pipeline's approval compares. **Lenient** (``correct_lenient``):
also "the answer is N" or the last number in the answer region; reported beside it,
or trained on with ``reward_format: lenient``. Neither reads a reasoning block.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from steps.gsm8k.answer import canonical, extract_answer

RewardFormat = Literal["strict", "lenient"]


@dataclass(frozen=True)
class Grade:
    correct: bool  # strict: the gold number, committed as '#### N' or '\boxed{N}' in the answer region
    formatted: bool  # an answer was committed in an instructed form (right or wrong)
    extracted: str | None  # the answer read leniently (the committed one when there is one)
    # The gold number, but not in an instructed form: right under the lenient reading only.
    correct_unformatted: bool = False

    @property
    def correct_lenient(self) -> bool:
        return self.correct or self.correct_unformatted


@dataclass(frozen=True)
class RewardShaping:
    """How a grade becomes a reward: which reading pays, and DAPO's soft overlong punishment (eq. 13),
    off while ``overlong_buffer`` is 0."""

    max_tokens: int
    overlong_buffer: int = 0
    overlong_penalty: float = 0.0
    reward_format: RewardFormat = "strict"


def grade(completion: str, gold: str) -> Grade:
    """Grade a completion against a gold number (any form: "7", "7.0", "1,000")."""
    want = canonical(gold)
    if want is None:
        raise ValueError(f"gold answer {gold!r} is not a number; pass gold_answer(row['answer'])")
    extracted, formatted = extract_answer(completion)
    right = extracted == want
    return Grade(correct=right and formatted, formatted=formatted, extracted=extracted,
                 correct_unformatted=right and not formatted)


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
    """1 for a correct answer (under ``shaping.reward_format``), 0 otherwise, plus the overlong
    punishment of a ``length``-token completion."""
    paid = result.correct if shaping.reward_format == "strict" else result.correct_lenient
    return (1.0 if paid else 0.0) + overlong_penalty(length, shaping)
