"""Adam with decoupled weight decay (AdamW) and global-norm gradient clipping.

Pure functions over numpy arrays: a step returns new arrays and never writes
into the old ones, so a sampler that still holds the previous weights is not
disturbed by a concurrent optimizer step.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# The API caps learning_rate at 0.01 (botocore's model), a range sized for an
# LLM's LoRA weights. The toy policy's weights live on a larger scale, so its
# optimizer multiplies the rate by this constant: the same as training
# parameters stored divided by LR_SCALE. Clients send API-valid rates.
LR_SCALE = 5.0


@dataclass(frozen=True)
class AdamConfig:
    """The SDK's ``AdamParams`` fields; a bad value raises ValueError naming it.

    ``lora_plus_lr_ratio`` is validated and otherwise a no-op: the toy policy is
    trained in full and has no LoRA B matrices for the ratio to scale.
    """

    learning_rate: float
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.0
    grad_clip_norm: float | None = None
    lora_plus_lr_ratio: float | None = None

    def __post_init__(self) -> None:
        checks = {
            "learning_rate": (self.learning_rate >= 0, "must be >= 0"),
            "beta1": (0 <= self.beta1 < 1, "must be in [0, 1)"),
            "beta2": (0 <= self.beta2 < 1, "must be in [0, 1)"),
            "eps": (self.eps > 0, "must be > 0"),
            "weight_decay": (self.weight_decay >= 0, "must be >= 0"),
            "grad_clip_norm": (self.grad_clip_norm is None or self.grad_clip_norm > 0, "must be > 0 or unset"),
            "lora_plus_lr_ratio": (self.lora_plus_lr_ratio is None or self.lora_plus_lr_ratio > 0,
                                   "must be > 0 or unset"),
        }
        for name, (ok, rule) in checks.items():
            value = getattr(self, name)
            if value is not None and not math.isfinite(value):
                ok = False
            if not ok:
                raise ValueError(f"adam parameter {name}={value!r} {rule}")


@dataclass(frozen=True)
class AdamState:
    """First and second moments and the number of steps taken."""

    m: np.ndarray
    v: np.ndarray
    step: int = 0

    @classmethod
    def zeros(cls, shape: tuple[int, ...]) -> "AdamState":
        return cls(np.zeros(shape), np.zeros(shape), 0)


def adam_step(
    params: np.ndarray, grad: np.ndarray, state: AdamState, cfg: AdamConfig
) -> tuple[np.ndarray, AdamState, dict[str, float]]:
    """One AdamW update: (new params, new state, metrics)."""
    grad_norm = float(np.sqrt(np.sum(grad * grad)))
    if cfg.grad_clip_norm is not None and grad_norm > cfg.grad_clip_norm:
        grad = grad * (cfg.grad_clip_norm / grad_norm)
    step = state.step + 1
    m = cfg.beta1 * state.m + (1 - cfg.beta1) * grad
    v = cfg.beta2 * state.v + (1 - cfg.beta2) * grad * grad
    m_hat = m / (1 - cfg.beta1**step)
    v_hat = v / (1 - cfg.beta2**step)
    # Decoupled decay (as torch.optim.AdamW): shrink the weights, then take the Adam step.
    lr = LR_SCALE * cfg.learning_rate
    new_params = params * (1 - lr * cfg.weight_decay) - lr * m_hat / (np.sqrt(v_hat) + cfg.eps)
    metrics = {"grad_norm": grad_norm, "learning_rate": float(cfg.learning_rate), "step": float(step)}
    return new_params, AdamState(m, v, step), metrics
