"""No byte outside the customer's network: pipeline.vpc, kms_key_arn and volume_kms_key_arn on every job of the
definition and on the training sessions, ValidateData network-isolated when it needs no network, and nothing
changed without the settings. (tests/test_definition_checks.py checks the definition built with them against
the request shapes; tests/test_iam.py the grants they need.)"""
from __future__ import annotations

import copy
import functools
import json
import re
import tempfile
from pathlib import Path
from typing import Any

import boto3
import pytest

from pipeline.checks import all_steps
from pipeline.config import load
from pipeline.definition import build_definition
from steps import train
from steps.cli import Refused
from steps.config import ConfigError, config_from_dict, load_yaml
from steps.platform.session import ENV_KMS_KEY, ENV_SECURITY_GROUPS, ENV_SUBNETS, SessionNetwork
from tests.local_service import REGION
from tests.test_pipeline_definition import LOCAL, local_build, step
from tests.test_train import argv

VPC = {"subnets": ["subnet-0a1b2c3d4e5f60718", "subnet-0f1e2d3c4b5a69788"], "security_group_ids": ["sg-0123abcd"]}
KEY = "arn:aws:kms:us-west-2:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
VOLUME_KEY = "arn:aws:kms:us-west-2:123456789012:key/mrk-0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e"
TOKENIZER = "s3://dapo-local/tokenizers/toy/"
NETWORK = {"vpc": VPC, "kms_key_arn": KEY, "volume_kms_key_arn": VOLUME_KEY}
API_VPC = {"Subnets": VPC["subnets"], "SecurityGroupIds": VPC["security_group_ids"]}
SESSION_ENV = {ENV_SUBNETS: ",".join(VPC["subnets"]), ENV_SECURITY_GROUPS: ",".join(VPC["security_group_ids"]),
               ENV_KMS_KEY: KEY}


@functools.cache
def _build(settings: str) -> dict[str, Any]:
    raw = load_yaml(LOCAL)
    raw["pipeline"].update(json.loads(settings))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.yaml"
        path.write_text(json.dumps(raw))
        return build_definition(*load(path))


def build_with(**pipeline: Any) -> dict[str, Any]:
    """config/local.yaml with these pipeline settings, built once per set of settings."""
    return copy.deepcopy(_build(json.dumps(pipeline, sort_keys=True)))


def network_build() -> dict[str, Any]:
    """Every network and encryption setting, and the tokenizer from S3: tests/test_definition_checks.py checks it."""
    return build_with(**NETWORK, tokenizer_s3_uri=TOKENIZER)


def jobs(definition: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["Name"]: s for s in all_steps(definition) if s["Type"] in ("Processing", "Training")}


# -- the definition ------------------------------------------------------------------------------
def test_every_job_runs_in_the_vpc_with_encrypted_traffic_outputs_and_volumes():
    found = jobs(network_build())
    assert set(found) == {"ValidateData", "TrainDAPO", "EvaluateModel", "ApproveModel", "RecordRejection"}
    for name, job in found.items():
        args = job["Arguments"]
        if job["Type"] == "Processing":
            network = args["NetworkConfig"]
            assert (network["VpcConfig"], network["EnableInterContainerTrafficEncryption"]) == (API_VPC, True), name
            if "ProcessingOutputConfig" in args:  # the approval steps write nothing to S3
                assert args["ProcessingOutputConfig"]["KmsKeyId"] == KEY, name
            assert args["ProcessingResources"]["ClusterConfig"]["VolumeKmsKeyId"] == VOLUME_KEY, name
        else:
            assert (args["VpcConfig"], args["EnableInterContainerTrafficEncryption"]) == (API_VPC, True)
            assert args["OutputDataConfig"]["KmsKeyId"] == KEY
            assert args["ResourceConfig"]["VolumeKmsKeyId"] == VOLUME_KEY


def test_validate_data_alone_is_network_isolated_and_only_with_the_tokenizer_from_s3():
    isolated = {name: job["Arguments"].get("NetworkConfig", {}).get("EnableNetworkIsolation", False)
                for name, job in jobs(network_build()).items()}
    assert isolated == {"ValidateData": True, "TrainDAPO": False, "EvaluateModel": False, "ApproveModel": False,
                        "RecordRejection": False}
    # Without the tokenizer files ValidateData reads the Hub and downloads the tokenizer: it needs the network.
    assert step(build_with(**NETWORK), "ValidateData")["Arguments"]["NetworkConfig"]["EnableNetworkIsolation"] is False
    # Without a VPC, isolation is all its network settings.
    assert step(build_with(tokenizer_s3_uri=TOKENIZER), "ValidateData")["Arguments"]["NetworkConfig"] == {
        "EnableNetworkIsolation": True}


