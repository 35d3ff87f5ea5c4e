"""The one interpreter of the definition's expressions (pipeline/expressions.py), case by case, and proof that
the offline checks and the local run both evaluate through it."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from local.pipeline_runner import LocalExecution, PipelineFailed, StepRecord
from pipeline import checks
from pipeline.expressions import (
    EXECUTION_VARIABLE_NAMES,
    RUN_TIME,
    Environment,
    ExpressionError,
    all_hold,
    evaluate,
    holds,
    parameter_values,
    parse_path,
    property_files,
    render,
    walk,
)

OUTPUT = "s3://bucket/pipelines/exec1/Evaluate/evaluation"
EVALUATE = {
    "Name": "Evaluate", "Type": "Processing",
    "Arguments": {"ProcessingOutputConfig": {"Outputs": [
        {"OutputName": "evaluation", "S3Output": {"S3Uri": OUTPUT, "LocalPath": "/opt/ml/processing/evaluation"}}]}},
    "PropertyFiles": [{"PropertyFileName": "Report", "OutputName": "evaluation", "FilePath": "evaluation.json"}],
}
DEFINITION: dict[str, Any] = {
    "Version": "2020-12-01",
    "Parameters": [
        {"Name": "Bucket", "Type": "String", "DefaultValue": "my-bucket"},
        {"Name": "BatchSize", "Type": "Integer", "DefaultValue": 32},
        {"Name": "LearningRate", "Type": "Float", "DefaultValue": 1e-05},
        {"Name": "Threshold", "Type": "Float", "DefaultValue": 0.5},
        {"Name": "Shuffle", "Type": "Boolean", "DefaultValue": True},
        {"Name": "Tag", "Type": "String"},  # no default
    ],
    "Steps": [EVALUATE],
}
# What a Describe*Job response holds: lists of named items, maps, scalars.
PROPERTIES = {
    "Evaluate": EVALUATE["Arguments"],
    "Train": {
        "TrainingJobName": "pipelines-exec1-Train-abc",
        "ModelArtifacts": {"S3ModelArtifacts": "s3://bucket/model.tar.gz"},
        "HyperParameters": {"learning_rate": "1e-05"},
        "InputDataConfig": [{"ChannelName": "train", "DataSource": {"S3DataSource": {"S3Uri": "s3://bucket/train"}}},
                            {"ChannelName": "eval", "DataSource": {"S3DataSource": {"S3Uri": "s3://bucket/eval"}}}],
        "FinalMetricDataList": [{"MetricName": "train:loss", "Value": -0.25}, {"MetricName": "eval:accuracy",
                                                                              "Value": 0.75}],
    },
}
REPORT = {"metrics": {"accuracy": {"value": 0.625}, "f1-score": 0.5},
          "training": {"steps_completed": 3, "stopped_early": False},
          "runs": [{"score": 0.1}, {"score": 0.9}], "note": None}
EXECUTION = {"PipelineExecutionId": "exec1", "PipelineName": "dapo"}


def step_property(step: str, path: str) -> Any:
    if step not in PROPERTIES:
        raise ExpressionError(f"step {step} has not succeeded")
    return walk(PROPERTIES[step], path)


def env(given: dict[str, Any] | None = None, files: dict[str, Any] | None = None) -> Environment:
    """The local run's kind of environment: real values, JSON files read from 'S3' (a dict here)."""
    files = {f"{OUTPUT}/evaluation.json": REPORT} if files is None else files

    def read_json(uri: str) -> Any:
        if uri not in files:
            raise ExpressionError(f"there is no file {uri}")
        return files[uri]

    return Environment(parameters=parameter_values(DEFINITION, {"Tag": "t", **(given or {})}), execution=EXECUTION,
                       step_property=step_property, read_json=read_json, property_files=property_files(DEFINITION))


def join(*values: Any, on: str = "/") -> dict[str, Any]:
    return {"Std:Join": {"On": on, "Values": list(values)}}


