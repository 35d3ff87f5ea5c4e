"""EvaluateModel: the real step entry point against the local service (ApproveModel: tests/test_approve.py)."""
from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from local.toy_data import write_split
from steps import evaluate, train
from tests.local_service import ENDPOINT_ENV_VARS, client_kwargs

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, training_service):
    """A model trained for 20 steps with the real training step, packed as SageMaker packs it."""
    d = tmp_path_factory.mktemp("trained")
    train_path, eval_path = write_split(d / "data", 400, 120, seed=5)
    with pytest.MonkeyPatch.context() as mp:
        for var in ENDPOINT_ENV_VARS:
            mp.setenv(var, training_service.url)
        code = train.main(["--config", str(ROOT / "config/local.yaml"), "--train", str(train_path),
                           "--eval", str(eval_path), "--model-dir", str(d / "model"), "--output-dir", str(d / "out"),
                           "--checkpoint-dir", str(d / "ckpt"), "--hyperparameters", str(d / "none.json"),
                           "--set", "max_steps=20", "--set", "eval_every=0",
                           "--set", f"model_package_group_arn={client_kwargs()['model_package_group_arn']}"])
    assert code == 0
    with tarfile.open(d / "model.tar.gz", "w:gz") as tar:
        tar.add(d / "model" / "model.json", arcname="model.json")
    return d, Path(eval_path)


def _accuracy(out: Path) -> float:
    return json.loads((out / "evaluation.json").read_text())["metrics"]["accuracy"]["value"]


@pytest.mark.usefixtures("local_service")
def test_trained_model_beats_the_base_model(trained, tmp_path):
    d, eval_path = trained
    # The model input as SageMaker hands it to a processing job: a directory holding model.tar.gz.
    model_input = tmp_path / "model_input"
    model_input.mkdir()
    (model_input / "model.tar.gz").write_bytes((d / "model.tar.gz").read_bytes())
    assert evaluate.main(["--model", str(model_input), "--eval", str(eval_path), "--output", str(tmp_path / "t"),
                          "--eval-size", "100"]) == 0
    assert evaluate.main(["--model", str(d / "model"), "--eval", str(eval_path), "--output", str(tmp_path / "b"),
                          "--eval-size", "100", "--base"]) == 0
    report = json.loads((tmp_path / "t" / "evaluation.json").read_text())
    assert report["n"] == 100
    assert report["model_package_arn"] == json.loads((d / "model/model.json").read_text())["model_package_arn"]
    # accuracy (strict: what the pipeline's condition compares), the lenient accuracy and the format-error rate.
    assert set(report["metrics"]) == {"accuracy", "accuracy_lenient", "format_error_rate"}
    assert report["metrics"]["accuracy_lenient"]["value"] >= report["metrics"]["accuracy"]["value"]
    # How training ended, for the pipeline's gate (at least one optimizer step) and the registry entry.
    assert report["training"] == {"steps_completed": 20, "stopped_early": False, "stop_reason": ""}
    assert _accuracy(tmp_path / "t") >= _accuracy(tmp_path / "b") + 0.2
    predictions = [json.loads(l) for l in (tmp_path / "t" / "predictions.jsonl").read_text().splitlines()]
    assert len(predictions) == 100
    assert {"question", "gold", "extracted", "correct", "correct_lenient", "formatted", "completion",
            "stop_reason"} <= set(predictions[0])
    assert sum(p["correct"] for p in predictions) / 100 == pytest.approx(_accuracy(tmp_path / "t"))
    metric = lambda name: report["metrics"][name]["value"]  # noqa: E731
    assert sum(p["correct_lenient"] for p in predictions) / 100 == pytest.approx(metric("accuracy_lenient"))
    assert sum(not p["formatted"] for p in predictions) / 100 == pytest.approx(metric("format_error_rate"))
    # The completion as the grader read it: decoded with its special tokens (the toy's end of turn).
    ended = [p for p in predictions if p["stop_reason"] == "stop"]
    assert ended and all(p["completion"].endswith("<eos>") for p in ended)


def test_failed_requests_are_counted_wrong_and_reported(trained, tmp_path, local_service, capsys):
    from local.training_session.faults import Faults

    d, eval_path = trained
    # Every sampling operation fails: the retries run out and each question counts as wrong.
    local_service.set_faults(Faults(fail_rate=1.0))
    assert evaluate.main(["--model", str(d / "model"), "--eval", str(eval_path), "--output", str(tmp_path),
                          "--eval-size", "5"]) == 0
    report = json.loads((tmp_path / "evaluation.json").read_text())
    assert report["n"] == 5 and report["failed_requests"] == 5 and report["metrics"]["accuracy"]["value"] == 0.0
    assert "5 of 5 requests failed" in capsys.readouterr().err


@pytest.mark.usefixtures("local_service")
def test_eval_size_zero_is_refused_not_replaced_by_the_default(trained, tmp_path, capsys):
    d, eval_path = trained
    assert evaluate.main(["--model", str(d / "model"), "--eval", str(eval_path), "--output", str(tmp_path),
                          "--eval-size", "0"]) == 2
    assert "--eval-size must be >= 1, got 0" in capsys.readouterr().err
    assert not (tmp_path / "evaluation.json").exists()


def test_evaluate_refuses_a_model_without_model_json(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert evaluate.main(["--model", str(tmp_path / "empty"), "--eval", str(tmp_path),
                          "--output", str(tmp_path / "o")]) == 2
    assert "neither model.json nor a model.tar.gz" in capsys.readouterr().err
    assert not (tmp_path / "o" / "evaluation.json").exists()
