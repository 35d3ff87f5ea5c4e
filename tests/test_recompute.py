"""EvaluateModel's answer files (steps/evaluate.py ANSWER_FILES): every figure of evaluation.json recomputed from
them alone, and a changed answer caught. The real step writes them in tests/test_evaluate_approve.py and the local
run in tests/test_local_run.py; both recompute them too."""
from __future__ import annotations

import json
import random
from types import SimpleNamespace

import pytest

from steps import evaluate
from steps.cli import Refused
from steps.dapo import heldout
from steps.dapo.heldout import Prediction, Sampled

BASE = "arn:aws:sagemaker:us-west-2:aws:hub-content/SageMakerPublicHub/Model/qwen3-8b/1.0.0"


def _answer(rng: random.Random, p_right: float, i: int) -> Prediction:
    right, formatted = rng.random() < p_right, rng.random() < 0.9
    failed = rng.random() < 0.02
    if failed:
        return Prediction(f"q{i}", "7", None, False, False, False, "", "", True)
    extracted = "7" if right else rng.choice(["8", "9", None])
    strict = right and formatted
    return Prediction(f"q{i}", "7", extracted, strict, right, formatted and extracted is not None,
                      f"... #### {extracted}", rng.choice(["stop", "length"]), False, float(strict))


def _result(seed: int, p_right: float, n: int = 60, k: int = 4) -> heldout.EvalResult:
    rng = random.Random(seed)
    greedy = [_answer(rng, p_right, i) for i in range(n)]
    samples = [[_answer(rng, p_right, i) for _ in range(k)] for i in range(n)]
    return heldout.graded(greedy, Sampled.of(k, 1.0, samples))


@pytest.fixture
def evaluated(tmp_path):
    results = {"trained": _result(1, 0.7), "base": _result(2, 0.4)}
    model = {"model_package_arn": "arn:aws:sagemaker:us-west-2:123456789012:model-package/dapo/1",
             "steps_completed": 30, "stopped_early": False, "stop_reason": ""}
    report = evaluate.report(results, model, SimpleNamespace(session=SimpleNamespace(base_model=BASE)))
    evaluate.write_outputs(tmp_path, report, results, [])
    return tmp_path, report


def test_every_figure_is_recomputed_from_the_answer_files_alone(evaluated, capsys):
    d, report = evaluated
    recomputed = evaluate.recompute(d)
    assert evaluate.differences(recomputed, report) == []
    # The figures the answers decide, all of them there: both models' and the paired difference's.
    assert set(recomputed["metrics"]) == set(recomputed["base"]["metrics"]) == {
        "accuracy", "accuracy_lenient", "format_error_rate", "pass_at_k", "maj_at_k", "pass_at_1"}
    assert {"value", "ci95_low", "ci95_high", "p_value", "trained_only_correct", "base_only_correct"} <= set(
        recomputed["improvement"])
    # The layout: one row per greedy answer, k per question of the sampled ones, each with its question's index.
    rows = [json.loads(line) for line in (d / "samples_base.jsonl").read_text().splitlines()]
    assert len(rows) == 60 * 4 and [(r["index"], r["sample"]) for r in rows[:5]] == [(0, 0), (0, 1), (0, 2), (0, 3),
                                                                                     (1, 0)]
    assert {"question", "gold", "completion", "extracted", "correct", "correct_lenient", "formatted", "failed",
            "temperature"} <= set(rows[0])
    assert [json.loads(line)["index"] for line in (d / "predictions.jsonl").read_text().splitlines()] == list(
        range(60))
    assert evaluate.main(["--recompute", str(d)]) == 0
    assert "recompute: 44 of 44 figures of " in capsys.readouterr().out


def test_a_changed_answer_is_a_mismatch_naming_the_figures_it_moves(evaluated, capsys):
    d, _ = evaluated
    path = d / "samples.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    flipped = next(r for r in rows if not r["correct"] and not r["failed"])
    flipped["correct"] = True
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert evaluate.main(["--recompute", str(d)]) == 1
    out = capsys.readouterr().out
    assert "recompute: MISMATCH metrics.pass_at_1.value: recorded " in out
    assert "MISMATCH metrics.accuracy" not in out and "MISMATCH base." not in out


def test_missing_or_incomplete_answer_files_are_refused(evaluated):
    d, _ = evaluated
    rows = (d / "samples.jsonl").read_text().splitlines()
    (d / "samples.jsonl").write_text("\n".join(rows[:-1]) + "\n")  # the last question has k - 1 samples
    with pytest.raises(Refused, match=r"samples.jsonl: not EvaluateModel's answer files \(the sampled answers are "
                                      r"not k=4 per question"):
        evaluate.recompute(d)
    (d / "predictions.jsonl").unlink()
    with pytest.raises(Refused, match=r"predictions.jsonl: missing"):
        evaluate.recompute(d)
