"""EvaluateModel: the real step entry point against the local service (ApproveModel: tests/test_approve.py)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from steps import evaluate
from steps.config import load_config
from steps.dapo import stats
from steps.gsm8k.task import GSM8K
from steps.platform import billing
from steps.tasks import load_examples
from tests.test_service_wire import control_client
from tests.test_train import toy_tokenizer

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def trained(learned_toy):
    """A model trained by the real training step (config/local.yaml's 30 steps: tests/learned_toy.py, the run
    test_train's test_loop_learns_the_toy_task checks), packed as SageMaker packs it; its 100 held-out questions."""
    assert learned_toy.code == 0, learned_toy.out
    return learned_toy.dir, learned_toy.eval


#: The steps that model was trained for: config/local.yaml's max_steps.
STEPS = load_config(ROOT / "config/local.yaml").dapo.max_steps


@pytest.mark.slow
def test_trained_model_beats_the_base_model_on_the_same_questions(trained, tmp_path, local_service):
    d, eval_path = trained
    # The model input as SageMaker hands it to a processing job: a directory holding model.tar.gz.
    model_input = tmp_path / "model_input"
    model_input.mkdir()
    (model_input / "model.tar.gz").write_bytes((d / "model.tar.gz").read_bytes())
    assert evaluate.main(["--model", str(model_input), "--eval", str(eval_path), "--output", str(tmp_path / "t"),
                          "--eval-size", "100"]) == 0
    report = json.loads((tmp_path / "t" / "evaluation.json").read_text())
    model = json.loads((d / "model/model.json").read_text())
    assert report["n"] == report["base"]["n"] == 100 and report["evaluated"] == "model_package"
    assert report["model_package_arn"] == model["model_package_arn"]
    assert report["base"]["model"] == model["base_model"]
    # Both models: strict accuracy (what the gate compares) and lenient with 95% Wilson intervals, the format-error
    # rate, and from 4 samples per question at the training temperature pass@4, maj@4 and pass@1.
    for block in (report, report["base"]):
        metrics = block["metrics"]
        assert set(metrics) == {"accuracy", "accuracy_lenient", "format_error_rate", "pass_at_k", "maj_at_k",
                                "pass_at_1"}
        for name in ("accuracy", "accuracy_lenient"):
            m = metrics[name]
            interval = stats.wilson(round(m["value"] * 100), 100)
            assert (m["ci95_low"], m["ci95_high"]) == (interval.low, interval.high)
            assert m["ci95_low"] < m["value"] < m["ci95_high"] or m["value"] in (0.0, 1.0)
        assert metrics["accuracy_lenient"]["value"] >= metrics["accuracy"]["value"]
        assert metrics["pass_at_k"]["k"] == metrics["maj_at_k"]["k"] == 4
        assert metrics["pass_at_k"]["temperature"] == 1.0
        assert metrics["pass_at_k"]["value"] >= metrics["pass_at_1"]["value"]
    # The paired difference: the trained adapter clearly better, its interval from the discordant questions.
    gain = report["improvement"]
    accuracy = {name: block["metrics"]["accuracy"]["value"] for name, block in (("t", report), ("b", report["base"]))}
    assert gain["value"] == pytest.approx(accuracy["t"] - accuracy["b"])
    assert gain["value"] == (gain["trained_only_correct"] - gain["base_only_correct"]) / 100
    assert gain["method"] == stats.PAIRED_METHOD and gain["n"] == 100
    assert gain["ci95_low"] >= 0.2 and gain["ci95_low"] < gain["value"] < gain["ci95_high"]
    assert report["metrics"]["pass_at_k"]["value"] > report["base"]["metrics"]["pass_at_k"]["value"]
    # How training ended, for the gate (at least one optimizer step, no guard's stop) and the registry entry.
    assert report["training"] == {"steps_completed": STEPS, "stopped_early": False, "stop_reason": "",
                                  "guard": "", "guard_stopped": 0}
    predictions = [json.loads(l) for l in (tmp_path / "t" / "predictions.jsonl").read_text().splitlines()]
    assert len(predictions) == 100
    assert {"question", "gold", "extracted", "correct", "correct_lenient", "formatted", "completion",
            "stop_reason", "reward"} <= set(predictions[0])
    assert sum(p["correct"] for p in predictions) / 100 == pytest.approx(accuracy["t"])
    metric = lambda name: report["metrics"][name]["value"]  # noqa: E731
    assert sum(p["correct_lenient"] for p in predictions) / 100 == pytest.approx(metric("accuracy_lenient"))
    assert sum(not p["formatted"] for p in predictions) / 100 == pytest.approx(metric("format_error_rate"))
    # The completion as the grader read it: decoded with its special tokens (the toy's end of turn).
    ended = [p for p in predictions if p["stop_reason"] == "stop"]
    assert ended and all(p["completion"].endswith("<eos>") for p in ended)
    # Rollouts: the first eval_rollouts (16) questions' answers of both models, side by side.
    shown = [json.loads(l) for l in (tmp_path / "t" / "rollouts.jsonl").read_text().splitlines()]
    assert [(r["model"], r["step"]) for r in shown] == [("base", 0)] * 16 + [("trained", STEPS)] * 16
    assert [r["question"] for r in shown[:16]] == [r["question"] for r in shown[16:]] == \
        [p["question"] for p in predictions[:16]]
    assert {"question", "completion", "extracted", "gold", "reward"} <= set(shown[0])
    assert [r["reward"] for r in shown[16:]] == [p["reward"] for p in predictions[:16]]
    # Every answer of both models is written beside it: evaluation.json's figures follow from them alone.
    assert evaluate.differences(evaluate.recompute(tmp_path / "t"), report) == []
    # What the evaluation's session billed, as the service counts it (read here through boto3), and the step's own
    # count the same: each question's prompt prefilled once per request (greedy, and k samples), for both models.
    bill = report["billing"]
    usage = control_client(local_service.url).describe_training_session(TrainingSessionName=bill["session"])[
        "TrainingSessionDetail"]["BillableTokenUsage"]
    counted = {"prefill_tokens": usage["PrefillTokenCount"], "sample_tokens": usage["SampleTokenCount"],
               "train_tokens": usage["TrainingTokenCount"]}
    assert bill == {**counted, "source": billing.SERVICE, "session": bill["session"], "client_count": counted}
    tok = toy_tokenizer()
    prompts = sum(len(GSM8K.prompt(ex, tok, {})) for ex in load_examples(eval_path)[:100])
    assert counted["prefill_tokens"] == 2 * 2 * prompts and counted["sample_tokens"] > 0
    assert counted["train_tokens"] == 0


def test_failed_requests_are_counted_wrong_and_reported(trained, tmp_path, local_service, capsys):
    from local.training_session.faults import Faults

    d, eval_path = trained
    # Every sampling operation fails: the retries run out and each question counts as wrong, for both models.
    local_service.set_faults(Faults(fail_rate=1.0))
    assert evaluate.main(["--model", str(d / "model"), "--eval", str(eval_path), "--output", str(tmp_path),
                          "--eval-size", "5"]) == 0
    report = json.loads((tmp_path / "evaluation.json").read_text())
    assert report["n"] == 5 and report["failed_requests"] == 5 and report["metrics"]["accuracy"]["value"] == 0.0
    assert report["base"]["failed_requests"] == 5 and report["metrics"]["pass_at_k"]["value"] == 0.0
    # Nothing told the models apart: the difference is 0 and its interval straddles it.
    assert report["improvement"]["value"] == 0.0 and report["improvement"]["ci95_low"] < 0
    assert "10 of 10 greedy requests failed" in capsys.readouterr().err


@pytest.mark.usefixtures("local_service")
def test_a_negative_eval_size_is_refused(trained, tmp_path, capsys):
    d, eval_path = trained
    assert evaluate.main(["--model", str(d / "model"), "--eval", str(eval_path), "--output", str(tmp_path),
                          "--eval-size", "-1"]) == 2
    assert "--eval-size must be >= 0 (0: every question), got -1" in capsys.readouterr().err
    assert not (tmp_path / "evaluation.json").exists()


def test_evaluate_refuses_a_model_without_model_json(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert evaluate.main(["--model", str(tmp_path / "empty"), "--eval", str(tmp_path),
                          "--output", str(tmp_path / "o")]) == 2
    assert "neither model.json nor a model.tar.gz" in capsys.readouterr().err
    assert not (tmp_path / "o" / "evaluation.json").exists()
