"""The definition checked against what SageMaker checks: the published schema, botocore's models, references.

(a) The published pipeline-definition JSON schema (aws-sagemaker-mlops), read in place from
../shared/data next to the checkout, patched only where it lags the service.
(b), (c) pipeline/checks.py: each job step's Arguments against botocore's Create*Job
input shape, and every reference against the Describe*Job output and the steps' declarations.
"""
from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

from pipeline.checks import (
    SCHEMA_DISPLAY_NAME,
    all_steps,
    check_arguments,
    check_console_texts,
    check_parameters,
    check_pipeline_description,
    check_references,
)
from pipeline.config import load
from pipeline.definition import build_definition, main, pipeline_description
from pipeline.pipeline import STEP_TEXTS
from pipeline.shapes import input_shape, service_model
from steps.config import load_yaml
from steps.config.parameters import PARAMETERS
from tests.test_network import build_with, network_build
from tests.test_pipeline_definition import EXAMPLE, LOCAL, local_build

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
SCHEMA_FILE = SHARED_DATA / "pipeline-definition-schema.json"
GET = {"$ref": "#/definitions/GetFunction"}
JSON_GET = {"$ref": "#/definitions/JsonGetFunction"}


@functools.cache
def example_build() -> dict[str, Any]:
    """The definition `make pipeline-definition` writes before config/config.yaml exists."""
    return build_definition(*load(EXAMPLE))


MLFLOW_SERVER = "arn:aws:sagemaker:us-west-2:123456789012:mlflow-tracking-server/dapo"


def mlflow_build() -> dict[str, Any]:
    """Tracking to a SageMaker MLflow server: the definition's MlflowConfig is an object, not null."""
    return build_with(mlflow_tracking_arn=MLFLOW_SERVER, mlflow_experiment="clip-sweep")


def definitions() -> list[Any]:
    return [pytest.param(lambda: local_build()["definition"], id="local.yaml"),
            pytest.param(example_build, id="config.yaml.example"),
            pytest.param(network_build, id="vpc-and-kms"),
            pytest.param(mlflow_build, id="mlflow")]


# --- (a) the published schema, patched where it lags the service ---------------------------------------------


def retry_exception_type_is_a_list(schema: dict[str, Any]) -> None:
    """The service takes a list of exception types per retry policy; the schema allows one string."""
    policy = schema["definitions"]["RetryPolicy"]["properties"]
    policy["ExceptionType"] = {"type": "array", "minItems": 1, "items": policy["ExceptionType"]}


def join_and_json_get_are_values(schema: dict[str, Any]) -> None:
    """Std:Join (a string) and Std:JsonGet (any type) stand for values; the schema's JoinFunction admits no `On`."""
    defs = schema["definitions"]
    defs["JsonGetFunction"] = {
        "type": "object", "required": ["Std:JsonGet"], "additionalProperties": False,
        "properties": {"Std:JsonGet": {
            "type": "object", "required": ["Path"], "additionalProperties": False,
            "properties": {"PropertyFile": GET, "S3Uri": {"$ref": "#/definitions/StringArgumentValue"},
                           "Path": {"type": "string"}}}},
    }
    defs["JoinFunction"] = {
        "type": "object", "required": ["Std:Join"], "additionalProperties": False,
        "properties": {"Std:Join": {
            "type": "object", "required": ["Values"], "additionalProperties": False,
            "properties": {"On": {"type": "string"}, "Values": {"type": "array", "items": {"anyOf": [
                {"type": ["string", "number", "boolean"]}, GET, JSON_GET]}}}}},
    }
    defs["StringArgumentValue"]["oneOf"] += [{"$ref": "#/definitions/JoinFunction"}, JSON_GET]
    for kind in ("Integer", "Float", "Boolean"):
        defs[f"{kind}ArgumentValue"]["oneOf"].append(JSON_GET)


def processing_steps_declare_property_files(schema: dict[str, Any]) -> None:
    """Processing steps carry PropertyFiles (read by Std:JsonGet); the schema's ProcessingStep has none."""
    schema["definitions"]["ProcessingStep"]["properties"]["PropertyFiles"] = {"type": "array", "items": {
        "type": "object", "required": ["PropertyFileName", "OutputName", "FilePath"], "additionalProperties": False,
        "properties": {name: {"type": "string"} for name in ("PropertyFileName", "OutputName", "FilePath")}}}