def json_get(path: str) -> dict[str, Any]:
    return {"Std:JsonGet": {"PropertyFile": {"Get": "Steps.Evaluate.PropertyFiles.Report"}, "Path": path}}


def error(node: Any, environment: Environment | None = None, where: str = "Arguments.X") -> str:
    with pytest.raises(ExpressionError) as exc:
        evaluate(node, environment or env(), where)
    return str(exc.value)


# --- Std:Join ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("values", "on", "text"), [
    (["s3:/", "bucket", "key"], "/", "s3://bucket/key"),
    (["a", "b"], None, "ab"),  # On omitted: ""
    ([32, -7], ",", "32,-7"),
    ([1e-05, 0.5, 1.0, 2.5e20], " ", "1e-05 0.5 1.0 2.5e+20"),
    ([True, False], " ", "true false"),
    ([], "/", ""),
])
def test_join_renders_each_kind_of_value(values: list[Any], on: str | None, text: str) -> None:
    node = {"Std:Join": {"Values": values} if on is None else {"On": on, "Values": values}}
    assert evaluate(node, env()) == text


@pytest.mark.parametrize("value", [None, {"a": 1}, [1], float("nan")])
def test_join_refuses_what_has_no_text(value: Any) -> None:
    message = error(join("s3://b", value))
    assert message.startswith("Arguments.X: Std:Join: value 1: cannot write the "), message


def test_join_of_nested_expressions() -> None:
    node = join(join("s3:/", {"Get": "Parameters.Bucket"}), {"Get": "Execution.PipelineExecutionId"},
                {"Get": "Parameters.BatchSize"}, json_get("metrics.accuracy.value"),
                json_get("training.stopped_early"), on="/")
    assert evaluate(node, env()) == "s3://my-bucket/exec1/32/0.625/false"


def test_join_of_a_json_null_names_the_value() -> None:
    message = error({"Args": [join("note=", json_get("note"), on="")]}, where="Arguments")
    assert message.startswith("Arguments.Args[0]: Std:Join: value 1: cannot write the null None"), message


def test_render_is_the_one_spelling() -> None:
    assert [render(v) for v in ("x", 3, 0.1, True)] == ["x", "3", "0.1", "true"]


# --- Std:JsonGet ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("path", "value"), [
    ("metrics.accuracy.value", 0.625),
    ("$.metrics.accuracy.value", 0.625),
    ("training.steps_completed", 3),
    ("runs[1].score", 0.9),
    ("runs[0]", {"score": 0.1}),
    ("metrics['f1-score']", 0.5),
    ("training['stopped_early']", False),
    ("note", None),
])
def test_json_get_paths(path: str, value: Any) -> None:
    assert evaluate(json_get(path), env()) == value


def test_json_get_reads_the_property_file_under_its_output() -> None:
    """<the output's S3Uri>/<FilePath>: the file SageMaker indexes for the step."""
    read: list[str] = []
    environment = env()
    spy = Environment(environment.parameters, environment.execution, environment.step_property,
                      lambda uri: read.append(uri) or REPORT, environment.property_files)
    assert evaluate(json_get("training.steps_completed"), spy) == 3
    assert read == [f"{OUTPUT}/evaluation.json"]


@pytest.mark.parametrize(("path", "fragments"), [
    ("metrics.recall.value", ["there is no 'recall' after 'metrics'", "keys accuracy, f1-score"]),
    ("runs[2].score", ["there is no [2] after 'runs'", "a list of 2"]),
    ("metrics.accuracy.value.x", ["there is no 'x' after 'metrics.accuracy.value'", "the number 0.625"]),
    ("missing", ["there is no 'missing' at the top"]),
])
def test_json_get_missing_key_is_a_clear_error(path: str, fragments: list[str]) -> None:
    message = error({"Conditions": [{"LeftValue": json_get(path)}]}, where="Arguments")
    assert message.startswith(f"Arguments.Conditions[0].LeftValue: Std:JsonGet Path {path!r}: "
                              f"in {OUTPUT}/evaluation.json: there is no "), message
    for fragment in fragments:
        assert fragment in message, message


