"""Trying a trained adapter and re-evaluating it without training again.

- ``make sample MODEL=<run id>`` (local.sample) samples a finished local run's adapter through the SDK, against
  the local service started on the run's saved state, and stops its session;
- ``make local-run REEVALUATE=<run id>`` reruns EvaluateModel and the gate from the run's own definition: only
  MinImprovement changed turns an approved adapter into a rejected one, TrainDAPO's outputs stay byte for byte,
  the registry entry keeps the earlier verdict (both on tests/test_local_run.py's approved run, which calls
  :func:`sample_and_reevaluate`); both refuse a run without its adapter, and a re-evaluation a parameter it
  would ignore, before anything starts;
- ``make reevaluate EXECUTION=<arn>`` (pipeline.reevaluate) starts a selective execution in moto with the source
  execution's parameters and refuses a parameter no selected step reads;
- new held-out data (``EvalDataS3Uri``, locally ``--eval-data``) is checked by EvaluateModel: the questions the
  adapter trained on leave the eval split (steps/validate.py ``validate_held_out``), the rest is evaluated;
- steps.approve keeps every earlier verdict (moto's registry replaces metadata, the local service merges it).
"""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from local import run
from local import sample as local_sample
from local.training_session.registry import PackageRegistry
from pipeline import reevaluate, sample
from pipeline.aws import UserError
from steps import approve, validate
from steps.cli import Refused
from tests.test_approve import EXECUTION, write_inputs
from tests.test_pipeline_definition import local_build
from tests.test_validate import good_rows, read_jsonl, row, write_jsonl

REGION = "us-west-2"
LOCAL = str(Path(__file__).resolve().parents[1] / "config" / "local.yaml")


