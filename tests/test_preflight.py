"""pipeline.preflight against moto: every check refuses with one line naming the setting and the fix.

moto does not implement the Public Hub calls (ListHubContents, DescribeHubContent): :func:`serve_public_hub`
answers them through botocore's ``before-call`` hook, so the clients stay real boto3 clients (their requests
are validated against botocore's model) and the SDK's own Hub scan runs on the answers.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml
from botocore.awsrequest import AWSResponse
from moto import mock_aws

from pipeline import preflight
from pipeline.aws import UserError
from pipeline.config import load
from steps.config import RunConfig

ROOT = Path(__file__).resolve().parents[1]
LOCAL = ROOT / "config" / "local.yaml"
REGION = "us-west-2"
ACCOUNT = "123456789012"  # moto's, and config/local.yaml's
ROLE = "dapo-local"  # config/local.yaml's role
BUCKET = "dapo-local"  # config/local.yaml's bucket
SERVED = "huggingface-vlm-qwen3-6-27b"  # served in us-west-2 by the SDK's list
BASE_MODEL = f"arn:aws:sagemaker:{REGION}:aws:hub-content/SageMakerPublicHub/Model/{SERVED}/1.0.0"
#: The fake Public Hub: Hub content name -> (search keywords, published Hugging Face id).
PUBLIC_HUB: dict[str, tuple[list[str], str]] = {
    SERVED: ([], "Qwen/Qwen3.6-27B"),  # trainable by the SDK's static list for us-west-2
    "huggingface-llm-acme-9b": (["@capability:training_session"], "acme/acme-9b"),  # by its keyword
    "huggingface-llm-mistral-7b": ([], "mistralai/Mistral-7B-v0.1"),  # on the Hub, not for training sessions
}


def hub_model_arn(name: str, region: str = REGION) -> str:
    return f"arn:aws:sagemaker:{region}:aws:hub-content/SageMakerPublicHub/Model/{name}/1.0.0"


def answer(body: dict[str, Any], status: int = 200) -> tuple[AWSResponse, dict[str, Any]]:
    """A ``before-call`` handler's response: botocore returns it instead of sending the request."""
    return AWSResponse(None, status, {}, None), {**body, "ResponseMetadata": {"HTTPStatusCode": status}}


def serve_public_hub(session: boto3.Session, hub: dict[str, tuple[list[str], str]] = PUBLIC_HUB) -> boto3.Session:
    """Answer ListHubContents and DescribeHubContent for every client ``session`` creates from now on."""
    def summary(name: str) -> dict[str, Any]:
        return {"HubContentName": name, "HubContentArn": hub_model_arn(name), "HubContentVersion": "1.0.0",
                "HubContentType": "Model", "DocumentSchemaVersion": "2.0.0", "HubContentStatus": "Available",
                "CreationTime": 0, "HubContentSearchKeywords": hub[name][0]}

    def list_hub_contents(**_: Any) -> tuple[AWSResponse, dict[str, Any]]:
        return answer({"HubContentSummaries": [summary(name) for name in hub]})

    def describe_hub_content(params: dict[str, Any], **_: Any) -> tuple[AWSResponse, dict[str, Any]]:
        name = json.loads(params["body"])["HubContentName"]
        if name not in hub:
            return answer({"Error": {"Code": "ResourceNotFound", "Message": f"{name} not found"}}, 400)
        return answer({**summary(name), "HubName": "SageMakerPublicHub",
                       "HubArn": f"arn:aws:sagemaker:{REGION}:aws:hub/SageMakerPublicHub",
                       "HubContentDocument": json.dumps({"HuggingfaceId": hub[name][1]})})

    session.events.register("before-call.sagemaker.ListHubContents", list_hub_contents)
    session.events.register("before-call.sagemaker.DescribeHubContent", describe_hub_content)
    return session


def deny(session: boto3.Session, service: str, operation: str, code: str) -> None:
    """Make ``operation`` fail as AWS does for a caller without the permission."""
    session.events.register_first(f"before-call.{service}.{operation}",  # ahead of serve_public_hub's answers
                                  lambda **_: answer({"Error": {"Code": code, "Message": "not authorized"}}, 403))


def record_calls(session: boto3.Session) -> list[str]:
    """Every API call of clients created from ``session`` from now on, answered by moto or by a hook."""
    calls: list[str] = []
    session.events.register("before-parameter-build", lambda model, **_: calls.append(model.name))
    return calls


def trust_policy() -> str:
    """The shipped config/iam/trust-policy.json, filled in for moto's account."""
    text = (ROOT / "config" / "iam" / "trust-policy.json").read_text()
    return text.replace("<ACCOUNT_ID>", ACCOUNT).replace("<REGION>", REGION)


