"""Rollouts in view: the answers an evaluation read, where a user looks (tinker-cookbook and TRL users debug
reward hacking from logged rollouts).

At each evaluation (every ``eval_every`` steps in training, and EvaluateModel's final one) the answers to
the first ``eval_rollouts`` held-out questions go to ``rollouts.jsonl`` (beside ``metrics.jsonl``; in
EvaluateModel's output beside ``evaluation.json``) and, when the run is tracked, to an MLflow table
(``rollouts/step_000010.json``, ``rollouts/final.json``, shown as tables among the run's artifacts). Always
the same questions, so one question's answers can be followed from step to step and base to trained.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from steps.dapo.heldout import Prediction

FILE = "rollouts.jsonl"
#: The columns, in order: where (step, model), what was asked and answered, and how it was graded.
FIELDS = ("step", "model", "question", "completion", "extracted", "gold", "reward", "correct", "formatted",
          "stop_reason")


def rows(predictions: Sequence[Prediction], step: int, model: str, limit: int) -> list[dict[str, Any]]:
    """The first ``limit`` answers as rollout records; ``model`` says whose ("trained", "base")."""
    return [{"step": step, "model": model, "question": p.question, "completion": p.completion,
             "extracted": p.extracted, "gold": p.gold, "reward": p.reward, "correct": p.correct,
             "formatted": p.formatted, "stop_reason": p.stop_reason} for p in predictions[:limit]]


def table(records: Sequence[dict[str, Any]]) -> dict[str, list[Any]]:
    """Column -> values, the form MLflow's ``log_table`` takes."""
    return {name: [r[name] for r in records] for name in FIELDS}


def artifact_file(step: int | None) -> str:
    """The MLflow table of the evaluation at ``step`` (None: EvaluateModel's final one)."""
    return "rollouts/final.json" if step is None else f"rollouts/step_{step:06d}.json"


def append(path: str | Path, records: Sequence[dict[str, Any]]) -> None:
    """Append to the JSONL file (flushed per evaluation: a killed job keeps what it wrote)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p, "a", encoding="utf-8") as f:
        f.write("".join(json.dumps(r) + "\n" for r in records))
