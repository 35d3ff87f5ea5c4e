"""Accuracy on held-out questions: in-training evaluation and the EvaluateModel step share it.

Greedy answers (temperature 0) give the accuracies. Each answer is graded both ways by the run's task
(steps/dapo/task.py): ``accuracy`` is the strict one (for GSM8K only '#### N' or '\\boxed{N}' in the
answer region counts), ``accuracy_lenient`` also takes an answer found otherwise ("the answer is N",
the last number there), and ``format_error_rate`` is the share of answers committed in no instructed
form (failed requests included).

With ``k`` > 0, k more answers per question are sampled at the training temperature (one request of k
samples per question, seeded): pass@k (some answer of k is right, Chen et al. 2021's estimator),
pass@1 (the sampled accuracy the training reward tracks) and maj@k (the majority answer is right;
steps/dapo/stats.py says how ties and missing answers count). Every request of an evaluation is on
the service before any result is awaited: :func:`launch` submits, :meth:`PendingEval.result` waits.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping, Sequence

from sagemaker.train.training_session import SamplingParams

from steps.dapo import stats
from steps.dapo.sampling import GenerationBatch, GroupSampler, RewardShaping
from steps.dapo.task import Example, Task
from steps.platform.billing import TokenMeter


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
    reward: float = 0.0  # the training reward of this answer (strict unless reward_format says lenient)


@dataclass(frozen=True)
class Sampled:
    """``k`` answers per question at ``temperature``: how many were right, and the majority's score."""

    k: int
    temperature: float
    correct: tuple[int, ...]  # strictly right answers among each question's k
    majority: tuple[float, ...]  # each question's maj@k score (stats.majority_score)
    failed: int  # questions whose request failed after retries: none of their answers right, no vote
    # Each question's k answers, graded (a failed request: k failed, wrong answers), so the figures above can be
    # recomputed from the files EvaluateModel writes (samples.jsonl); empty where only the counts were made.
    answers: tuple[tuple[Prediction, ...], ...] = ()

    @classmethod
    def of(cls, k: int, temperature: float, answers: Sequence[Sequence[Prediction]]) -> "Sampled":
        """The counts from each question's graded answers. Only answers committed in the instructed form vote
        (the strict reading, as accuracy is strict): an unformatted or missing answer abstains."""
        return cls(k, temperature, tuple(sum(a.correct for a in group) for group in answers),
                   tuple(stats.majority_score((a.extracted if a.formatted else None, a.correct) for a in group)
                         for group in answers),
                   sum(all(a.failed for a in group) for group in answers), tuple(tuple(g) for g in answers))

    def _mean(self, values: Sequence[float]) -> float:
        return sum(values) / len(values) if values else 0.0

    @property
    def pass_at_k(self) -> float:
        return self._mean([stats.pass_at_k(self.k, c, self.k) for c in self.correct])

    @property
    def pass_at_1(self) -> float:
        return self._mean([stats.pass_at_k(self.k, c, 1) for c in self.correct])

    @property
    def maj_at_k(self) -> float:
        return self._mean(self.majority)


@dataclass(frozen=True)
class EvalResult:
    accuracy: float
    accuracy_lenient: float
    format_error_rate: float
    n: int
    failed: int
    predictions: tuple[Prediction, ...]
    sampled: Sampled | None = None  # with k > 0


@dataclass(frozen=True)
class PendingEval:
    """An evaluation whose requests are all submitted; :meth:`result` waits for them and grades."""

    examples: Sequence[Example]
    greedy: tuple[GroupSampler, GenerationBatch]
    sampled: tuple[GroupSampler, GenerationBatch] | None

    def result(self) -> EvalResult:
        return graded(_predictions(*self.greedy, self.examples),
                      None if self.sampled is None else _sampled(*self.sampled, self.examples))


def graded(predictions: Sequence[Prediction], sampled: Sampled | None = None) -> EvalResult:
    """An evaluation's figures from its graded greedy answers (and its sampled ones)."""
    n = len(predictions)
    return EvalResult(
        accuracy=sum(p.correct for p in predictions) / n if n else 0.0,
        accuracy_lenient=sum(p.correct_lenient for p in predictions) / n if n else 0.0,
        format_error_rate=sum(not p.formatted for p in predictions) / n if n else 0.0,
        n=n,
        failed=sum(p.failed for p in predictions),
        predictions=tuple(predictions),
        sampled=sampled,
    )