def write_config(tmp_path: Path, **changes: dict[str, Any]) -> Path:
    """config/local.yaml with a served base model and some keys replaced (a None value removes the key)."""
    raw = yaml.safe_load(LOCAL.read_text())
    raw["session"]["base_model"] = BASE_MODEL
    for section, values in changes.items():
        for key, value in values.items():
            if value is None:
                raw[section].pop(key, None)
            else:
                raw[section][key] = value
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def create_account(session: boto3.Session) -> None:
    """What a prepared account holds for config/local.yaml: the role, the data (the image is not in ECR)."""
    session.client("iam").create_role(RoleName=ROLE, AssumeRolePolicyDocument=trust_policy())
    s3 = session.client("s3")
    s3.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": REGION})
    for split in ("train", "eval"):
        row = b'{"question": "q", "answer": "#### 1"}\n'  # rows enough for the tests' BatchSize 64
        s3.put_object(Bucket=BUCKET, Key=f"data/{split}/gsm8k-{split}.jsonl", Body=row * 100)


def push_image(session: boto3.Session, repository: str, tag: str) -> None:
    ecr = session.client("ecr")
    ecr.create_repository(repositoryName=repository)
    ecr.put_image(repositoryName=repository, imageTag=tag, imageManifest=json.dumps(
        {"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
         "config": {"digest": "sha256:" + "0" * 64, "size": 1,
                    "mediaType": "application/vnd.docker.container.image.v1+json"},
         "layers": []}))


@pytest.fixture
def session():
    """moto with the account prepared and the Public Hub answered; no call recorded yet."""
    with mock_aws():
        session = serve_public_hub(boto3.Session(region_name=REGION))
        create_account(session)
        yield session


@pytest.fixture
def run(tmp_path) -> RunConfig:
    return load(write_config(tmp_path))[1]


def with_changes(tmp_path: Path, **changes: dict[str, Any]) -> RunConfig:
    return load(write_config(tmp_path, **changes))[1]


def refusal(call, *args) -> str:
    with pytest.raises(UserError) as err:
        call(*args)
    message = str(err.value)
    assert "\n" not in message
    return message


# -- the whole preflight ---------------------------------------------------------------------


def test_a_ready_account_passes_with_read_only_calls(session, run, capsys):
    calls = record_calls(session)
    preflight.before_deploy(session, run, "config.yaml")
    # The image (dapo-steps:local) is not an ECR URI, so it is not looked up.
    assert calls == ["GetRole", "ListObjectsV2", "ListObjectsV2", "ListHubContents", "DescribeHubContent",
                     "DescribeHubContent"]
    assert capsys.readouterr().err == ""


def test_offline_refusals_come_before_any_request(session, tmp_path):
    calls = record_calls(session)
    run = with_changes(tmp_path, session={"base_model": None})
    assert refusal(preflight.before_deploy, session, run, "config.yaml").startswith("'session.base_model' is not set")
    assert calls == []


@pytest.mark.parametrize(("service", "operation", "code", "note"), [
    ("iam", "GetRole", "AccessDenied", "that arn:aws:iam::123456789012:role/dapo-local exists (no iam:GetRole"),
    ("s3", "ListObjectsV2", "AccessDenied", "the data under s3://dapo-local/data/train/ (no s3:ListBucket"),
    ("sagemaker", "ListHubContents", "AccessDeniedException",
     f"that the Public Hub in {REGION} serves {SERVED} (no sagemaker:ListHubContents"),
])
def test_a_check_without_permission_is_a_note_and_the_others_still_run(session, run, capsys, service, operation,
                                                                       code, note):
    deny(session, service, operation, code)
    calls = record_calls(session)
    preflight.before_deploy(session, run, "config.yaml")
    assert f"note: cannot check {note} permission)" in capsys.readouterr().err
    assert {"GetRole", "ListObjectsV2", "ListHubContents"} <= set(calls)


