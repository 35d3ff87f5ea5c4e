"""Deploy (upsert) and start against moto, the --wait loop, the user errors, and `make data`'s upload."""
from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from moto import mock_aws

from pipeline import deploy as deploy_cmd
from pipeline import start as start_cmd
from pipeline.aws import UserError
from pipeline.config import load
from pipeline.data import jsonl_destination, parquet_rows, upload_jsonl
from pipeline.definition import pipeline_description
from pipeline.start import wait_for_execution
from steps.config import ConfigError
from tests.test_preflight import (
    BUCKET,
    LOCAL,
    REGION,
    create_account,
    hub_model_arn,
    record_calls,
    serve_public_hub,
    write_config,
)


@pytest.fixture
def aws():
    """moto, with the Public Hub answered (moto lacks it) and every call recorded; an empty account."""
    with mock_aws():
        session = serve_public_hub(boto3.Session(region_name=REGION))
        yield session, record_calls(session)


@pytest.fixture
def account(aws):
    """The account config/local.yaml's pipeline section describes: its role and its data."""
    create_account(aws[0])
    aws[1].clear()
    return aws


@pytest.fixture
def config(tmp_path) -> Path:
    """config/local.yaml with a base model training sessions serve: a config deploy accepts."""
    return write_config(tmp_path)


def cli_uses(session: boto3.Session, monkeypatch: pytest.MonkeyPatch) -> None:
    """Have the commands' main() use ``session``: the Public Hub's answers are hooked into it."""
    monkeypatch.setattr(deploy_cmd, "aws_session", lambda region: session)
    monkeypatch.setattr(start_cmd, "aws_session", lambda region: session)


@pytest.fixture(scope="module")
def deployed(tmp_path_factory):
    """`python -m pipeline.deploy` on a tagged config in moto, then an upsert of the same definition."""
    path = write_config(tmp_path_factory.mktemp("cfg"), pipeline={"tags": {"project": "dapo", "owner": "ml"}})
    cfg, _ = load(path)
    out = io.StringIO()
    with mock_aws(), pytest.MonkeyPatch.context() as mp:
        session = serve_public_hub(boto3.Session(region_name=REGION))
        create_account(session)
        cli_uses(session, mp)
        with contextlib.redirect_stdout(out):
            code = deploy_cmd.main(["--config", str(path)])
        sm = session.client("sagemaker")
        definition = sm.describe_pipeline(PipelineName=cfg.name)["PipelineDefinition"]
        calls = record_calls(session)
        sm = session.client("sagemaker")  # created after the recorder, so it reports to it
        # A second deploy would rebuild the same definition: upsert it directly instead.
        second = deploy_cmd.upsert(sm, cfg, definition)
        described = sm.describe_pipeline(PipelineName=cfg.name)
        tags = sm.list_tags(ResourceArn=described["PipelineArn"])["Tags"]
    return {"cfg": cfg, "code": code, "out": out.getvalue(), "second": second, "second_calls": calls,
            "described": described, "tags": tags}


# -- deploy ------------------------------------------------------------------------------


def test_first_deploy_creates_second_updates(deployed):
    arn = deployed["described"]["PipelineArn"]
    assert deployed["code"] == 0
    assert f"created pipeline 'dapo-local' in us-west-2: {arn}" in deployed["out"]
    assert deployed["second"] == ("updated", arn)
    assert deployed["second_calls"][:3] == ["ListPipelines", "UpdatePipeline", "AddTags"]
    assert "CreatePipeline" not in deployed["second_calls"]


def test_deploy_sends_the_offline_definition_with_role_description_and_tags(deployed):
    cfg, described = deployed["cfg"], deployed["described"]
    definition = json.loads(described["PipelineDefinition"])
    assert definition["Version"] == "2020-12-01"
    assert [s["Name"] for s in definition["Steps"]] == ["ValidateData", "TrainDAPO", "EvaluateModel", "CheckAccuracy"]
    assert described["RoleArn"] == cfg.role_arn
    assert described["PipelineDescription"] == pipeline_description(cfg)
    assert described["PipelineDescription"].startswith(cfg.description)
    assert {t["Key"]: t["Value"] for t in deployed["tags"]} == {"project": "dapo", "owner": "ml"}


