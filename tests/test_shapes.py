"""pipeline/shapes.py: a value checked against botocore's models as the AWS API checks it."""
from __future__ import annotations

from typing import Any

import pytest

from pipeline.shapes import RULES, Constraint, compile_pattern, constraints, input_shape, service_model, violations

RUNTIME = "sagemakertrainingsessionruntime"


def sampling(**params: Any) -> dict[str, Any]:
    """A valid ExecuteSamplingOperation request, with ``params`` merged into its samplingParams."""
    return {
        "trainingSessionName": "dapo-session-1",
        "operationConfig": {"sample": {"prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 2, 3]}]},
                                       "numSamples": 4,
                                       "samplingParams": {"maxTokens": 512, "seed": 7, **params}}},
    }


def processing(**overrides: Any) -> dict[str, Any]:
    """A valid CreateProcessingJob request, with top-level ``overrides``."""
    return {
        "ProcessingJobName": "validate-data",
        "ProcessingResources": {"ClusterConfig": {"InstanceCount": 1, "InstanceType": "ml.m5.large",
                                                  "VolumeSizeInGB": 30}},
        "AppSpecification": {"ImageUri": "123456789012.dkr.ecr.us-west-2.amazonaws.com/dapo:latest"},
        "RoleArn": "arn:aws:iam::123456789012:role/DapoPipelineRole",
        "ProcessingInputs": [{"InputName": "train", "S3Input": {
            "S3Uri": "s3://bucket/data/train/", "LocalPath": "/opt/ml/processing/input/train",
            "S3DataType": "S3Prefix", "S3InputMode": "File"}}],
        "Environment": {"DAPO_SEED": "1"},
        **overrides,
    }


def execute_sampling():
    return input_shape(RUNTIME, "ExecuteSamplingOperation")


def create_processing():
    return input_shape("sagemaker", "CreateProcessingJob")


def only(found: list, rule: str, path: str):
    """The one violation found, checked to be ``rule`` at ``path`` with a message naming the member."""
    assert [(v.rule, v.path) for v in found] == [(rule, path)], found
    assert found[0].message.startswith(f"{path}: "), found[0].message
    assert found[0].rule in RULES
    return found[0]


def test_valid_requests_pass() -> None:
    assert violations(execute_sampling(), sampling(temperature=0.7, topP=0.9)) == []
    assert violations(create_processing(), processing()) == []


def test_integer_outside_32_bits_is_a_range_violation() -> None:
    v = only(violations(execute_sampling(), sampling(seed=99_999_999_999)), "range",
             "operationConfig.sample.samplingParams.seed")
    assert "99999999999" in v.message and "[-2147483648, 2147483647]" in v.message
    assert violations(execute_sampling(), sampling(seed=2**31 - 1)) == []
    only(violations(execute_sampling(), sampling(seed=-(2**31) - 1)), "range",
         "operationConfig.sample.samplingParams.seed")


def test_declared_min_and_max_bound_numbers() -> None:
    cluster = {"InstanceCount": 0, "InstanceType": "ml.m5.large", "VolumeSizeInGB": 30}
    only(violations(create_processing(), processing(ProcessingResources={"ClusterConfig": cluster})), "range",
         "ProcessingResources.ClusterConfig.InstanceCount")
    stopping = {"MaxRuntimeInSeconds": 777_601}  # the model's max is 9 days
    v = only(violations(create_processing(), processing(StoppingCondition=stopping)), "range",
             "StoppingCondition.MaxRuntimeInSeconds")
    assert "777601" in v.message


@pytest.mark.parametrize("value", ["7", True, 7.0, None])
def test_integer_type_excludes_strings_bools_and_floats(value: Any) -> None:
    request = sampling()
    request["operationConfig"]["sample"]["numSamples"] = value
    rule = "required" if value is None else "type"
    only(violations(execute_sampling(), request), rule, "operationConfig.sample.numSamples")


def test_float_must_be_a_finite_number() -> None:
    only(violations(execute_sampling(), sampling(temperature="hot")), "type",
         "operationConfig.sample.samplingParams.temperature")
    only(violations(execute_sampling(), sampling(temperature=float("nan"))), "range",
         "operationConfig.sample.samplingParams.temperature")


def test_missing_required_member_is_named() -> None:
    request = processing()
    del request["RoleArn"]
    v = only(violations(create_processing(), request), "required", "RoleArn")
    assert "CreateProcessingJobRequest" in v.message


def test_unknown_member_is_refused() -> None:
    only(violations(create_processing(), processing(RoleARN="x")), "unknown", "RoleARN")


def test_enum_names_the_value() -> None:
    cluster = {"InstanceCount": 1, "InstanceType": "ml.bogus.large", "VolumeSizeInGB": 30}
    v = only(violations(create_processing(), processing(ProcessingResources={"ClusterConfig": cluster})), "enum",
             "ProcessingResources.ClusterConfig.InstanceType")
    assert "'ml.bogus.large'" in v.message


def test_string_max_length_is_enforced() -> None:
    v = only(violations(create_processing(), processing(Environment={"OK": "x" * 257})), "length",
             "Environment['OK']")
    assert "257 characters" in v.message and "[0, 256]" in v.message
    # ProcessingJobName's pattern allows 63 characters too: a longer name breaks both rules.
    too_long = violations(create_processing(), processing(ProcessingJobName="a" * 64))
    assert {(v.rule, v.path) for v in too_long} == {("length", "ProcessingJobName"), ("pattern", "ProcessingJobName")}