def test_an_ecr_image_without_describe_permission_is_a_note(session, capsys):
    deny(session, "ecr", "DescribeImages", "AccessDeniedException")
    preflight.check_image(session, f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/dapo-steps:t1")
    assert "note: cannot check that" in capsys.readouterr().err


def test_other_errors_are_not_swallowed(session, run):
    deny(session, "iam", "GetRole", "ServiceFailure")
    with pytest.raises(Exception, match="ServiceFailure"):
        preflight.before_deploy(session, run, "config.yaml")


# -- placeholders and the base model (offline) ------------------------------------------------


def test_placeholders_are_refused_by_key():
    _, example = load(ROOT / "config" / "config.yaml.example")
    message = refusal(preflight.check_placeholders, example, "config/config.yaml")
    assert message.startswith("config/config.yaml: fill in 'pipeline.role_arn', 'pipeline.image_uri'")
    assert "'session.base_model'" in message and "(still <PLACEHOLDER> values from the example)" in message


SERVES_US_WEST_2 = ("training sessions serve huggingface-vlm-gemma-4-31b-it, huggingface-vlm-qwen3-6-27b, "
                    "huggingface-vlm-qwen3-8-27b, openai-reasoning-gpt-oss-20b in us-west-2")


@pytest.mark.parametrize(("base_model", "region", "message"), [
    (None, REGION, "'session.base_model' is not set: name the SageMaker Public Hub model to fine-tune "
                   f"(its ARN, see config/default.yaml); {SERVES_US_WEST_2}"),
    (hub_model_arn("local-toy-arith"), REGION, "'session.base_model': local-toy-arith is the local "
     f"training-session service's toy model (config/local.yaml only); {SERVES_US_WEST_2}"),
    (hub_model_arn("huggingface-llm-mistral-7b"), REGION,
     "'session.base_model': training sessions do not serve huggingface-llm-mistral-7b in us-west-2; "
     f"{SERVES_US_WEST_2}"),
    (hub_model_arn(SERVED, "us-east-1"), "us-east-1", f"'session.base_model': training sessions do not serve {SERVED} "
     "in us-east-1; training sessions serve openai-reasoning-gpt-oss-20b in us-east-1"),
    (hub_model_arn(SERVED, "us-east-1"), REGION, f"'session.base_model': {hub_model_arn(SERVED, 'us-east-1')} is in "
     "us-east-1, the pipeline runs in us-west-2; use the model's us-west-2 ARN (or set 'session.region' to us-east-1)"),
    ("arn:aws:sagemaker:us-west-2:aws:hub-content/MyHub/Model/x/1", REGION, "'session.base_model': "
     "arn:aws:sagemaker:us-west-2:aws:hub-content/MyHub/Model/x/1 is not a SageMaker Public Hub model ARN"),
    ("Qwen/Qwen3.6-27B", REGION, "'session.base_model': Qwen/Qwen3.6-27B is a model id; name the SageMaker "
     "Public Hub model instead (its ARN, see config/default.yaml)"),
    (hub_model_arn(SERVED, "eu-west-1"), "eu-west-1", "'session.region': training sessions serve no base model in "
     "eu-west-1; use one of ap-south-1, us-east-1, us-west-2"),
])
def test_base_models_training_sessions_do_not_serve_are_refused(base_model, region, message):
    assert message in refusal(preflight.check_base_model, base_model, region, "'session.base_model'")


@pytest.mark.parametrize("base_model", [BASE_MODEL, SERVED])
def test_a_served_base_model_by_arn_or_hub_content_name(base_model):
    assert preflight.check_base_model(base_model, REGION, "'session.base_model'") == SERVED


def test_a_deploy_refuses_the_local_config_for_its_toy_model(session):
    _, run = load(LOCAL)
    assert "local-toy-arith is the local training-session service's toy model" in \
        refusal(preflight.before_deploy, session, run, str(LOCAL))


# -- roles ------------------------------------------------------------------------------------


def test_a_missing_role_is_refused(session):
    assert refusal(preflight.check_role, session, f"arn:aws:iam::{ACCOUNT}:role/nobody", "'pipeline.role_arn'") == (
        f"'pipeline.role_arn': role arn:aws:iam::{ACCOUNT}:role/nobody does not exist; "
        "create it as described in config/iam/README.md")


def test_a_role_sagemaker_may_not_assume_is_refused(session):
    ec2_only = {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}]}
    session.client("iam").create_role(RoleName="ec2-role", AssumeRolePolicyDocument=json.dumps(ec2_only))
    assert refusal(preflight.check_role, session, f"arn:aws:iam::{ACCOUNT}:role/ec2-role", "'session.role_arn'") == (
        f"'session.role_arn': role arn:aws:iam::{ACCOUNT}:role/ec2-role does not let sagemaker.amazonaws.com assume "
        "it; give it config/iam/trust-policy.json (aws iam update-assume-role-policy --role-name ec2-role "
        "--policy-document file://build/iam/trust-policy.json)")


def test_the_shipped_trust_policy_passes():
    assert preflight.trusts_sagemaker(json.loads(trust_policy()))
    assert not preflight.trusts_sagemaker({"Statement": [{"Effect": "Deny", "Principal": {"Service": [
        "sagemaker.amazonaws.com"]}, "Action": "sts:AssumeRole"}]})


def test_the_training_sessions_own_role_is_checked_too(session, tmp_path):
    run = with_changes(tmp_path, session={"role_arn": f"arn:aws:iam::{ACCOUNT}:role/session-role"})
    assert refusal(preflight.before_deploy, session, run, "config.yaml").startswith(
        f"'session.role_arn': role arn:aws:iam::{ACCOUNT}:role/session-role does not exist")


# -- the image --------------------------------------------------------------------------------


