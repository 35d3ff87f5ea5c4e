"""``python -m pipeline.deploy --config config/config.yaml``: create or update the pipeline.

Checks what it can before the upsert and fails with one line naming the fix:
unfilled ``<PLACEHOLDER>`` values, no region, no credentials, a role that does
not exist, an image that is not in ECR. The definition it sends is the one
``make pipeline-definition`` writes, built offline; only the calls below reach AWS.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any, Sequence

import boto3
from botocore.exceptions import ClientError

from pipeline.aws import UserError, aws_session, cli_main, console_url, existing_pipeline_arn, resolve_region
from pipeline.config import find_placeholders, load
from pipeline.definition import build_definition
from steps.config import PipelineConfig, RunConfig
from steps.platform.versions import require_training_session_sdk

_ECR_IMAGE = re.compile(
    r"^\d{12}\.dkr\.ecr\.[a-z0-9-]+\.amazonaws\.com(?:\.cn)?/(?P<repo>[^:@]+)(?::(?P<tag>[^@]+))?(?:@(?P<digest>.+))?$"
)


def check_ready(run: RunConfig, source: str) -> None:
    """Refuse a config that still holds values from the example file."""
    left = find_placeholders(run)
    if left:
        raise UserError(f"{source}: fill in {', '.join(repr(k) for k in left)} (still <PLACEHOLDER> values from the example)")


def check_role(session: boto3.Session, role_arn: str) -> None:
    try:
        session.client("iam").get_role(RoleName=role_arn.rsplit("/", 1)[-1])
    except ClientError as exc:
        code = exc.response["Error"]["Code"]
        if code == "NoSuchEntity":
            raise UserError(
                f"'pipeline.role_arn': role {role_arn} does not exist; create it as described in config/iam/README.md"
            ) from None
        if code != "AccessDenied":
            raise
        print(f"note: cannot check that {role_arn} exists (no iam:GetRole permission)", file=sys.stderr)


def check_image(session: boto3.Session, image_uri: str) -> None:
    """An ECR image must exist before an execution pulls it; other registries are not checked."""
    m = _ECR_IMAGE.match(image_uri)
    if not m:
        return
    image_id = {"imageDigest": m["digest"]} if m["digest"] else {"imageTag": m["tag"] or "latest"}
    try:
        session.client("ecr").describe_images(repositoryName=m["repo"], imageIds=[image_id])
    except ClientError as exc:
        code = exc.response["Error"]["Code"]
        if code in ("RepositoryNotFoundException", "ImageNotFoundException"):
            raise UserError(f"'pipeline.image_uri': {image_uri} is not in ECR ({code}); run 'make push-image'") from None
        if code != "AccessDeniedException":
            raise
        print(f"note: cannot check that {image_uri} exists (no ecr:DescribeImages permission)", file=sys.stderr)


def upsert(sm: Any, cfg: PipelineConfig, definition: str) -> tuple[str, str]:
    """CreatePipeline, or UpdatePipeline (and AddTags) if it exists; returns ("created"|"updated", ARN)."""
    args = dict(
        PipelineName=cfg.name,
        PipelineDefinition=definition,  # ~30 KB; the API takes up to 1 MB inline
        RoleArn=cfg.role_arn,
        PipelineDescription=cfg.description,
    )
    tags = [{"Key": k, "Value": v} for k, v in cfg.tags.items()]
    arn = existing_pipeline_arn(sm, cfg.name)
    if arn is None:
        return "created", sm.create_pipeline(**args, **({"Tags": tags} if tags else {}))["PipelineArn"]
    sm.update_pipeline(**args)
    if tags:
        sm.add_tags(ResourceArn=arn, Tags=tags)
    return "updated", arn


def deploy(cfg: PipelineConfig, run: RunConfig, session: boto3.Session) -> tuple[str, str]:
    """Check the role and the image, then upsert the offline-built definition."""
    check_role(session, cfg.role_arn)
    check_image(session, cfg.image_uri)
    definition = json.dumps(build_definition(cfg, run))
    return upsert(session.client("sagemaker"), cfg, definition)


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipeline.deploy", description=__doc__.split("\n")[0])
    p.add_argument("--config", required=True, help="YAML config with session/dapo/pipeline sections")
    args = p.parse_args(argv)

    require_training_session_sdk()
    cfg, run = load(args.config)
    check_ready(run, args.config)
    region = resolve_region(run.session.region, args.config)
    action, arn = deploy(cfg, run, aws_session(region))
    print(f"{action} pipeline '{cfg.name}' in {region}: {arn}")
    print(f"console: {console_url(region, f'pipelines/{cfg.name}')}")
    print('start it with: make start-pipeline [PARAMS="BatchSize=64 MaxSteps=30"] [WAIT=1]')
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