def test_json_get_of_a_file_that_is_not_there() -> None:
    assert f"there is no file {OUTPUT}/evaluation.json" in error(json_get("metrics"), env(files={}))


def test_json_get_of_an_undeclared_property_file() -> None:
    node = {"Std:JsonGet": {"PropertyFile": {"Get": "Steps.Evaluate.PropertyFiles.Other"}, "Path": "a"}}
    assert "step Evaluate declares no property file 'Other' (it declares ['Report'])" in error(node)


def test_json_get_by_s3_uri() -> None:
    node = {"Std:JsonGet": {"S3Uri": join(OUTPUT, "evaluation.json"), "Path": "runs[0].score"}}
    assert evaluate(node, env()) == 0.1


def test_json_get_while_building_is_unknown_but_its_path_is_checked() -> None:
    building = Environment(parameters={}, execution={}, step_property=step_property, read_json=None,
                           property_files=property_files(DEFINITION))
    assert evaluate(join("accuracy ", json_get("metrics.accuracy.value"), on=""), building) == f"accuracy {RUN_TIME}"
    assert "cannot parse the property path 'metrics..value'" in error(json_get("metrics..value"), building)


# --- Get -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("reference", "value"), [
    ("Steps.Evaluate.ProcessingOutputConfig.Outputs['evaluation'].S3Output.S3Uri", OUTPUT),
    ("Steps.Train.InputDataConfig['eval'].DataSource.S3DataSource.S3Uri", "s3://bucket/eval"),
    ("Steps.Train.InputDataConfig[0].ChannelName", "train"),
    ("Steps.Train.FinalMetricDataList['eval:accuracy'].Value", 0.75),
    ("Steps.Train.HyperParameters['learning_rate']", "1e-05"),
    ("Steps.Train.ModelArtifacts.S3ModelArtifacts", "s3://bucket/model.tar.gz"),
    ("Execution.PipelineExecutionId", "exec1"),
    ("Execution.PipelineName", "dapo"),
])
def test_get_of_step_properties_and_execution_variables(reference: str, value: Any) -> None:
    assert evaluate({"Get": reference}, env()) == value


@pytest.mark.parametrize(("reference", "fragment"), [
    ("Steps.Evaluate.ProcessingOutputConfig.Outputs['report'].S3Output.S3Uri",
     "there is no ['report'] after 'ProcessingOutputConfig.Outputs' (there: a list of 1)"),
    ("Steps.Train.ModelArtifactz", "there is no 'ModelArtifactz' at the top"),
    ("Steps.Approve.Outcome", "step Approve has not succeeded"),
    ("Execution.PipelineArn", "'PipelineArn' is not available here (available: PipelineExecutionId, PipelineName)"),
    ("Execution.PipelineExecutionID", "'PipelineExecutionID' is not an execution variable"),
    ("Parameters.Batchsize", "parameter 'Batchsize' has no value"),
    ("Pipeline.Name", "a Get names Parameters.<name>, Execution.<variable> or Steps.<step>.<property>"),
])
def test_get_that_has_no_value_is_named(reference: str, fragment: str) -> None:
    message = error({"Get": reference})
    assert message.startswith(f"Arguments.X: Get {reference!r}: ") and fragment in message, message


def test_get_of_parameters_default_and_overridden() -> None:
    defaults = env()
    assert [evaluate({"Get": f"Parameters.{n}"}, defaults) for n in ("Bucket", "BatchSize", "LearningRate",
                                                                    "Shuffle")] == ["my-bucket", 32, 1e-05, True]
    # StartPipelineExecution passes values as strings; each becomes its parameter's Type.
    overridden = env({"Bucket": "other", "BatchSize": "64", "LearningRate": "2e-5", "Shuffle": "false"})
    assert [evaluate({"Get": f"Parameters.{n}"}, overridden) for n in ("Bucket", "BatchSize", "LearningRate",
                                                                      "Shuffle")] == ["other", 64, 2e-05, False]
    assert evaluate(join("lr=", {"Get": "Parameters.LearningRate"}, on=""), overridden) == "lr=2e-05"


