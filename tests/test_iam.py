"""The IAM documents grant exactly what the code calls: every action collected below is granted, and every
granted action is one of them.

Collected: what deploy (with its preflight) and start send, recorded against moto; what the SDK sends for
the training, resumed training, evaluation and approval steps, recorded against the local training-session
service; the SageMaker calls named in steps/; the job types of the definition; and, listed with a reason,
what SageMaker itself does with the pipeline role while it runs the jobs and the training session.
What MLflow logging adds when a tracking server is configured (mlflow-policy.json) is recorded the same
way, against MLflow's REST server behind a tracking server ARN (tests/test_tracking.py). What `make sessions` /
`make stop-orphans` send is the deployer's, recorded against the local service and moto. What a VPC and KMS keys
add (vpc-policy.json, kms-policy.json) SageMaker does on the role's behalf; each grant is listed with its reason
and scoped to the configured subnets, security groups and keys.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Callable, Iterator

import boto3
import botocore.handlers
import botocore.session
import pytest
from botocore import xform_name
from mlflow.protos.service_pb2 import MlflowService
from mlflow.utils.rest_utils import extract_api_info_for_service
from moto import mock_aws

from local.toy_data import write_split
from pipeline import deploy as deploy_cmd
from pipeline import preflight
from pipeline import sessions as sessions_cmd
from pipeline import start as start_cmd
from pipeline.config import load
from steps import approve, evaluate, train
from steps.platform import tracking
from steps.platform.ownership import ENV_JOB, ENV_LOCAL_JOBS, ENV_PIPELINE, PREFIX, Owner, pipeline_key
from tests.local_service import BASE_MODEL_ARN, ENDPOINT_ENV_VARS, client_kwargs
from tests.test_pipeline_definition import all_steps, local_build
from tests.test_preflight import ACCOUNT, REGION, answer, create_account, push_image, serve_public_hub, write_config
from tests.test_tracking import managed_mlflow

ROOT = Path(__file__).resolve().parents[1]
IAM = ROOT / "config" / "iam"
ROLE_ARN = "arn:aws:iam::<ACCOUNT_ID>:role/<ROLE_NAME>"
JOB_ACTIONS = {
    "Processing": ("CreateProcessingJob", "DescribeProcessingJob", "StopProcessingJob"),
    "Training": ("CreateTrainingJob", "DescribeTrainingJob", "StopTrainingJob"),
}
#: Operations whose IAM action has another name than the operation.
IAM_ACTION_OF = {"s3:ListObjectsV2": "s3:ListBucket", "s3:HeadObject": "s3:GetObject"}
#: What SageMaker does with the pipeline role while it runs our jobs and the training session: no request of
#: ours carries these. After AWS's minimal CreateProcessingJob/CreateTrainingJob execution roles (cited in
#: config/iam/README.md) and the training-session prerequisites.
ON_OUR_BEHALF = {
    "iam:PassRole": "the pipeline passes the role to its jobs, TrainDAPO to its training session",
    "sagemaker:AddTags": "the pipeline tags the jobs it creates with the pipeline's tags",
    "s3:ListBucket": "jobs list their S3Prefix inputs (the data; the validated data and model under the output "
                     "prefix) and TrainDAPO its checkpoints",
    "s3:GetObject": "jobs download their inputs, TrainDAPO its checkpoints",
    "s3:PutObject": "jobs upload outputs and checkpoints; the training session writes under s3_output_path",
    "ecr:GetAuthorizationToken": "jobs pull the step image",
    "ecr:BatchCheckLayerAvailability": "jobs pull the step image",
    "ecr:GetDownloadUrlForLayer": "jobs pull the step image",
    "ecr:BatchGetImage": "jobs pull the step image",
    "logs:CreateLogGroup": "job logs",
    "logs:CreateLogStream": "job logs",
    "logs:PutLogEvents": "job logs",
    "logs:DescribeLogStreams": "job logs",
    "cloudwatch:PutMetricData": "TrainDAPO's metric definitions",
    "sagemaker:CreateModelPackage": "save_state and save_weights_for_sampler publish into the model package group",
    "sagemaker:DescribeModelPackageGroup": "the training session checks the group it publishes into",
    "sagemaker:DescribeHubContent": "the training session resolves its base model on the Public Hub, and "
                                    "the SDK reads the model's tokenizer id there (a Hub ARN reaches no Hub "
                                    "locally, so the recorded run cannot show it)",
}
#: What SageMaker does with the role for jobs and sessions in a VPC (vpc-policy.json): attach them to the subnets.
#: After AWS's CreateProcessingJob/CreateTrainingJob execution-role permissions for a VpcConfig.
VPC_ON_OUR_BEHALF = {
    "ec2:CreateNetworkInterface": "each job's and session's instances get a network interface in the subnets",
    "ec2:CreateNetworkInterfacePermission": "SageMaker attaches those interfaces to instances it runs",
    "ec2:DeleteNetworkInterface": "and removes them when the job or session ends",
    "ec2:DeleteNetworkInterfacePermission": "and removes them when the job or session ends",
    "ec2:DescribeNetworkInterfaces": "SageMaker checks the interfaces it created",
    "ec2:DescribeVpcs": "SageMaker checks the configured subnets and security groups before it starts a job",
    "ec2:DescribeDhcpOptions": "SageMaker checks the VPC's DNS settings",
    "ec2:DescribeSubnets": "SageMaker checks the configured subnets",
    "ec2:DescribeSecurityGroups": "SageMaker checks the configured security groups",
}
#: What SageMaker, S3 and EBS do with the role for kms_key_arn and volume_kms_key_arn (kms-policy.json).
KMS_ON_OUR_BEHALF = {
    "kms:Encrypt": "SageMaker encrypts with OutputDataConfig.KmsKeyId (its documented requirement)",
    "kms:GenerateDataKey": "S3 encrypts the objects the jobs and training sessions write (SSE-KMS)",
    "kms:Decrypt": "jobs read what earlier steps wrote (validated data, the model, checkpoints on a resume)",
    "kms:DescribeKey": "SageMaker and the training session check the keys they are given",
    "kms:CreateGrant": "the training session and EBS (the jobs' volumes) use the keys through grants",
}
#: What deploy and start send that moto cannot record.
DEPLOYER_UNRECORDED = {
    "iam:PassRole": "CreatePipeline passes the pipeline role: authorised, never sent",
}


def policy(name: str) -> dict[str, Any]:
    return json.loads((IAM / name).read_text())


def statements(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return doc["Statement"]


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def granted(doc: dict[str, Any]) -> set[str]:
    return {a for s in statements(doc) if s["Effect"] == "Allow" for a in as_list(s["Action"])}


def operations(service: str) -> set[str]:
    return set(botocore.session.get_session().get_service_model(service).operation_names)


SAGEMAKER_OPERATIONS = operations("sagemaker") | operations("sagemakertrainingsessionruntime")


def recorder(calls: set[str]) -> Callable[..., None]:
    """A botocore handler adding the IAM action of each call; ``before-parameter-build`` precedes the
    ``before-call`` hooks that answer for moto, so hooked calls are recorded too."""
    def record(model: Any, **_: Any) -> None:
        action = f"{model.service_model.signing_name}:{model.name}"
        calls.add(IAM_ACTION_OF.get(action, action))
    return record


# -- what the code calls -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def deployer_calls(tmp_path_factory) -> set[str]:
    """Deploy's preflight and upsert (create, then update with tags), start, and what --wait polls, in moto."""
    image = f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/dapo-steps:t1"
    path = write_config(tmp_path_factory.mktemp("cfg"), pipeline={"image_uri": image, "tags": {"project": "dapo"}})
    cfg, run = load(path)
    calls: set[str] = set()
    with mock_aws():
        session = serve_public_hub(boto3.Session(region_name=REGION))
        create_account(session)
        push_image(session, "dapo-steps", "t1")
        session.events.register("before-call.sagemaker.ListPipelineExecutionSteps",  # moto lacks it
                                lambda **_: answer({"PipelineExecutionSteps": []}))
        session.events.register("before-parameter-build", recorder(calls))
        # deploy() = this preflight + the offline build (no request: see test_pipeline_definition) + upsert.
        preflight.before_deploy(session, run, str(path))
        sm = session.client("sagemaker")
        definition = json.dumps(local_build()["definition"])
        deploy_cmd.upsert(sm, cfg, definition)  # create
        deploy_cmd.upsert(sm, cfg, definition)  # update + tags
        arn = start_cmd.start(session, cfg.name, REGION, {"BatchSize": "8"}, str(path))
        sm.describe_pipeline_execution(PipelineExecutionArn=arn)  # what --wait polls
        start_cmd._list_steps(sm)(arn)
    return calls