def launch(client: Any, task: Task[Any], tokenizer: Any, examples: Sequence[Example], max_tokens: int,
           sample_retries: int = 2, chat_template_kwargs: Mapping[str, Any] | None = None, *,
           k: int = 0, temperature: float = 1.0, seed: int = 0,
           shaping: RewardShaping | None = None, meter: TokenMeter | None = None) -> PendingEval:
    """Submit a greedy request per example, and with ``k`` > 0 a request of ``k`` samples at ``temperature``
    (seeded from ``seed``: two models evaluated with one seed draw with the same random numbers).
    ``shaping`` turns grades into the rewards reported beside the answers (default: strict, no overlong
    punishment); ``meter`` counts the billable tokens of every request that completes."""
    shaping = shaping or RewardShaping(max_tokens=max_tokens)

    def sampler(group_size: int, temp: float) -> GroupSampler:
        return GroupSampler(task=task, tokenizer=tokenizer, examples=examples, group_size=group_size,
                            params=SamplingParams(max_tokens=max_tokens, temperature=temp), shaping=shaping,
                            sample_retries=sample_retries, chat_template_kwargs=chat_template_kwargs or {},
                            meter=meter)

    indices = range(len(examples))
    greedy = sampler(1, 0.0)
    pending_greedy = (greedy, greedy.launch(client, indices, seed=None))
    pending_sampled = None
    if k:
        sampled = sampler(k, temperature)
        pending_sampled = (sampled, sampled.launch(client, indices, seed=seed))
    return PendingEval(examples, pending_greedy, pending_sampled)


def evaluate_greedy(client: Any, task: Task[Any], tokenizer: Any, examples: Sequence[Example], max_tokens: int,
                    sample_retries: int = 2, chat_template_kwargs: Mapping[str, Any] | None = None, *,
                    shaping: RewardShaping | None = None, meter: TokenMeter | None = None) -> EvalResult:
    """Temperature-0 answers to every example, all requests in flight at once, each graded once (by the
    sampler, as it is in training: the prediction reuses that grade)."""
    return launch(client, task, tokenizer, examples, max_tokens, sample_retries, chat_template_kwargs,
                  shaping=shaping, meter=meter).result()


def _answers(sampler: GroupSampler, batch: GenerationBatch, examples: Sequence[Example]) -> list[list[Prediction]]:
    """Each example's graded answers (``group_size`` of them); a failed request's: that many failed, wrong ones."""
    answers = []
    for i, (ex, group) in enumerate(zip(examples, batch.result())):
        if group is None:
            answers.append([Prediction(ex.question, ex.gold, None, False, False, False, "", "", True)]
                           * sampler.group_size)
            continue
        answers.append([Prediction(ex.question, ex.gold, r.grade.extracted, r.grade.correct, r.grade.correct_lenient,
                                   r.grade.formatted, sampler.text(i, r.tokens), r.stop_reason, False, r.reward)
                        for r in group.rollouts])
    return answers


def _predictions(sampler: GroupSampler, batch: GenerationBatch, examples: Sequence[Example]) -> list[Prediction]:
    return [group[0] for group in _answers(sampler, batch, examples)]


def _sampled(sampler: GroupSampler, batch: GenerationBatch, examples: Sequence[Example]) -> Sampled:
    """pass@k's and maj@k's counts, and the answers they count."""
    return Sampled.of(sampler.group_size, sampler.params.temperature, _answers(sampler, batch, examples))


# -- the answers as files: every figure of an evaluation can be recomputed from them ---------------------------------
def greedy_rows(result: EvalResult) -> list[dict[str, Any]]:
    """One row per question, in the evaluated order: ``index`` (the question's position among the evaluated
    ones, the same for both models), then the graded answer's fields (:class:`Prediction`)."""
    return [{"index": i, **asdict(p)} for i, p in enumerate(result.predictions)]


def sample_rows(result: EvalResult) -> list[dict[str, Any]]:
    """One row per sampled answer (``k`` per question): ``index``, ``sample`` (0..k-1), ``temperature``, then the
    graded answer's fields. Empty without samples (k = 0)."""
    sampled = result.sampled
    if sampled is None:
        return []
    return [{"index": i, "sample": j, "temperature": sampled.temperature, **asdict(a)}
            for i, group in enumerate(sampled.answers) for j, a in enumerate(group)]


def from_rows(greedy: Sequence[Mapping[str, Any]], samples: Sequence[Mapping[str, Any]]) -> EvalResult:
    """The evaluation those rows record (:func:`greedy_rows`, :func:`sample_rows`): its figures recomputed from
    the graded answers alone. Rows are put in order by ``index`` (and ``sample``); a gap is an error."""
    names = [f.name for f in fields(Prediction)]

    def answer(row: Mapping[str, Any]) -> Prediction:
        return Prediction(**{name: row[name] for name in names if name in row})

    ordered = sorted(greedy, key=lambda r: r["index"])
    if [r["index"] for r in ordered] != list(range(len(ordered))):
        raise ValueError("the greedy answers' index is not 0..n-1 without gaps")
    if not samples:
        return graded([answer(r) for r in ordered])
    groups: dict[int, list[Mapping[str, Any]]] = {}
    for row in sorted(samples, key=lambda r: (r["index"], r["sample"])):
        groups.setdefault(row["index"], []).append(row)
    k = len(groups.get(0, ()))
    if sorted(groups) != list(range(len(ordered))) or any(len(g) != k for g in groups.values()):
        raise ValueError(f"the sampled answers are not k={k} per question for each of the {len(ordered)} questions")
    answers = [[answer(r) for r in groups[i]] for i in range(len(ordered))]
    return graded([answer(r) for r in ordered], Sampled.of(k, float(samples[0]["temperature"]), answers))
