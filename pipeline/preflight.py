"""Preflight: what ``make deploy-pipeline`` and ``make start-pipeline`` check before anything is billed.

Each check refuses with one line naming the setting and the fix. First, offline:

- no ``<PLACEHOLDER>`` is left from the example config;
- ``session.base_model`` is set, is not the local service's toy model, is a SageMaker Public Hub
  model (ARN or Hub content name) in the configured region, and is one that training sessions
  serve there according to the installed SDK's list (``_TRAINABLE_MODELS_BY_REGION``).

Then with read-only calls:

- the pipeline role (and the training session's role) exists and its trust policy lets
  ``sagemaker.amazonaws.com`` assume it (``iam:GetRole``);
- the step image is in ECR (``ecr:DescribeImages``; other registries are not checked);
- each data prefix holds at least one data object, ``.jsonl``, ``.json``, ``.csv`` or ``.parquet`` (``s3:ListBucket``);
- the Public Hub of the region serves the base model for training sessions, by the SDK's own
  live scan (``sagemaker:ListHubContents`` + ``sagemaker:DescribeHubContent``).

A check the caller has no permission for (AccessDenied) prints a ``note:`` and the others go on.
``make start-pipeline`` repeats every check on the values the execution will use, overridden
parameters included (a role deleted or an image untagged since the deploy fails there too).

moto, which the tests run these checks against, does not implement the Public Hub calls: the
tests answer them through botocore's event hooks and let the SDK's scan run on those answers. So
only a real account shows that the live scan reads the real Hub.
"""
from __future__ import annotations

import re
import sys
from typing import Any, Callable, Collection, Iterator, Mapping, TypeVar

import boto3
from botocore.exceptions import ClientError

from pipeline.aws import UserError
from pipeline.config import find_placeholders
from steps.config import RunConfig
from steps.config.parameters import BY_NAME

#: The local training-session service's model (local/training_session): config/local.yaml only, never deployed.
TOY_MODEL = "local-toy-arith"
SAGEMAKER = "sagemaker.amazonaws.com"
DATA_PARAMETERS = ("TrainDataS3Uri", "EvalDataS3Uri")
_HUB_MODEL_ARN = re.compile(
    r"^arn:aws[a-z-]*:sagemaker:(?P<region>[a-z0-9-]+):aws:hub-content/SageMakerPublicHub/Model/"
    r"(?P<name>[^/\s]+)(?:/[^/\s]+)?$"
)
_ECR_IMAGE = re.compile(
    r"^\d{12}\.dkr\.ecr\.[a-z0-9-]+\.amazonaws\.com(?:\.cn)?/(?P<repo>[^:@]+)(?::(?P<tag>[^@]+))?(?:@(?P<digest>.+))?$"
)
_DENIED = ("AccessDenied", "AccessDeniedException")
T = TypeVar("T")


def before_deploy(session: boto3.Session, run: RunConfig, source: str) -> None:
    """Every check, offline ones first: nothing is sent for a config that cannot deploy."""
    check_all(session, run, source, overridden=())


def before_start(session: boto3.Session, run: RunConfig, source: str, overridden: Collection[str]) -> None:
    """The same checks on the values one execution runs with (``run``: the config with the overrides in place):
    a role deleted or an image untagged since the deploy, or an overridden ``ImageUri``, fails here too."""
    check_all(session, run, source, overridden)


def check_offline(run: RunConfig, source: str, region: str, overridden: Collection[str] = ()) -> str:
    """The checks that need no AWS (no credentials, no call): placeholders, then the base model; returns its Hub
    content name. ``make deploy-pipeline`` runs them before it looks for credentials."""
    check_placeholders(run, source)
    return check_base_model(run.session.base_model, region, label("BaseModel", overridden))


def check_all(session: boto3.Session, run: RunConfig, source: str, overridden: Collection[str]) -> None:
    """Offline checks first, then the read-only calls; a value set by a parameter is named as that parameter."""
    model = check_offline(run, source, session.region_name, overridden)
    roles = {"pipeline.role_arn": run.pipeline.role_arn}
    if run.session.role_arn and run.session.role_arn != run.pipeline.role_arn:
        roles["session.role_arn"] = run.session.role_arn  # the role the training session assumes
    for key, role_arn in roles.items():
        check_role(session, role_arn, f"'{key}'")
    check_image(session, run.pipeline.image_uri, label("ImageUri", overridden))
    for name in DATA_PARAMETERS:
        check_data(session, getattr(run.pipeline, BY_NAME[name].field), label(name, overridden))
    check_base_model_served(session, model, label("BaseModel", overridden))


