"""GRPO group advantages and DAPO's reward shaping: one place for each rule."""
from __future__ import annotations

from typing import Sequence

import numpy as np


def group_advantages(rewards: Sequence[float], std_scaling: bool = False) -> list[float]:
    """Advantage of each sample relative to its group: ``r - mean(r)``.

    With ``std_scaling`` the difference is divided by the group's standard
    deviation (GRPO's original form). Off by default: Dr. GRPO showed the
    division over-weights near-uniform groups, and dynamic sampling already
    drops the zero-variance ones.
    """
    r = np.asarray(rewards, dtype=np.float64)
    adv = r - r.mean()
    if std_scaling:
        std = r.std()
        adv = adv / std if std > 0 else np.zeros_like(adv)
    return adv.tolist()


def is_informative(rewards: Sequence[float]) -> bool:
    """DAPO dynamic sampling keeps a group only if its rewards are not all equal:
    an all-equal group has zero advantage everywhere and contributes no gradient."""
    return len(set(rewards)) > 1


def overlong_penalty(length: int, max_tokens: int, buffer: int, penalty: float) -> float:
    """DAPO soft overlong punishment (eq. 13), scaled by ``penalty``.

    0 up to ``max_tokens - buffer`` tokens, then falling linearly to
    ``-penalty`` at ``max_tokens``. ``buffer == 0`` turns it off.
    """
    if buffer <= 0:
        return 0.0
    start = max_tokens - buffer
    if length <= start:
        return 0.0
    if length >= max_tokens:
        return -penalty
    return -penalty * (length - start) / buffer