def test_the_jobs_that_create_sessions_hand_them_the_vpc_and_key():
    definition = network_build()
    for name in ("TrainDAPO", "EvaluateModel"):
        env = step(definition, name)["Arguments"]["Environment"]
        assert SessionNetwork.from_env(env) == SessionNetwork(tuple(VPC["subnets"]), tuple(VPC["security_group_ids"]),
                                                              KEY), name
    for name in ("ValidateData", "ApproveModel", "RecordRejection"):
        assert not set(step(definition, name)["Arguments"].get("Environment") or {}) & set(SESSION_ENV), name


NETWORK_MEMBERS = ("NetworkConfig", "VpcConfig", "EnableInterContainerTrafficEncryption", "KmsKeyId",
                   "VolumeKmsKeyId")


def without_network(node: Any) -> Any:
    """The definition with every network and encryption member, and the session's variables, taken out."""
    if isinstance(node, list):
        return [without_network(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: without_network(v) for k, v in node.items() if k not in NETWORK_MEMBERS and k not in SESSION_ENV}
    return {k: v for k, v in out.items() if not (k == "Environment" and v == {})}


def differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Where two JSON documents differ, as paths (a failure message that says which member, not a truncated dump)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b), key=str)
                for d in (differences(a[k], b[k], f"{path}/{k}") if k in a and k in b else [f"{path}/{k}: one side"])]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {a!r:.200} != {b!r:.200}"]


def test_without_the_settings_nothing_changes():
    unset = local_build()["definition"]
    assert not any(member in json.dumps(unset) for member in (*NETWORK_MEMBERS, *SESSION_ENV))
    # Built with them, the definition differs from the one built without in those members only.
    assert differences(without_network(build_with(**NETWORK)), unset) == []


# -- the training session --------------------------------------------------------------------------
def test_the_training_session_runs_in_the_vpc_and_encrypts_with_the_key(tmp_path, local_service, monkeypatch):
    from local.toy_data import write_split

    data = write_split(tmp_path / "data", 40, 10, seed=3)
    for key, value in SESSION_ENV.items():
        monkeypatch.setenv(key, value)
    before = {s["name"] for s in local_service.sessions()}
    assert train.main(argv(tmp_path, data, "batch_size=4", "max_steps=1", "eval_size=2")) == 0
    (name,) = [s["name"] for s in local_service.sessions() if s["name"] not in before]
    control = boto3.client("sagemaker", region_name=REGION, endpoint_url=local_service.url)
    detail = control.describe_training_session(TrainingSessionName=name)["TrainingSessionDetail"]
    assert detail["VpcConfig"] == API_VPC
    assert detail["OutputConfig"]["S3Location"]["KmsKeyArn"] == KEY


def test_the_session_network_is_read_back_as_written_and_a_half_vpc_is_refused():
    network = SessionNetwork(tuple(VPC["subnets"]), tuple(VPC["security_group_ids"]), KEY)
    assert network.environment() == SESSION_ENV and SessionNetwork.from_env(SESSION_ENV) == network
    assert SessionNetwork().environment() == {} and SessionNetwork.from_env({}).client_kwargs() == {}
    with pytest.raises(Refused, match=f"{ENV_SUBNETS}='subnet-1' and {ENV_SECURITY_GROUPS}='': a VPC needs both"):
        SessionNetwork.from_env({ENV_SUBNETS: "subnet-1"})


@pytest.mark.parametrize("change,message", [
    ({"vpc": {"subnets": ["vpc-123"], "security_group_ids": ["sg-1"]}}, "'pipeline.vpc.subnets.0' must be {subnets"),
    ({"vpc": {"subnets": ["subnet-1"], "security_group_ids": []}}, "'pipeline.vpc.security_group_ids' must be"),
    ({"vpc": {"subnets": ["subnet-1"]}}, "'pipeline.vpc.security_group_ids' is required"),
    ({"vpc": {"subnets": [f"subnet-{i}" for i in range(17)], "security_group_ids": ["sg-1"]}},
     "'pipeline.vpc.subnets' must be {subnets"),
    ({"kms_key_arn": "alias/dapo"}, "'pipeline.kms_key_arn' must be a KMS key ARN"),
    ({"volume_kms_key_arn": "1234abcd-12ab-34cd-56ef-1234567890ab"}, "'pipeline.volume_kms_key_arn' must be a KMS"),
])
def test_bad_network_settings_name_the_key(change, message):
    raw = load_yaml(LOCAL)
    raw["pipeline"].update(change)
    with pytest.raises(ConfigError, match=re.escape(message)):
        config_from_dict(raw, "c.yaml")