def label(parameter: str, overridden: Collection[str] = ()) -> str:
    """How a message names a value: the pipeline parameter that overrode it, else its config key."""
    return f"parameter {parameter}" if parameter in overridden else f"'{BY_NAME[parameter].key}'"


# -- offline -------------------------------------------------------------------------------


def check_placeholders(run: RunConfig, source: str) -> None:
    """Refuse a config that still holds values from the example file."""
    left = find_placeholders(run)
    if left:
        keys = ", ".join(repr(k) for k in left)
        raise UserError(f"{source}: fill in {keys} (still <PLACEHOLDER> values from the example)")


def served_by_region() -> dict[str, frozenset[str]] | None:
    """Hub content names training sessions serve, by region, as the installed SDK lists them (no call).

    A private table of sagemaker-train 1.27 that the SDK means to drop once the Public Hub publishes
    the training-session capability; without it only the live scan (:func:`check_base_model_served`) decides.
    """
    from sagemaker.train.training_session import _utils

    return getattr(_utils, "_TRAINABLE_MODELS_BY_REGION", None)


def hub_content_name(base_model: str, region: str, setting: str) -> str:
    """The Hub content name a base model ARN (in ``region``) or name selects."""
    if base_model.startswith("arn:"):
        m = _HUB_MODEL_ARN.match(base_model)
        if not m:
            raise UserError(f"{setting}: {base_model} is not a SageMaker Public Hub model ARN "
                            "(arn:aws:sagemaker:<region>:aws:hub-content/SageMakerPublicHub/Model/<name>/<version>)")
        if m["region"] != region:
            raise UserError(f"{setting}: {base_model} is in {m['region']}, the pipeline runs in {region}; "
                            f"use the model's {region} ARN (or set 'session.region' to {m['region']})")
        return m["name"]
    if "/" in base_model:  # a provider/model id, which only a Hub scan can map to a Hub model
        raise UserError(f"{setting}: {base_model} is a model id; name the SageMaker Public Hub model instead "
                        "(its ARN, see config/default.yaml)")
    return base_model


def check_base_model(base_model: str | None, region: str, setting: str) -> str:
    """Named, not the toy, in the region, served for training sessions there; returns its Hub content name."""
    by_region = served_by_region()
    served = None if by_region is None else by_region.get(region, frozenset())
    if served is not None and not served:
        raise UserError(f"'session.region': training sessions serve no base model in {region}; "
                        f"use one of {', '.join(sorted(by_region))}")
    choose = f"training sessions serve {', '.join(sorted(served))} in {region}" if served else \
        "see config/default.yaml for the served models"
    if not base_model:
        raise UserError(f"{setting} is not set: name the SageMaker Public Hub model to fine-tune "
                        f"(its ARN, see config/default.yaml); {choose}")
    name = hub_content_name(base_model, region, setting)
    if name == TOY_MODEL:
        raise UserError(f"{setting}: {TOY_MODEL} is the local training-session service's toy model "
                        f"(config/local.yaml only); {choose}")
    if served is not None and name not in served:
        raise UserError(f"{setting}: training sessions do not serve {name} in {region}; {choose}")
    return name


# -- read-only calls -----------------------------------------------------------------------


def _code(exc: ClientError) -> str:
    return exc.response.get("Error", {}).get("Code", "")


def _note_if_denied(exc: ClientError, what: str, permission: str) -> None:
    """A check the caller may not run is skipped with a note; any other error propagates."""
    if _code(exc) not in _DENIED:
        raise exc
    print(f"note: cannot check {what} (no {permission} permission)", file=sys.stderr)


def trusts_sagemaker(trust_policy: dict[str, Any]) -> bool:
    """Whether a role's trust policy allows ``sagemaker.amazonaws.com`` to ``sts:AssumeRole``."""
    def as_list(value: Any) -> list[Any]:
        return value if isinstance(value, list) else [value]

    for statement in as_list(trust_policy.get("Statement", [])):
        principal = statement.get("Principal", {})
        services = as_list(principal.get("Service", [])) if isinstance(principal, dict) else []
        actions = as_list(statement.get("Action", []))
        if statement.get("Effect") == "Allow" and SAGEMAKER in services and \
                any(a in ("sts:AssumeRole", "sts:*", "*") for a in actions):
            return True
    return False


