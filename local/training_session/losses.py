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
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

LOSS_FNS = ("cross_entropy", "importance_sampling", "ppo", "cispo")
REQUIRED_INPUTS = {
    "cross_entropy": ("target_tokens", "weights"),
    "importance_sampling": ("target_tokens", "weights", "logprobs", "advantages"),
    "ppo": ("target_tokens", "weights", "logprobs", "advantages"),
    "cispo": ("target_tokens", "weights", "logprobs", "advantages"),
}
# ref_log_prob is accepted like the real service does, and unused: none of the
# four losses has a KL term. temperature, when given, is the per-token
# temperature the policy divides its logits by before computing p.
ACCEPTED_INPUTS = ("target_tokens", "weights", "advantages", "logprobs", "ref_log_prob", "temperature")
DEFAULT_CLIP = (0.8, 1.2)  # PPO's epsilon = 0.2, used when loss_fn_config leaves a bound out


class LossInputError(ValueError):
    """A forward/backward request the service refuses; the message names the datum and key."""


@dataclass(frozen=True)
class ClipBounds:
    low: float
    high: float


@dataclass(frozen=True)
class TokenLoss:
    loss: np.ndarray  # per token
    dloss_dp: np.ndarray  # per token
    clipped: np.ndarray  # bool per token: the clip changed this token's gradient


