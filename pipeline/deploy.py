"""``python -m pipeline.deploy --config config/config.yaml``: create or update the pipeline.

Checks what it can before the upsert and fails with one line naming the fix: first what
needs no AWS (placeholders, the region, the base model), then the credentials, then the rest
of :mod:`pipeline.preflight` (the roles, the image, the data, the Public Hub). The definition
it sends is the one ``make pipeline-definition`` writes, built offline.
"""
from __future__ import annotations

import argparse
import json
from typing import Any, Sequence

import boto3

from pipeline import preflight
from pipeline.aws import aws_session, cli_main, console_url, existing_pipeline_arn, resolve_region
from pipeline.config import load
from pipeline.definition import build_definition, pipeline_description
from steps.config import PipelineConfig, RunConfig
from steps.platform.versions import require_training_session_sdk


def upsert(sm: Any, cfg: PipelineConfig, definition: str) -> tuple[str, str]:
    """CreatePipeline, or UpdatePipeline (and AddTags) if it exists; returns ("created"|"updated", ARN)."""
    args = dict(
        PipelineName=cfg.name,
        PipelineDefinition=definition,  # ~30 KB; the API takes up to 1 MB inline
        RoleArn=cfg.role_arn,
        PipelineDescription=pipeline_description(cfg),  # checked by build_definition
    )
    tags = [{"Key": k, "Value": v} for k, v in cfg.tags.items()]
    arn = existing_pipeline_arn(sm, cfg.name)
    if arn is None:
        return "created", sm.create_pipeline(**args, **({"Tags": tags} if tags else {}))["PipelineArn"]
    sm.update_pipeline(**args)
    if tags:
        sm.add_tags(ResourceArn=arn, Tags=tags)
    return "updated", arn


def deploy(cfg: PipelineConfig, run: RunConfig, session: boto3.Session, source: str) -> tuple[str, str]:
    """Preflight (``source`` names the config file), then upsert the offline-built definition."""
    preflight.before_deploy(session, run, source)
    definition = json.dumps(build_definition(cfg, run))
    return upsert(session.client("sagemaker"), cfg, definition)


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipeline.deploy", description=__doc__.split("\n")[0])
    p.add_argument("--config", required=True, help="YAML config with session/dapo/pipeline sections")
    args = p.parse_args(argv)

    require_training_session_sdk()
    cfg, run = load(args.config)
    # What needs no AWS is refused before the region, the credentials or any call: a placeholder first.
    preflight.check_placeholders(run, args.config)
    region = resolve_region(run.session.region, args.config)
    preflight.check_offline(run, args.config, region)
    action, arn = deploy(cfg, run, aws_session(region), args.config)
    print(f"{action} pipeline '{cfg.name}' in {region}: {arn}")
    print(f"console: {console_url(region, f'pipelines/{cfg.name}')}")
    print('start it with: make start-pipeline [PARAMS="BatchSize=64 MaxSteps=30"] [WAIT=1]')
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