def test_deploy_refuses_a_missing_role(aws, config):
    session, calls = aws
    cfg, run = load(config)
    with pytest.raises(UserError, match=r"'pipeline.role_arn': role arn:aws:iam::123456789012:role/dapo-local "
                                        r"does not exist"):
        deploy_cmd.deploy(cfg, run, session, str(config))
    assert "CreatePipeline" not in calls


def test_deploy_refuses_an_image_not_in_ecr(account, tmp_path):
    session, calls = account
    uri = "123456789012.dkr.ecr.us-west-2.amazonaws.com/dapo-steps:abc123"
    cfg, run = load(write_config(tmp_path, pipeline={"image_uri": uri}))
    with pytest.raises(UserError, match=r"'pipeline.image_uri': .* is not in ECR .*make push-image"):
        deploy_cmd.deploy(cfg, run, session, "config.yaml")
    assert "CreatePipeline" not in calls


def test_deploy_refuses_data_prefixes_without_jsonl(account, tmp_path):
    session, calls = account
    cfg, run = load(write_config(tmp_path, pipeline={"eval_s3_uri": f"s3://{BUCKET}/data/evaluation"}))
    with pytest.raises(UserError, match=rf"^'pipeline.eval_s3_uri': no data object \(.jsonl, .json, .csv, "
                                        rf".parquet\) under s3://{BUCKET}/data/evaluation/; upload your data there "
                                        r"with 'make data'$"):
        deploy_cmd.deploy(cfg, run, session, "config.yaml")
    assert "CreatePipeline" not in calls


