"""Control plane of the local service: the ``sagemaker`` JSON 1.1 operations it serves.

Each handler takes the service state and the request body and returns the
response body; a :class:`ServiceError` becomes HTTP 400 ``{"__type", "message"}``.
Training sessions, the model package calls the SDK makes, and DescribeHubContent
for the one base model.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Callable

from local.training_session.registry import parse_group_arn
from local.training_session.state import ServiceState, Session
from local.training_session.tokenizer import BASE_MODEL_NAME
from local.training_session.wire import ServiceError, invalid

#: Account of model package groups created by name alone (CreateModelPackageGroup).
DEFAULT_ACCOUNT = "123456789012"
_HUB_ARN = re.compile(r"^arn:[\w-]+:sagemaker:[\w-]+:aws:hub-content/SageMakerPublicHub/Model/"
                      r"(?P<name>[^/]+)/(?P<version>[^/]+)$")
_SESSION_NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")


def base_model_arn(region: str = "us-west-2", version: str = "1.0.0") -> str:
    """The Hub ARN that selects the local base model."""
    return f"arn:aws:sagemaker:{region}:aws:hub-content/SageMakerPublicHub/Model/{BASE_MODEL_NAME}/{version}"


@dataclass(frozen=True)
class Request:
    """What a handler needs from an HTTP request."""

    body: dict[str, Any]
    region: str


def _session(state: ServiceState, req: Request) -> Session:
    name = req.body.get("TrainingSessionName")
    session = state.find(name) if isinstance(name, str) else None
    if session is None:
        raise ServiceError("ResourceNotFound", f"Training session {name!r} does not exist")
    return session


def _parse_base_model(arn: Any, region: str) -> tuple[str, str]:
    match = _HUB_ARN.match(arn) if isinstance(arn, str) else None
    if not match or match["name"] != BASE_MODEL_NAME:
        raise invalid(f"ModelConfig.BaseModelArn {arn!r} is not served here: the local training-session "
                      f"service serves only {BASE_MODEL_NAME!r}, e.g. {base_model_arn(region)} "
                      "(any version)")
    return match["name"], match["version"]


def create_training_session(state: ServiceState, req: Request) -> dict[str, Any]:
    body = req.body
    name = body.get("TrainingSessionName")
    if not isinstance(name, str) or not _SESSION_NAME.match(name):
        raise invalid(f"TrainingSessionName {name!r} must be 1-63 letters, digits and hyphens")
    base_model = _parse_base_model((body.get("ModelConfig") or {}).get("BaseModelArn"), req.region)
    group_arn = body.get("ModelPackageGroupArn")
    if not group_arn:
        raise invalid("ModelPackageGroupArn is required by the local service (it registers "
                      "saved weights there)")
    account = parse_group_arn(group_arn)["account"]
    output_path = ((body.get("OutputConfig") or {}).get("S3Location") or {}).get("Path")
    if not isinstance(output_path, str) or not output_path.startswith("s3://"):
        raise invalid(f"OutputConfig.S3Location.Path {output_path!r} must be an s3:// URI")
    session = state.create_session(
        name=name, region=req.region, account=account, group=state.registry.ensure_group(group_arn),
        base_model=base_model, output_path=output_path,
        request={k: v for k, v in body.items() if k != "TrainingSessionName"})
    return {"TrainingSessionArn": session.arn}


def describe_training_session(state: ServiceState, req: Request) -> dict[str, Any]:
    return {"TrainingSessionDetail": _session(state, req).detail()}


def stop_training_session(state: ServiceState, req: Request) -> dict[str, Any]:
    _session(state, req).stop()
    return {}


def delete_training_session(state: ServiceState, req: Request) -> dict[str, Any]:
    state.delete_session(_session(state, req))
    return {}


def _page(items: list[Any], req: Request, key: str) -> dict[str, Any]:
    """One page of ``items`` under ``key``, with NextToken as an offset."""
    token = req.body.get("NextToken") or "0"
    if not str(token).isdigit():
        raise invalid(f"NextToken {token!r} was not issued by this service")
    start = int(token)
    size = req.body.get("MaxResults") or 100
    page: dict[str, Any] = {key: items[start:start + size]}
    if start + size < len(items):
        page["NextToken"] = str(start + size)
    return page


def list_training_sessions(state: ServiceState, req: Request) -> dict[str, Any]:
    contains, status = req.body.get("NameContains"), req.body.get("StatusEquals")
    sessions = sorted(state.sessions(), key=lambda s: s.created, reverse=True)
    summaries = [s.summary() for s in sessions
                 if (not contains or contains in s.name) and (not status or s.status == status)]
    return _page(summaries, req, "TrainingSessionSummaries")


def describe_model_package(state: ServiceState, req: Request) -> dict[str, Any]:
    return state.registry.get(req.body.get("ModelPackageName")).describe()


def list_model_packages(state: ServiceState, req: Request) -> dict[str, Any]:
    body = req.body
    group = body.get("ModelPackageGroupName")
    if not group:
        raise invalid("ModelPackageGroupName is required by the local service")
    packages = state.registry.list(group)
    if body.get("SortBy") == "Name":
        packages.sort(key=lambda p: p.version)
    if body.get("SortOrder", "Ascending") == "Descending":
        packages.reverse()
    approval = body.get("ModelApprovalStatus")
    summaries = [p.summary() for p in packages if not approval or p.approval_status == approval]
    return _page(summaries, req, "ModelPackageSummaryList")


def update_model_package(state: ServiceState, req: Request) -> dict[str, Any]:
    package = state.registry.update_approval(
        req.body.get("ModelPackageArn"), req.body.get("ModelApprovalStatus"),
        req.body.get("ApprovalDescription"))
    return {"ModelPackageArn": package.arn}


def delete_model_package(state: ServiceState, req: Request) -> dict[str, Any]:
    state.registry.delete(req.body.get("ModelPackageName"))
    return {}


def create_model_package_group(state: ServiceState, req: Request) -> dict[str, Any]:
    group = state.registry.create_group(req.body.get("ModelPackageGroupName") or "", req.region,
                                        DEFAULT_ACCOUNT, req.body.get("ModelPackageGroupDescription") or "")
    return {"ModelPackageGroupArn": group.arn}


def describe_model_package_group(state: ServiceState, req: Request) -> dict[str, Any]:
    return state.registry.group(req.body.get("ModelPackageGroupName") or "").describe()


def describe_hub_content(state: ServiceState, req: Request) -> dict[str, Any]:
    name = req.body.get("HubContentName")
    if name != BASE_MODEL_NAME:
        raise ServiceError("ResourceNotFound", f"Hub content {name!r} does not exist; the local "
                           f"service's only model is {BASE_MODEL_NAME!r}")
    version = req.body.get("HubContentVersion") or "1.0.0"
    hub_arn = f"arn:aws:sagemaker:{req.region}:aws:hub/SageMakerPublicHub"
    return {
        "HubContentName": name, "HubContentArn": base_model_arn(req.region, version),
        "HubContentVersion": version, "HubContentType": "Model", "DocumentSchemaVersion": "2.0.0",
        "HubName": "SageMakerPublicHub", "HubArn": hub_arn, "HubContentStatus": "Available",
        "HubContentDisplayName": "Local toy arithmetic policy", "CreationTime": 0,
        # No Hugging Face tokenizer exists for it: use local.training_session.tokenizer.
        "HubContentDocument": json.dumps({"ModelName": name, "Tokenizer": "local.training_session.tokenizer.ToyTokenizer"}),
    }


CONTROL_PLANE: dict[str, Callable[[ServiceState, Request], dict[str, Any]]] = {
    "CreateTrainingSession": create_training_session,
    "DescribeTrainingSession": describe_training_session,
    "StopTrainingSession": stop_training_session,
    "DeleteTrainingSession": delete_training_session,
    "ListTrainingSessions": list_training_sessions,
    "DescribeModelPackage": describe_model_package,
    "ListModelPackages": list_model_packages,
    "UpdateModelPackage": update_model_package,
    "DeleteModelPackage": delete_model_package,
    "CreateModelPackageGroup": create_model_package_group,
    "DescribeModelPackageGroup": describe_model_package_group,
    "DescribeHubContent": describe_hub_content,
}
