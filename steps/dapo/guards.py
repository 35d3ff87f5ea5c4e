"""Health guards: stop a sick run the way the generation-batch cap does (a checkpoint, exit 0, never approved).

Each guard is a rule over a step's sampled completions (steps/dapo/health.py) and fires when its condition
holds for ``guard_patience`` consecutive steps; a step whose condition does not hold resets its count. They
judge a step's completions before it trains on them, so a fired guard's run keeps the model of the step
before. Pure: :func:`observe` takes the guards' memory (:class:`GuardState`, carried in the loop state and the
checkpoint, so a resumed run keeps its counts) and one step's figures, and returns the new memory and the
:class:`Trip`, if one fired. When several fire on the same step, the first in :data:`RULES` is named: a
repetition loop runs into ``max_tokens`` too, and its name says more than "truncated".

The rules (thresholds are config keys, documented in config/default.yaml):

- ``entropy_collapse``: the entropy estimate is below ``guard_min_entropy`` nats per token;
- ``repetition_loops``: more than ``guard_max_repetition_frac`` of the completions end in a repeated n-gram loop;
- ``truncation``: more than ``guard_max_truncated_frac`` of the completions were cut off at ``max_tokens``;
- ``format_errors_rising``: the format error rate is at least ``guard_format_error_rise`` above the lowest
  of the run's earlier steps while the sampled (strict) accuracy is at least ``guard_accuracy_drop`` below
  the highest of them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

from steps.config import DapoConfig


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

    @classmethod
    def from_json(cls, raw: Mapping[str, Any] | None) -> "GuardState":
        raw = raw or {}
        return cls(dict(raw.get("streaks") or {}), raw.get("best_accuracy"), raw.get("lowest_format_error"))


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


def _below(value: float, limit: float) -> bool:
    return not math.isnan(value) and value < limit  # NaN: not measured, never sick


def _above(value: float, limit: float) -> bool:
    return not math.isnan(value) and value > limit


def _format_errors_rising(f: Mapping[str, float], memory: GuardState, limits: Limits) -> bool:
    if memory.best_accuracy is None or memory.lowest_format_error is None:
        return False  # the run's first step: nothing to rise or fall from
    return (f["format_error_rate"] - memory.lowest_format_error >= limits.format_error_rise
            and memory.best_accuracy - f["accuracy"] >= limits.accuracy_drop)


RULES: tuple[Rule, ...] = (
    Rule("entropy_collapse",
         lambda f, m, lim: _below(f["entropy"], lim.min_entropy),
         lambda f, m, lim: f"the entropy estimate (the sampled tokens' mean negative log-probability) is "
                           f"{f['entropy']:.4f} nats per token, below guard_min_entropy={lim.min_entropy:g}",
         "The policy writes nearly the same completion every time, so groups stop differing and nothing is "
         "learned: lower learning_rate, raise clip_high_threshold (DAPO's clip-higher keeps entropy up), or "
         "check that temperature is 1."),
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


def observe(memory: GuardState, figures: Mapping[str, float], limits: Limits, step: int
            ) -> tuple[GuardState, Trip | None]:
    """One step's verdict: the guards' new memory, and the guard that fired (None: none did).

    ``figures``: the step's sampled completions' ``entropy``, ``repetition_frac``, ``truncated_frac``,
    ``format_error_rate`` and ``accuracy`` (steps/dapo/health.py); ``step``: the optimizer step they were
    sampled for, named in the reason.
    """
    if not limits.enabled:
        return memory, None
    streaks = {rule.name: memory.streaks.get(rule.name, 0) + 1 if rule.holds(figures, memory, limits) else 0
               for rule in RULES}
    fired = next((rule for rule in RULES if streaks[rule.name] >= limits.patience), None)
    new = replace(memory, streaks=streaks,
                  best_accuracy=_extreme(max, memory.best_accuracy, figures["accuracy"]),
                  lowest_format_error=_extreme(min, memory.lowest_format_error, figures["format_error_rate"]))
    if fired is None:
        return new, None
    reason = (f"health guard {fired.name} at step {step}: {fired.explain(figures, memory, limits)}, for "
              f"{streaks[fired.name]} consecutive steps (guard_patience={limits.patience}). Training stops here "
              f"with the model of step {step - 1}, which is never approved. {fired.advice} "
              "(Set guards: false to turn the guards off, or a guard_* key to change a threshold.)")
    return new, Trip(fired.name, reason)


def _extreme(pick: Callable[[float, float], float], known: float | None, value: float) -> float | None:
    if math.isnan(value):
        return known
    return value if known is None else pick(known, value)
