"""The IAM documents parse, name real actions, stay least-privilege, and cover what the code calls."""
from __future__ import annotations

import fnmatch
import json
import re
from pathlib import Path
from typing import Any

import boto3
import botocore.session
import pytest
from botocore import xform_name
from moto import mock_aws

import sagemaker.train.training_session as training_session_sdk
from pipeline import deploy as deploy_cmd
from pipeline import start as start_cmd
from pipeline.config import load
from tests.test_pipeline_definition import all_steps, local_build

ROOT = Path(__file__).resolve().parents[1]
IAM = ROOT / "config" / "iam"
LOCAL = ROOT / "config" / "local.yaml"
ROLE_ARN = "arn:aws:iam::<ACCOUNT_ID>:role/<ROLE_NAME>"
# The training-session API as steps.train drives it through the SDK (create,
# poll until Running, stop; forward_backward/optim_step/save_state and sampling
# on the runtime; model packages for resume and the final model; the Hub for the
# tokenizer). Each must appear in the SDK's source, so the list cannot drift.
TRAINING_SESSION_CALLS = (
    "CreateTrainingSession", "DescribeTrainingSession", "StopTrainingSession",
    "ExecuteTrainingOperation", "GetTrainingOperationResult",
    "ExecuteSamplingOperation", "GetSamplingOperationResult",
    "DescribeModelPackage", "ListModelPackages", "DescribeHubContent",
)
JOB_ACTIONS = {
    "Processing": ("CreateProcessingJob", "DescribeProcessingJob", "StopProcessingJob"),
    "Training": ("CreateTrainingJob", "DescribeTrainingJob", "StopTrainingJob"),
}


def policy(name: str) -> dict[str, Any]:
    return json.loads((IAM / name).read_text())


