"""How healthy a step's sampled completions are: pure functions of the rollouts (and of the update's output).

The figures a sick RL run shows first, each in the ``train:`` line, ``metrics.jsonl``, MLflow and curves.png;
the guards (below) watch them:

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

**The health guards** stop a sick run the way the generation-batch cap does (a checkpoint, exit 0, never approved).

Each guard is a rule over a step's sampled completions (steps/dapo/health.py) and fires when its condition
holds for ``guard_patience`` consecutive steps; a step whose condition does not hold resets its count. They
judge a step's completions before it trains on them, so a fired guard's run keeps the model of the step
before. Pure: :func:`observe` takes the guards' memory (:class:`GuardState`, carried in the loop state and the
checkpoint, so a resumed run keeps its counts) and one step's figures, and returns the new memory and the
:class:`Trip`, if one fired. When several fire on the same step, the first in :data:`RULES` is named: a
repetition loop runs into ``max_tokens`` too, and its name says more than "truncated".

The rules (thresholds are config keys, documented in config/default.yaml):

- ``entropy_collapse``: the median of the last ``guard_patience`` steps' entropy estimates is below
  ``guard_min_entropy`` nats per token (:func:`recent_entropy`: one noisy step neither stops a run nor resets the
  count); it fires once the window is full, rather than after ``guard_patience`` steps of holding;
- ``repetition_loops``: more than ``guard_max_repetition_frac`` of the completions end in a repeated n-gram loop;
- ``truncation``: more than ``guard_max_truncated_frac`` of the completions were cut off at ``max_tokens``;
- ``format_errors_rising``: the format error rate is at least ``guard_format_error_rise`` above the lowest
  of the run's earlier steps while the sampled (strict) accuracy is at least ``guard_accuracy_drop`` below
  the highest of them.

A step the generation-batch cap stops is named by the first guard whose condition holds on that step, even
before ``guard_patience`` steps (``observe(..., capped=...)``): a collapsed policy writes the same completion
for every sample, so its groups score alike and the cap runs out, and at the local run's own settings that
happens on the first step. Patience is there so that one noisy step does not stop a run that would go on; the
cap stops this one anyway, and the guard says why where the cap's advice (more generation batches) would only
buy more identical groups.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from steps.config import DapoConfig
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


# -- the guards ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Limits:
    """The guards' settings (the ``guard*`` config keys)."""

    enabled: bool = True
    patience: int = 3
    min_entropy: float = 0.02
    max_repetition_frac: float = 0.5
    max_truncated_frac: float = 0.5
    format_error_rise: float = 0.2
    accuracy_drop: float = 0.05

    @classmethod
    def from_config(cls, cfg: DapoConfig) -> "Limits":
        return cls(cfg.guards, cfg.guard_patience, cfg.guard_min_entropy, cfg.guard_max_repetition_frac,
                   cfg.guard_max_truncated_frac, cfg.guard_format_error_rise, cfg.guard_accuracy_drop)


@dataclass(frozen=True)
class GuardState:
    """What the guards remember between steps: each rule's run of consecutive steps, and the run's extremes
    that "rising" and "falling" are measured from."""

    streaks: Mapping[str, int] = field(default_factory=dict, hash=False)
    best_accuracy: float | None = None
    lowest_format_error: float | None = None
    entropy_window: tuple[float, ...] = ()  # the last guard_patience steps' entropy estimates (measured ones)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any] | None) -> "GuardState":
        raw = raw or {}
        return cls(dict(raw.get("streaks") or {}), raw.get("best_accuracy"), raw.get("lowest_format_error"),
                   tuple(raw.get("entropy_window") or ()))


@dataclass(frozen=True)
class Trip:
    guard: str
    reason: str


#: (figures, memory before this step, limits) -> whether the rule's condition holds this step.
Condition = Callable[[Mapping[str, float], GuardState, Limits], bool]
#: (figures, memory before this step, limits) -> what was seen, for the stop reason.
Explain = Callable[[Mapping[str, float], GuardState, Limits], str]