@pytest.mark.parametrize(("given", "message"), [
    ({"BatchSize": "6.5"}, "parameter BatchSize='6.5': must be integer"),
    ({"Threshold": "high"}, "parameter Threshold='high': must be float"),
    ({"Shuffle": "yes"}, "parameter Shuffle='yes': must be true or false"),
    ({"Batchsize": "64"}, "unknown pipeline parameter(s) Batchsize (the pipeline has: Bucket, BatchSize,"),
])
def test_bad_parameter_values_are_refused(given: dict[str, str], message: str) -> None:
    with pytest.raises(ExpressionError) as exc:
        parameter_values(DEFINITION, given)
    assert str(exc.value).startswith(message), exc.value


def test_a_parameter_without_default_or_value_has_none() -> None:
    assert "Tag" not in parameter_values(DEFINITION, {})
    environment = Environment(parameter_values(DEFINITION, {}), EXECUTION, step_property)
    assert "parameter 'Tag' has no value: it is not declared, or has no default" in error({"Get": "Parameters.Tag"},
                                                                                          environment)


def test_paths_parse_as_sagemaker_writes_them() -> None:
    assert [str(t) for t in parse_path("A.Outputs['x'].B[3]")] == [".A", ".Outputs", "['x']", ".B", "[3]"]
    assert [str(t) for t in parse_path('$.a["k"]')] == [".a", "['k']"]
    for bad in ("", "a..b", "a[x]", ".a", "a['x'"):
        with pytest.raises(ExpressionError, match="cannot parse the property path"):
            parse_path(bad)


# --- conditions ----------------------------------------------------------------------------------------------


def cond(kind: str, left: Any, right: Any) -> dict[str, Any]:
    return {"Type": kind, "LeftValue": left, "RightValue": right}


@pytest.mark.parametrize(("condition", "outcome"), [
    (cond("GreaterThanOrEqualTo", json_get("metrics.accuracy.value"), {"Get": "Parameters.Threshold"}), True),
    (cond("GreaterThanOrEqualTo", 0.5, 0.5), True),
    (cond("GreaterThanOrEqualTo", json_get("training.steps_completed"), 4), False),
    (cond("GreaterThan", 3, 2.5), True),
    (cond("GreaterThan", 2.5, 2.5), False),
    (cond("LessThan", 1, 2), True),
    (cond("LessThan", 2, 2), False),
    (cond("LessThanOrEqualTo", 2, 2.0), True),
    (cond("Equals", 1, 1.0), True),  # JSON has one number type
    (cond("Equals", {"Get": "Parameters.Bucket"}, "my-bucket"), True),
    (cond("Equals", {"Get": "Parameters.Shuffle"}, True), True),
    (cond("Equals", "a", "b"), False),
    ({"Type": "In", "QueryValue": {"Get": "Parameters.BatchSize"}, "Values": [16, 32.0]}, True),
    ({"Type": "In", "QueryValue": "32", "Values": [32]}, False),  # another kind never matches
    ({"Type": "Not", "Condition": cond("Equals", 1, 2)}, True),
    ({"Type": "Or", "Conditions": [cond("LessThan", 2, 1), cond("Equals", "x", "x")]}, True),
    ({"Type": "Or", "Conditions": [cond("LessThan", 2, 1)]}, False),
])
def test_conditions(condition: dict[str, Any], outcome: bool) -> None:
    assert holds(condition, env()) is outcome


