"""DAPO's rule-based reward: the one place a grade becomes a reward.

Training (every sampled completion) grades through the task and turns the grade into a reward
here, so what is rewarded and what is reported as correct cannot drift apart. The reward is 1
for a correct answer under ``reward_format`` (``strict``: committed in the instructed form, the
default and what approval compares; ``lenient``: also an answer found some other way), else 0,
plus DAPO's soft overlong punishment (eq. 13), off while ``overlong_buffer`` is 0.
"""
from __future__ import annotations

from dataclasses import dataclass

from steps.config.models import RewardFormat
from steps.dapo.task import Grade


@dataclass(frozen=True)
class RewardShaping:
    """How a grade becomes a reward: which reading pays, and the overlong punishment."""

    max_tokens: int
    overlong_buffer: int = 0
    overlong_penalty: float = 0.0
    reward_format: RewardFormat = "strict"


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
