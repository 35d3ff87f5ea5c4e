"""The training curves as one picture, from the records of ``metrics.jsonl``.

TrainDAPO logs it to the MLflow run beside the evaluation's reports; the local run draws it again
with the base model's greedy accuracy at step 0. Above: reward, strict and lenient accuracy and the
filtered fractions per step, greedy eval points; below: the rollouts' mean length and the share cut
off at ``max_tokens``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence


def plot_curves(records: Sequence[dict[str, Any]], out: Path, *, title: str = "DAPO training curves",
                base: tuple[float, float] | None = None) -> None:
    """``base``: the base model's greedy (strict, lenient) accuracy, drawn at step 0."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r for r in records if r.get("kind") == "step"]
    evals = [r for r in records if r.get("kind") == "eval"]
    fig, (ax, lengths) = plt.subplots(2, 1, figsize=(8, 7), sharex=True, gridspec_kw={"height_ratios": [2, 1]})
    x = [r["step"] for r in steps]
    ax.plot(x, [r["reward_mean"] for r in steps], label="reward mean (sampled)")
    ax.plot(x, [r["accuracy"] for r in steps], label="accuracy, strict: the reward's (sampled, T=1)")
    ax.plot(x, [r["accuracy_lenient"] for r in steps], label="accuracy, lenient (sampled, T=1)", linestyle="-.")
    ax.plot(x, [r["filtered_frac"] for r in steps], label="filtered fraction", linestyle="--")
    ax.plot(x, [r["filtered_all_wrong_frac"] for r in steps], label="filtered, all wrong", linestyle=":")
    for index, (name, style) in enumerate((("strict", "o-"), ("lenient", "s:"))):
        key = "accuracy" if name == "strict" else "accuracy_lenient"
        points = ([(0, base[index])] if base else []) + [(r["step"], r[key]) for r in evals]
        if points:
            label = f"greedy eval accuracy, {name}" + (" (step 0: base)" if base and name == "strict" else "")
            ax.plot([p[0] for p in points], [p[1] for p in points], style, label=label)
    ax.set_ylim(-0.05, 1.05)
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    ax.set_title(title)
    # The rollouts' lengths: a reasoning model's grow or shrink as it learns; cut-off ones hit max_tokens.
    lengths.plot(x, [r["completion_tokens_mean"] for r in steps], color="tab:purple", label="completion tokens, mean")
    lengths.set_ylabel("tokens")
    lengths.set_xlabel("step")
    lengths.grid(alpha=0.3)
    cut = lengths.twinx()
    cut.plot(x, [r["truncated_frac"] for r in steps], color="tab:red", linestyle="--",
             label="truncated at max_tokens (right)")
    cut.set_ylim(0, max([0.05] + [r["truncated_frac"] * 1.2 for r in steps]))
    lengths.legend(handles=lengths.get_lines() + cut.get_lines(), loc="upper right")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