def test_a_condition_step_holds_when_every_condition_does() -> None:
    gate = [cond("GreaterThanOrEqualTo", json_get("metrics.accuracy.value"), {"Get": "Parameters.Threshold"}),
            cond("GreaterThanOrEqualTo", json_get("training.steps_completed"), 1)]
    assert all_hold(gate, env()) is True
    assert all_hold(gate, env({"Threshold": "0.7"})) is False
    assert all_hold([], env()) is True


@pytest.mark.parametrize(("condition", "message"), [
    (cond("GreaterThan", "0.5", 0.1),
     "Conditions[0]: GreaterThan compares numbers, not the string '0.5' and the number 0.1"),
    (cond("LessThan", True, 1), "Conditions[0]: LessThan compares numbers, not the boolean True and the number 1"),
    (cond("GreaterThanOrEqualTo", json_get("note"), 1),
     "Conditions[0]: GreaterThanOrEqualTo compares numbers, not the null None"),
    (cond("Equals", "1", 1), "Conditions[0]: Equals compares values of one kind, not the string '1' and the number 1"),
    ({"Type": "NotEquals", "LeftValue": 1, "RightValue": 2},
     "Conditions[0]: condition type 'NotEquals' is not one of GreaterThan, GreaterThanOrEqualTo, LessThan"),
    (cond("GreaterThan", json_get("metrics.missing"), 1),
     "Conditions[0].LeftValue: Std:JsonGet Path 'metrics.missing'"),
])
def test_conditions_that_cannot_be_decided_are_named(condition: dict[str, Any], message: str) -> None:
    with pytest.raises(ExpressionError) as exc:
        all_hold([condition], env())
    assert str(exc.value).startswith(message), exc.value


# --- both users run through it -------------------------------------------------------------------------------


def test_execution_variable_names_match_the_checks() -> None:
    assert set(checks.EXECUTION_VARIABLES) == set(EXECUTION_VARIABLE_NAMES)


def runner(tmp_path: Path) -> LocalExecution:
    execution = LocalExecution(DEFINITION, {"Tag": "t", "BatchSize": "64"}, s3=None, workdir=tmp_path, env={},
                               execution_id="exec1", pipeline_name="dapo")
    execution.records["Evaluate"] = StepRecord("Evaluate", "Processing", "Succeeded",
                                               properties=EVALUATE["Arguments"])
    return execution


def test_checks_and_local_run_join_alike(tmp_path: Path) -> None:
    """The values that used to differ (booleans, floats) now render the same way in both."""
    node = {"Args": [join("s3:/", {"Get": "Parameters.Bucket"}, {"Get": "Parameters.Shuffle"},
                          {"Get": "Parameters.LearningRate"}, {"Get": "Execution.PipelineName"})]}
    assert checks.resolve(node, DEFINITION) == {"Args": ["s3://my-bucket/true/1e-05/dapo"]}
    assert runner(tmp_path).resolve(node) == {"Args": ["s3://my-bucket/true/1e-05/dapo"]}


def test_local_run_types_parameter_values_and_fails_the_step_on_an_expression(tmp_path: Path) -> None:
    execution = runner(tmp_path)
    assert execution.values["BatchSize"] == 64  # --param BatchSize=64 arrives as text
    fail = {"Name": "Stop", "Type": "Fail", "Arguments": {"ErrorMessage": join("at ", {"Get": "Parameters.Nope"})}}
    with pytest.raises(PipelineFailed) as exc:
        execution._run_step(fail)
    assert exc.value.step == "Stop"
    assert exc.value.message.startswith("Arguments.ErrorMessage.Std:Join.Values[1]: Get 'Parameters.Nope': "
                                        "parameter 'Nope' has no value"), exc.value.message
    assert execution.records["Stop"].status == "Failed"


def test_checks_leave_json_get_to_run_time() -> None:
    assert checks.resolve({"ErrorMessage": join("accuracy ", json_get("metrics.accuracy.value"), on="")},
                          DEFINITION) == {"ErrorMessage": f"accuracy {RUN_TIME}"}