@pytest.fixture(scope="module")
def sdk_calls(tmp_path_factory, training_service) -> set[str]:
    """The steps against the local training-session service: train, train again (resume), evaluate the trained
    and the base model, approve. Every botocore client the SDK builds reports to the recorder."""
    d = tmp_path_factory.mktemp("steps")
    train_path, eval_path = write_split(d / "data", 60, 20, seed=5)
    calls: set[str] = set()
    with pytest.MonkeyPatch.context() as mp:
        for var in ENDPOINT_ENV_VARS:
            mp.setenv(var, training_service.url)
        # As a pipeline's training job runs it: the step stops the pipeline's orphans before it creates a session.
        owner = {ENV_PIPELINE: "dapo-iam", ENV_JOB: "TrainDAPO-iam", ENV_LOCAL_JOBS: str(d / "jobs")}
        for name, value in owner.items():
            mp.setenv(name, value)
        mp.setattr(botocore.handlers, "BUILTIN_HANDLERS",
                   [*botocore.handlers.BUILTIN_HANDLERS, ("before-parameter-build", recorder(calls))])
        mp.setattr(boto3, "DEFAULT_SESSION", None)  # boto3.client() (approve's) then builds one that records
        for steps in (1, 2):  # the second run resumes from the first one's checkpoint
            assert train.main(["--config", str(ROOT / "config/local.yaml"), "--train", str(train_path),
                               "--eval", str(eval_path), "--model-dir", str(d / "model"),
                               "--output-dir", str(d / "out"), "--checkpoint-dir", str(d / "ckpt"),
                               "--hyperparameters", str(d / "none.json"), "--set", f"max_steps={steps}",
                               "--set", "batch_size=4", "--set", "save_every=1", "--set", "eval_size=4",
                               "--set", f"model_package_group_arn={client_kwargs()['model_package_group_arn']}"]) == 0
        # The base model and the trained adapter, in one session.
        assert evaluate.main(["--model", str(d / "model"), "--eval", str(eval_path), "--eval-size", "4",
                              "--output", str(d / "eval")]) == 0
        assert approve.main(["--model", str(d / "model"), "--evaluation", str(d / "eval" / "evaluation.json")]) == 0
    return calls