def training_output_has_compression_type(schema: dict[str, Any]) -> None:
    """CreateTrainingJob's OutputDataConfig has CompressionType (enum from botocore's model); the schema lacks it."""
    output = schema["definitions"]["TrainingStep"]["properties"]["Arguments"]["properties"]["OutputDataConfig"]
    values = service_model("sagemaker").shape_for("OutputCompressionType").enum
    output["properties"]["CompressionType"] = {"oneOf": [{"type": "string", "enum": values}, GET]}


def training_step_takes_environment(schema: dict[str, Any]) -> None:
    """CreateTrainingJob takes Environment (TrainDAPO's owner: the pipeline's name and the execution's ARN); the
    schema's TrainingStep lacks it. Written as the schema writes the Environment of a processing step."""
    arguments = schema["definitions"]["TrainingStep"]["properties"]["Arguments"]
    arguments["properties"]["Environment"] = {
        "type": "object", "patternProperties": {".*": {"$ref": "#/definitions/StringArgumentValue"}}}


def top_level_experiment_config(schema: dict[str, Any]) -> None:
    """The SDK always sends PipelineExperimentConfig (null when off); the schema has no such top-level key."""
    value = {"$ref": "#/definitions/StringArgumentValue"}
    schema["properties"]["PipelineExperimentConfig"] = {"oneOf": [{"type": "null"}, {
        "type": "object", "additionalProperties": False,
        "properties": {"ExperimentName": value, "TrialName": value}}]}


def top_level_mlflow_config(schema: dict[str, Any]) -> None:
    """Not in the issue's list: sagemaker-mlops 1.27 always sends "MlflowConfig" (null unless configured; with a
    tracking server, CreatePipeline's MlflowConfig members: the server's ARN and the experiment's name)."""
    schema["properties"]["MlflowConfig"] = {"oneOf": [{"type": "null"}, {
        "type": "object", "required": ["MlflowResourceArn"], "additionalProperties": False,
        "properties": {"MlflowResourceArn": {"type": "string"}, "MlflowExperimentName": {"type": ["string", "null"]}}}]}


SCHEMA_PATCHES: tuple[Callable[[dict[str, Any]], None], ...] = (
    retry_exception_type_is_a_list,
    join_and_json_get_are_values,
    processing_steps_declare_property_files,
    training_output_has_compression_type,
    training_step_takes_environment,
    top_level_experiment_config,
    top_level_mlflow_config,
)


def published_schema() -> dict[str, Any]:
    if not SCHEMA_FILE.is_file():
        pytest.skip(f"the published pipeline-definition schema is not at {SCHEMA_FILE} "
                    "(../shared/data next to the checkout); it is read in place, never copied")
    return json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))