def test_pattern_matches_the_whole_value() -> None:
    # ProcessingJobName's pattern [a-zA-Z0-9](-*[a-zA-Z0-9]){0,62} is found in "-x" and "my_job", but the API
    # matches it against the whole value, as it refuses a job named my_job.
    for name in ("-x", "my_job", "job-"):
        only(violations(create_processing(), processing(ProcessingJobName=name)), "pattern", "ProcessingJobName")
    assert violations(create_processing(), processing(ProcessingJobName="validate-data-2")) == []
    only(violations(create_processing(), processing(RoleArn="arn:aws:iam::12345:role/too-short-account")),
         "pattern", "RoleArn")
    # The runtime's ClientToken [a-zA-Z0-9-]+: a uuid4 is one, a space or an underscore breaks it.
    token = input_shape(RUNTIME, "ExecuteTrainingOperation").members["clientToken"]
    assert violations(token, "0b3c9a62-5e3a-4f0e-9a51-8d7c2f1e4b6a") == []
    assert [v.rule for v in violations(token, "a b")] == [v.rule for v in violations(token, "tok_1")] == ["pattern"]


def test_list_items_and_map_entries_are_addressed() -> None:
    inputs = processing()["ProcessingInputs"] * 2
    inputs[1] = {"InputName": "test", "S3Input": {**inputs[0]["S3Input"], "S3Uri": "bucket/data/test/"}}
    only(violations(create_processing(), processing(ProcessingInputs=inputs)), "pattern",
         "ProcessingInputs[1].S3Input.S3Uri")
    v = only(violations(create_processing(), processing(Environment={"9-9": "x"})), "pattern", "Environment['9-9']")
    assert "(map key)" in v.message
    only(violations(create_processing(), processing(Environment={"OK": "x" * 257})), "length", "Environment['OK']")
    only(violations(create_processing(), processing(ProcessingInputs=inputs[:1] * 11)), "length", "ProcessingInputs")


def test_union_takes_exactly_one_member() -> None:
    request = sampling()
    request["operationConfig"]["loadWeightsForSampling"] = {"modelPackageArn": "arn"}
    v = only(violations(execute_sampling(), request), "union", "operationConfig")
    assert "got ['loadWeightsForSampling', 'sample']" in v.message
    only(violations(execute_sampling(), sampling() | {"operationConfig": {}}), "union", "operationConfig")


def test_structure_list_and_boolean_types() -> None:
    only(violations(create_processing(), processing(ProcessingInputs={"InputName": "x"})), "type", "ProcessingInputs")
    only(violations(create_processing(), processing(NetworkConfig={"EnableNetworkIsolation": "true"})), "type",
         "NetworkConfig.EnableNetworkIsolation")
    only(violations(create_processing(), processing(AppSpecification="image")), "type", "AppSpecification")


def test_every_model_pattern_compiles() -> None:
    """Java/ECMA constructs (\\p{L}, surrogate pairs) are translated; nothing is skipped."""
    for service in ("sagemaker", RUNTIME):
        model = service_model(service)
        for name in model.shape_names:
            if pattern := model.shape_for(name).metadata.get("pattern"):
                compile_pattern(pattern)
    tag = compile_pattern(r"^[\p{L}\p{Z}\p{N}_.:/=+\-@]*$")
    assert tag.search("Équipe 42") and not tag.search("a;b")
    assert compile_pattern(r"^[\uD800\uDC00-\uDBFF\uDFFF]$").search("\U0001F600")
    assert compile_pattern(r"arn:[\p{Alnum}\-]+:lambda").search("arn:aws-cn:lambda")
    # A subcategory (botocore 1.44.18's models use \p{Cc}, control characters): only that one.
    control = compile_pattern(r"^[^\p{Cc}]*$")
    assert control.search("tab-free text") and not control.search("bell\x07") and control.search("Ünïcode")
    with pytest.raises(ValueError, match=r"unsupported regex property \\p\{Cx\}"):
        compile_pattern(r"\p{Cx}")


def test_constraints_are_enumerated_and_stable() -> None:
    found = constraints(execute_sampling())
    assert found == constraints(execute_sampling())
    assert len(found) == 70, len(found)  # changes only with the botocore model
    assert Constraint("operationConfig.sample.samplingParams.seed", "range", "Integer", "max=2147483647") in found
    assert {c.rule for c in found} >= {"required", "type", "range", "length", "union"}
    assert {c.rule for c in found} <= set(RULES)


def test_constraints_of_the_job_requests() -> None:
    processing_rules = constraints(create_processing())
    training_rules = constraints(input_shape("sagemaker", "CreateTrainingJob"))
    assert (len(processing_rules), len(training_rules)) == (249, 471)
    assert Constraint("ProcessingJobName", "length", "ProcessingJobName", "max=63") in processing_rules
    assert {c.rule for c in training_rules} == {"required", "type", "range", "length", "pattern", "enum"}


def test_constraints_terminate_on_recursive_shapes() -> None:
    # SearchExpression nests SubExpressions of SearchExpression.
    found = constraints(input_shape("sagemaker", "Search"))
    assert any(c.path == "SearchExpression.SubExpressions[*]" for c in found)
    assert not any("SubExpressions[*].SubExpressions" in c.path for c in found)