@pytest.fixture(scope="module")
def sessions_cli_calls(tmp_path_factory, training_service) -> set[str]:
    """`make sessions` and `make stop-orphans` (YES=1) with an orphan to stop: the sessions on the local service,
    the running training jobs in moto."""
    path = write_config(tmp_path_factory.mktemp("sessions-cfg"), pipeline={"name": "dapo-iam-sessions"})
    calls: set[str] = set()
    with pytest.MonkeyPatch.context() as mp, mock_aws():
        for var in ENDPOINT_ENV_VARS:
            mp.setenv(var, training_service.url)
        from sagemaker.train.training_session import ServiceClient

        orphan = ServiceClient(**client_kwargs()).create_lora_training_client(
            base_model=BASE_MODEL_ARN, training_session_name=Owner("dapo-iam-sessions", "gone").session_name(1))
        mp.setattr(botocore.handlers, "BUILTIN_HANDLERS",
                   [*botocore.handlers.BUILTIN_HANDLERS, ("before-parameter-build", recorder(calls))])
        mp.setattr(boto3, "DEFAULT_SESSION", None)
        assert sessions_cmd.main(["--config", str(path)]) == 0
        assert sessions_cmd.main(["--config", str(path), "--stop-orphans", "--yes"]) == 0
    assert training_service.state.find(orphan.training_session_name).status == "Stopped"
    return calls


def steps_source_calls() -> set[str]:
    """SageMaker operations steps/ calls by name (e.g. approve's update_model_package). MLflow tracking's calls
    are mlflow-policy.json's, recorded (and its MlflowClient's create_experiment is not SageMaker's)."""
    by_snake = {xform_name(op): op for op in SAGEMAKER_OPERATIONS}
    source = "\n".join(p.read_text() for p in (ROOT / "steps").rglob("*.py") if p.name != "tracking.py")
    # Operation names with an underscore: `.search(` is re.search, not SageMaker's Search; and paginated ones.
    called = re.findall(r"\.([a-z][a-z0-9]*_[a-z0-9_]+)\(", source) + re.findall(r'get_paginator\("(\w+)"\)', source)
    return {f"sagemaker:{by_snake[m]}" for m in called if m in by_snake}