@dataclass(frozen=True)
class Rule:
    name: str
    holds: Condition
    explain: Explain
    advice: str
    # Its condition already spans guard_patience steps (a figure over a window of them): it fires as soon as it
    # holds over a full window, rather than after guard_patience consecutive steps of holding.
    windowed: bool = False


def _below(value: float, limit: float) -> bool:
    return not math.isnan(value) and value < limit  # NaN: not measured, never sick


def _above(value: float, limit: float) -> bool:
    return not math.isnan(value) and value > limit


def _window(f: Mapping[str, float], memory: GuardState, limits: Limits) -> tuple[float, ...]:
    """This step's entropy estimate after the earlier ones, the last ``patience`` of them (NaN: not measured)."""
    latest = () if math.isnan(f["entropy"]) else (f["entropy"],)
    return (memory.entropy_window + latest)[-max(1, limits.patience):]


def recent_entropy(f: Mapping[str, float], memory: GuardState, limits: Limits) -> float:
    """What ``entropy_collapse`` judges: the median of the last ``patience`` steps' estimates (fewer early in a
    run), NaN if this step's was not measured.

    Why not each step's own estimate: near collapse it is the mean of -log p over the sampled tokens, almost all
    ~0, so the one rare token a step happens to draw (-log p of 5 to 10 nats) moves it across the threshold. An
    independent check of the toy at temperature 0.03 read 0.0027, 0.0268, 0.0026 on three steps: the middle one
    reset a count of consecutive steps. Such noise only ever lifts the estimate, and the median ignores a lifted
    step among three; a healthy policy's estimates (about 1 nat for the toy) are nowhere near the threshold.
    """
    if math.isnan(f["entropy"]):
        return math.nan
    return float(statistics.median(_window(f, memory, limits)))


def _entropy_collapsed(f: Mapping[str, float], memory: GuardState, limits: Limits) -> bool:
    return _below(recent_entropy(f, memory, limits), limits.min_entropy)


def _entropy_explained(f: Mapping[str, float], memory: GuardState, limits: Limits) -> str:
    window = _window(f, memory, limits)
    over = (f" (the median of the last {len(window)} steps' estimates: {', '.join(f'{e:.4f}' for e in window)})"
            if len(window) > 1 else "")
    return (f"the entropy estimate (the sampled tokens' mean negative log-probability) is "
            f"{recent_entropy(f, memory, limits):.4f} nats per token{over}, below "
            f"guard_min_entropy={limits.min_entropy:g}")


def _format_errors_rising(f: Mapping[str, float], memory: GuardState, limits: Limits) -> bool:
    if memory.best_accuracy is None or memory.lowest_format_error is None:
        return False  # the run's first step: nothing to rise or fall from
    return (f["format_error_rate"] - memory.lowest_format_error >= limits.format_error_rise
            and memory.best_accuracy - f["accuracy"] >= limits.accuracy_drop)