# -- a finished local run: tests/test_local_run.py's approved run is sampled and re-evaluated ---------------------
def sample_and_reevaluate(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Called at the end of test_local_run_trains_evaluates_and_approves, on its approved run (one local run serves
    both: a run costs a minute here, and a module fixture would be one per pytest-xdist worker)."""
    sample_prints_the_adapters_completions_and_stops_its_session(run_dir, capsys)
    reevaluation_changes_the_verdict_and_leaves_training_untouched(run_dir, capsys)
    reevaluation_on_new_held_out_data_leaves_out_what_the_adapter_trained_on(run_dir, capsys)


def squeeze(text: str) -> str:
    """``text`` without whitespace: how output wrapped at 100 columns is compared."""
    return "".join(text.split())


def digests(run_dir: Path) -> dict[str, str]:
    """Every file TrainDAPO and ValidateData left, and the run's own reports."""
    paths = [p for step in ("TrainDAPO", "ValidateData") for p in (run_dir / "work" / step).rglob("*") if p.is_file()]
    paths += [run_dir / name for name in ("model.json", "metrics.jsonl", "evaluation.json", "validation.json")]
    return {str(p.relative_to(run_dir)): hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}


def sample_prints_the_adapters_completions_and_stops_its_session(run_dir: Path, capsys) -> None:
    """A succeeded run keeps only its adapter's package; the SDK samples it from a session that is then stopped."""
    packages = sorted(p.name for p in (run_dir / "service-state" / "packages").rglob("*") if p.is_file())
    version = json.loads((run_dir / "model.json").read_text())["model_package_arn"].rsplit("/", 1)[-1]
    assert packages == [f"{version}.json", f"{version}.npz"]
    capsys.readouterr()
    code = local_sample.main([run_dir.name, "--runs-dir", str(run_dir.parent), "--n", "2", "--temperature", "0",
                              "--prompt", "Ann has 3 apples and buys 4 more. How many apples does she have?"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.count("--- completion ") == 2 and "--- completion 2 of 2: " in out
    session = out.split("sample: training session ", 1)[1].split()[0]
    assert f"sample: training session {session} stopped" in out
    assert f"source=service session={session}" in " ".join(out.split())  # the bill, read once the session stopped
    assert all(len(line) <= 100 for line in out.splitlines())  # a person's terminal: the ARNs' lines wrapped


def reevaluation_changes_the_verdict_and_leaves_training_untouched(run_dir: Path, capsys) -> None:
    """Approved at AccuracyThreshold 0.2; the same adapter, the same questions, AccuracyThreshold 0.99: rejected with
    both numbers and what held, the rejection recorded on the package, whose approval stays Approved (no
    --update-approval). (The second re-evaluation rejects on MinImprovement.)"""
    before = digests(run_dir)
    params = json.loads((run_dir / "run.json").read_text())["params"]
    capsys.readouterr()
    code = run.main(["--runs-dir", str(run_dir.parent), "--quiet", "--reevaluate", run_dir.name,
                     "--param", "AccuracyThreshold=0.99"])
    out = capsys.readouterr().out
    assert code == 1, out  # rejected: the execution fails at AccuracyTooLow, as a local run does
    assert digests(run_dir) == before
    folder = run_dir / "reevaluations" / "1"
    record = json.loads((folder / "reevaluation.json").read_text())
    assert (record["verdict_before"], record["verdict_after"]) == ("Approved", "Rejected")
    assert record["approval"] == {"before": "Approved", "after": "Approved", "update": "false"}
    assert record["model_package"]["ModelApprovalStatus"] == "Approved"
    assert record["parameters"] == {"AccuracyThreshold": "0.99"}
    assert record["values"] == {**params, "AccuracyThreshold": "0.99", "UpdateApproval": "false"}
    steps = record["steps"]
    assert [steps[s]["status"] for s in ("ValidateData", "TrainDAPO", "EvaluateModel", "RecordRejection")] == \
        ["Succeeded"] * 4
    assert steps["TrainDAPO"]["message"].startswith("kept from run") and steps["CheckAccuracy"]["message"] == "false"
    assert "ApproveModel" not in steps
    metadata = record["model_package"]["CustomerMetadataProperties"]
    accuracy = json.loads((run_dir / "reevaluations" / "1" / "evaluation.json").read_text())["metrics"]["accuracy"]
    assert metadata["accuracy_threshold"] == "0.9900"
    assert metadata["rejection_reason"] == f"accuracy {accuracy['value']:.4f} below AccuracyThreshold 0.99"
    assert metadata["verdicts"] == "2" and metadata["pipeline_execution_arn"].endswith(f"{run_dir.name}-r1")
    assert metadata["verdict_1"].startswith(f"Approved execution={run_dir.name} accuracy=")
    assert metadata["verdict_1"].endswith("min_improvement=0.0000")
    old, new = (json.loads(p.read_text()) for p in (run_dir / "evaluation.json", folder / "evaluation.json"))
    assert new["n"] == old["n"] and new["model_package_arn"] == old["model_package_arn"]
    assert (folder / "evaluation_base.json").exists() and (folder / "logs" / "EvaluateModel.log").exists()
    flat = squeeze(out)  # lines wrapped at 100 columns, read without whitespace
    steps_done = json.loads((run_dir / "evaluation.json").read_text())["training"]["steps_completed"]
    assert squeeze(f"verdict: Rejected (was Approved): accuracy {accuracy['value']:.4f} below AccuracyThreshold "
                   f"0.99") in flat
    assert squeeze(f"Not approved: accuracy {accuracy['value']:.4f} below AccuracyThreshold 0.99 (held:") in flat
    assert squeeze(f"{steps_done} optimizer steps completed") in flat
    assert squeeze("approval: recorded on the model package, approval left at Approved (UPDATE_APPROVAL=1 sets it "
                   "to the verdict)") in flat
    assert squeeze("training sessions created: 1, left running: 0") in flat  # EvaluateModel's; not TrainDAPO's


def reevaluation_on_new_held_out_data_leaves_out_what_the_adapter_trained_on(run_dir: Path, capsys) -> None:
    """--eval-data: 8 questions the run never saw and 2 it trained on (one with other case and spacing); the
    re-evaluation evaluates exactly the 8, says so in its validation.json, and training stays as it was. With
    --update-approval (UPDATE_APPROVAL=1) its rejection sets the package's status."""
    before = digests(run_dir)
    (trained,) = [p for p in (run_dir / "work" / "ValidateData").rglob("train.jsonl") if "validated" in p.parts]
    seen = {json.loads(line)["question"] for line in (run_dir / "data" / "eval.jsonl").read_text().splitlines()}
    seen |= {r["question"] for r in read_jsonl(trained)}
    new = [r for r in good_rows(40, who="Quentin") if r["question"] not in seen][:8]
    assert len(new) == 8
    trained_rows = read_jsonl(trained)[:2]
    trained_rows[1] = {**trained_rows[1], "question": "  " + trained_rows[1]["question"].upper()}
    held_out = write_jsonl(run_dir.parent / "new-held-out" / "test.jsonl", [new[0], trained_rows[0], *new[1:5],
                                                                             trained_rows[1], *new[5:]])
    capsys.readouterr()
    code = run.main(["--runs-dir", str(run_dir.parent), "--quiet", "--reevaluate", run_dir.name,
                     "--eval-data", str(held_out.parent), "--param", "EvalSize=0", "--param", "MinImprovement=1",
                     "--update-approval"])
    out = capsys.readouterr().out
    assert code == 1, out  # MinImprovement 1: rejected, whatever 8 questions show
    assert digests(run_dir) == before
    folder = run_dir / "reevaluations" / "2"
    evaluation = json.loads((folder / "evaluation.json").read_text())
    assert evaluation["n"] == 8 and evaluation["base"]["n"] == 8
    assert [p["question"] for p in map(json.loads, (folder / "predictions.jsonl").read_text().splitlines())] == \
        [r["question"] for r in new]
    assert evaluation["held_out"] == {"checked_by": "EvaluateModel", "validation": "validation.json", "rows": 10,
                                      "kept": 8, "trained_on_removed": 2}
    checked = json.loads((folder / "validation.json").read_text())
    assert checked["status"] == "accepted" and checked["overlap"]["count"] == 2
    assert checked["overlap"]["action"] == "removed from eval"
    assert [r["line"] for r in checked["overlap"]["first_rows"]] == [2, 7]
    assert checked["grader_agreement"]["checked"] == 10 and checked["trained_on"]["rows"] == len(read_jsonl(trained))
    assert read_jsonl(folder / "data" / "test.jsonl") == read_jsonl(held_out)  # what was evaluated stays with it
    record = json.loads((folder / "reevaluation.json").read_text())
    assert record["approval"] == {"before": "Approved", "after": "Rejected", "update": "true"}
    assert record["eval_data"]["given"] == [str(held_out)] and record["steps"]["TrainDAPO"]["message"].startswith(
        "kept from run")
    flat = squeeze(out)  # lines wrapped at 100 columns, read without whitespace
    assert squeeze("held-out data accepted: 8/10 rows kept; 2 questions the adapter trained on removed from "
                   "eval") in flat
    assert squeeze("approval: recorded on the model package, approval changed from Approved to Rejected") in flat
    assert squeeze("training sessions created: 1, left running: 0") in flat


# -- the held-out check of a re-evaluation, as a function ----------------------------------------------------------
def validated_run(tmp_path: Path) -> tuple[Path, Path]:
    """ValidateData's output of a small run (its train split is what the adapter trained on) and its eval file."""
    eval_file = write_jsonl(tmp_path / "data" / "eval.jsonl", good_rows(3, who="Zed"))
    train = write_jsonl(tmp_path / "data" / "train.jsonl", good_rows(6))
    out = tmp_path / "validated"
    assert validate.validate(str(train), str(eval_file), 2, out)["status"] == "accepted"
    return out, eval_file


def test_held_out_data_is_checked_again_only_when_it_is_not_what_validate_checked(tmp_path):
    validated, eval_file = validated_run(tmp_path)
    assert validate.checked_by_validate(str(eval_file), validated)
    assert validate.checked_by_validate(str(eval_file.parent / "eval.jsonl"), validated)
    other = write_jsonl(tmp_path / "new" / "eval.jsonl", good_rows(2, who="Bo"))
    assert not validate.checked_by_validate(str(other), validated)
    with pytest.raises(Refused, match="the held-out data \\(EvalDataS3Uri\\): .*no such file"):
        validate.checked_by_validate(str(tmp_path / "missing"), validated)


def test_held_out_rows_the_adapter_trained_on_leave_the_eval_split_and_the_rest_is_validated(tmp_path):
    validated, _ = validated_run(tmp_path)
    trained = read_jsonl(validated / "train.jsonl")
    rows = [*good_rows(2, who="Bo"), {**trained[3], "question": trained[3]["question"].lower()},
            row("What is 3 + 4?", "seven"), *good_rows(4, who="Bo")[2:]]
    out = tmp_path / "evaluation"
    report = validate.validate_held_out(str(write_jsonl(tmp_path / "new.jsonl", rows)), validated, out)
    assert read_jsonl(out / "eval.jsonl") == good_rows(4, who="Bo")
    assert report["status"] == "accepted" and report["on_overlap"] == "remove-from-eval"
    assert report["overlap"] == {"count": 1, "action": "removed from eval",
                                 "first_rows": [{"file": str(tmp_path / "new.jsonl"), "line": 3}]}
    assert report["splits"]["eval"]["rejected"] == 1 and report["kept"] == {"eval": 4}
    assert report["trained_on"]["rows"] == 6 and report["mode"] == "re-evaluation"
    assert json.loads((out / "validation.json").read_text()) == report


@pytest.mark.parametrize("rows, message", [
    ("trained", "the held-out data has no usable rows: 6 read, 0 rejected .none., 6 asked questions the adapter "
                "trained on"),
    ([row(f"What is {i} + 4?", "about seven") for i in range(4)], "grader cannot read the gold answers of eval"),
])
def test_held_out_data_that_leaves_nothing_to_evaluate_is_refused_naming_rows(tmp_path, rows, message):
    validated, _ = validated_run(tmp_path)
    rows = read_jsonl(validated / "train.jsonl") if rows == "trained" else rows
    out = tmp_path / "evaluation"
    with pytest.raises(Refused, match=message):
        validate.validate_held_out(str(write_jsonl(tmp_path / "new.jsonl", rows)), validated, out)
    assert json.loads((out / "validation.json").read_text())["status"] == "refused"
    assert not (out / "eval.jsonl").exists()


def fake_finished_run(runs: Path) -> Path:
    """What plan() reads of a finished run, without running one: the refusals come before anything starts."""
    run_dir = runs / "20261206-000000-abcd"
    (run_dir / "service-state").mkdir(parents=True)
    kept = {"config": LOCAL, "params": {"MaxSteps": "3"}, "outcome": "succeeded"}
    (run_dir / "run.json").write_text(json.dumps(kept))
    (run_dir / "steps.json").write_text(json.dumps({name: {"name": name, "type": "Processing", "status": "Succeeded"}
                                                    for name in ("ValidateData", "TrainDAPO")}))
    (run_dir / "pipeline.json").write_text(json.dumps(local_build()["definition"]))
    (run_dir / "model.json").write_text(json.dumps({"model_package_arn": "arn:aws:sagemaker:us-west-2:123456789012:"
                                                                         "model-package/dapo-local/3"}))
    return run_dir


@pytest.mark.parametrize("args, message", [
    (["--param", "BatchSize=8"], "parameter BatchSize is read only by ValidateData and TrainDAPO, which a "
                                 "re-evaluation keeps"),
    (["--param", "MinImprovment=0.5"], "did you mean MinImprovement?"),
    (["--param", "MaxSteps=5"], "read only by TrainDAPO"),
    (["--param", "MinImprovement=2"], "'pipeline.min_improvement' must be"),
    (["--train-rows", "10"], "drop --train-rows"),
    (["--param", "EvalDataS3Uri=s3://b/new/"], "--param EvalDataS3Uri=...: a local re-evaluation takes new held-out "
                                                "data as a file or folder: --eval-data <path>"),
    (["--eval-data", "/nonexistent/heldout"], "--eval-data /nonexistent/heldout: no such file or directory"),
])
def test_reevaluation_refuses_what_it_would_ignore_before_creating_anything(tmp_path, args, message):
    run_dir = fake_finished_run(tmp_path)
    with pytest.raises(Refused, match=message):
        run.main(["--runs-dir", str(tmp_path), "--reevaluate", run_dir.name, *args])
    assert not (run_dir / "reevaluations").exists()


def test_eval_data_belongs_to_a_reevaluation(tmp_path):
    with pytest.raises(Refused, match="--eval-data x.jsonl is new held-out data for a re-evaluation: add --reevaluate"):
        run.main(["--runs-dir", str(tmp_path), "--eval-data", "x.jsonl"])
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("change, message", [
    ({"outcome": "interrupted"}, "that run is interrupted; re-evaluate a run that ended"),
    ({"TrainDAPO": "Failed"}, "TrainDAPO did not succeed in that run"),
    ({"model.json": None}, "has no trained adapter (TrainDAPO did not finish)"),
    ({"service-state": None}, "this run's adapter weights are gone"),
])
def test_reevaluation_and_sample_need_a_finished_run_with_its_adapter(tmp_path, change, message, capsys):
    run_dir = fake_finished_run(tmp_path)
    if "outcome" in change:
        (run_dir / "run.json").write_text(json.dumps({"config": LOCAL, "params": {}, **change}))
    if "TrainDAPO" in change:
        (run_dir / "steps.json").write_text(json.dumps({"TrainDAPO": {"status": "Failed"}}))
    if "model.json" in change:
        (run_dir / "model.json").unlink()
    if "service-state" in change:
        (run_dir / "service-state").rmdir()
    with pytest.raises(Refused, match=re.escape(message)):
        run.main(["--runs-dir", str(tmp_path), "--reevaluate", run_dir.name])
    if "outcome" not in change and "TrainDAPO" not in change:  # sample needs the adapter, not how the run ended
        assert local_sample.main([run_dir.name, "--runs-dir", str(tmp_path), "--prompt", "hi"]) == 2
        assert message in capsys.readouterr().err
    assert not (run_dir / "reevaluations").exists()


def test_reevaluation_and_sample_name_the_runs_there_when_the_id_is_wrong(tmp_path):
    fake_finished_run(tmp_path)
    with pytest.raises(Refused, match="does not exist; the local runs with a trained adapter: 20261206-000000-abcd"):
        run.main(["--runs-dir", str(tmp_path), "--reevaluate", "20261206-000000-ffff"])


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
    # UpdateApproval false: the verdict is recorded on the package, its approval status left (ApproveModel and
    # RecordRejection read it: tests/test_reevaluate.py's moto registry test and the local re-evaluation hold that).
    assert {p["Name"]: p["Value"] for p in recorded} == {
        "MaxSteps": "40", "EvalDataS3Uri": "s3://dapo-local/heldout/", "MinImprovement": "0.1", "EvalSize": "0",
        "UpdateApproval": "false"}
    out = capsys.readouterr().out
    assert "keeps ValidateData and TrainDAPO from it (nothing is trained)" in out
    assert "its approval status is left as it is (UPDATE_APPROVAL=1 sets it to the verdict)" in out
    # Asked (make reevaluate UPDATE_APPROVAL=1): the new verdict sets it.
    arn = reevaluate.reevaluate(session, "dapo-local", source, {}, LOCAL, update_approval=True)
    recorded = sm.list_pipeline_parameters_for_execution(PipelineExecutionArn=arn)["PipelineParameters"]
    assert {p["Name"]: p["Value"] for p in recorded}["UpdateApproval"] == "true"
    assert "the new verdict sets the model package's approval status" in capsys.readouterr().out


def test_reevaluate_on_new_held_out_data_is_the_same_selective_execution_with_the_new_uri(deployed, capsys):
    """SageMaker runs every step on a path between two selected ones: selecting ValidateData would select TrainDAPO
    (ValidateData -> TrainDAPO -> EvaluateModel), so the new data goes to EvaluateModel, which checks it itself."""
    session, sm, source, sent = deployed
    arn = reevaluate.reevaluate(session, "dapo-local", source, {"EvalDataS3Uri": "s3://dapo-local/new-heldout/"},
                                LOCAL)
    (request,) = sent
    assert [s["StepName"] for s in request["SelectiveExecutionConfig"]["SelectedSteps"]] == [
        "EvaluateModel", "CheckAccuracy", "ApproveModel", "RecordRejection", "AccuracyTooLow"]
    assert request["SelectiveExecutionConfig"]["SourcePipelineExecutionArn"] == source
    recorded = sm.list_pipeline_parameters_for_execution(PipelineExecutionArn=arn)["PipelineParameters"]
    assert {p["Name"]: p["Value"] for p in recorded} == {"MaxSteps": "40", "UpdateApproval": "false",
                                                         "EvalDataS3Uri": "s3://dapo-local/new-heldout/"}
    assert "held-out data: s3://dapo-local/new-heldout/, checked by EvaluateModel" in capsys.readouterr().out
    # ... because EvaluateModel reads it beside ValidateData's output, whose train split it removes from it.
    definition = local_build()["definition"]
    (evaluate,) = [s for s in definition["Steps"] if s["Name"] == "EvaluateModel"]
    inputs = {i["InputName"]: i["S3Input"]["S3Uri"] for i in evaluate["Arguments"]["ProcessingInputs"]}
    assert inputs["heldout"] == {"Get": "Parameters.EvalDataS3Uri"}
    assert inputs["validated"] == {"Get": "Steps.ValidateData.ProcessingOutputConfig.Outputs['validated'].S3Output."
                                          "S3Uri"}
    args = evaluate["Arguments"]["AppSpecification"]["ContainerArguments"]
    assert args[args.index("--held-out") + 1] == "/opt/ml/processing/input/heldout"


def test_a_definition_whose_evaluate_does_not_read_the_held_out_data_refuses_new_data():
    """A pipeline deployed before EvaluateModel checked held-out data itself: EvalDataS3Uri would change nothing."""
    definition = local_build()["definition"]
    (evaluate,) = [s for s in definition["Steps"] if s["Name"] == "EvaluateModel"]
    evaluate["Arguments"]["ProcessingInputs"] = [i for i in evaluate["Arguments"]["ProcessingInputs"]
                                                 if i["InputName"] != "heldout"]
    with pytest.raises(UserError, match="EvalDataS3Uri is read only by ValidateData, .* in this definition "
                                        "\\(built before EvaluateModel read the held-out data itself"):
        reevaluate.check_overrides({"EvalDataS3Uri": "s3://b/new/"}, definition)


@pytest.mark.parametrize("params, message", [
    ({"LearningRate": "0.001"}, "read only by TrainDAPO"),
    ({"MinImprovement": "2"}, "'pipeline.min_improvement' must be"),
])
def test_reevaluate_refuses_before_starting(deployed, params, message):
    session, _, source, sent = deployed
    with pytest.raises(Exception, match=message):
        reevaluate.reevaluate(session, "dapo-local", source, params, LOCAL)
    assert sent == []


def test_a_definition_without_update_approval_is_refused_unless_the_verdict_may_set_the_status():
    with pytest.raises(UserError, match="no UpdateApproval parameter .* UPDATE_APPROVAL=1"):
        reevaluate.approval({"MinImprovement"}, {}, update=False)
    assert reevaluate.approval({"MinImprovement"}, {}, update=True)[0] == {}
    assert reevaluate.approval({"UpdateApproval"}, {"UpdateApproval": "True"}, update=False)[0] == {
        "UpdateApproval": "true"}


def test_reevaluate_refuses_an_execution_of_another_pipeline(deployed):
    session, _, source, sent = deployed
    with pytest.raises(UserError, match="is an execution of pipeline 'dapo-local', not of 'other'"):
        reevaluate.reevaluate(session, "other", source, {}, LOCAL)


# -- the registry keeps every verdict ----------------------------------------------------------------------------
def test_each_new_verdict_keeps_the_earlier_ones_in_moto(tmp_path, monkeypatch, capsys):
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
    # A re-evaluation's default (UpdateApproval false): a rejection is recorded, the Approved package stays Approved.
    with mock_aws():
        sm = boto3.client("sagemaker", region_name=REGION)
        sm.create_model_package_group(ModelPackageGroupName="dapo")
        arn = sm.create_model_package(ModelPackageGroupName="dapo",
                                      ModelApprovalStatus="PendingManualApproval")["ModelPackageArn"]
        args = write_inputs(tmp_path, arn)
        for n, (bar, reject, update) in enumerate([("0", False, "true"), ("0.9", True, "false"),
                                                   ("0.9", True, "true")], 1):
            capsys.readouterr()
            assert approve.main([*args, "--execution-arn", f"{EXECUTION}{n}", "--min-improvement", bar,
                                 "--update-approval", update, *(["--reject"] if reject else [])]) == 0
            out = capsys.readouterr().out
            status, metadata = (lambda d: (d["ModelApprovalStatus"], d["CustomerMetadataProperties"]))(
                sm.describe_model_package(ModelPackageName=arn))
            if n == 2:  # recorded, not applied
                assert status == "Approved" and metadata["verdict"] == "Rejected" and "rejection_reason" in metadata
                assert f"approve: {arn} recorded (verdict Rejected 2, the earlier one kept as verdict_1), approval " \
                       "left at Approved (UpdateApproval=true sets it)" in out
            if n == 3:  # asked: the verdict sets the status; verdict_2 is the gate's Rejected, not the status
                assert status == "Rejected" and metadata["verdict_2"].startswith("Rejected execution=k2x9q12 ")
                assert "approval changed from Approved to Rejected" in out


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


# -- make sample MODEL=<package ARN>: the AWS form, against the local service as its endpoint --------------------
@pytest.fixture
def adapter(service_client, local_service):
    """A sampler package of the local toy (weights saved before any training: enough to sample from)."""
    from tests.local_service import BASE_MODEL_ARN

    with service_client.create_lora_training_client(base_model=BASE_MODEL_ARN) as tc:
        return tc.save_weights_for_sampler().result().model_package_arn


def _sessions(service, before: set[str]) -> dict[str, str]:
    return {s["name"]: s["status"] for s in service.sessions() if s["name"] not in before}


def test_sample_a_package_in_a_session_of_its_own_and_stop_it(adapter, local_service, capsys):
    before = {s["name"] for s in local_service.sessions()}
    code = sample.main(["--config", LOCAL, "--model", adapter, "--prompt", "What is 2 plus 3?", "--n", "3",
                        "--seed", "1"])
    out = capsys.readouterr().out
    assert code == 0, out
    (name, status), = _sessions(local_service, before).items()
    assert status == "Stopped" and f"sample: training session {name} stopped" in out
    flat = " ".join(out.split())  # wrapped at 100 columns, read as one
    assert out.count("--- completion ") == 3 and f"3 completion(s) of {adapter}" in flat
    assert re.search(r"^billing: prefill_tokens=\d+ sample_tokens=\d+ train_tokens=0 source=service", out, re.M)
    assert f" source=service session={name} " in flat


def test_sample_stops_its_session_when_sampling_fails(adapter, local_service, capsys):
    from local.training_session.faults import Faults

    before = {s["name"] for s in local_service.sessions()}
    local_service.set_faults(Faults(sampling_fail_rate=1.0))
    code = sample.main(["--config", LOCAL, "--model", adapter, "--prompt", "What is 2 plus 3?"])
    assert code == 1 and "nothing is left running" in capsys.readouterr().err
    assert list(_sessions(local_service, before).values()) == ["Stopped"]


def test_sample_refuses_a_package_that_is_not_there_before_creating_a_session(local_service, capsys):
    before = {s["name"] for s in local_service.sessions()}
    missing = "arn:aws:sagemaker:us-west-2:123456789012:model-package/dapo-local/999"
    assert sample.main(["--config", LOCAL, "--model", missing, "--prompt", "hi"]) == 2
    assert f"model package {missing}: " in capsys.readouterr().err
    assert _sessions(local_service, before) == {}
