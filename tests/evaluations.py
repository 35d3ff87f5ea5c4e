"""Crafted evaluation.json files for the gate's and the approve step's tests, built by EvaluateModel's own report
(steps/evaluate.py) from answers decided here, so their layout is the real one."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from steps import evaluate
from steps.dapo.heldout import EvalResult, Prediction, Sampled

BASE = "arn:aws:sagemaker:us-west-2:aws:hub-content/SageMakerPublicHub/Model/qwen3-8b/1.0.0"


def _result(correct: list[bool], k: int) -> EvalResult:
    predictions = tuple(Prediction(f"q{i}", "7", "7" if ok else "8", ok, ok, True, "#### 7" if ok else "#### 8",
                                   "stop", False, float(ok)) for i, ok in enumerate(correct))
    n = len(correct)
    # k samples per question: k - 1 of them right where the greedy answer is, none elsewhere.
    sampled = Sampled(k, 1.0, tuple(k - 1 if ok else 0 for ok in correct), tuple(float(ok) for ok in correct), 0)
    return EvalResult(sum(correct) / n, sum(correct) / n, 0.0, n, 0, predictions, sampled)


def paired(trained: int, base: int, both: int, n: int, *, steps: int = 30, guard: str = "",
           model_package_arn: str = "arn:aws:sagemaker:us-west-2:123456789012:model-package/dapo/1",
           k: int = 4) -> dict[str, Any]:
    """evaluation.json of ``n`` questions: ``trained`` only the trained adapter got right, ``base`` only the base
    model, ``both`` both of them."""
    assert trained + base + both <= n
    t = [True] * trained + [False] * base + [True] * both + [False] * (n - trained - base - both)
    b = [False] * trained + [True] * base + [True] * both + [False] * (n - trained - base - both)
    model = {"model_package_arn": model_package_arn, "steps_completed": steps, "stopped_early": bool(guard),
             "stop_reason": f"guard {guard} fired" if guard else "", "guard": guard, "guard_stopped": bool(guard)}
    cfg = SimpleNamespace(session=SimpleNamespace(base_model=BASE))
    return evaluate.report({"trained": _result(t, k), "base": _result(b, k)}, model, cfg)
