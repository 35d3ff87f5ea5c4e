"""Greedy accuracy on held-out questions: in-training evaluation and the EvaluateModel step share it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from sagemaker.train.training_session import SamplingParams

from steps.dapo.sampling import GroupSampler
from steps.gsm8k.data import Example
from steps.gsm8k.reward import RewardShaping


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


def evaluate_greedy(client: Any, tokenizer: Any, examples: Sequence[Example], max_tokens: int,
                    retries: int = 2) -> EvalResult:
    """Temperature-0 answers to every example, all requests in flight at once, each graded once."""
    sampler = GroupSampler(
        tokenizer=tokenizer, examples=examples, group_size=1,
        params=SamplingParams(max_tokens=max_tokens, temperature=0.0),
        shaping=RewardShaping(max_tokens=max_tokens), retries=retries,
    )
    groups = sampler.launch(client, range(len(examples)), seed=None).result()
    predictions = []
    for ex, group in zip(examples, groups):
        if group is None:
            predictions.append(Prediction(ex.question, ex.gold, None, False, False, "", True))
            continue
        answer = group.rollouts[0]
        text = tokenizer.decode(list(answer.tokens), skip_special_tokens=True)
        predictions.append(Prediction(ex.question, ex.gold, answer.grade.extracted, answer.grade.correct,
                                      answer.grade.formatted, text, False))
    n = len(predictions)
    return EvalResult(
        accuracy=sum(p.correct for p in predictions) / n if n else 0.0,
        format_error_rate=sum(not p.formatted for p in predictions) / n if n else 0.0,
        n=n,
        failed=sum(p.failed for p in predictions),
        predictions=tuple(predictions),
    )
