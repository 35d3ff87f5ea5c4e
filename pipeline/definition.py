"""``python -m pipeline.definition --config X --out build/pipeline.json``: the definition, offline.

Builds exactly what ``make deploy-pipeline`` would send to CreatePipeline, with
no AWS call at all: the boto3 session has throwaway credentials and refuses to
send any request, the SDK gets its default bucket and role ARN handed to it,
and telemetry and role validation are off.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any, Sequence

import boto3

from pipeline.aws import UserError, cli_main
from pipeline.checks import check_pipeline_description, problems
from pipeline.config import load
from steps.config import PipelineConfig, RunConfig
from steps.config.parameters import PARAMETERS
from steps.platform import files
from steps.platform.versions import require_training_session_sdk

# Any region works offline: nothing in the definition depends on it.
OFFLINE_REGION = "us-east-1"


class OfflineViolation(RuntimeError):
    """Something tried to reach AWS while building the definition offline."""


def _refuse(request: Any, **_: Any) -> None:
    raise OfflineViolation(f"building the definition must not call AWS, but it sent {request.method} {request.url}")


def offline_boto_session(region: str) -> boto3.Session:
    """A session with dummy credentials whose every request fails before it leaves the process."""
    session = boto3.Session(aws_access_key_id="offline", aws_secret_access_key="offline", region_name=region)
    session.events.register("before-send", _refuse)
    return session


def _prepare_offline_env(region: str) -> None:
    # The SDK creates a boto3 client at import time: give it a region, and keep
    # the credential chain from probing the EC2 metadata endpoint.
    if not os.environ.get("AWS_DEFAULT_REGION"):
        os.environ["AWS_DEFAULT_REGION"] = region
    os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
    # Role validation would call iam:SimulatePrincipalPolicy.
    os.environ["SAGEMAKER_VALIDATE_ROLE"] = "false"


def pipeline_description(cfg: PipelineConfig) -> str:
    """CreatePipeline's PipelineDescription: the config's pipeline.description, the steps, and what each
    parameter means (the one table, steps/config/parameters.py), so the console explains a run's settings."""
    meanings = "; ".join(f"{p.name}: {p.meaning}" for p in PARAMETERS)
    return (f"{cfg.description.rstrip('. ')}. ValidateData -> TrainDAPO -> EvaluateModel -> CheckAccuracy -> "
            f"ApproveModel, or RecordRejection and AccuracyTooLow. Parameters: {meanings}.")


def build_definition(cfg: PipelineConfig, run: RunConfig) -> dict[str, Any]:
    """The pipeline definition as a dict, built without touching AWS; refused if SageMaker would refuse it."""
    # The description goes beside the definition (CreatePipeline's PipelineDescription): refused before the build.
    if found := check_pipeline_description(pipeline_description(cfg)):
        raise UserError("SageMaker would refuse this pipeline's description:\n  " + "\n  ".join(found))
    region = run.session.region or OFFLINE_REGION
    _prepare_offline_env(region)
    from pipeline.pipeline import get_pipeline, make_session  # needs the region set above

    session = make_session(region, cfg.default_bucket, offline_boto_session(region))
    definition = json.loads(get_pipeline(cfg, run, session=session).definition())
    if found := problems(definition):  # see pipeline/checks.py: what SageMaker checks, checked offline
        raise UserError("SageMaker would refuse this pipeline definition:\n  " + "\n  ".join(found))
    return definition


def write_definition(config: str | Path, out: str | Path) -> Path:
    """Load ``config``, build its definition offline and write it to ``out`` (pretty JSON); returns the path."""
    cfg, run = load(config)
    definition = build_definition(cfg, run)
    return files.write_json(out, definition, indent=2)


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipeline.definition", description=__doc__.split("\n")[0])
    p.add_argument("--config", required=True, help="YAML config with session/dapo/pipeline sections")
    p.add_argument("--out", default="build/pipeline.json", help="where to write the definition JSON")
    args = p.parse_args(argv)

    require_training_session_sdk()
    out = write_definition(args.config, args.out)
    print(f"wrote {out} from {args.config}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
