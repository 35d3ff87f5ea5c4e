"""The gate (CheckAccuracy), on crafted evaluation.json files built by EvaluateModel's own report:

- its conditions, as the built definition holds them and pipeline/expressions.py evaluates them, agree with the
  approve step's account of them (steps/approve.py ``failed_conditions``) on every kind of run;
- through the local runner on the built definition, from CheckAccuracy on: a run whose adapter is no better than
  its base model is rejected with the reason on the registry entry, and a good one approved (moto's registry).
"""
from __future__ import annotations

import copy
import dataclasses
import io
import json
import tarfile
import urllib.request
from pathlib import Path
from typing import Any

import boto3
import pytest

from local.pipeline_runner import LocalExecution, PipelineFailed, StepRecord
from pipeline.expressions import Environment, all_hold, parameter_values, property_files
from steps import approve
from tests import evaluations
from tests.test_pipeline_definition import local_build

BUCKET = "dapo-gate"
EVALUATION_URI = f"s3://{BUCKET}/EvaluateModel/evaluation"
MODEL_URI = f"s3://{BUCKET}/TrainDAPO/model.tar.gz"

# name -> (the evaluation, the conditions approve names as failed, by their first words)
RUNS = {
    "better than its base": (evaluations.paired(trained=30, base=5, both=40, n=120), []),
    "no better than its base": (evaluations.paired(trained=6, base=5, both=64, n=120), ["improvement"]),
    "worse than its base": (evaluations.paired(trained=2, base=20, both=60, n=120), ["improvement"]),
    "below the threshold": (evaluations.paired(trained=30, base=5, both=0, n=120), ["accuracy"]),
    "stopped before a step": (evaluations.paired(trained=0, base=0, both=70, n=120, steps=0),
                              ["no optimizer step", "improvement"]),
    "stopped by a guard": (evaluations.paired(trained=30, base=5, both=40, n=120, guard="repetition_loops"),
                           ["stopped by the repetition_loops guard"]),
}
BARS = {"AccuracyThreshold": 0.5, "MinImprovement": 0.0}


def _check(definition: dict[str, Any]) -> dict[str, Any]:
    return next(s for s in definition["Steps"] if s["Name"] == "CheckAccuracy")


def _environment(definition: dict[str, Any], evaluation: dict[str, Any], bars: dict[str, float]) -> Environment:
    def step_property(step: str, path: str) -> Any:
        assert (step, path) == ("EvaluateModel", "ProcessingOutputConfig.Outputs['evaluation'].S3Output.S3Uri")
        return EVALUATION_URI

    def read_json(uri: str) -> Any:
        assert uri == f"{EVALUATION_URI}/evaluation.json"
        return json.loads(json.dumps(evaluation))  # as read back from the file

    return Environment(parameters=parameter_values(definition, bars), execution={}, step_property=step_property,
                       read_json=read_json, property_files=property_files(definition))


@pytest.mark.parametrize("name", RUNS)
def test_the_condition_and_the_approve_steps_account_of_it_agree(name):
    definition = local_build()["definition"]
    evaluation, expected = RUNS[name]
    env = _environment(definition, evaluation, BARS)
    holds = all_hold(_check(definition)["Arguments"]["Conditions"], env)
    failed = approve.failed_conditions(evaluation, approve.Bars(BARS["AccuracyThreshold"], BARS["MinImprovement"]))
    assert holds == (not failed) == (name == "better than its base")
    assert [next(w for w in expected if short.startswith(w)) for short, _ in failed] == expected


def test_min_improvement_moves_the_bar():
    """MinImprovement 0.05: an adapter shown better, but not by 5 points at 95%, is rejected."""
    definition = local_build()["definition"]
    evaluation = evaluations.paired(trained=12, base=2, both=60, n=120)
    low = evaluation["improvement"]["ci95_low"]
    assert 0 < low < 0.05
    for bar, approved in ((0.0, True), (0.05, False)):
        bars = {**BARS, "MinImprovement": bar}
        env = _environment(definition, evaluation, bars)
        assert all_hold(_check(definition)["Arguments"]["Conditions"], env) == approved
        assert not approve.failed_conditions(evaluation, approve.Bars(0.5, bar)) == approved


