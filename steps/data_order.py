"""A seeded, resumable order over the training prompts.

Each epoch is a fresh permutation drawn from ``(seed, epoch)``, so the whole
order is a pure function of the seed and a resume needs only the position
``(epoch, offset)``: no RNG state to pickle, and no prompt seen twice in an epoch.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DataPosition:
    epoch: int = 0
    offset: int = 0


def _permutation(n: int, seed: int, epoch: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch]).permutation(n)


def take(n_examples: int, count: int, seed: int, pos: DataPosition) -> tuple[list[int], DataPosition]:
    """The next ``count`` example indices from ``pos``, wrapping into new epochs."""
    if n_examples < 1:
        raise ValueError("no training examples")
    out: list[int] = []
    epoch, offset = pos.epoch, pos.offset
    while len(out) < count:
        perm = _permutation(n_examples, seed, epoch)
        chunk = perm[offset : offset + count - len(out)]
        out.extend(int(i) for i in chunk)
        offset += len(chunk)
        if offset >= n_examples:
            epoch, offset = epoch + 1, 0
    return out, DataPosition(epoch, offset)
