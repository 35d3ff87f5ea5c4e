"""Greedy evaluation on held-out questions, shared by in-training eval and EvaluateModel."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from sagemaker.train.training_session import SamplingParams

from steps.data import Example
from steps.rollouts import GroupSampler, RewardShaping


@dataclass(frozen=True)
class Prediction:
    question: str
    gold: str
    extracted: str | None
    correct: bool
    formatted: bool
    completion: str
    failed: bool  # the request failed after retries: counted as wrong


@dataclass(frozen=True)
class EvalResult:
    accuracy: float
    format_error_rate: float
    n: int
    failed: int
    predictions: tuple[Prediction, ...]


def evaluate_greedy(client: Any, tokenizer: Any, examples: Sequence[Example], max_tokens: int, retries: int = 2) -> EvalResult:
    """Temperature-0 answers to every example, all requests in flight at once."""
    from steps import gsm8k

    sampler = GroupSampler(
        tokenizer=tokenizer, examples=examples, group_size=1,
        params=SamplingParams(max_tokens=max_tokens, temperature=0.0),
        shaping=RewardShaping(max_tokens=max_tokens), retries=retries,
    )
    indices = list(range(len(examples)))
    groups = sampler.collect(client, indices, sampler.submit(client, indices, seed=None), seed=None)
    predictions = []
    for ex, group in zip(examples, groups):
        if group is None:
            predictions.append(Prediction(ex.question, ex.gold, None, False, False, "", True))
            continue
        text = tokenizer.decode(list(group.rollouts[0].tokens), skip_special_tokens=True)
        g = gsm8k.grade(text, ex.gold)
        predictions.append(Prediction(ex.question, ex.gold, g.extracted, g.correct, g.formatted, text, False))
    n = len(predictions)
    return EvalResult(
        accuracy=sum(p.correct for p in predictions) / n if n else 0.0,
        format_error_rate=sum(not p.formatted for p in predictions) / n if n else 0.0,
        n=n,
        failed=sum(p.failed for p in predictions),
        predictions=tuple(predictions),
    )
