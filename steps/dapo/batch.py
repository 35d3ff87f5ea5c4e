"""From kept groups to training datums: pure functions, like tinker-cookbook's ``rl/data_processing.py``.

1. Group advantages: each sample's reward relative to its group.
2. Overlong masking: a completion cut off at ``max_tokens`` was cut, not wrong, so it teaches nothing.
3. Datums in the tinker-cookbook layout. For ``prompt + completion`` the model sees every token but
   the last (``model_input``) and is scored on the sequence shifted by one (``target_tokens``).
   Positions predicting a prompt token carry weight 0, advantage 0 and logprob 0; positions predicting a
   completion token carry the sample's weight, its (scaled) advantage and the sampler's logprob.

Datums are built as the wire dicts ``forward_backward`` accepts as-is (the SDK's "raw datum dicts"; it
still checks lengths and required keys). Typed ``Datum``/``TensorData`` objects would be turned straight
back into these dicts and cost four times the CPU (``make bench``, client overhead).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from steps.dapo.sampling import Group


@dataclass(frozen=True)
class TrainSample:
    """One completion ready to train on."""

    prompt: tuple[int, ...]
    completion: tuple[int, ...]
    sampling_logprobs: tuple[float, ...]
    advantage: float
    weight: float = 1.0  # 0 masks the sample (overlong filtering)


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


def train_samples(groups: Sequence[Group], std_scaling: bool, overlong_filtering: bool) -> list[TrainSample]:
    out = []
    for g in groups:
        for r, adv in zip(g.rollouts, group_advantages(g.rewards, std_scaling)):
            weight = 0.0 if (overlong_filtering and r.stop_reason == "length") else 1.0
            out.append(TrainSample(g.prompt, r.tokens, r.logprobs, adv, weight))
    return out


def token_scales(samples: Sequence[TrainSample], aggregation: str) -> list[float]:
    """Per-sample multiplier on the advantage that fixes how tokens are weighted.

    The service sums the loss over tokens, so every token already counts the
    same (DAPO's token-level loss). ``token`` keeps that and divides by the
    batch's trained-token count, one constant, so the loss reads as a token
    mean. ``sequence`` divides each sample by its own length and by the number
    of samples: GRPO's original per-sample mean, where a long completion's
    tokens count less.
    """
    lengths = [len(s.completion) for s in samples]
    if aggregation == "token":
        total = sum(n for n, s in zip(lengths, samples) if s.weight > 0) or 1
        return [1.0 / total] * len(samples)
    if aggregation == "sequence":
        count = sum(1 for s in samples if s.weight > 0) or 1
        return [1.0 / (max(n, 1) * count) for n in lengths]
    raise ValueError(f"unknown loss_aggregation {aggregation!r} (use 'token' or 'sequence')")


def build_datum(sample: TrainSample, scale: float = 1.0) -> dict[str, Any]:
    """Lay one sample out as a datum for an RL loss (ppo / importance_sampling / cispo)."""
    if len(sample.sampling_logprobs) != len(sample.completion):
        raise ValueError(
            f"sample has {len(sample.completion)} completion tokens but "
            f"{len(sample.sampling_logprobs)} sampling logprobs"
        )
    tokens = [*sample.prompt, *sample.completion]
    zeros = [0.0] * (len(sample.prompt) - 1)  # positions predicting prompt tokens
    n = len(sample.completion)
    return {
        "modelInput": {"chunks": [{"tokens": tokens[:-1], "type": "encoded_text"}]},
        "lossFnInputs": {
            "target_tokens": {"data": tokens[1:], "dtype": "int64"},
            "weights": {"data": zeros + [sample.weight] * n, "dtype": "float32"},
            "advantages": {"data": zeros + [sample.advantage * scale] * n, "dtype": "float32"},
            "logprobs": {"data": zeros + [float(x) for x in sample.sampling_logprobs], "dtype": "float32"},
        },
    }


def build_datums(samples: Sequence[TrainSample], aggregation: str) -> list[dict[str, Any]]:
    scales = token_scales(samples, aggregation)
    return [build_datum(s, c) for s, c in zip(samples, scales)]
