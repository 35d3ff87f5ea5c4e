"""Trying a trained adapter and re-evaluating it without training again.

- ``make sample MODEL=<run id>`` (local.sample) samples a finished local run's adapter through the SDK, against
  the local service started on the run's saved state, and stops its session;
- ``make local-run REEVALUATE=<run id>`` reruns EvaluateModel and the gate from the run's own definition: only
  MinImprovement changed turns an approved adapter into a rejected one, TrainDAPO's outputs stay byte for byte,
  the registry entry keeps the earlier verdict;
- ``make reevaluate EXECUTION=<arn>`` (pipeline.reevaluate) starts a selective execution in moto with the source
  execution's parameters and refuses a parameter no selected step reads;
- steps.approve keeps every earlier verdict (moto's registry replaces metadata, the local service merges it).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from local import reevaluate as local_reevaluate
from local import run
from local import sample as local_sample
from local.training_session.models import PackageRegistry
from pipeline import reevaluate
from pipeline.aws import UserError
from steps import approve
from steps.cli import Refused
from tests.test_approve import EXECUTION, write_inputs
from tests.test_pipeline_definition import local_build

REGION = "us-west-2"
LOCAL = str(Path(__file__).resolve().parents[1] / "config" / "local.yaml")


# -- a finished local run, approved at its own bars --------------------------------------------------------------
@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A small local run approved at AccuracyThreshold 0 and MinImprovement -1: any adapter that took a step."""
    runs = tmp_path_factory.mktemp("runs")
    code = run.main(["--runs-dir", str(runs), "--definition-out", str(runs / "pipeline.json"), "--quiet",
                     "--train-rows", "120", "--eval-rows", "24", "--param", "MaxSteps=2", "--param", "EvalSize=16",
                     "--param", "AccuracyThreshold=0", "--param", "MinImprovement=-1"])
    assert code == 0
    (run_dir,) = [p for p in runs.iterdir() if (p / "summary.txt").exists()]
    return run_dir


def digests(run_dir: Path) -> dict[str, str]:
    """Every file TrainDAPO and ValidateData left, and the run's own reports."""
    paths = [p for step in ("TrainDAPO", "ValidateData") for p in (run_dir / "work" / step).rglob("*") if p.is_file()]
    paths += [run_dir / name for name in ("model.json", "metrics.jsonl", "evaluation.json", "validation.json")]
    return {str(p.relative_to(run_dir)): hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}


