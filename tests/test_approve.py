"""ApproveModel and RecordRejection: the evaluation written onto the model package, in moto's registry and in
the local training-session service's (where the session registered the package the pipeline approves)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import boto3
import botocore.session
import pytest
from moto import mock_aws

from local.toy_data import write_split
from steps import approve, train
from steps.platform import billing
from steps.platform.billing import TokenCount
from tests import evaluations
from tests.local_service import ENDPOINT_ENV_VARS, client_kwargs

EXECUTION = "arn:aws:sagemaker:us-west-2:123456789012:pipeline/dapo-gsm8k/execution/k2x9q1"
BASE = evaluations.BASE
# botocore's CustomerMetadataValue pattern, \p{L}\p{Z}\p{N} read as Python's \w and a space.
METADATA_VALUE = re.compile(r"[\w .:/=+\-@]{1,256}")


@pytest.fixture
def registry(monkeypatch):
    """moto's registry with one pending package, as the training session leaves it."""
    for var in ENDPOINT_ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    with mock_aws():
        sm = boto3.client("sagemaker", region_name="us-west-2")
        sm.create_model_package_group(ModelPackageGroupName="dapo")
        arn = sm.create_model_package(ModelPackageGroupName="dapo", ModelApprovalStatus="PendingManualApproval",
                                      ModelPackageDescription="dapo weights")["ModelPackageArn"]
        yield sm, arn


def write_inputs(tmp_path, arn, *, steps=30, stopped_early=False, stop_reason="", evaluation=None):
    """model.json and evaluation.json (default: 200 questions, trained 0.83, base 0.43) as the steps write them."""
    model = {"model_package_arn": arn, "base_model": BASE, "steps_completed": steps, "stopped_early": stopped_early,
             "stop_reason": stop_reason, "config": {"session": {"region": "us-west-2"}},
             "mlflow": {"tracking_uri": "arn:aws:sagemaker:us-west-2:123456789012:mlflow-tracking-server/t",
                        "experiment": "clip sweep (2)", "run_id": "5f0c2a"}}
    evaluation = evaluation or evaluations.paired(trained=84, base=4, both=82, n=200, steps=steps)
    (tmp_path / "model.json").write_text(json.dumps(model))
    (tmp_path / "evaluation.json").write_text(json.dumps(evaluation))
    return ["--model", str(tmp_path / "model.json"), "--evaluation", str(tmp_path), "--execution-arn", EXECUTION,
            "--accuracy-threshold", "0.5", "--min-improvement", "0"]


def test_approve_writes_the_figures_onto_the_package(registry, tmp_path, capsys):
    sm, arn = registry
    args = write_inputs(tmp_path, arn)
    assert approve.main(args) == 0
    desc = sm.describe_model_package(ModelPackageName=arn)
    assert desc["ModelApprovalStatus"] == "Approved"
    assert desc["CustomerMetadataProperties"] == {
        "accuracy": "0.8300", "accuracy_ci95_low": "0.7718", "accuracy_ci95_high": "0.8757",
        "accuracy_lenient": "0.8300", "format_error_rate": "0.0000", "pass_at_k": "0.8300", "maj_at_k": "0.8300",
        "k": "4", "n": "200",
        "base_accuracy": "0.4300", "base_accuracy_ci95_low": "0.3633", "base_accuracy_ci95_high": "0.4993",
        "base_pass_at_k": "0.4300",
        "improvement": "0.4000", "improvement_ci95_low": "0.3149", "improvement_ci95_high": "0.4760",
        "improvement_method": "exact McNemar: Fay-Lumbard 2021 melded interval - exact2x2 mcnemarExactDP",
        "accuracy_threshold": "0.5000", "min_improvement": "0.0000", "steps_completed": "30",
        "stopped_early": "false", "base_model": BASE, "pipeline_execution_arn": EXECUTION,
        "mlflow_run_id": "5f0c2a", "mlflow_experiment": "clip sweep _2_", "verdict": "Approved",
    }
    assert desc["ApprovalDescription"] == (
        "Approved by the DAPO pipeline; greedy accuracy 0.8300 (95% CI 0.7718 to 0.8757; lenient 0.8300) on 200 "
        "held-out questions, threshold 0.5; base model 0.4300 (95% CI 0.3633 to 0.4993); improvement +0.4000, 95% CI "
        "+0.3149 to +0.4760 by exact McNemar, MinImprovement 0; pass@4 0.8300 (base 0.4300), maj@4 0.8300; "
        f"30 optimizer steps from {BASE}")
    assert approve.main(args) == 0  # idempotent: a retried step changes nothing
    assert "already recorded (verdict Approved), approval left at Approved" in capsys.readouterr().out
    assert sm.describe_model_package(ModelPackageName=arn)["CustomerMetadataProperties"]["accuracy"] == "0.8300"


