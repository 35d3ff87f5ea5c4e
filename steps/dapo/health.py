"""How healthy a step's sampled completions are: pure functions of the rollouts (and of the update's output).

The figures a sick RL run shows first, each in the ``train:`` line, ``metrics.jsonl``, MLflow and curves.png;
the guards (steps/dapo/guards.py) watch them:

- ``entropy``: the mean negative log-probability of the sampled tokens under the distribution they were
  sampled from (the sampler's logprobs), nats per token: a Monte Carlo estimate of the policy's per-token
  entropy. Near 0, the policy writes the same thing every time (entropy collapse). It is a mean per token, not
  a sum, yet it is not bounded by ln(vocabulary size) as the entropy itself is (ln 201 = 5.30 for the toy): it
  estimates the entropy only for tokens drawn from the distribution whose logprobs come back. Tokens written
  by something else score their own -log p, however improbable: the local service's ``loop_rate`` knob
  (local/training_session/sickness.py) splices in a repeated n-gram the toy would never sample and returns
  the toy's logprobs of it, so a looping toy reads ~9 nats per token (a cross-entropy). A real model that
  loops samples its loop itself, with high probability, and its estimate falls instead; either way
  ``repetition_frac`` is what the ``repetition_loops`` guard reads.
- ``sampler_kl``: the mismatch between the sampler's and the trainer's logprobs of the same tokens under the
  same weights: k3 (Schulman's ``(r - 1) - log r`` with ``r = p_trainer / p_sampler``), an unbiased estimate
  of KL(sampler || trainer) per trained token. Large, and the PPO ratio measures the engines' disagreement
  rather than the update. It needs per-token logprobs in the loss's outputs (``lossFnOutputs[i].logprobs``):
  the local service returns them for every loss, as tinker does; the real service's
  ``ForwardBackwardOutput.loss_fn_outputs`` documents only ``actor/*`` diagnostics. Where it cannot be measured
  (no such logprobs; or a step that trained only on groups earlier weights drew, e.g. one filled by the
  previous step's surplus, whose logprobs differ from the trainer's by a step of training too) it is left
  out: no ``sampler_kl`` in the train line or the record, and ``sampler_kl_note`` in metrics.jsonl saying
  why. Never a NaN, never a made-up 0.
- ``completion_tokens_p50``/``_p95``/``_max``: completion lengths (numpy's linear-interpolated percentiles);
  the share cut off at ``max_tokens`` is ``truncated_frac`` (steps/dapo/metrics.py).
- ``repetition_frac``: the share of completions ending in a repeated n-gram loop (:func:`ends_in_loop`).
- ``format_error_rate``: the share without an answer in the instructed form (the task's ``Grade.formatted``).

:func:`health_figures` also gives the sampled (strict) ``accuracy`` and ``truncated_frac``, the same figures
``metrics.train_figures`` logs, because the guards judge a step's completions before it trains on them.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from steps.dapo.batch import TrainSample
from steps.dapo.sampling import Group, Rollout, StepBatch

#: A completion "ends in a loop" when, for some period p in 1..LOOP_MAX_PERIOD, its last
#: max(LOOP_MIN_REPEATS * p, LOOP_MIN_TOKENS) tokens are one p-token block repeated: at least
#: LOOP_MIN_REPEATS times, and over at least LOOP_MIN_TOKENS tokens (so "0 0 0" in a number is no loop).
LOOP_MAX_PERIOD = 32
LOOP_MIN_REPEATS = 3
LOOP_MIN_TOKENS = 24


def ends_in_loop(tokens: Sequence[int], stopped: bool = False) -> bool:
    """Whether a completion ends in a repeated n-gram loop (the definition above). ``stopped``: it ended
    itself (stop reason "stop"), so its last token is the end-of-turn token, which is left out."""
    t = tuple(tokens[:-1] if stopped else tokens)
    for p in range(1, LOOP_MAX_PERIOD + 1):
        n = max(LOOP_MIN_REPEATS * p, LOOP_MIN_TOKENS)
        if len(t) < n:
            break
        tail = t[-n:]
        if tail[p:] == tail[:-p]:  # t[i] == t[i + p] throughout: period p
            return True
    return False


def health_figures(rollouts: Sequence[Rollout]) -> dict[str, float]:
    """The sampled completions' health (everything but ``sampler_kl``, which needs the update's output), with
    their accuracy and truncated share."""
    n = len(rollouts)
    if not n:
        return {k: math.nan for k in ("entropy", "completion_tokens_p50", "completion_tokens_p95",
                                       "completion_tokens_max", "repetition_frac", "format_error_rate",
                                       "truncated_frac", "accuracy")}
    # Only rollouts whose sampler returned a logprob per token count towards the entropy.
    scored = [r for r in rollouts if r.tokens and len(r.logprobs) == len(r.tokens)]
    n_tokens = sum(len(r.tokens) for r in scored)
    lengths = np.array([len(r.tokens) for r in rollouts], dtype=np.float64)
    p50, p95 = np.percentile(lengths, [50, 95])
    return {
        "entropy": -sum(sum(r.logprobs) for r in scored) / n_tokens if n_tokens else math.nan,
        "completion_tokens_p50": float(p50),
        "completion_tokens_p95": float(p95),
        "completion_tokens_max": int(lengths.max()),
        "repetition_frac": sum(ends_in_loop(r.tokens, r.stop_reason == "stop") for r in rollouts) / n,
        "format_error_rate": sum(not r.grade.formatted for r in rollouts) / n,
        "truncated_frac": sum(r.stop_reason == "length" for r in rollouts) / n,
        "accuracy": sum(r.grade.correct for r in rollouts) / n,
    }


def step_rollouts(batch: StepBatch) -> list[Rollout]:
    """The rollouts a step's figures describe: those sampled this step, or, for a step filled entirely by
    carried groups, the ones it trains on (as ``metrics.train_figures`` does)."""
    return [r for g in (batch.sampled or batch.kept) for r in g.rollouts]


def drawn_by(groups: Sequence[Group], step: int) -> list[bool]:
    """Per sample of ``groups`` (in ``batch.train_samples``' order), whether the weights of optimizer step
    ``step`` sampled it."""
    return [g.sampler_step == step for g in groups for _ in g.rollouts]


def _tensor(value: Any) -> list[float] | None:
    """A loss output as a list: the wire's TensorData ``{"data": [...]}`` or a bare list."""
    if isinstance(value, Mapping):
        value = value.get("data")
    return list(value) if isinstance(value, (list, tuple)) else None


NO_LOGPROBS = "the loss's outputs carry no per-token logprobs (this service returns none for this loss)"
ONLY_OLDER = ("every group this step trained on was sampled by earlier weights (an earlier step's surplus or spare "
              "generation batches), whose logprobs differ from the trainer's by the training since, not only by "
              "the engines")


def sampler_kl(samples: Sequence[TrainSample], on_policy: Sequence[bool],
               loss_fn_outputs: Sequence[Mapping[str, Any]] | None) -> dict[str, Any]:
    """``{"sampler_kl": k3}``, the estimate of KL(sampler || trainer) per trained token (see the module docstring),
    or, where it cannot be measured, ``{"sampler_kl_note": why}``.

    ``samples`` are the update's datums in order (``build_datums`` keeps it), ``on_policy[i]`` whether sample
    i was drawn by the weights the update starts from: only those count (a carried group's logprobs differ
    from the trainer's by a step of training too, not only by the engines). Completion tokens with weight > 0
    only: those the loss trains on.
    """
    if not loss_fn_outputs or len(loss_fn_outputs) != len(samples):
        return {"sampler_kl_note": NO_LOGPROBS}
    sampled: list[float] = []
    trained: list[float] = []
    for sample, fresh, output in zip(samples, on_policy, loss_fn_outputs):
        logprobs = _tensor(output.get("logprobs")) if isinstance(output, Mapping) else None
        if logprobs is None:
            return {"sampler_kl_note": NO_LOGPROBS}
        n = len(sample.completion)
        if not fresh or sample.weight <= 0 or n == 0 or len(logprobs) < n:
            continue
        sampled.extend(sample.sampling_logprobs)
        trained.extend(logprobs[-n:])  # the datum's last n positions predict the completion's tokens
    if not sampled:
        return {"sampler_kl_note": ONLY_OLDER if not any(on_policy) else
                "no completion token of the samples the step's own weights drew has a weight in the loss"}
    log_ratio = np.asarray(trained, dtype=np.float64) - np.asarray(sampled, dtype=np.float64)
    with np.errstate(over="ignore"):
        return {"sampler_kl": float(np.mean(np.expm1(log_ratio) - log_ratio))}
