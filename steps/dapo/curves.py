"""The training curves as one picture, from the records of ``metrics.jsonl``.

TrainDAPO logs it to the MLflow run beside the evaluation's reports; the local run draws it again
with the base model's greedy accuracy at step 0. Above: reward, strict and lenient accuracy and the
filtered fractions per step, greedy eval points; in the middle: the rollouts' lengths (mean, p50, p95,
max) and the share cut off at ``max_tokens``; below, the health the guards watch (steps/dapo/health.py):
the entropy estimate and the sampler-trainer mismatch (nats per token), and the shares ending in a
repetition loop or without the instructed answer form.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence


def plot_curves(records: Sequence[dict[str, Any]], out: Path, *, title: str = "DAPO training curves",
                base: tuple[float, float] | None = None) -> Any:
    """``base``: the base model's greedy (strict, lenient) accuracy, drawn at step 0. Returns the (closed) figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r for r in records if r.get("kind") == "step"]
    evals = [r for r in records if r.get("kind") == "eval"]
    fig, (ax, lengths, health) = plt.subplots(3, 1, figsize=(8, 10), sharex=True,
                                              gridspec_kw={"height_ratios": [2, 1, 1]})
    x = [r["step"] for r in steps]
    ax.plot(x, [r["reward_mean"] for r in steps], label="reward mean (sampled)")
    # Lenient under strict, wide and pale: where the two coincide (most runs) both stay visible.
    ax.plot(x, [r["accuracy_lenient"] for r in steps], label="accuracy, lenient (sampled, T=1)", color="tab:orange",
            linewidth=5, alpha=0.35)
    ax.plot(x, [r["accuracy"] for r in steps], label="accuracy, strict: the reward's (sampled, T=1)",
            color="tab:orange", linewidth=1.5)
    ax.plot(x, [r["filtered_frac"] for r in steps], label="filtered fraction", linestyle="--")
    ax.plot(x, [r["filtered_all_wrong_frac"] for r in steps], label="filtered, all wrong", linestyle=":")
    # Lenient first, as large hollow squares; strict on top, as dots inside them.
    for index, (name, style) in ((1, ("lenient", dict(marker="s", markersize=10, markerfacecolor="none",
                                                        linestyle=":"))),
                                 (0, ("strict", dict(marker="o", markersize=5, linestyle="-")))):
        key = "accuracy" if name == "strict" else "accuracy_lenient"
        points = ([(0, base[index])] if base else []) + [(r["step"], r[key]) for r in evals]
        if points:
            label = f"greedy eval accuracy, {name}" + (" (step 0: base)" if base and name == "strict" else "")
            ax.plot([p[0] for p in points], [p[1] for p in points], color="tab:brown", label=label, **style)
    ax.set_ylim(-0.05, 1.05)
    ax.set_ylabel("reward, accuracy, fraction")
    ax.set_xlabel("optimizer step")
    ax.tick_params(labelbottom=True)  # the shared x axis, labelled on both panels
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    ax.set_title(title)
    _lengths(lengths, x, steps)
    _health(health, x, steps)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return fig


def _series(steps: Sequence[dict[str, Any]], key: str) -> list[float]:
    """One figure per step; NaN where a record lacks it (metrics.jsonl of a run from before the figure)."""
    return [float(r.get(key, math.nan)) for r in steps]


def _lengths(lengths: Any, x: list[int], steps: Sequence[dict[str, Any]]) -> None:
    """The rollouts' lengths: a reasoning model's grow or shrink as it learns; cut-off ones hit max_tokens."""
    lengths.plot(x, [r["completion_tokens_mean"] for r in steps], color="tab:purple", label="completion tokens, mean")
    for key, style in (("p50", ":"), ("p95", "--"), ("max", "-.")):
        lengths.plot(x, _series(steps, f"completion_tokens_{key}"), color="tab:purple", linestyle=style,
                     alpha=0.6, label=key)
    lengths.set_ylabel("tokens")
    lengths.set_xlabel("optimizer step")
    lengths.tick_params(labelbottom=True)
    lengths.grid(alpha=0.3)
    cut = lengths.twinx()
    cut.plot(x, [r["truncated_frac"] for r in steps], color="tab:red", linestyle="--",
             label="truncated at max_tokens (right)")
    cut.set_ylim(0, max([0.05] + [r["truncated_frac"] * 1.2 for r in steps]))
    cut.set_ylabel("fraction truncated")
    lengths.legend(handles=lengths.get_lines() + cut.get_lines(), loc="upper right", fontsize="small")


def _health(ax: Any, x: list[int], steps: Sequence[dict[str, Any]]) -> None:
    """The guards' figures: entropy and mismatch in nats per token (left), the shares of sick completions (right)."""
    ax.plot(x, _series(steps, "entropy"), color="tab:green", label="entropy estimate (nats/token)")
    ax.plot(x, _series(steps, "sampler_kl"), color="tab:gray", linestyle="--",
            label="sampler-trainer KL, k3 (nats/token)")
    ax.set_ylabel("nats / token")
    ax.set_xlabel("optimizer step")
    ax.grid(alpha=0.3)
    shares = ax.twinx()
    shares.plot(x, _series(steps, "repetition_frac"), color="tab:orange", linestyle=":",
                label="ending in a repetition loop (right)")
    shares.plot(x, _series(steps, "format_error_rate"), color="tab:brown", linestyle="-.",
                label="format errors (right)")
    shares.set_ylim(-0.02, 1.02)
    shares.set_ylabel("fraction of completions")
    ax.legend(handles=ax.get_lines() + shares.get_lines(), loc="center right", fontsize="small")