def test_the_verdict_names_the_failed_condition_in_words_then_those_that_held():
    """What AccuracyTooLow's message says (RecordRejection's verdict.json), e.g. for a run the entropy guard stopped:
    not "stopped by a health guard 1 (must be 0)", and no raw float."""
    evaluation = evaluations.paired(trained=32, base=5, both=40, n=120, guard="entropy_collapse")
    bars = approve.Bars(0.2, 0.0)
    low = evaluation["improvement"]["ci95_low"]
    assert approve.verdict(evaluation, bars) == (
        "Not approved: stopped by the entropy_collapse guard (held: accuracy 0.6000 >= AccuracyThreshold 0.2, 30 "
        f"optimizer steps completed, improvement lower bound {low:+.4f} >= MinImprovement 0). The model package "
        "records the figures and the rejection.")
    worst = evaluations.paired(trained=0, base=20, both=0, n=120, steps=0, guard="truncation")
    assert approve.verdict(worst, approve.Bars(0.5, 0.0)).startswith(  # the guard's stop first: the cause
        "Not approved: stopped by the truncation guard; accuracy 0.0000 below AccuracyThreshold 0.5; no optimizer step "
        "completed; improvement lower bound -0.")
    assert approve.verdict(RUNS["better than its base"][0], approve.Bars(0.5, 0.0)).startswith(
        "Approved: accuracy 0.5833 >= AccuracyThreshold 0.5, 30 optimizer steps completed, improvement lower bound +")


# -- through the local runner --------------------------------------------------------------------------------------
@pytest.fixture
def moto_server():
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    # moto keeps its accounts per process: start from an empty one.
    urllib.request.urlopen(urllib.request.Request(f"{url}/moto-api/reset", method="POST"), timeout=10)
    yield url
    server.stop()


def _client(service: str, url: str) -> Any:
    return boto3.client(service, region_name="us-west-2", endpoint_url=url, aws_access_key_id="testing",
                        aws_secret_access_key="testing")


def _from_the_gate_on(tmp_path: Path, url: str, evaluation: dict[str, Any]) -> tuple[LocalExecution, str]:
    """The built definition from CheckAccuracy on, run by the local runner as if TrainDAPO and EvaluateModel had
    written ``evaluation`` and a model.json of a pending package (in moto: S3 and the registry)."""
    s3, sm = _client("s3", url), _client("sagemaker", url)
    # The gate's bucket, and the one RecordRejection writes its verdict to (config/local.yaml's pipeline output).
    for bucket in (BUCKET, local_build()["cfg"].output_prefix.split("/")[2]):
        s3.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
    group = f"gate-{tmp_path.name}"[:63]
    sm.create_model_package_group(ModelPackageGroupName=group)
    arn = sm.create_model_package(ModelPackageGroupName=group, ModelApprovalStatus="PendingManualApproval")[
        "ModelPackageArn"]
    model = {"model_package_arn": arn, "base_model": evaluations.BASE, "steps_completed": 30, "stopped_early": False,
             "stop_reason": "", "config": {"session": {"region": "us-west-2"}}}
    packed = io.BytesIO()
    with tarfile.open(fileobj=packed, mode="w:gz") as tar:
        body = json.dumps(model).encode()
        info = tarfile.TarInfo("model.json")
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))
    s3.put_object(Bucket=BUCKET, Key="TrainDAPO/model.tar.gz", Body=packed.getvalue())
    s3.put_object(Bucket=BUCKET, Key="EvaluateModel/evaluation/evaluation.json", Body=json.dumps(evaluation))

    full = local_build()["definition"]
    definition = {**copy.deepcopy(full), "Steps": [copy.deepcopy(_check(full))]}
    env = {"AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_REGION": "us-west-2", "AWS_DEFAULT_REGION": "us-west-2", "PATH": "/usr/bin:/bin"}
    execution = LocalExecution(definition, {}, s3, tmp_path / "work", env, execution_id="gate",
                               pipeline_name="dapo-local")
    # The steps before the gate are done: their records, and EvaluateModel's property file declaration.
    execution.expressions = dataclasses.replace(execution.expressions, property_files=property_files(full))
    execution.records["TrainDAPO"] = StepRecord("TrainDAPO", "Training", "Succeeded",
                                                properties={"ModelArtifacts": {"S3ModelArtifacts": MODEL_URI}})
    execution.records["EvaluateModel"] = StepRecord("EvaluateModel", "Processing", "Succeeded", properties={
        "ProcessingOutputConfig": {"Outputs": [{"OutputName": "evaluation", "S3Output": {"S3Uri": EVALUATION_URI}}]}})
    return execution, arn