@pytest.fixture(scope="module")
def mlflow_calls(tmp_path_factory, training_service, sdk_calls) -> set[str]:
    """What logging to a SageMaker MLflow tracking server adds: train (one step, started by an execution) and
    evaluate with the server configured, every botocore call and every request the server got recorded,
    less what the same steps send without MLflow."""
    d = tmp_path_factory.mktemp("mlflow")
    train_path, eval_path = write_split(d / "data", 60, 20, seed=5)
    execution = f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:pipeline/dapo-gsm8k/execution/x1"
    calls: set[str] = set()
    with managed_mlflow(d / "server.db") as (env, requests), pytest.MonkeyPatch.context() as mp:
        for name, value in {**env, tracking.ENV_EXECUTION_ARN: execution}.items():
            mp.setenv(name, value)
        for var in ENDPOINT_ENV_VARS:
            mp.setenv(var, training_service.url)
        mp.setattr(botocore.handlers, "BUILTIN_HANDLERS",
                   [*botocore.handlers.BUILTIN_HANDLERS, ("before-parameter-build", recorder(calls))])
        mp.setattr(boto3, "DEFAULT_SESSION", None)
        assert train.main(["--config", str(ROOT / "config/local.yaml"), "--train", str(train_path),
                           "--eval", str(eval_path), "--model-dir", str(d / "model"), "--output-dir", str(d / "out"),
                           "--checkpoint-dir", str(d / "ckpt"), "--hyperparameters", str(d / "none.json"),
                           "--set", "max_steps=1", "--set", "batch_size=4", "--set", "eval_size=4",
                           "--set", f"model_package_group_arn={client_kwargs()['model_package_group_arn']}"]) == 0
        for _attempt in (1, 2):  # a retried EvaluateModel appends to the rollouts table the first attempt logged
            assert evaluate.main(["--model", str(d / "model"), "--eval", str(eval_path), "--eval-size", "4",
                                  "--output", str(d / "eval")]) == 0
    assert json.loads((d / "model" / "model.json").read_text())["mlflow"]  # the run was tracked
    return {f"sagemaker-mlflow:{r['api']}" for r in requests} | (calls - sdk_calls)


def job_calls() -> set[str]:
    types = {s["Type"] for s in all_steps(local_build()["definition"])}
    assert types == {"Processing", "Training", "Condition", "Fail"}
    return {f"sagemaker:{op}" for kind in types & set(JOB_ACTIONS) for op in JOB_ACTIONS[kind]}


@pytest.fixture(scope="module")
def role_calls(sdk_calls) -> set[str]:
    return job_calls() | sdk_calls | steps_source_calls() | set(ON_OUR_BEHALF)


# -- least privilege, proven ---------------------------------------------------------------------


def test_the_deployer_is_granted_exactly_what_deploy_start_and_the_session_commands_call(deployer_calls,
                                                                                      sessions_cli_calls):
    assert {"iam:GetRole", "ecr:DescribeImages", "s3:ListBucket", "sagemaker:ListHubContents",
            "sagemaker:DescribeHubContent", "sagemaker:CreatePipeline", "sagemaker:UpdatePipeline",
            "sagemaker:AddTags", "sagemaker:StartPipelineExecution", "sagemaker:ListPipelineExecutionSteps",
            } <= deployer_calls  # the recording works
    assert sessions_cli_calls == {"sagemaker:ListTrainingSessions", "sagemaker:ListTrainingJobs",
                                  "sagemaker:ListProcessingJobs", "sagemaker:StopTrainingSession",
                                  "sagemaker:DescribeTrainingSession"}  # make sessions: each one's billed tokens
    calls = deployer_calls | sessions_cli_calls | set(DEPLOYER_UNRECORDED)
    given = granted(policy("deployer-policy.json"))
    assert {"missing": calls - given, "never used": given - calls} == {"missing": set(), "never used": set()}