def check_loss_fn(loss_fn: str, loss_fn_config: Mapping | None) -> ClipBounds:
    """Validate the loss name and config; return the clip bounds to use."""
    if loss_fn not in LOSS_FNS:
        raise LossInputError(f"loss_fn {loss_fn!r} is not supported; use one of {', '.join(LOSS_FNS)}")
    config = dict(loss_fn_config or {})
    rules = {
        "clip_low_threshold": (lambda v: 0 < v <= 1, "in (0, 1]"),
        "clip_high_threshold": (lambda v: 1 <= v <= 10, "in [1, 10]"),
    }
    for key, value in config.items():
        if key not in rules:
            raise LossInputError(f"loss_fn_config key {key!r} is not accepted; use {' and '.join(rules)}")
        ok, rule = rules[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not ok(value):
            raise LossInputError(
                f"loss_fn_config[{key!r}] = {value!r} must be a number {rule}: a bound on the probability "
                f"ratio, not an epsilon (PPO's epsilon 0.2 is clip_low_threshold 0.8, clip_high_threshold 1.2)"
            )
    return ClipBounds(float(config.get("clip_low_threshold", DEFAULT_CLIP[0])),
                      float(config.get("clip_high_threshold", DEFAULT_CLIP[1])))


def check_datum(index: int, tokens: np.ndarray, inputs: Mapping[str, np.ndarray], loss_fn: str, vocab_size: int) -> None:
    """Refuse a datum the way the service does, naming ``datum[index]`` and the key."""
    where = f"datum[{index}]"
    if tokens.ndim != 1 or len(tokens) == 0 or tokens.dtype.kind not in "iuf":
        raise LossInputError(f"{where}: model_input must be a non-empty list of token ids")
    _check_ids(f"{where}: model_input", tokens, vocab_size)
    for key in inputs:
        if key not in ACCEPTED_INPUTS:
            raise LossInputError(f"{where}: loss_fn_inputs key {key!r} is not accepted; use {', '.join(ACCEPTED_INPUTS)}")
    missing = [key for key in REQUIRED_INPUTS[loss_fn] if key not in inputs]
    if missing:
        raise LossInputError(
            f"{where}: loss function {loss_fn!r} requires {', '.join(REQUIRED_INPUTS[loss_fn])} "
            f"in loss_fn_inputs; missing {', '.join(missing)}"
        )
    for key, values in inputs.items():
        if values.dtype.kind not in "biuf":
            raise LossInputError(f"{where}: loss_fn_inputs[{key!r}] must hold numbers, got dtype {values.dtype}")
        if values.ndim != 1 or len(values) != len(tokens):
            raise LossInputError(
                f"{where}: loss_fn_inputs[{key!r}] has shape {values.shape} but model_input has {len(tokens)} "
                f"tokens; every per-token input covers the prompt as well as the completion"
            )
        if not np.all(np.isfinite(values)):
            raise LossInputError(f"{where}: loss_fn_inputs[{key!r}] contains NaN or infinity")
    _check_ids(f"{where}: loss_fn_inputs['target_tokens']", inputs["target_tokens"], vocab_size)
    if "temperature" in inputs:
        bad = (inputs["temperature"] <= 0) & (inputs["weights"] != 0)
        if bad.any():
            raise LossInputError(f"{where}: loss_fn_inputs['temperature'] must be > 0 where the weight is not 0 "
                                 f"(position {int(np.argmax(bad))})")


def _check_ids(what: str, ids: np.ndarray, vocab_size: int) -> None:
    bad = (ids != np.round(ids)) | (ids < 0) | (ids >= vocab_size)
    if bad.any():
        i = int(np.argmax(bad))
        raise LossInputError(f"{what}[{i}] = {ids[i]:g} is not a token id of this model (0..{vocab_size - 1})")


def token_loss(loss_fn: str, p: np.ndarray, inputs: Mapping[str, np.ndarray], clip: ClipBounds) -> TokenLoss:
    """Loss per token and d loss / d p for one datum (inputs already validated)."""
    w = inputs["weights"].astype(np.float64)
    if loss_fn == "cross_entropy":
        return TokenLoss(-w * p, -w, np.zeros(len(p), dtype=bool))
    adv = inputs["advantages"].astype(np.float64)
    # Prompt positions carry weight 0 and an arbitrary (usually 0) logprob: keep
    # exp() away from them so they cannot overflow into 0 * inf = NaN.
    log_ratio = np.where(w != 0, p - inputs["logprobs"], 0.0)
    r = np.exp(log_ratio)
    if loss_fn == "importance_sampling":
        return TokenLoss(-w * r * adv, -w * r * adv, np.zeros(len(p), dtype=bool))
    r_clipped = np.clip(r, clip.low, clip.high)
    if loss_fn == "ppo":
        unclipped, clipped = r * adv, r_clipped * adv
        # Where min() picks the clipped term the ratio sits outside the band and
        # the term is constant in p: that token has no gradient.
        uses_clip = clipped < unclipped
        return TokenLoss(-w * np.minimum(unclipped, clipped), np.where(uses_clip, 0.0, -w * r * adv), uses_clip & (w != 0))
    if loss_fn == "cispo":
        outside = ((r < clip.low) | (r > clip.high)) & (w != 0)
        return TokenLoss(-w * r_clipped * adv * p, -w * r_clipped * adv, outside)
    raise LossInputError(f"loss_fn {loss_fn!r} is not supported; use one of {', '.join(LOSS_FNS)}")


def summarize(loss_fn: str, per_datum: Sequence[TokenLoss], p: Sequence[np.ndarray], inputs: Sequence[Mapping[str, np.ndarray]]) -> dict[str, float]:
    """Batch metrics: ``loss:sum``, and for the RL losses the clip fraction and KL estimate."""
    metrics = {"loss:sum": float(sum(t.loss.sum() for t in per_datum))}
    if loss_fn in ("ppo", "cispo", "importance_sampling"):
        mask = np.concatenate([x["weights"] != 0 for x in inputs])
        n = max(int(mask.sum()), 1)
        clipped = np.concatenate([t.clipped for t in per_datum])
        kl = np.concatenate([x["logprobs"] - lp for x, lp in zip(inputs, p)])
        metrics["actor/pg_clipfrac"] = float(clipped[mask].sum() / n)
        metrics["actor/ppo_kl"] = float(kl[mask].sum() / n)
    return metrics
