"""Loss functions of the training-session API, per token, with their derivatives.

The service sums every loss over tokens. With w = weights, A = advantages,
q = sampling logprobs, p = the current logprob of the target token and
r = exp(p - q):

- cross_entropy:        -w p
- importance_sampling:  -w r A
- ppo:                  -w min(r A, clip(r, low, high) A)
- cispo:                -w sg(clip(r, low, high)) A p      (sg = stop-gradient)

``low``/``high`` bound the probability *ratio* (PPO's epsilon 0.2 is {0.8, 1.2};
DAPO's clip-higher is {0.8, 1.28}). Each function returns the loss per token and
its derivative with respect to p; the policy chains that through its softmax.

:data:`LOSS_FNS` is the one table of each loss function's rules: the service
validates requests against it, the policy computes with it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np


@dataclass(frozen=True)
class ClipBounds:
    low: float
    high: float


@dataclass(frozen=True)
class TokenLoss:
    loss: np.ndarray  # per token
    dloss_dp: np.ndarray  # per token
    clipped: np.ndarray  # bool per token: the clip changed this token's gradient


#: Per-token maths: (p, the datum's loss inputs, clip bounds or None) -> TokenLoss.
PerToken = Callable[[np.ndarray, Mapping[str, np.ndarray], ClipBounds | None], TokenLoss]


@dataclass(frozen=True)
class LossFn:
    """One loss function: the lossFnInputs a datum must carry, whether lossFnConfig's
    clip bounds apply to it, and its per-token loss."""

    required_inputs: tuple[str, ...]
    uses_clip: bool
    per_token: PerToken


# lossFnConfig: the bounds on the probability ratio, by key: (low, high, low is exclusive).
# botocore models lossFnConfig as an open Document; these are the SDK's documented ranges.
CLIP_RANGES = {"clip_low_threshold": (0.0, 1.0, True), "clip_high_threshold": (1.0, 10.0, False)}
DEFAULT_CLIP = ClipBounds(0.8, 1.2)  # PPO's epsilon = 0.2, used when lossFnConfig leaves a bound out
# The lossFnInputs keys the service accepts. ref_log_prob is accepted like the real
# service does, and unused: none of the four losses has a KL term. temperature, when
# given, is the per-token temperature the policy divides its logits by before computing p.
ACCEPTED_INPUTS = ("target_tokens", "weights", "advantages", "logprobs", "ref_log_prob", "temperature")


def clip_bounds(loss_fn_config: Mapping[str, float] | None) -> ClipBounds:
    """The bounds a (validated) lossFnConfig sets, defaults for those it leaves out."""
    config = loss_fn_config or {}
    return ClipBounds(float(config.get("clip_low_threshold", DEFAULT_CLIP.low)),
                      float(config.get("clip_high_threshold", DEFAULT_CLIP.high)))


def _no_clip(n: int) -> np.ndarray:
    return np.zeros(n, dtype=bool)


def _cross_entropy(p: np.ndarray, inputs: Mapping[str, np.ndarray], clip: ClipBounds | None) -> TokenLoss:
    w = inputs["weights"].astype(np.float64)
    return TokenLoss(-w * p, -w, _no_clip(len(p)))


def _ratio(p: np.ndarray, inputs: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(weights, advantages, r = exp(p - q)) of one datum."""
    w = inputs["weights"].astype(np.float64)
    # Prompt positions carry weight 0 and an arbitrary (usually 0) logprob: keep
    # exp() away from them so they cannot overflow into 0 * inf = NaN.
    log_ratio = np.where(w != 0, p - inputs["logprobs"], 0.0)
    return w, inputs["advantages"].astype(np.float64), np.exp(log_ratio)


def _importance_sampling(p: np.ndarray, inputs: Mapping[str, np.ndarray], clip: ClipBounds | None) -> TokenLoss:
    w, adv, r = _ratio(p, inputs)
    return TokenLoss(-w * r * adv, -w * r * adv, _no_clip(len(p)))


def _ppo(p: np.ndarray, inputs: Mapping[str, np.ndarray], clip: ClipBounds | None) -> TokenLoss:
    assert clip is not None, "ppo needs clip bounds"
    w, adv, r = _ratio(p, inputs)
    unclipped, clipped = r * adv, np.clip(r, clip.low, clip.high) * adv
    # Where min() picks the clipped term the ratio sits outside the band and
    # the term is constant in p: that token has no gradient.
    uses_clip = clipped < unclipped
    return TokenLoss(-w * np.minimum(unclipped, clipped), np.where(uses_clip, 0.0, -w * r * adv),
                     uses_clip & (w != 0))


def _cispo(p: np.ndarray, inputs: Mapping[str, np.ndarray], clip: ClipBounds | None) -> TokenLoss:
    assert clip is not None, "cispo needs clip bounds"
    w, adv, r = _ratio(p, inputs)
    r_clipped = np.clip(r, clip.low, clip.high)
    outside = ((r < clip.low) | (r > clip.high)) & (w != 0)
    return TokenLoss(-w * r_clipped * adv * p, -w * r_clipped * adv, outside)


_RL_INPUTS = ("target_tokens", "weights", "logprobs", "advantages")
#: Every loss function's rules, by the API's lossFnName.
LOSS_FNS: Mapping[str, LossFn] = {
    "cross_entropy": LossFn(("target_tokens", "weights"), uses_clip=False, per_token=_cross_entropy),
    "importance_sampling": LossFn(_RL_INPUTS, uses_clip=False, per_token=_importance_sampling),
    "ppo": LossFn(_RL_INPUTS, uses_clip=True, per_token=_ppo),
    "cispo": LossFn(_RL_INPUTS, uses_clip=True, per_token=_cispo),
}


def summarize(loss_fn: str, per_datum: Sequence[TokenLoss], p: Sequence[np.ndarray],
              inputs: Sequence[Mapping[str, np.ndarray]]) -> dict[str, float]:
    """Batch metrics: ``loss:sum``, and for the losses of a sampled policy the clip fraction and KL estimate."""
    metrics = {"loss:sum": float(sum(t.loss.sum() for t in per_datum))}
    if "logprobs" in LOSS_FNS[loss_fn].required_inputs:
        mask = np.concatenate([x["weights"] != 0 for x in inputs])
        n = max(int(mask.sum()), 1)
        clipped = np.concatenate([t.clipped for t in per_datum])
        kl = np.concatenate([x["logprobs"] - lp for x, lp in zip(inputs, p)])
        metrics["actor/pg_clipfrac"] = float(clipped[mask].sum() / n)
        metrics["actor/ppo_kl"] = float(kl[mask].sum() / n)
    return metrics
