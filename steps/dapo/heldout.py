"""Greedy accuracy on held-out questions: in-training evaluation and the EvaluateModel step share it.

Each answer is graded both ways by the run's task (steps/dapo/task.py): ``accuracy`` is the
strict one (for GSM8K only '#### N' or '\\boxed{N}' in the answer region counts),
``accuracy_lenient`` also takes an answer found otherwise ("the answer is N", the last number
there), and ``format_error_rate`` is the share of answers committed in no instructed form
(failed requests included).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from sagemaker.train.training_session import SamplingParams

from steps.dapo.reward import RewardShaping
from steps.dapo.sampling import GroupSampler
from steps.dapo.task import Example, Task


@dataclass(frozen=True)
class Prediction:
    question: str
    gold: str
    extracted: str | None
    correct: bool  # strict
    correct_lenient: bool
    formatted: bool
    completion: str  # as the grader read it: special tokens kept
    stop_reason: str  # "stop", "length" (cut off at max_tokens), or "" for a failed request
    failed: bool  # the request failed after retries: counted as wrong


@dataclass(frozen=True)
class EvalResult:
    accuracy: float
    accuracy_lenient: float
    format_error_rate: float
    n: int
    failed: int
    predictions: tuple[Prediction, ...]


def evaluate_greedy(client: Any, task: Task[Any], tokenizer: Any, examples: Sequence[Example], max_tokens: int,
                    sample_retries: int = 2, chat_template_kwargs: Mapping[str, Any] | None = None) -> EvalResult:
    """Temperature-0 answers to every example, all requests in flight at once, each graded once (by the
    sampler, as it is in training: the prediction reuses that grade)."""
    sampler = GroupSampler(
        task=task, tokenizer=tokenizer, examples=examples, group_size=1,
        params=SamplingParams(max_tokens=max_tokens, temperature=0.0),
        shaping=RewardShaping(max_tokens=max_tokens), sample_retries=sample_retries,
        chat_template_kwargs=chat_template_kwargs or {},
    )
    groups = sampler.launch(client, range(len(examples)), seed=None).result()
    predictions = []
    for i, (ex, group) in enumerate(zip(examples, groups)):
        if group is None:
            predictions.append(Prediction(ex.question, ex.gold, None, False, False, False, "", "", True))
            continue
        answer = group.rollouts[0]
        text = sampler.text(i, answer.tokens)
        predictions.append(Prediction(ex.question, ex.gold, answer.grade.extracted, answer.grade.correct,
                                      answer.grade.correct_lenient, answer.grade.formatted, text,
                                      answer.stop_reason, False))
    n = len(predictions)
    return EvalResult(
        accuracy=sum(p.correct for p in predictions) / n if n else 0.0,
        accuracy_lenient=sum(p.correct_lenient for p in predictions) / n if n else 0.0,
        format_error_rate=sum(not p.formatted for p in predictions) / n if n else 0.0,
        n=n,
        failed=sum(p.failed for p in predictions),
        predictions=tuple(predictions),
    )