def patched_schema(skip: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    schema = published_schema()
    for patch in SCHEMA_PATCHES:
        if patch is not skip:
            patch(schema)
    return schema


def validator(schema: dict[str, Any]) -> Draft202012Validator:
    # "http://json-schema.org/schema#" is the unversioned "latest draft" URI, which jsonschema maps to its latest
    # draft (2020-12) only with a DeprecationWarning; name that draft. The keywords the schema uses ($ref into
    # definitions, oneOf, anyOf, patternProperties, object-form items) mean the same in every draft since 6.
    assert schema["$schema"] == "http://json-schema.org/schema#"
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def _leaves(error: ValidationError) -> Iterator[ValidationError]:
    """The innermost errors under ``error``; of a oneOf over step or parameter kinds, only the matching kind's."""
    if not error.context:
        yield error
        return
    branches: dict[Any, list[ValidationError]] = {}
    for child in error.context:
        branches.setdefault(child.relative_schema_path[0], []).append(child)
    matching = [b for b in branches.values() if not any(list(c.path) == ["Type"] for c in b)]
    for branch in matching or branches.values():
        for child in branch:
            yield from _leaves(child)


def schema_problems(definition: dict[str, Any], schema: dict[str, Any]) -> list[str]:
    """One line per violation, naming the deepest field that fails."""
    found = []
    for error in validator(schema).iter_errors(definition):
        leaf = max(_leaves(error), key=lambda e: len(e.absolute_path))
        found.append(f"{leaf.json_path}: {leaf.message}")
    return found


def _enums(node: Any) -> Iterator[list[Any]]:
    if isinstance(node, dict):
        if "enum" in node:
            yield node["enum"]
        for value in node.values():
            yield from _enums(value)
    elif isinstance(node, list):
        for value in node:
            yield from _enums(value)


def test_schema_patches_keep_every_enum() -> None:
    patched = list(_enums(patched_schema()))
    assert all(enum in patched for enum in _enums(published_schema()))


@pytest.mark.parametrize("build", definitions())
def test_definition_matches_the_published_schema(build: Callable[[], dict[str, Any]]) -> None:
    schema = patched_schema()  # first: without the schema file the test skips before building anything
    assert schema_problems(build(), schema) == []


@pytest.mark.parametrize("patch", SCHEMA_PATCHES, ids=lambda p: p.__name__)
def test_each_schema_patch_is_needed(patch: Callable[[dict[str, Any]], None]) -> None:
    schema = patched_schema(skip=patch)
    assert schema_problems(local_build()["definition"], schema) != []


def test_schema_violation_names_the_field() -> None:
    schema = patched_schema()
    broken = copy.deepcopy(local_build()["definition"])
    broken["Steps"][0]["RetryPolicies"][0]["MaxAttempts"] = "3"
    broken["Steps"][1]["RetryPolicies"][1]["ExceptionType"] = ["Step.BOGUS"]
    found = schema_problems(broken, schema)
    assert "$.Steps[0].RetryPolicies[0].MaxAttempts: '3' is not of type 'integer'" in found
    assert any(p.startswith("$.Steps[1].RetryPolicies[1].ExceptionType[0]: 'Step.BOGUS' is not one of")
               for p in found), found


# --- (b), (c) Arguments against botocore's models, references against Describe outputs --------------------


@pytest.mark.parametrize("build", definitions())
def test_definition_passes_the_model_checks(build: Callable[[], dict[str, Any]]) -> None:
    definition = build()
    assert [s["Type"] for s in all_steps(definition)].count("Processing") == 4
    assert check_parameters(definition) == []
    assert check_arguments(definition) == []
    assert check_references(definition) == []
    assert check_console_texts(definition) == []


def broken(change: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
    """A copy of the local definition with ``change`` applied."""
    definition = copy.deepcopy(local_build()["definition"])
    change(definition)
    return definition


def step(definition: dict[str, Any], name: str) -> dict[str, Any]:
    return next(s for s in all_steps(definition) if s["Name"] == name)


def parameter(definition: dict[str, Any], name: str) -> dict[str, Any]:
    return next(p for p in definition["Parameters"] if p["Name"] == name)


def only(found: list[str], *fragments: str) -> str:
    assert len(found) == 1 and all(f in found[0] for f in fragments), found
    return found[0]


def test_reference_to_a_field_the_describe_output_lacks() -> None:
    def change(d: dict[str, Any]) -> None:
        step(d, "EvaluateModel")["Arguments"]["ProcessingInputs"][0]["S3Input"]["S3Uri"] = {
            "Get": "Steps.TrainDAPO.ModelArtifactz.S3ModelArtifacts"}

    only(check_references(broken(change)), "step EvaluateModel: Arguments.ProcessingInputs[0].S3Input.S3Uri",
         "DescribeTrainingJobResponse has no field 'ModelArtifactz'")


def test_reference_to_an_output_the_step_does_not_declare() -> None:
    def change(d: dict[str, Any]) -> None:
        step(d, "ApproveModel")["Arguments"]["ProcessingInputs"][1]["S3Input"]["S3Uri"] = {
            "Get": "Steps.EvaluateModel.ProcessingOutputConfig.Outputs['report'].S3Output.S3Uri"}

    only(check_references(broken(change)), "step ApproveModel: Arguments.ProcessingInputs[1].S3Input.S3Uri",
         "ProcessingOutputConfig.Outputs['report'] is not declared by step EvaluateModel", "['evaluation']")


@pytest.mark.parametrize(("expr", "fragment"), [
    ("Steps.TrainDAPOx.ModelArtifacts.S3ModelArtifacts", "step 'TrainDAPOx' does not exist"),
    ("Steps.CheckAccuracy.Outcome", "CheckAccuracy is a Condition step, which has no properties"),
    ("Steps.TrainDAPO.ModelArtifacts", "ModelArtifacts is a structure (ModelArtifacts), not a single value"),
    ("Steps.TrainDAPO.FinalMetricDataList['train:los'].Value", "FinalMetricDataList['train:los'] is not declared"),
    ("Steps.TrainDAPO.HyperParameters['lora_rnak']", "HyperParameters['lora_rnak'] is not set by step TrainDAPO"),
    ("Steps.TrainDAPO.ModelArtifacts..S3ModelArtifacts", "cannot parse the property path"),
    ("Parameters.ImageURI", "parameter 'ImageURI' is not declared"),
    ("Execution.PipelineExecutionID", "'PipelineExecutionID' is not an execution variable"),
])
def test_broken_references_are_named(expr: str, fragment: str) -> None:
    def change(d: dict[str, Any]) -> None:
        step(d, "ValidateData")["Arguments"]["AppSpecification"]["ImageUri"] = {"Get": expr}

    only(check_references(broken(change)), "step ValidateData: Arguments.AppSpecification.ImageUri", fragment)


def test_property_file_must_be_declared_on_the_named_step() -> None:
    def change(d: dict[str, Any]) -> None:
        step(d, "EvaluateModel")["PropertyFiles"][0]["PropertyFileName"] = "Report"

    found = check_references(broken(change))
    # The condition's four JsonGets (accuracy, steps completed, the improvement's lower bound, the guard's stop); the
    # fail message reads RecordRejection's verdict instead.
    assert len(found) == 4 and all("declares no property file 'EvaluationReport'" in p for p in found), found
    assert found[0].startswith("step CheckAccuracy: Arguments.Conditions[0].LeftValue.Std:JsonGet.PropertyFile: ")


def test_metric_references_resolve_against_the_declared_metrics() -> None:
    def change(d: dict[str, Any]) -> None:
        step(d, "ValidateData")["Arguments"]["AppSpecification"]["ContainerArguments"][3] = {
            "Get": "Steps.TrainDAPO.FinalMetricDataList['train:loss'].Value"}

    assert check_references(broken(change)) == []


def test_wrong_parameter_type() -> None:
    found = check_parameters(broken(lambda d: parameter(d, "BatchSize").update(DefaultValue="16")))
    only(found, "parameter BatchSize: DefaultValue '16' is a str, but its Type is Integer")
    found = check_parameters(broken(lambda d: parameter(d, "LearningRate").update(DefaultValue=True)))
    only(found, "parameter LearningRate: DefaultValue True is a bool, but its Type is Float")


def test_bad_instance_type_via_a_parameter_default() -> None:
    definition = broken(lambda d: parameter(d, "ProcessingInstanceType").update(DefaultValue="ml.bogus.large"))
    found = check_arguments(definition)
    assert {p.split(":")[0] for p in found} == {"step ValidateData", "step EvaluateModel", "step ApproveModel",
                                                "step RecordRejection"}
    only(found[:1], "Arguments.ProcessingResources.ClusterConfig.InstanceType: 'ml.bogus.large' is not one of",
         "ProcessingInstanceType", "[enum]")


def test_over_max_length() -> None:
    def change(d: dict[str, Any]) -> None:
        step(d, "TrainDAPO")["Arguments"]["HyperParameters"]["s3_output_path"] = "t" * 2501

    only(check_arguments(broken(change)), "step TrainDAPO: Arguments.HyperParameters['s3_output_path']",
         "2501 characters", "[length]")


def test_joined_s3_uri_is_checked_against_the_pattern() -> None:
    """Std:Join is resolved over placeholders, so a join that cannot form an S3 URI is caught."""
    def change(d: dict[str, Any]) -> None:
        join = step(d, "TrainDAPO")["Arguments"]["OutputDataConfig"]["S3OutputPath"]["Std:Join"]
        join["Values"][0] = "dapo-local/pipeline"

    only(check_arguments(broken(change)), "step TrainDAPO: Arguments.OutputDataConfig.S3OutputPath",
         "'dapo-local/pipeline/abcdef123456/TrainDAPO/output' does not match S3Uri's pattern", "[pattern]")


def test_required_members_except_the_job_name() -> None:
    only(check_arguments(broken(lambda d: step(d, "ApproveModel")["Arguments"].pop("RoleArn"))),
         "step ApproveModel: Arguments.RoleArn: is required by CreateProcessingJobRequest", "[required]")


def test_the_cli_refuses_a_definition_sagemaker_would_refuse(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    raw = load_yaml(LOCAL)
    raw["pipeline"]["processing_instance_type"] = "ml.bogus.large"  # the config only checks the "ml." prefix
    config, out = tmp_path / "bogus.yaml", tmp_path / "p.json"
    config.write_text(json.dumps(raw))
    assert main(["--config", str(config), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: SageMaker would refuse this pipeline definition:")
    assert "step ValidateData: Arguments.ProcessingResources.ClusterConfig.InstanceType: 'ml.bogus.large'" in err
    assert not out.exists()



# --- what the console shows: every step's DisplayName and Description, the pipeline's description ------------


def test_every_step_explains_itself_under_its_unchanged_name() -> None:
    steps = {s["Name"]: s for s in all_steps(local_build()["definition"])}
    assert list(steps) == ["ValidateData", "TrainDAPO", "EvaluateModel", "CheckAccuracy", "ApproveModel",
                           "RecordRejection", "AccuracyTooLow"]
    assert {name: (s["DisplayName"], s["Description"]) for name, s in steps.items()} == STEP_TEXTS
    # Each description names the parameters its step reads, by the names the console lists.
    for name, needed in {"ValidateData": ("TrainDataS3Uri", "EvalDataS3Uri", "BaseModel", "BatchSize"),
                         "TrainDAPO": ("BatchSize", "GroupSize", "MaxSteps", "LearningRate", "MaxNumGenBatches",
                                       "ClipLowThreshold", "ClipHighThreshold", "TrainingInstanceType"),
                         "EvaluateModel": ("EvalSize",), "CheckAccuracy": ("AccuracyThreshold", "MinImprovement"),
                         "AccuracyTooLow": ("AccuracyThreshold", "MinImprovement")}.items():
        assert all(p in steps[name]["Description"] for p in needed), name


def test_console_limits_are_the_schemas_and_botocores() -> None:
    """The DisplayName rule is the published schema's StepName; botocore's StepDescription (3072) is tighter than
    the schema's Description (4096), so the check of botocore's shape is the one that binds."""
    defs = published_schema()["definitions"]
    assert defs["ProcessingStep"]["properties"]["DisplayName"] == {"$ref": "#/definitions/StepName"}
    assert defs["StepName"]["pattern"] == f"^{SCHEMA_DISPLAY_NAME}$"
    assert defs["ProcessingStep"]["properties"]["Description"] == {"$ref": "#/definitions/ParameterDescription"}
    botocore_max = service_model("sagemaker").shape_for("StepDescription").metadata["max"]
    assert botocore_max == 3072 < defs["ParameterDescription"]["maxLength"]


@pytest.mark.parametrize(("change", "fragments"), [
    (lambda s: s.update(DisplayName="Validate data"),
     ["step ValidateData: DisplayName 'Validate data' must be 1-64 letters, digits, '-' or '_'", "[pattern]"]),
    (lambda s: s.update(DisplayName="V" * 65), ["must be 1-64 letters, digits"]),
    (lambda s: s.update(Description="d" * 3073),
     ["step ValidateData: Description: 'dddd", "has 3073 characters, outside the allowed [0, 3072] (StepDescription)",
      "[length]"]),
    (lambda s: s.pop("Description"), ["step ValidateData: no Description; give the step one", "[console]"]),
])
def test_a_console_text_that_breaks_the_limits_is_refused(change: Callable[[dict[str, Any]], Any],
                                                         fragments: list[str]) -> None:
    only(check_console_texts(broken(lambda d: change(step(d, "ValidateData")))), *fragments)


def test_the_schema_refuses_the_display_name_the_check_refuses() -> None:
    schema = patched_schema()
    definition = broken(lambda d: step(d, "ValidateData").update(DisplayName="Validate data"))
    assert "$.Steps[0].DisplayName: 'Validate data' does not match '^[A-Za-z0-9\\\\-_]{1,64}$'" in schema_problems(
        definition, schema)


def test_pipeline_description_names_each_parameter_and_its_meaning() -> None:
    cfg = load(LOCAL)[0]
    text = pipeline_description(cfg)
    assert text.startswith(cfg.description + ". ValidateData -> TrainDAPO")
    assert all(f"{p.name}: {p.meaning}" in text for p in PARAMETERS)
    assert check_pipeline_description(text) == []
    limit = input_shape("sagemaker", "CreatePipeline").members["PipelineDescription"].metadata["max"]
    assert len(text) <= limit == 3072


def test_the_cli_refuses_a_description_too_long_before_building(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture) -> None:
    raw = load_yaml(LOCAL)
    raw["pipeline"]["description"] = "x" * 3000
    config, out = tmp_path / "long.yaml", tmp_path / "p.json"
    config.write_text(json.dumps(raw))
    assert main(["--config", str(config), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: SageMaker would refuse this pipeline's description:\n  PipelineDescription: ")
    assert "characters, outside the allowed [0, 3072] (PipelineDescription); shorten pipeline.description" in err
    assert not out.exists()