def statements(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return doc["Statement"]


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def allowed(doc: dict[str, Any], action: str) -> bool:
    return any(
        fnmatch.fnmatch(action.lower(), pattern.lower())
        for s in statements(doc) if s["Effect"] == "Allow"
        for pattern in as_list(s["Action"])
    )


def operations(service: str) -> set[str]:
    return set(botocore.session.get_session().get_service_model(service).operation_names)


SAGEMAKER_OPERATIONS = operations("sagemaker") | operations("sagemakertrainingsessionruntime")


@pytest.mark.parametrize("name", ["pipeline-role-policy.json", "trust-policy.json", "deployer-policy.json"])
def test_documents_parse_and_only_allow(name):
    doc = policy(name)
    assert doc["Version"] == "2012-10-17"
    assert statements(doc) and all(s["Effect"] == "Allow" for s in statements(doc))
    sids = [s["Sid"] for s in statements(doc)]
    assert len(sids) == len(set(sids))


@pytest.mark.parametrize("name", ["pipeline-role-policy.json", "deployer-policy.json"])
def test_no_wildcard_actions_and_real_sagemaker_action_names(name):
    for s in statements(policy(name)):
        for action in as_list(s["Action"]):
            service, _, op = action.partition(":")
            assert "*" not in action, action
            if service == "sagemaker":
                # A typo here would only show up as AccessDenied in a running pipeline.
                assert op in SAGEMAKER_OPERATIONS, action


@pytest.mark.parametrize("name", ["pipeline-role-policy.json", "deployer-policy.json"])
def test_resource_star_only_where_iam_offers_nothing_narrower(name):
    for s in statements(policy(name)):
        if "*" in as_list(s["Resource"]):
            for action in as_list(s["Action"]):
                assert action.split(":")[1].startswith(("List", "GetAuthorizationToken", "PutMetricData")), action


def test_pass_role_is_this_role_to_sagemaker_only():
    for name in ("pipeline-role-policy.json", "deployer-policy.json"):
        [s] = [s for s in statements(policy(name)) if "iam:PassRole" in as_list(s["Action"])]
        assert as_list(s["Action"]) == ["iam:PassRole"]
        assert s["Resource"] == ROLE_ARN
        assert s["Condition"] == {"StringEquals": {"iam:PassedToService": "sagemaker.amazonaws.com"}}


def test_trust_is_sagemaker_in_this_account():
    [s] = statements(policy("trust-policy.json"))
    assert s["Principal"] == {"Service": "sagemaker.amazonaws.com"} and s["Action"] == "sts:AssumeRole"
    assert s["Condition"]["StringEquals"] == {"aws:SourceAccount": "<ACCOUNT_ID>"}


def test_role_runs_every_job_type_of_the_definition():
    doc = policy("pipeline-role-policy.json")
    types = {s["Type"] for s in all_steps(local_build()["definition"])}
    assert types == {"Processing", "Training", "Condition", "Fail"}
    for kind in types & set(JOB_ACTIONS):
        for op in JOB_ACTIONS[kind]:
            assert allowed(doc, f"sagemaker:{op}"), op
    assert allowed(doc, "sagemaker:AddTags")  # jobs carry the pipeline's tags


def test_role_covers_the_training_session_api():
    sdk_source = "\n".join(p.read_text() for p in Path(training_session_sdk.__file__).parent.glob("*.py"))
    doc = policy("pipeline-role-policy.json")
    for op in TRAINING_SESSION_CALLS:
        assert op in SAGEMAKER_OPERATIONS, op
        assert f".{xform_name(op)}(" in sdk_source, f"the SDK no longer calls {op}"
        assert allowed(doc, f"sagemaker:{op}"), op


def test_role_covers_the_sagemaker_calls_in_steps():
    """Any SageMaker operation steps/ calls by name (e.g. approve's update_model_package) is allowed."""
    by_snake = {xform_name(op): op for op in SAGEMAKER_OPERATIONS}
    source = "\n".join(p.read_text() for p in (ROOT / "steps").rglob("*.py"))
    # Operation names with an underscore: `.search(` is re.search, not SageMaker's Search.
    called = {by_snake[m] for m in re.findall(r"\.([a-z][a-z0-9]*_[a-z0-9_]+)\(", source) if m in by_snake}
    assert "UpdateModelPackage" in called  # steps.approve
    doc = policy("pipeline-role-policy.json")
    assert {op for op in called if not allowed(doc, f"sagemaker:{op}")} == set()


def test_role_covers_job_data_image_and_logs():
    doc = policy("pipeline-role-policy.json")
    for action in ("s3:GetObject", "s3:PutObject", "s3:ListBucket", "ecr:BatchGetImage",
                   "ecr:GetDownloadUrlForLayer", "ecr:GetAuthorizationToken", "logs:CreateLogStream",
                   "logs:PutLogEvents", "cloudwatch:PutMetricData", "sagemaker:UpdateModelPackage"):
        assert allowed(doc, action), action
    writable = [s for s in statements(doc) if "s3:PutObject" in as_list(s["Action"])]
    assert [s["Resource"] for s in writable] == ["arn:aws:s3:::<OUTPUT_BUCKET>/<OUTPUT_PREFIX>/*"]


def test_deployer_covers_what_deploy_and_start_send():
    """Record the requests of a real deploy and start against moto; each must be allowed."""
    cfg, _ = load(LOCAL)
    image = "123456789012.dkr.ecr.us-west-2.amazonaws.com/dapo-steps:t1"
    with mock_aws():
        session = boto3.Session(region_name="us-west-2")
        session.client("iam").create_role(RoleName="dapo-local", AssumeRolePolicyDocument="{}")
        ecr = session.client("ecr")
        ecr.create_repository(repositoryName="dapo-steps")
        ecr.put_image(repositoryName="dapo-steps", imageTag="t1", imageManifest=json.dumps(
            {"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
             "config": {"digest": "sha256:" + "0" * 64, "size": 1, "mediaType": "application/vnd.docker.container.image.v1+json"},
             "layers": []}))
        sent: set[str] = set()
        session.events.register("before-call", lambda model, **_: sent.add(f"{model.service_model.signing_name}:{model.name}"))
        # deploy() = these checks + the offline build (no request, see test_pipeline_definition) + upsert.
        deploy_cmd.check_role(session, cfg.role_arn)
        deploy_cmd.check_image(session, image)
        sm = session.client("sagemaker")
        tagged = cfg.model_copy(update={"tags": {"project": "dapo"}})
        definition = json.dumps(local_build()["definition"])
        deploy_cmd.upsert(sm, tagged, definition)  # create
        deploy_cmd.upsert(sm, tagged, definition)  # update + tags
        arn = start_cmd.start(sm, cfg.name, "us-west-2", {"BatchSize": "8"}, str(LOCAL))
        sm.describe_pipeline_execution(PipelineExecutionArn=arn)  # what --wait polls
    sent.add("sagemaker:ListPipelineExecutionSteps")  # --wait; moto lacks it, so it cannot be recorded
    assert {"iam:GetRole", "ecr:DescribeImages", "sagemaker:CreatePipeline", "sagemaker:UpdatePipeline",
            "sagemaker:StartPipelineExecution"} <= sent
    doc = policy("deployer-policy.json")
    assert {a for a in sent if not allowed(doc, a)} == set()
    assert allowed(doc, "iam:PassRole")  # CreatePipeline passes the role


def test_every_placeholder_is_documented():
    readme = (IAM / "README.md").read_text()
    for name in ("pipeline-role-policy.json", "trust-policy.json", "deployer-policy.json"):
        for placeholder in set(re.findall(r"<[A-Z_]+>", (IAM / name).read_text())):
            assert f"`{placeholder}`" in readme, (name, placeholder)