RULES: tuple[Rule, ...] = (
    Rule("entropy_collapse",
         _entropy_collapsed,
         _entropy_explained,
         "The policy writes nearly the same completion every time, so groups stop differing and nothing is "
         "learned: lower learning_rate, raise clip_high_threshold (DAPO's clip-higher keeps entropy up), or "
         "check that temperature is 1.",
         windowed=True),
    Rule("repetition_loops",
         lambda f, m, lim: _above(f["repetition_frac"], lim.max_repetition_frac),
         lambda f, m, lim: f"{f['repetition_frac']:.0%} of the sampled completions end in a repeated n-gram loop, "
                           f"more than guard_max_repetition_frac={lim.max_repetition_frac:g}",
         "The policy has degenerated into repeating itself (a known failure of LoRA RL runs): lower "
         "learning_rate or lora_rank, or start again from an earlier checkpoint's model package."),
    Rule("truncation",
         lambda f, m, lim: _above(f["truncated_frac"], lim.max_truncated_frac),
         lambda f, m, lim: f"{f['truncated_frac']:.0%} of the sampled completions were cut off at max_tokens, "
                           f"more than guard_max_truncated_frac={lim.max_truncated_frac:g}",
         "Cut-off completions earn nothing (overlong_filtering masks them), so most of the sampling is wasted: "
         "raise max_tokens, turn the model's thinking off (session.chat_template_kwargs), or set "
         "overlong_buffer so that length is punished before the cut."),
    Rule("format_errors_rising",
         _format_errors_rising,
         lambda f, m, lim: f"the format error rate is {f['format_error_rate']:.2f}, at least "
                           f"guard_format_error_rise={lim.format_error_rise:g} above the run's lowest "
                           f"({m.lowest_format_error:.2f}), while the sampled accuracy is {f['accuracy']:.2f}, at "
                           f"least guard_accuracy_drop={lim.accuracy_drop:g} below the run's best "
                           f"({m.best_accuracy:.2f})",
         "The policy is abandoning the instructed answer form and getting less right: check the reward "
         "(reward_format, the grader) for a hack, lower learning_rate, or start again from an earlier "
         "checkpoint's model package."),
)
GUARDS = tuple(rule.name for rule in RULES)


def observe(memory: GuardState, figures: Mapping[str, float], limits: Limits, step: int, capped: str | None = None,
            stopped_by: str = "the step the generation-batch cap stopped") -> tuple[GuardState, Trip | None]:
    """One step's verdict: the guards' new memory, and the guard that fired (None: none did).

    ``figures``: the step's sampled completions' ``entropy``, ``repetition_frac``, ``truncated_frac``,
    ``format_error_rate`` and ``accuracy`` (steps/dapo/health.py); ``step``: the optimizer step they were
    sampled for, named in the reason. ``capped``: the generation-batch cap stopped this step, for this reason
    (what it saw); then the first guard whose condition holds this step fires, whatever its count (the module
    docstring says why), and its reason names the cap's too. ``stopped_by``: what stopped the step so (the cap, or
    the forecast before step 1).
    """
    if not limits.enabled:
        return memory, None
    streaks = {rule.name: memory.streaks.get(rule.name, 0) + 1 if rule.holds(figures, memory, limits) else 0
               for rule in RULES}
    window = _window(figures, memory, limits)

    def due(rule: Rule) -> bool:
        if capped or (rule.windowed and len(window) >= limits.patience):
            return streaks[rule.name] >= 1
        return streaks[rule.name] >= limits.patience

    fired = next((rule for rule in RULES if due(rule)), None)
    new = replace(memory, streaks=streaks,
                  best_accuracy=_extreme(max, memory.best_accuracy, figures["accuracy"]),
                  lowest_format_error=_extreme(min, memory.lowest_format_error, figures["format_error_rate"]),
                  entropy_window=window)
    if fired is None:
        return new, None
    seen = fired.explain(figures, memory, limits)
    count = streaks[fired.name]
    if fired.windowed and len(window) >= limits.patience:
        steps = f"the last {len(window)} steps" if len(window) > 1 else "this step"
        when = f"over {steps} (guard_patience={limits.patience})"
    elif count >= limits.patience:
        when = f"for {count} consecutive steps (guard_patience={limits.patience})"
    else:
        when = f"on {stopped_by}, which is its symptom: {capped}"
    reason = (f"health guard {fired.name} at step {step}: {seen}, {when}. Training stops here with the model of "
              f"step {step - 1}, which is never approved. {fired.advice} "
              "(Set guards: false to turn the guards off, or a guard_* key to change a threshold.)")
    return new, Trip(fired.name, reason)


def _extreme(pick: Callable[[float, float], float], known: float | None, value: float) -> float | None:
    if math.isnan(value):
        return known
    return value if known is None else pick(known, value)