def test_the_pipeline_role_is_granted_exactly_what_its_jobs_and_session_call(role_calls, sdk_calls):
    assert {"sagemaker:CreateTrainingSession", "sagemaker:ExecuteTrainingOperation",
            "sagemaker:ExecuteSamplingOperation", "sagemaker:StopTrainingSession",
            "sagemaker:UpdateModelPackage", "sagemaker:ListTrainingSessions"} <= sdk_calls  # the recording works
    # The orphan sweep on AWS (locally: a register): TrainDAPO is a training job, EvaluateModel a processing job.
    assert {"sagemaker:ListTrainingJobs", "sagemaker:ListProcessingJobs"} <= steps_source_calls()
    given = granted(policy("pipeline-role-policy.json"))
    assert {"missing": role_calls - given, "never used": given - role_calls} == {"missing": set(),
                                                                                "never used": set()}


def test_mlflow_logging_is_granted_exactly_what_it_calls(mlflow_calls):
    assert {"sagemaker-mlflow:CreateRun", "sagemaker-mlflow:LogBatch", "s3:PutObject",
            "sagemaker:DescribePipelineExecution"} <= mlflow_calls  # the recording works
    given = granted(policy("mlflow-policy.json"))
    assert {"missing": mlflow_calls - given, "never used": given - mlflow_calls} == {"missing": set(),
                                                                                    "never used": set()}


def test_mlflow_grants_are_scoped_to_the_tracking_server_its_artifact_store_and_this_pipeline():
    scopes = {action.split(":")[0] if action.startswith("sagemaker-mlflow:") else action: s["Resource"]
              for s in statements(policy("mlflow-policy.json")) for action in as_list(s["Action"])}
    assert scopes == {
        "sagemaker-mlflow": "arn:aws:sagemaker:<REGION>:<ACCOUNT_ID>:mlflow-tracking-server/<MLFLOW_TRACKING_SERVER>",
        "s3:PutObject": "arn:aws:s3:::<MLFLOW_ARTIFACT_BUCKET>/<MLFLOW_ARTIFACT_PREFIX>/*",
        "s3:GetObject": "arn:aws:s3:::<MLFLOW_ARTIFACT_BUCKET>/<MLFLOW_ARTIFACT_PREFIX>/*",
        "s3:ListBucket": "arn:aws:s3:::<MLFLOW_ARTIFACT_BUCKET>",
        "sagemaker:DescribePipelineExecution":
            "arn:aws:sagemaker:<REGION>:<ACCOUNT_ID>:pipeline/<PIPELINE_NAME>/execution/*",
    }


def test_the_sdk_calls_are_the_training_session_api_and_the_model_registry(sdk_calls):
    assert all(a.startswith("sagemaker:") and a.split(":")[1] in SAGEMAKER_OPERATIONS for a in sdk_calls), sdk_calls


# -- the documents ---------------------------------------------------------------------------


POLICIES = ["pipeline-role-policy.json", "deployer-policy.json", "mlflow-policy.json", "vpc-policy.json",
            "kms-policy.json"]
#: The MLflow REST API's operations: the sagemaker-mlflow IAM actions are named after them.
MLFLOW_OPERATIONS = {request.__name__ for request in extract_api_info_for_service(MlflowService, "/api/2.0")}


@pytest.mark.parametrize("name", [*POLICIES, "trust-policy.json"])
def test_documents_parse_and_only_allow(name):
    doc = policy(name)
    assert doc["Version"] == "2012-10-17"
    assert statements(doc) and all(s["Effect"] == "Allow" for s in statements(doc))
    sids = [s["Sid"] for s in statements(doc)]
    assert len(sids) == len(set(sids))


@pytest.mark.parametrize("name", POLICIES)
def test_no_wildcard_actions_and_real_sagemaker_action_names(name):
    for action in granted(policy(name)):
        service, _, op = action.partition(":")
        assert "*" not in action, action
        if service == "sagemaker":
            # A typo here would only show up as AccessDenied in a running pipeline.
            assert op in SAGEMAKER_OPERATIONS, action
        if service == "sagemaker-mlflow":
            assert op in MLFLOW_OPERATIONS, action