def test_an_adapter_no_better_than_its_base_is_rejected_with_the_reason(tmp_path, moto_server):
    evaluation = RUNS["no better than its base"][0]
    # Its accuracy clears the threshold: only the comparison with the base model keeps it out.
    assert evaluation["metrics"]["accuracy"]["value"] >= local_build()["cfg"].accuracy_threshold
    execution, arn = _from_the_gate_on(tmp_path, moto_server, evaluation)
    with pytest.raises(PipelineFailed) as failed:
        execution.run()
    assert failed.value.step == "AccuracyTooLow"
    gain = evaluation["improvement"]
    accuracy = evaluation["metrics"]["accuracy"]["value"]
    # The condition that failed, in words, then those that held; figures to 4 decimals (RecordRejection's verdict).
    assert failed.value.message == (
        f"Not approved: improvement lower bound {gain['ci95_low']:+.4f} below MinImprovement 0 (held: accuracy "
        f"{accuracy:.4f} >= AccuracyThreshold 0.2, 30 optimizer steps completed, no health guard stopped training). "
        "The model package records the figures and the rejection.")
    assert [(r.name, r.status) for r in execution.records.values()][2:] == [
        ("CheckAccuracy", "Succeeded"), ("RecordRejection", "Succeeded"), ("AccuracyTooLow", "Failed")]
    entry = _client("sagemaker", moto_server).describe_model_package(ModelPackageName=arn)
    assert entry["ModelApprovalStatus"] == "Rejected"
    properties = entry["CustomerMetadataProperties"]
    assert properties["rejection_reason"] == f"improvement lower bound {gain['ci95_low']:+.4f} below MinImprovement 0"
    assert (properties["accuracy"], properties["base_accuracy"]) == ("0.5833", "0.5750")
    assert entry["ApprovalDescription"].startswith(
        "Rejected by the DAPO pipeline: the improvement over the base model is not shown: its 95% lower bound "
        f"{gain['ci95_low']:+.4f} is below MinImprovement 0; greedy accuracy 0.5833")


def test_an_adapter_better_than_its_base_is_approved(tmp_path, moto_server):
    evaluation = RUNS["better than its base"][0]
    execution, arn = _from_the_gate_on(tmp_path, moto_server, evaluation)
    execution.run()
    assert [(r.name, r.status) for r in execution.records.values()][2:] == [
        ("CheckAccuracy", "Succeeded"), ("ApproveModel", "Succeeded")]
    entry = _client("sagemaker", moto_server).describe_model_package(ModelPackageName=arn)
    assert entry["ModelApprovalStatus"] == "Approved"
    properties = entry["CustomerMetadataProperties"]
    assert "rejection_reason" not in properties
    assert float(properties["improvement_ci95_low"]) > 0 and float(properties["accuracy"]) > float(
        properties["base_accuracy"])