def _read(call: Callable[[], T], absent: Mapping[str, str], what: str, permission: str) -> T | None:
    """The read's answer; a refusal when its error code says the thing is absent (``absent`` maps code ->
    message); None, with a note, when the caller may not read it."""
    try:
        return call()
    except ClientError as exc:
        if _code(exc) in absent:
            raise UserError(absent[_code(exc)]) from None
        _note_if_denied(exc, what, permission)
        return None


def check_role(session: boto3.Session, role_arn: str, setting: str) -> None:
    name = role_arn.rsplit("/", 1)[-1]
    missing = f"{setting}: role {role_arn} does not exist; create it as described in config/iam/README.md"
    role = _read(lambda: session.client("iam").get_role(RoleName=name)["Role"], {"NoSuchEntity": missing},
                 f"that {role_arn} exists", "iam:GetRole")
    # botocore decodes the URL-encoded AssumeRolePolicyDocument into a dict.
    if role is not None and not trusts_sagemaker(role["AssumeRolePolicyDocument"]):
        raise UserError(
            f"{setting}: role {role_arn} does not let {SAGEMAKER} assume it; give it config/iam/trust-policy.json "
            f"(aws iam update-assume-role-policy --role-name {name} "
            "--policy-document file://build/iam/trust-policy.json)"
        )


def check_image(session: boto3.Session, image_uri: str, setting: str = "'pipeline.image_uri'") -> None:
    """An ECR image must exist before an execution pulls it; other registries are not checked."""
    m = _ECR_IMAGE.match(image_uri)
    if not m:
        return
    image_id = {"imageDigest": m["digest"]} if m["digest"] else {"imageTag": m["tag"] or "latest"}
    absent = {code: f"{setting}: {image_uri} is not in ECR ({code}); run 'make push-image'"
              for code in ("RepositoryNotFoundException", "ImageNotFoundException")}
    _read(lambda: session.client("ecr").describe_images(repositoryName=m["repo"], imageIds=[image_id]), absent,
          f"that {image_uri} exists", "ecr:DescribeImages")


def _keys(s3: Any, bucket: str, prefix: str) -> Iterator[str]:
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        yield from (obj["Key"] for obj in page.get("Contents", []))


def check_data(session: boto3.Session, uri: str, setting: str) -> None:
    """At least one data object (``.jsonl``, ``.json``, ``.csv``, ``.parquet``: steps/tasks/reader.py) under the
    prefix (the first page that has one ends the listing)."""
    bucket, _, prefix = uri[len("s3://"):].partition("/")
    absent = {"NoSuchBucket": f"{setting}: bucket {bucket} of {uri} does not exist; create it and run 'make data'"}
    from steps.tasks.reader import READERS  # the formats ValidateData reads

    found = _read(lambda: any(key.lower().endswith(tuple(READERS)) for key in _keys(session.client("s3"), bucket,
                                                                                  prefix)),
                  absent, f"the data under {uri}", "s3:ListBucket")
    if found is False:
        raise UserError(f"{setting}: no data object ({', '.join(READERS)}) under {uri}; upload your data there with "
                        "'make data'")


def served_base_models(session: boto3.Session) -> frozenset[str]:
    """Hub content names the region's Public Hub serves for training sessions: the SDK's own live scan
    (what ``ServiceClient.list_base_models()`` reads, keyed by Hub content name rather than model id)."""
    from sagemaker.train.training_session._utils import _hub_model_index

    return frozenset(_hub_model_index(session.client("sagemaker"), refresh=True).values())


def check_base_model_served(session: boto3.Session, name: str, setting: str) -> None:
    """The live counterpart of :func:`check_base_model`: the region's Hub, not the SDK's list, decides."""
    region = session.region_name
    try:
        served = served_base_models(session)
    except ClientError as exc:
        _note_if_denied(exc, f"that the Public Hub in {region} serves {name}", "sagemaker:ListHubContents")
        return
    if name not in served:
        listed = ", ".join(sorted(served)) or "none"
        raise UserError(f"{setting}: the SageMaker Public Hub in {region} does not serve {name} for training "
                        f"sessions (it serves: {listed}); pick one of those")