@pytest.mark.parametrize("name", POLICIES)
def test_resource_star_only_where_iam_offers_nothing_narrower(name):
    for s in statements(policy(name)):
        if "*" in as_list(s["Resource"]):
            for action in as_list(s["Action"]):
                assert (action.split(":")[1].startswith(("List", "GetAuthorizationToken", "PutMetricData"))
                        or action.startswith("ec2:Describe")), action


def conditions(doc: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(action, condition key) for every conditioned grant."""
    for s in statements(doc):
        for test in s.get("Condition", {}).values():
            for key in test:
                for action in as_list(s["Action"]):
                    yield action, key


def test_no_condition_that_its_requests_cannot_satisfy():
    """s3:prefix exists only on listings (s3:ListBucket); a listing without one would be denied by it, so only
    the deployer, whose preflight always lists a prefix, uses it."""
    for name in ("pipeline-role-policy.json", "deployer-policy.json"):
        for action, key in conditions(policy(name)):
            if key == "s3:prefix":
                assert (name, action) == ("deployer-policy.json", "s3:ListBucket")


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
    assert preflight.trusts_sagemaker(policy("trust-policy.json"))  # what the preflight accepts


def test_only_the_output_prefix_is_writable():
    writable = [s for s in statements(policy("pipeline-role-policy.json")) if "s3:PutObject" in as_list(s["Action"])]
    assert [s["Resource"] for s in writable] == ["arn:aws:s3:::<OUTPUT_BUCKET>/<OUTPUT_PREFIX>/*"]


def statement_of(name: str, action: str) -> dict[str, Any]:
    [s] = [s for s in statements(policy(name)) if action in as_list(s["Action"])]
    return s


def test_the_deployer_stops_only_sessions_named_by_a_dapo_pipeline():
    s = statement_of("deployer-policy.json", "sagemaker:StopTrainingSession")
    assert s["Resource"] == f"arn:aws:sagemaker:<REGION>:<ACCOUNT_ID>:training-session/{PREFIX}-*"
    assert pipeline_key("any-pipeline").startswith(f"{PREFIX}-")


def test_vpc_and_kms_grants_are_what_sagemaker_does_for_them():
    assert granted(policy("vpc-policy.json")) == set(VPC_ON_OUR_BEHALF)
    assert granted(policy("kms-policy.json")) == set(KMS_ON_OUR_BEHALF)


def scopes(doc: dict[str, Any]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for s in statements(doc):
        for action in as_list(s["Action"]):
            out.setdefault(action, set()).update(as_list(s["Resource"]))
    return out


def test_network_interfaces_only_in_the_configured_subnets_and_security_groups():
    ec2 = "arn:aws:ec2:<REGION>:<ACCOUNT_ID>"
    found = scopes(policy("vpc-policy.json"))
    assert found["ec2:CreateNetworkInterface"] == {
        f"{ec2}:subnet/<SUBNET_ID>", f"{ec2}:security-group/<SECURITY_GROUP_ID>", f"{ec2}:network-interface/*"}
    managed = statement_of("vpc-policy.json", "ec2:DeleteNetworkInterface")
    assert managed["Condition"] == {"ArnEquals": {"ec2:Subnet": f"{ec2}:subnet/<SUBNET_ID>"}}
    assert all(r == "*" for a, rs in found.items() if a.startswith("ec2:Describe") for r in rs)


def test_kms_only_on_the_configured_keys_and_grants_only_for_aws_services():
    key, volume = ("arn:aws:kms:<REGION>:<ACCOUNT_ID>:key/<KMS_KEY_ID>",
                   "arn:aws:kms:<REGION>:<ACCOUNT_ID>:key/<VOLUME_KMS_KEY_ID>")
    found = scopes(policy("kms-policy.json"))
    assert all(resources <= {key, volume} for resources in found.values()), found
    assert found["kms:GenerateDataKey"] == found["kms:Decrypt"] == found["kms:Encrypt"] == {key}
    grants = statement_of("kms-policy.json", "kms:CreateGrant")
    assert grants["Condition"] == {"Bool": {"kms:GrantIsForAWSResource": "true"}}


def test_every_placeholder_is_documented():
    readme = (IAM / "README.md").read_text()
    for name in [*POLICIES, "trust-policy.json"]:
        for placeholder in set(re.findall(r"<[A-Z_]+>", (IAM / name).read_text())):
            assert f"`{placeholder}`" in readme, (name, placeholder)