def test_an_image_not_in_ecr_is_refused(session):
    uri = f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/dapo-steps:abc123"
    assert refusal(preflight.check_image, session, uri) == (
        f"'pipeline.image_uri': {uri} is not in ECR (RepositoryNotFoundException); run 'make push-image'")
    push_image(session, "dapo-steps", "other")
    assert "(ImageNotFoundException)" in refusal(preflight.check_image, session, uri)
    push_image(session, "dapo-steps-2", "abc123")
    preflight.check_image(session, f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/dapo-steps-2:abc123")


# -- the data ---------------------------------------------------------------------------------


def test_a_missing_bucket_is_refused(session):
    assert refusal(preflight.check_data, session, "s3://no-such-bucket/data/train/", "'pipeline.train_s3_uri'") == (
        "'pipeline.train_s3_uri': bucket no-such-bucket of s3://no-such-bucket/data/train/ does not exist; "
        "create it and run 'make data'")


@pytest.mark.parametrize("keys", [[], ["data/empty/readme.txt"], ["data/empty-old/gsm8k.jsonl"]],
                         ids=["nothing", "no-jsonl", "only-a-sibling-prefix"])
def test_a_prefix_without_jsonl_is_refused(session, keys):
    for key in keys:
        session.client("s3").put_object(Bucket=BUCKET, Key=key, Body=b"{}\n")
    assert refusal(preflight.check_data, session, f"s3://{BUCKET}/data/empty/", "'pipeline.eval_s3_uri'") == (
        f"'pipeline.eval_s3_uri': no data object (.jsonl, .json, .csv, .parquet) under s3://{BUCKET}/data/empty/; "
        "upload your data there with 'make data'")


def test_a_single_jsonl_object_is_data(session):
    preflight.check_data(session, f"s3://{BUCKET}/data/train/gsm8k-train.jsonl", "'pipeline.train_s3_uri'")


# -- the Public Hub (live) --------------------------------------------------------------------


def test_the_sdk_scan_finds_what_the_hub_serves_for_training_sessions(session):
    assert preflight.served_base_models(session) == {SERVED, "huggingface-llm-acme-9b"}


def test_a_model_the_regions_hub_does_not_serve_is_refused(session):
    assert refusal(preflight.check_base_model_served, session, "openai-reasoning-gpt-oss-20b",
                   "'session.base_model'") == (
        "'session.base_model': the SageMaker Public Hub in us-west-2 does not serve openai-reasoning-gpt-oss-20b "
        f"for training sessions (it serves: huggingface-llm-acme-9b, {SERVED}); pick one of those")


# -- start: the execution's own values --------------------------------------------------------


def test_start_names_the_parameter_that_set_a_value(session, run, tmp_path):
    empty = with_changes(tmp_path, pipeline={"train_s3_uri": f"s3://{BUCKET}/x"})
    assert refusal(preflight.before_start, session, empty, "config.yaml", {"TrainDataS3Uri": f"s3://{BUCKET}/x"}
                   ).startswith(f"parameter TrainDataS3Uri: no data object (.jsonl, .json, .csv, .parquet) under "
                                f"s3://{BUCKET}/x/")
    assert refusal(preflight.before_start, session, empty, "config.yaml", {}).startswith(
        "'pipeline.train_s3_uri': no data object")
    toy = with_changes(tmp_path, session={"base_model": hub_model_arn("local-toy-arith")})
    assert refusal(preflight.before_start, session, toy, "config.yaml", {"BaseModel": "..."}).startswith(
        "parameter BaseModel: local-toy-arith is the local training-session service's toy model")


def test_start_makes_the_same_read_only_calls_as_deploy(session, run):
    calls = record_calls(session)
    preflight.before_start(session, run, "config.yaml", {})
    # A role deleted since the deploy fails the start, not the first step.
    assert calls == ["GetRole", "ListObjectsV2", "ListObjectsV2", "ListHubContents", "DescribeHubContent",
                     "DescribeHubContent"]


def test_start_refuses_an_overridden_image_that_is_not_in_ecr(session, run, tmp_path):
    image = f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/dapo-steps:never-pushed"
    overridden = with_changes(tmp_path, pipeline={"image_uri": image})
    assert refusal(preflight.before_start, session, overridden, "config.yaml", {"ImageUri": image}) == (
        f"parameter ImageUri: {image} is not in ECR (RepositoryNotFoundException); run 'make push-image'")


def test_start_refuses_a_placeholder_left_in_the_config(session, tmp_path):
    left = with_changes(tmp_path, pipeline={"role_arn": "arn:aws:iam::<ACCOUNT_ID>:role/dapo"})
    calls = record_calls(session)
    assert "still <PLACEHOLDER> values" in refusal(preflight.before_start, session, left, "config.yaml", {})
    assert calls == []