def test_sample_prints_the_adapters_completions_and_stops_its_session(finished, capsys):
    """A succeeded run keeps only its adapter's package; the SDK samples it from a session that is then stopped."""
    packages = sorted(p.name for p in (finished / "service-state" / "packages").rglob("*") if p.is_file())
    version = json.loads((finished / "model.json").read_text())["model_package_arn"].rsplit("/", 1)[-1]
    assert packages == [f"{version}.json", f"{version}.npz"]
    code = local_sample.main([finished.name, "--runs-dir", str(finished.parent), "--n", "2", "--temperature", "0",
                              "--prompt", "Ann has 3 apples and buys 4 more. How many apples does she have?"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.count("--- completion ") == 2 and "--- completion 2 of 2: " in out
    session = out.split("sample: training session ", 1)[1].split()[0]
    assert f"sample: training session {session} stopped" in out
    assert f"source=service session={session}" in out  # the bill, read once the session was stopped


def test_sample_refuses_a_run_without_an_adapter(tmp_path, capsys):
    (tmp_path / "20261206-000000-abcd").mkdir()
    assert local_sample.main(["20261206-000000-abcd", "--runs-dir", str(tmp_path), "--prompt", "hi"]) == 2
    assert "model.json does not exist: run 20261206-000000-abcd has no trained adapter" in capsys.readouterr().err


def test_reevaluation_changes_the_verdict_and_leaves_training_untouched(finished, capsys):
    before = digests(finished)
    code = run.main(["--runs-dir", str(finished.parent), "--quiet", "--reevaluate", finished.name,
                     "--param", "MinImprovement=0.9"])
    out = capsys.readouterr().out
    assert code == 1, out  # rejected: the execution fails at AccuracyTooLow, as a local run does
    assert digests(finished) == before
    record = json.loads((finished / "reevaluations" / "1" / "reevaluation.json").read_text())
    assert (record["verdict_before"], record["verdict_after"]) == ("Approved", "Rejected")
    assert record["parameters"] == {"MinImprovement": "0.9"}
    assert record["values"] == {"MaxSteps": "2", "EvalSize": "16", "AccuracyThreshold": "0", "MinImprovement": "0.9"}
    steps = record["steps"]
    assert [steps[s]["status"] for s in ("ValidateData", "TrainDAPO", "EvaluateModel", "RecordRejection")] == \
        ["Succeeded"] * 4
    assert steps["TrainDAPO"]["message"].startswith("kept from run") and steps["CheckAccuracy"]["message"] == "false"
    assert "ApproveModel" not in steps
    metadata = record["model_package"]["CustomerMetadataProperties"]
    assert metadata["min_improvement"] == "0.9000" and "below MinImprovement 0.9" in metadata["rejection_reason"]
    assert metadata["verdicts"] == "2"
    assert metadata["verdict_1"].startswith(f"Approved execution={finished.name} accuracy=")
    assert metadata["verdict_1"].endswith("accuracy_threshold=0.0000 min_improvement=-1.0000")
    assert metadata["pipeline_execution_arn"].endswith(f"{finished.name}-r1")
    evaluation = json.loads((finished / "reevaluations" / "1" / "evaluation.json").read_text())
    assert evaluation["n"] == 16 and (finished / "reevaluations" / "1" / "evaluation_base.json").exists()
    assert "verdict: Rejected (was Approved): improvement lower bound" in out
    assert "training sessions created: 1, left running: 0" in out  # EvaluateModel's; TrainDAPO's was not created


@pytest.mark.parametrize("args, message", [
    (["--param", "BatchSize=8"], "parameter BatchSize is read only by ValidateData and TrainDAPO, which a "
                                 "re-evaluation keeps"),
    (["--param", "MinImprovment=0.5"], "did you mean MinImprovement?"),
    (["--param", "MaxSteps=5"], "read only by TrainDAPO"),
    (["--train-rows", "10"], "drop --train-rows"),
])
def test_reevaluation_refuses_what_it_would_ignore_before_creating_anything(finished, args, message):
    with pytest.raises(Refused, match=message):
        run.main(["--runs-dir", str(finished.parent), "--reevaluate", finished.name, *args])
    folder = finished / "reevaluations"  # none, or the one the test above made
    assert not folder.exists() or {p.name for p in folder.iterdir()} <= {"1"}


def test_reevaluation_needs_a_finished_run(tmp_path):
    with pytest.raises(Refused, match="does not exist; the local runs with a trained adapter: none"):
        run.main(["--runs-dir", str(tmp_path), "--reevaluate", "20261206-000000-abcd"])


# -- on AWS: selective execution ---------------------------------------------------------------------------------
@pytest.fixture
def deployed():
    """The real definition deployed in moto, and one finished execution of it."""
    definition = local_build()["definition"]
    with mock_aws():
        session = boto3.Session(region_name=REGION)
        sent: list[dict] = []
        session.events.register("provide-client-params.sagemaker.StartPipelineExecution",
                                lambda params, **_: sent.append(params))
        sm = session.client("sagemaker")
        sm.create_pipeline(PipelineName="dapo-local", RoleArn="arn:aws:iam::123456789012:role/dapo-local",
                           PipelineDefinition=json.dumps(definition))
        source = sm.start_pipeline_execution(PipelineName="dapo-local", PipelineParameters=[
            {"Name": "MaxSteps", "Value": "40"}, {"Name": "EvalDataS3Uri", "Value": "s3://dapo-local/heldout/"}],
        )["PipelineExecutionArn"]
        sent.clear()
        yield session, sm, source, sent


def test_reevaluate_starts_a_selective_execution_with_the_source_parameters(deployed, capsys):
    session, sm, source, sent = deployed
    arn = reevaluate.reevaluate(session, "dapo-local", source, {"MinImprovement": "0.1", "EvalSize": "0"}, LOCAL)
    (request,) = sent
    assert request["SelectiveExecutionConfig"] == {
        "SourcePipelineExecutionArn": source,
        "SelectedSteps": [{"StepName": s} for s in
                          ("EvaluateModel", "CheckAccuracy", "ApproveModel", "RecordRejection", "AccuracyTooLow")]}
    recorded = sm.list_pipeline_parameters_for_execution(PipelineExecutionArn=arn)["PipelineParameters"]
    assert {p["Name"]: p["Value"] for p in recorded} == {
        "MaxSteps": "40", "EvalDataS3Uri": "s3://dapo-local/heldout/", "MinImprovement": "0.1", "EvalSize": "0"}
    assert "keeps ValidateData and TrainDAPO from it (nothing is trained)" in capsys.readouterr().out


@pytest.mark.parametrize("params, message", [
    ({"EvalDataS3Uri": "s3://dapo-local/other/"}, "EvalDataS3Uri is read only by ValidateData"),
    ({"LearningRate": "0.001"}, "read only by TrainDAPO"),
    ({"MinImprovement": "2"}, "'pipeline.min_improvement' must be"),
])
def test_reevaluate_refuses_before_starting(deployed, params, message):
    session, _, source, sent = deployed
    with pytest.raises(Exception, match=message):
        reevaluate.reevaluate(session, "dapo-local", source, params, LOCAL)
    assert sent == []


def test_reevaluate_refuses_an_execution_of_another_pipeline(deployed):
    session, _, source, sent = deployed
    with pytest.raises(UserError, match="is an execution of pipeline 'dapo-local', not of 'other'"):
        reevaluate.reevaluate(session, "other", source, {}, LOCAL)


# -- the registry keeps every verdict ----------------------------------------------------------------------------
def test_each_new_verdict_keeps_the_earlier_ones_in_moto(tmp_path, monkeypatch):
    """moto replaces the metadata on each update (SageMaker merges it): the history survives either way, and an
    approval after a rejection carries no rejection_reason."""
    for var in ("SAGEMAKER_TRAINING_SESSION_ENDPOINT", "SAGEMAKER_TRAINING_SESSION_RUNTIME_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    with mock_aws():
        sm = boto3.client("sagemaker", region_name=REGION)
        sm.create_model_package_group(ModelPackageGroupName="dapo")
        arn = sm.create_model_package(ModelPackageGroupName="dapo",
                                      ModelApprovalStatus="PendingManualApproval")["ModelPackageArn"]
        args = write_inputs(tmp_path, arn)
        for n, (bar, reject) in enumerate([("0", False), ("0.9", True), ("0", False)], 1):
            assert approve.main([*args, "--execution-arn", f"{EXECUTION}{n}", "--min-improvement", bar,
                                 *(["--reject"] if reject else [])]) == 0
        described = sm.describe_model_package(ModelPackageName=arn)
    metadata = described["CustomerMetadataProperties"]
    assert described["ModelApprovalStatus"] == "Approved" and "rejection_reason" not in metadata
    assert metadata["verdicts"] == "3" and metadata["pipeline_execution_arn"] == f"{EXECUTION}3"
    assert metadata["verdict_1"].startswith("Approved execution=k2x9q11 accuracy=")
    assert metadata["verdict_2"].startswith("Rejected execution=k2x9q12 ")
    assert "rejection_reason=improvement lower bound" in metadata["verdict_2"]
    assert "verdict 3 of this adapter" in described["ApprovalDescription"]


def test_the_local_registry_removes_what_an_update_names():
    registry = PackageRegistry()
    try:
        group = registry.ensure_group("arn:aws:sagemaker:us-west-2:123456789012:model-package-group/g")
        package = registry.add(group, {}, is_checkpoint=False, description="", base_model=("m", "1"),
                               session_name="s", s3_prefix="s3://b/p")
        registry.update_approval(package.arn, "Rejected", "no", {"a": "1", "rejection_reason": "low"})
        updated = registry.update_approval(package.arn, "Approved", "yes", {"b": "2"}, remove=["rejection_reason"])
    finally:
        registry.close()
    assert updated.customer_metadata == {"a": "1", "b": "2"} and updated.approval_status == "Approved"


def test_reevaluation_folder_numbers_are_claimed_once(finished):
    plan = local_reevaluate.Reevaluation(finished, 1, {}, {}, LOCAL, {}, {})
    first, second = local_reevaluate.create_folder(plan)[1], local_reevaluate.create_folder(plan)[1]
    try:
        assert first != second and first.parent == second.parent == finished / "reevaluations"
    finally:
        first.rmdir()
        second.rmdir()