@pytest.mark.parametrize(("base_model", "message"), [
    (None, "error: 'session.base_model' is not set: name the SageMaker Public Hub model to fine-tune"),
    (hub_model_arn("local-toy-arith"), "error: 'session.base_model': local-toy-arith is the local training-session "
                                       "service's toy model (config/local.yaml only)"),
    (hub_model_arn("huggingface-llm-mistral-7b"),
     "error: 'session.base_model': training sessions do not serve huggingface-llm-mistral-7b in us-west-2"),
], ids=["unset", "toy", "not-served"])
def test_deploy_cli_refuses_a_base_model_training_sessions_do_not_serve(account, tmp_path, capsys, monkeypatch,
                                                                        base_model, message):
    session, calls = account
    cli_uses(session, monkeypatch)
    path = write_config(tmp_path, session={"base_model": base_model})
    assert deploy_cmd.main(["--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1
    assert calls == []  # refused offline, before any request


def test_deploy_cli_refuses_a_base_model_the_regions_hub_does_not_serve(account, config, capsys, monkeypatch):
    """Served by the SDK's list for us-west-2, but not carried by this (fake) Public Hub."""
    session, calls = account
    cli_uses(session, monkeypatch)
    path = write_config(config.parent, session={"base_model": hub_model_arn("openai-reasoning-gpt-oss-20b")})
    assert deploy_cmd.main(["--config", str(path)]) == 2
    assert capsys.readouterr().err.startswith("error: 'session.base_model': the SageMaker Public Hub in us-west-2 "
                                              "does not serve openai-reasoning-gpt-oss-20b for training sessions")
    assert "ListHubContents" in calls and "CreatePipeline" not in calls


def test_deploy_cli_refuses_placeholders(tmp_path, capsys):
    image = "<ACCOUNT_ID>.dkr.ecr.us-west-2.amazonaws.com/dapo-steps:<IMAGE_TAG>"
    path = write_config(tmp_path, pipeline={"image_uri": image})
    assert deploy_cmd.main(["--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "'pipeline.image_uri'" in err and "Traceback" not in err


def no_aws_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """An environment where boto3 finds no credentials (and asks no instance metadata service)."""
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                "AWS_WEB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def test_deploy_cli_reports_placeholders_and_the_base_model_before_asking_for_credentials(tmp_path, capsys,
                                                                                           monkeypatch):
    """A fresh copy of the example config on a machine with no AWS set up: the placeholders are the first
    thing to fix, named before the region or the credentials are looked for."""
    no_aws_credentials(monkeypatch, tmp_path)
    for var in ("AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(var, raising=False)
    assert deploy_cmd.main(["--config", str(LOCAL.parent / "config.yaml.example")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "still <PLACEHOLDER> values from the example" in err
    assert "'pipeline.image_uri'" in err and "credentials" not in err

    path = write_config(tmp_path, session={"base_model": yaml.safe_load(LOCAL.read_text())["session"]["base_model"]})
    assert deploy_cmd.main(["--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: 'session.base_model': local-toy-arith is the local training-session service's "
                          "toy model") and "credentials" not in err


def test_deploy_cli_refuses_a_missing_image_uri(tmp_path, capsys):
    path = write_config(tmp_path, pipeline={"image_uri": None})
    assert deploy_cmd.main(["--config", str(path)]) == 2
    assert "'pipeline.image_uri' is required" in capsys.readouterr().err


def test_deploy_cli_without_a_region(tmp_path, capsys, monkeypatch):
    for var in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    path = write_config(tmp_path, session={"region": None})
    assert deploy_cmd.main(["--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "no AWS region" in err and "'session.region'" in err


def test_deploy_cli_without_credentials(tmp_path, config, capsys, monkeypatch):
    no_aws_credentials(monkeypatch, tmp_path)
    assert deploy_cmd.main(["--config", str(config)]) == 2
    assert "no AWS credentials found" in capsys.readouterr().err


# -- start -------------------------------------------------------------------------------


@pytest.fixture
def pipeline_in_moto(account, config):
    """The deployed pipeline of `config`, without rebuilding it: its definition is what moto stores."""
    session, calls = account
    cfg, _ = load(config)
    params = [
        {"Name": "TrainDataS3Uri", "Type": "String", "DefaultValue": cfg.train_s3_uri},
        {"Name": "EvalDataS3Uri", "Type": "String", "DefaultValue": cfg.eval_s3_uri},
        {"Name": "BaseModel", "Type": "String", "DefaultValue": hub_model_arn("huggingface-vlm-qwen3-6-27b")},
        {"Name": "BatchSize", "Type": "Integer", "DefaultValue": 16},
        {"Name": "MaxSteps", "Type": "Integer", "DefaultValue": 30},
        {"Name": "LearningRate", "Type": "Float", "DefaultValue": 0.05},
        {"Name": "SelectiveRollouts", "Type": "Boolean", "DefaultValue": False},
        {"Name": "AccuracyThreshold", "Type": "Float", "DefaultValue": 0.2},
        {"Name": "ImageUri", "Type": "String", "DefaultValue": "dapo-steps:local"},
    ]
    sm = session.client("sagemaker")
    sm.create_pipeline(PipelineName=cfg.name, RoleArn=cfg.role_arn,
                       PipelineDefinition=json.dumps({"Version": "2020-12-01", "Parameters": params, "Steps": []}))
    calls.clear()
    return session, sm, cfg.name


def recorded_parameters(sm, arn: str) -> dict[str, str]:
    recorded = sm.list_pipeline_parameters_for_execution(PipelineExecutionArn=arn)["PipelineParameters"]
    return {p["Name"]: p["Value"] for p in recorded}


def test_start_passes_parameter_overrides(pipeline_in_moto, config):
    session, sm, name = pipeline_in_moto
    given = {"BatchSize": "64", "MaxSteps": "30", "SelectiveRollouts": "true"}  # a Boolean: true or false
    arn = start_cmd.start(session, name, REGION, given, str(config))
    assert arn.startswith(f"arn:aws:sagemaker:{REGION}:123456789012:pipeline/{name}/execution/")
    assert recorded_parameters(sm, arn) == given


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"BatchSzie": "64"},
         "unknown pipeline parameter 'BatchSzie'; did you mean BatchSize?\n  the pipeline has: TrainDataS3Uri,"),
        ({"BatchSize": "lots"}, "BatchSize='lots': must be integer"),
        ({"SelectiveRollouts": "1"}, "parameter SelectiveRollouts='1': must be true or false"),
        ({"BatchSize": "0"}, "'dapo.batch_size' must be >= 1"),
        ({"LearningRate": "-1e-5"}, "'dapo.learning_rate' must be in (0, 0.01]"),
        ({"AccuracyThreshold": "2"}, "AccuracyThreshold=2: 'pipeline.accuracy_threshold' must be in [0, 1]"),
        ({"TrainDataS3Uri": f"s3://{BUCKET}/data/other"},
         f"parameter TrainDataS3Uri: no data object (.jsonl, .json, .csv, .parquet) under s3://{BUCKET}/data/other/; "
         "upload your data there"),
        ({"BaseModel": hub_model_arn("local-toy-arith")},
         "parameter BaseModel: local-toy-arith is the local training-session service's toy model"),
        ({"BaseModel": hub_model_arn("openai-reasoning-gpt-oss-20b")},
         "parameter BaseModel: the SageMaker Public Hub in us-west-2 does not serve openai-reasoning-gpt-oss-20b"),
    ],
)
def test_start_refuses_bad_overrides_before_starting(pipeline_in_moto, account, config, params, message):
    session, _, name = pipeline_in_moto
    with pytest.raises((UserError, ConfigError)) as err:
        start_cmd.start(session, name, REGION, params, str(config))
    assert message in str(err.value)
    assert "StartPipelineExecution" not in account[1]


def test_start_checks_the_data_and_base_model_of_the_execution(pipeline_in_moto, config):
    session, sm, name = pipeline_in_moto
    calls = record_calls(session)
    start_cmd.start(session, name, REGION, {}, str(config))
    # The preflight's; then the train file counted against BatchSize (one small object: it is read).
    assert calls[-8:] == ["ListObjectsV2", "ListObjectsV2", "ListHubContents", "DescribeHubContent",
                          "DescribeHubContent", "ListObjectsV2", "GetObject", "StartPipelineExecution"]


def test_start_sends_a_data_prefix_that_ends_with_a_slash(pipeline_in_moto, config):
    """s3://b/data/train as an S3Prefix would also read s3://b/data/train-old/..."""
    session, sm, name = pipeline_in_moto
    arn = start_cmd.start(session, name, REGION, {"TrainDataS3Uri": f"s3://{BUCKET}/data/train"}, str(config))
    assert recorded_parameters(sm, arn) == {"TrainDataS3Uri": f"s3://{BUCKET}/data/train/"}


def test_start_accepts_an_exponent_learning_rate(pipeline_in_moto, config):
    session, _, name = pipeline_in_moto
    assert start_cmd.start(session, name, REGION, {"LearningRate": "1e-5"}, str(config))


def test_start_when_not_deployed(aws, config):
    with pytest.raises(UserError, match="pipeline 'dapo-local' is not deployed in us-west-2; "
                                        "run 'make deploy-pipeline'"):
        start_cmd.start(aws[0], "dapo-local", REGION, {}, str(config))


def test_start_cli_parses_params_and_prints_the_execution(pipeline_in_moto, config, capsys, monkeypatch):
    session, sm, name = pipeline_in_moto
    cli_uses(session, monkeypatch)
    assert start_cmd.main(["--config", str(config), "--param", "BatchSize=32", "--param", "ImageUri=img:2"]) == 0
    out = capsys.readouterr().out
    arn = out.split("started ", 1)[1].split()[0]
    assert arn.startswith(f"arn:aws:sagemaker:{REGION}:123456789012:pipeline/{name}/execution/")
    assert f"#/pipelines/{name}/executions/{arn.rsplit('/', 1)[-1]}" in out
    assert recorded_parameters(sm, arn) == {"BatchSize": "32", "ImageUri": "img:2"}


def test_start_cli_rejects_a_malformed_param(capsys):
    assert start_cmd.main(["--config", str(LOCAL), "--param", "BatchSize"]) == 2
    assert "--param 'BatchSize': expected NAME=VALUE, e.g. --param BatchSize=64" in capsys.readouterr().err


# -- --wait ------------------------------------------------------------------------------


class FakeExecution:
    """Scripted DescribePipelineExecution / ListPipelineExecutionSteps answers, one per poll."""

    def __init__(self, polls: list[tuple[str, list[dict[str, Any]]]], failure: str = "") -> None:
        self.polls, self.failure, self.n, self.sleeps = polls, failure, -1, []

    def describe(self, arn: str) -> dict[str, Any]:
        self.n += 1
        status = self.polls[self.n][0]
        return {"PipelineExecutionStatus": status, **({"FailureReason": self.failure} if status == "Failed" else {})}

    def list_steps(self, arn: str) -> list[dict[str, Any]]:
        return self.polls[self.n][1]  # newest first, as the API lists them

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)


def test_wait_prints_each_change_once_until_the_end():
    validate_ok = {"StepName": "ValidateData", "StepStatus": "Succeeded"}
    fake = FakeExecution(
        [
            ("Executing", [{"StepName": "ValidateData", "StepStatus": "Executing"}]),
            ("Executing", [{"StepName": "TrainDAPO", "StepStatus": "Executing"}, validate_ok]),
            ("Executing", [{"StepName": "TrainDAPO", "StepStatus": "Executing"}, validate_ok]),
            ("Executing", [{"StepName": "TrainDAPO", "StepStatus": "Executing", "AttemptCount": 2}, validate_ok]),
            ("Failed", [{"StepName": "TrainDAPO", "StepStatus": "Failed", "AttemptCount": 2,
                         "FailureReason": "ClientError: CapacityError"}, validate_ok]),
        ],
        failure="Step failure: One or multiple steps failed.",
    )
    lines: list[str] = []
    status = wait_for_execution("arn:x", fake.describe, fake.list_steps, poll_seconds=15, sleep=fake.sleep,
                                out=lines.append)
    assert status == "Failed"
    assert lines == [
        "  ValidateData: Executing",
        "  ValidateData: Succeeded",
        "  TrainDAPO: Executing",
        "  TrainDAPO: Executing (attempt 2)",
        "  TrainDAPO: Failed (attempt 2) - ClientError: CapacityError",
        "execution Failed: Step failure: One or multiple steps failed.",
    ]
    assert fake.sleeps == [15, 15, 15, 15]  # between polls, never after the end


def test_wait_returns_at_once_for_a_finished_execution():
    fake = FakeExecution([("Succeeded", [{"StepName": "ApproveModel", "StepStatus": "Succeeded"}])])
    lines: list[str] = []
    status = wait_for_execution("arn:x", fake.describe, fake.list_steps, sleep=fake.sleep, out=lines.append)
    assert status == "Succeeded"
    assert lines == ["  ApproveModel: Succeeded", "execution Succeeded"] and fake.sleeps == []


# -- make data ---------------------------------------------------------------------------


def test_jsonl_destination():
    assert jsonl_destination("s3://b/dapo/data/train", "gsm8k-train.jsonl") == \
        ("b", "dapo/data/train/gsm8k-train.jsonl")
    assert jsonl_destination("s3://b/dapo/train/", "x.jsonl") == ("b", "dapo/train/x.jsonl")
    assert jsonl_destination("s3://b/exact/train.jsonl", "x.jsonl") == ("b", "exact/train.jsonl")
    assert jsonl_destination("s3://b", "x.jsonl") == ("b", "x.jsonl")


def test_parquet_rows_are_uploaded_as_gsm8k_jsonl(aws, tmp_path):
    session, _ = aws
    rows = [
        {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = 7\n#### 7", "extra": 1},
        {"question": "Ünïcode: 2 × 5?", "answer": "#### 10", "extra": 2},
    ]
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    s3 = session.client("s3")
    s3.create_bucket(Bucket="dapo-local", CreateBucketConfiguration={"LocationConstraint": REGION})

    uri, count = upload_jsonl(s3, parquet_rows(str(path)), "s3://dapo-local/data/train", "gsm8k-train.jsonl")

    assert (uri, count) == ("s3://dapo-local/data/train/gsm8k-train.jsonl", 2)
    body = s3.get_object(Bucket="dapo-local", Key="data/train/gsm8k-train.jsonl")["Body"].read().decode("utf-8")
    assert [json.loads(line) for line in body.splitlines()] == [
        {"question": r["question"], "answer": r["answer"]} for r in rows
    ]
