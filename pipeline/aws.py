"""What the deploy/start/data commands share: region, credentials, and user-facing errors."""
from __future__ import annotations

import functools
import os
import sys
from typing import Any, Callable

import boto3
from botocore.exceptions import BotoCoreError, ClientError

from steps.cli import Refused


class UserError(Refused):
    """A problem the user fixes (config, credentials, missing resource); printed without a traceback."""


def resolve_region(configured: str | None, source: str) -> str:
    """The config's ``session.region``, else the AWS CLI's usual environment/profile lookup."""
    region = configured or boto3.Session().region_name
    if not region:
        raise UserError(
            f"no AWS region: set 'session.region' in {source}, or export AWS_REGION (or AWS_DEFAULT_REGION)"
        )
    # The SageMaker SDK creates a boto3 client while it is imported, which
    # fails without a default region; make the chosen region that default.
    if not os.environ.get("AWS_DEFAULT_REGION"):
        os.environ["AWS_DEFAULT_REGION"] = region
    return region


def aws_session(region: str) -> boto3.Session:
    """A boto3 session for ``region`` that has credentials, checked before any request."""
    session = boto3.Session(region_name=region)
    if session.get_credentials() is None:
        raise UserError(
            "no AWS credentials found: run 'aws configure' or 'aws sso login', "
            "or export AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (or AWS_PROFILE)"
        )
    return session


def existing_pipeline_arn(sm: Any, name: str) -> str | None:
    """The ARN of the pipeline called ``name``, or None if there is none."""
    # Listing is unambiguous; a failed DescribePipeline says "not found" with
    # different error codes in AWS and in moto.
    for page in sm.get_paginator("list_pipelines").paginate(PipelineNamePrefix=name):
        for summary in page["PipelineSummaries"]:
            if summary["PipelineName"] == name:
                return summary["PipelineArn"]
    return None


def console_url(region: str, path: str) -> str:
    return f"https://{region}.console.aws.amazon.com/sagemaker/home?region={region}#/{path}"


def cli_main(main: Callable[..., int]) -> Callable[..., int]:
    """Turn user errors into one ``error:`` line on stderr and a non-zero exit code."""

    @functools.wraps(main)
    def wrapper(*args, **kwargs) -> int:
        try:
            return main(*args, **kwargs)
        except Refused as exc:  # UserError, ConfigError, a malformed --param ...
            message = str(exc)
        except ClientError as exc:
            err = exc.response.get("Error", {})
            message = f"AWS refused {exc.operation_name}: {err.get('Code')}: {err.get('Message')}"
        except BotoCoreError as exc:  # no credentials, endpoint unreachable, ...
            message = f"AWS call failed: {exc}"
        sys.stderr.write(f"error: {message}\n")
        return 2

    return wrapper