def test_a_rejection_records_the_figures_and_why_without_approving(registry, tmp_path):
    sm, arn = registry
    low = evaluations.paired(trained=2, base=0, both=60, n=200)  # 0.31, 0.30: below the bar, and no better
    assert approve.main([*write_inputs(tmp_path, arn, evaluation=low), "--reject"]) == 0
    desc = sm.describe_model_package(ModelPackageName=arn)
    assert desc["ModelApprovalStatus"] == "Rejected"
    properties = desc["CustomerMetadataProperties"]
    assert properties["accuracy"] == "0.3100" and properties["base_accuracy"] == "0.3000"
    assert properties["rejection_reason"] == ("accuracy 0.3100 below AccuracyThreshold 0.5 / improvement lower bound "
                                              f"{low['improvement']['ci95_low']:+.4f} below MinImprovement 0")
    assert desc["ApprovalDescription"].startswith(
        "Rejected by the DAPO pipeline: the accuracy 0.3100 is below the threshold 0.5 and the improvement over the "
        f"base model is not shown: its 95% lower bound {low['improvement']['ci95_low']:+.4f} is below "
        "MinImprovement 0; greedy accuracy 0.3100")
    assert all(METADATA_VALUE.fullmatch(v) for v in properties.values()), properties


def test_a_run_stopped_before_its_first_step_is_recorded_as_the_base_weights(registry, tmp_path):
    sm, arn = registry
    reason = "step 1: only 3 of 32 groups had mixed rewards (filtered fraction 0.91). Raise max_num_gen_batches."
    args = write_inputs(tmp_path, arn, steps=0, stopped_early=True, stop_reason=reason,
                        evaluation=evaluations.paired(trained=0, base=0, both=180, n=200, steps=0))
    assert approve.main([*args, "--reject"]) == 0
    desc = sm.describe_model_package(ModelPackageName=arn)
    assert desc["ModelApprovalStatus"] == "Rejected"
    properties = desc["CustomerMetadataProperties"]
    assert (properties["steps_completed"], properties["stopped_early"]) == ("0", "true")
    assert properties["rejection_reason"].startswith("no optimizer step completed / improvement lower bound -0.0")
    assert desc["ApprovalDescription"].startswith(
        "Rejected by the DAPO pipeline: no optimizer step completed, so these are the base weights and the "
        "improvement over the base model is not shown")
    assert f"training stopped early: {reason}" in desc["ApprovalDescription"]
    # moto does not check botocore's patterns; SageMaker does.
    assert all(METADATA_VALUE.fullmatch(v) for v in properties.values()), properties


def test_a_run_a_health_guard_stopped_is_rejected_naming_the_guard(registry, tmp_path):
    sm, arn = registry
    args = write_inputs(tmp_path, arn, evaluation=evaluations.paired(trained=84, base=4, both=82, n=200,
                                                                     guard="entropy_collapse"))
    assert approve.main([*args, "--reject", "--output", str(tmp_path / "verdict")]) == 0
    properties = sm.describe_model_package(ModelPackageName=arn)["CustomerMetadataProperties"]
    assert properties["rejection_reason"] == "stopped by the entropy_collapse guard"
    assert properties["guard"] == "entropy_collapse"
    # The verdict in words, which AccuracyTooLow's message reads.
    verdict = json.loads((tmp_path / "verdict" / "verdict.json").read_text())
    assert verdict["status"] == "Rejected"
    assert verdict["message"].startswith("Not approved: stopped by the entropy_collapse guard (held: accuracy 0.8300 ")


