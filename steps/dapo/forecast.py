"""A forecast before training: can the data teach the model at all, and what will the run sample and train?

DAPO learns only from groups whose rewards are mixed: a prompt whose ``group_size`` answers are all wrong (or all
right) has zero advantage and is dropped, paid for. So the run's first act on the session (``Trainer.start``)
draws step 1's first generation batch with the base model and reads it before anything trains: the base pass
rate (strict and lenient), how often the instructed form is followed, and the share of mixed groups, which is
the keep rate dynamic sampling will see. From those it predicts the generation batches a step needs and the
run's sampled and trained tokens (and dollars with ``session.prices``). The probe is step 1's own first batch,
so none of it is wasted: its groups are step 1's first.

If no group is mixed the run stops before step 1, with the cause (every answer wrong, every answer right, or the
instructed form never followed) and what to try, rather than drawing ``max_num_gen_batches`` generation batches
of a model that cannot learn from them. Pure: :func:`forecast` reads graded groups.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Sequence

from steps.dapo.sampling import Group
from steps.platform.billing import TokenCount, cost_usd

#: What to try when the probe finds nothing to learn from, named as the user sets it.
ADVICE = ("Try another task or instruction (the task section, TASK=), a larger group_size "
          '(PARAMS="GroupSize=16"), or supervised fine-tuning first.')


@dataclass(frozen=True)
class Forecast:
    prompts: int
    group_size: int
    pass_rate: float  # strict: the answer committed in the instructed form
    pass_rate_lenient: float
    format_rate: float  # completions with an answer in the instructed form
    keep_rate: float  # mixed groups among the probe's: the share dynamic sampling keeps
    gen_batches_per_step: float  # expected at that keep rate (inf when nothing is kept)
    steps: int
    sampled_tokens: int  # predicted over the run: completion tokens sampled
    trained_tokens: int  # predicted over the run: datum tokens trained
    cost_usd: float | None = None

    def record(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None and v != math.inf}

    def stop_reason(self, reward_format: str) -> str:
        """Why the run cannot learn (no mixed group), in one sentence with what to try; "" when it can."""
        if self.keep_rate > 0:
            return ""
        seen = f"{self.prompts} prompts x {self.group_size} answers of the base model"
        paid = self.pass_rate_lenient if reward_format == "lenient" else self.pass_rate
        if self.format_rate == 0 and reward_format == "strict":
            cause = "the instructed answer form was never followed, so no answer earns a reward"
        elif paid == 0:
            cause = "every answer was wrong"
        elif paid == 1:
            cause = "every answer was right"
        else:
            cause = "each prompt's answers were all right or all wrong"
        return (f"forecast: no group of the probe ({seen}) had mixed rewards: {cause}. DAPO learns only from groups "
                f"with right and wrong answers, so training stops before step 1. {ADVICE}")


def forecast(groups: Sequence[Group], batch_size: int, steps: int, prices: Any = None) -> Forecast:
    """The forecast of a run of ``steps`` steps of ``batch_size`` groups from the probe's graded ``groups``."""
    rollouts = [r for g in groups for r in g.rollouts]
    n, size = len(rollouts), len(groups[0].rollouts)
    keep = sum(g.is_informative() for g in groups) / len(groups)
    per_batch = 1 / keep if keep else math.inf  # generation batches a step, expected
    completion = sum(len(r.tokens) for r in rollouts) / n
    prompt = sum(len(g.prompt) for g in groups) / len(groups)
    sampled = per_batch * batch_size * size * completion * steps if keep else 0.0
    prefill = per_batch * batch_size * prompt * steps if keep else 0.0
    trained = batch_size * size * (prompt + completion - 1) * steps
    usd = cost_usd(TokenCount(int(prefill), int(sampled), int(trained)), prices)
    return Forecast(len(groups), size, sum(r.grade.correct for r in rollouts) / n,
                    sum(r.grade.correct_lenient for r in rollouts) / n,
                    sum(r.grade.formatted for r in rollouts) / n, keep, per_batch, steps, int(sampled), int(trained),
                    usd)