def test_the_largest_metadata_fits_the_registrys_limits():
    """Every key approve may write at once (a rejection on all four conditions, pass@k, a guard, the MLflow run, the
    execution, both sessions' billing with prices and earlier sessions) fits CustomerMetadataProperties as botocore
    models it, beside the key the training session writes itself (TrainingSessionName)."""
    shapes = botocore.session.get_session().get_service_model("sagemaker")
    limits = {name: shapes.shape_for(name).metadata for name in ("CustomerMetadataMap", "CustomerMetadataKey",
                                                                 "CustomerMetadataValue")}
    prices = {"prefill_usd_per_million": 1.25, "sample_usd_per_million": 5.5, "train_usd_per_million": 4.75}
    big = TokenCount(2**31 - 1, 9 * 10**10, 7 * 10**10)  # beyond a 32-bit Integer: a long run's totals
    train_bill = billing.block(big, big, "dapo-1a2b3c4d-abc123def456-TrainDAPO-0123456789-2", None, TokenCount(5, 6, 7))
    eval_bill = billing.block(big, None, "dapo-1a2b3c4d-abc123def456-EvaluateModel-0123456789-1", None)
    model = {"model_package_arn": "arn:aws:sagemaker:us-west-2:123456789012:model-package/dapo/7", "base_model": BASE,
             "steps_completed": 0, "stopped_early": True, "stop_reason": "guard entropy_collapse fired",
             "config": {"session": {"region": "us-west-2", "prices": prices}}, "billing": train_bill,
             "mlflow": {"tracking_uri": "arn:aws:sagemaker:us-west-2:123456789012:mlflow-tracking-server/t",
                        "experiment": "e" * 300, "run_id": "5f0c2a" * 6}}
    evaluation = {**evaluations.paired(trained=0, base=90, both=10, n=1319, steps=0, guard="entropy_collapse"),
                  "billing": eval_bill}
    properties = approve.metadata(model, evaluation, EXECUTION, approve.Bars(0.99, 0.05), reject=True)

    assert {"pass_at_k", "guard", "rejection_reason", "mlflow_run_id", "pipeline_execution_arn", "billed_usd",
            "billed_prefill_tokens", "billed_sample_tokens", "billed_train_tokens", "billed_source"} <= set(properties)
    assert len(properties) + 1 <= limits["CustomerMetadataMap"]["max"]  # + TrainingSessionName
    assert all(limits["CustomerMetadataKey"]["min"] <= len(k) <= limits["CustomerMetadataKey"]["max"]
               and METADATA_VALUE.fullmatch(k) for k in properties)
    assert all(len(v) <= limits["CustomerMetadataValue"]["max"] and METADATA_VALUE.fullmatch(v)
               for v in properties.values()), properties
    # The run's tokens: both sessions together (TrainDAPO's with its earlier sessions), money at the run's prices.
    total = big + big + TokenCount(5, 6, 7)
    assert [properties[f"billed_{k}"] for k in billing.FIELDS] == [str(n) for n in (total.prefill, total.sample,
                                                                                    total.train)]
    assert properties["billed_usd"] == f"{(total.prefill * 1.25 + total.sample * 5.5 + total.train * 4.75) / 1e6:.4f}"
    assert properties["billed_source"] == "DescribeTrainingSession.BillableTokenUsage + client count"


def test_approve_refuses_a_bad_evaluation(tmp_path, capsys):
    arn = "arn:aws:sagemaker:us-west-2:123456789012:model-package/g/1"
    (tmp_path / "model.json").write_text(json.dumps({"model_package_arn": arn}))
    (tmp_path / "evaluation.json").write_text(json.dumps({"metrics": {}}))
    assert approve.main(["--model", str(tmp_path), "--evaluation", str(tmp_path / "evaluation.json")]) == 2
    assert "metrics.accuracy.value" in capsys.readouterr().err


def test_approve_reaches_the_registry_the_training_session_wrote_to(tmp_path, local_service):
    """SAGEMAKER_TRAINING_SESSION_ENDPOINT set (as locally): the package the real training step registered in the
    local service is the one approved, with its metadata; the service's own key stays."""
    train_path, eval_path = write_split(tmp_path / "data", 60, 20, seed=5)
    assert train.main(["--config", str(Path(__file__).resolve().parents[1] / "config/local.yaml"),
                       "--train", str(train_path), "--eval", str(eval_path), "--model-dir", str(tmp_path / "model"),
                       "--output-dir", str(tmp_path / "out"), "--checkpoint-dir", str(tmp_path / "ckpt"),
                       "--hyperparameters", str(tmp_path / "none.json"), "--set", "max_steps=1",
                       "--set", "batch_size=4", "--set", "eval_size=4",
                       "--set", f"model_package_group_arn={client_kwargs()['model_package_group_arn']}"]) == 0
    arn = json.loads((tmp_path / "model" / "model.json").read_text())["model_package_arn"]
    (tmp_path / "evaluation.json").write_text(json.dumps({"metrics": {"accuracy": {"value": 0.75}}, "n": 4}))
    assert approve.main(["--model", str(tmp_path / "model"), "--evaluation", str(tmp_path),
                         "--execution-arn", EXECUTION]) == 0
    sm = boto3.client("sagemaker", region_name="us-west-2", endpoint_url=local_service.url)
    desc = sm.describe_model_package(ModelPackageName=arn)
    assert desc["ModelApprovalStatus"] == "Approved"
    properties = desc["CustomerMetadataProperties"]
    assert properties["TrainingSessionName"].startswith("sagemaker-training-session-")
    assert {k: properties[k] for k in ("accuracy", "n", "steps_completed", "stopped_early",
                                       "pipeline_execution_arn")} == {
        "accuracy": "0.7500", "n": "4", "steps_completed": "1", "stopped_early": "false",
        "pipeline_execution_arn": EXECUTION}
    assert desc["ApprovalDescription"].startswith("Approved by the DAPO pipeline; greedy accuracy 0.7500 on 4")
