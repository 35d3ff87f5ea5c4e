"""``python -m pipeline.start --config X [--param Name=Value ...] [--wait]``: start an execution.

Overrides are checked against the *deployed* pipeline's parameters (name and
type) and against the config's ranges, and :mod:`pipeline.preflight` checks the
role, the image, the base model and the data prefixes the execution will use, before
anything starts: a typo, ``BatchSize=0`` or an empty prefix fails here and not an hour
into a run.
"""
from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
import textwrap
import time
from typing import Any, Callable, Iterable, Sequence

import boto3
from botocore.exceptions import ClientError

from pipeline import budget, expressions, preflight
from pipeline.aws import UserError, aws_session, cli_main, console_url, existing_pipeline_arn, resolve_region
from pipeline.config import load
from steps.cli import parameter, parse_pairs
from steps.config import RunConfig, config_from_dict, load_yaml
from steps.config.parameters import BY_NAME, overridden
from steps.platform.versions import require_training_session_sdk

TERMINAL = ("Succeeded", "Failed", "Stopped")


def check_params(params: dict[str, str], declared: dict[str, str], config_path: str) -> RunConfig:
    """Names and types from the deployed definition, ranges from the config models; returns the
    config the execution runs with (the file with the overrides in place)."""
    typed: dict[str, Any] = {}
    for name, value in params.items():
        if name not in declared:
            # A short first line; the full list wrapped on the lines after it (16 names: some 200 characters).
            listed = textwrap.wrap(f"the pipeline has: {', '.join(declared)}", width=96, initial_indent="  ",
                                   subsequent_indent="    ", break_long_words=False, break_on_hyphens=False)
            raise UserError("\n".join([f"unknown pipeline parameter '{name}'{did_you_mean(name, declared)}",
                                        *listed]))
        try:  # as the service types it (a Boolean is true or false, not 1 or 0)
            typed[name] = expressions.typed(name, declared[name], value)
        except expressions.ExpressionError as exc:
            raise UserError(f"{exc} ({parameter(name)})") from None
    # Errors name the file, and the parameters only when there are some (not "config + parameters : ...").
    given = " ".join(f"{n}={v}" for n, v in params.items())
    source = f"{config_path} + parameters {given}" if given else config_path
    return config_from_dict(overridden(load_yaml(config_path), typed), source=source)


#: A train prefix holding one .jsonl object up to this size is counted before an execution starts (GSM8K's train
#: split is some 4 MB); several objects or a bigger one are left to ValidateData, which refuses before any session.
COUNT_MAX_BYTES = 64 * 1024 * 1024


def check_batch_size(s3: Any, uri: str, batch_size: int) -> str | None:
    """A BatchSize larger than the train split is refused here when counting it is cheap (one small object: its
    non-empty lines, an upper bound of ValidateData's usable rows); otherwise the returned line says that
    ValidateData refuses it, before any training session starts. None: counted, and it fits."""
    bucket, _, prefix = uri[len("s3://"):].partition("/")
    later = "ValidateData refuses a BatchSize larger than its usable rows, before any training session starts"
    try:
        found = [obj for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
                 for obj in page.get("Contents", []) if obj["Key"].endswith(".jsonl")]
        if len(found) != 1 or found[0]["Size"] > COUNT_MAX_BYTES:
            return (f"BatchSize {batch_size}: the train rows under {uri} are not counted here ({len(found)} "
                    f"objects); {later}")
        body = s3.get_object(Bucket=bucket, Key=found[0]["Key"])["Body"]
        rows = sum(1 for line in body.iter_lines() if line.strip())
    except ClientError as exc:
        return f"BatchSize {batch_size}: {uri} could not be read here ({exc.response['Error']['Code']}); {later}"
    if batch_size > rows:
        raise UserError(f"BatchSize {batch_size} is larger than the train data: s3://{bucket}/{found[0]['Key']} has "
                        f"{rows} rows; lower it ({parameter('BatchSize', 'N')}) or upload more data")
    return None


def did_you_mean(name: str, names: Iterable[str]) -> str:
    """``"; did you mean BatchSize?"`` for ``batchsize``: the closest name, case aside; else ""."""
    by_lower = {n.lower(): n for n in names}
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=1, cutoff=0.6)
    return f"; did you mean {by_lower[close[0]]}?" if close else ""


def deployed_parameters(sm: Any, name: str, region: str) -> dict[str, str]:
    """Name -> type ("Integer", "Float", "String", ...) of the deployed pipeline's parameters."""
    if existing_pipeline_arn(sm, name) is None:
        raise UserError(f"pipeline '{name}' is not deployed in {region}; run 'make deploy-pipeline' first")
    definition = json.loads(sm.describe_pipeline(PipelineName=name)["PipelineDefinition"])
    return {p["Name"]: p["Type"] for p in definition.get("Parameters", [])}


def check_experiment(sm: Any, name: str, experiment: str) -> None:
    """An execution's MLflow experiment needs a pipeline that tracks to MLflow, and a name MLflow on SageMaker takes."""
    if not re.fullmatch(r"[a-zA-Z0-9\-_./]{1,256}", experiment):
        raise UserError(f"EXPERIMENT={experiment!r}: an MLflow experiment name is 1-256 letters, digits and -_./")
    definition = json.loads(sm.describe_pipeline(PipelineName=name)["PipelineDefinition"])
    if not definition.get("MlflowConfig"):
        raise UserError(f"EXPERIMENT={experiment}: pipeline '{name}' does not track to MLflow; set "
                        "pipeline.mlflow_tracking_arn in the config and run 'make deploy-pipeline' first")


def start(session: boto3.Session, name: str, region: str, params: dict[str, str], config_path: str,
          experiment: str | None = None) -> str:
    """Check the overrides and what the execution reads, start it and return its ARN. ``experiment`` is
    the execution's MLflow experiment (StartPipelineExecution's MlflowExperimentName), which TrainDAPO logs to."""
    sm = session.client("sagemaker")
    run = check_params(params, deployed_parameters(sm, name, region), config_path)
    if experiment:
        check_experiment(sm, name, experiment)
    preflight.before_start(session, run, config_path, params)
    note = check_batch_size(session.client("s3"), getattr(run.pipeline, BY_NAME["TrainDataS3Uri"].field),
                            run.dapo.batch_size)
    if note:
        print(note, flush=True)
    # What the execution may bill, before it can.
    print(budget.describe(run.dapo, prices=run.session.prices, base_model=run.session.base_model), flush=True)
    # The config's form of a data prefix ends with '/': s3://b/data/train would also read s3://b/data/train-old/.
    data = {n: getattr(run.pipeline, BY_NAME[n].field) for n in preflight.DATA_PARAMETERS if n in params}
    params = {**params, **data}
    response = sm.start_pipeline_execution(
        PipelineName=name,
        PipelineParameters=[{"Name": n, "Value": v} for n, v in params.items()],
        **({"MlflowExperimentName": experiment} if experiment else {}),
    )
    return response["PipelineExecutionArn"]


def _step_line(step: dict[str, Any]) -> str:
    line = f"  {step['StepName']}: {step.get('StepStatus', '?')}"
    if step.get("AttemptCount", 1) > 1:
        line += f" (attempt {step['AttemptCount']})"
    if step.get("FailureReason"):
        line += f" - {step['FailureReason']}"
    return line


def wait_for_execution(
    arn: str,
    describe: Callable[[str], dict[str, Any]],
    list_steps: Callable[[str], list[dict[str, Any]]],
    *,
    poll_seconds: float = 30,
    sleep: Callable[[float], None] = time.sleep,
    out: Callable[[str], None] = print,
) -> str:
    """Print each step's status when it changes until the execution ends; return its final status."""
    shown: dict[str, str] = {}
    while True:
        execution = describe(arn)  # read first: the steps listed after it are at least as recent
        for step in reversed(list_steps(arn)):  # the API lists the newest step first
            line = _step_line(step)
            if shown.get(step["StepName"]) != line:
                shown[step["StepName"]] = line
                out(line)
        status = execution["PipelineExecutionStatus"]
        if status in TERMINAL:
            reason = f": {execution['FailureReason']}" if execution.get("FailureReason") else ""
            out(f"execution {status}{reason}")
            return status
        sleep(poll_seconds)


def _list_steps(sm: Any) -> Callable[[str], list[dict[str, Any]]]:
    def list_steps(arn: str) -> list[dict[str, Any]]:
        pages = sm.get_paginator("list_pipeline_execution_steps").paginate(PipelineExecutionArn=arn)
        return [step for page in pages for step in page["PipelineExecutionSteps"]]

    return list_steps


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipeline.start", description=__doc__.split("\n")[0])
    p.add_argument("--config", required=True, help="YAML config with session/dapo/pipeline sections")
    p.add_argument("--param", action="append", default=[], metavar="Name=Value",
                   help="override a pipeline parameter (repeatable)")
    p.add_argument("--mlflow-experiment", metavar="NAME",
                   help="the execution's MLflow experiment (the pipeline must track to MLflow)")
    p.add_argument("--wait", action="store_true", help="poll and print each step's status until the execution ends")
    p.add_argument("--poll-seconds", type=float, default=30.0)
    args = p.parse_args(argv)

    require_training_session_sdk()
    cfg, run = load(args.config)
    params = parse_pairs(args.param, "--param", example="BatchSize=64")
    region = resolve_region(run.session.region, args.config)
    session = aws_session(region)
    arn = start(session, cfg.name, region, params, args.config, args.mlflow_experiment)
    return follow(session, cfg.name, region, arn, args.wait, args.poll_seconds)


def follow(session: Any, pipeline_name: str, region: str, arn: str, wait: bool, poll_seconds: float) -> int:
    """Print a started execution's ARN and console link; with ``wait``, each step's status until it ends (exit 0
    only if it succeeded). make start-pipeline and make reevaluate both end here."""
    print(f"started {arn}")
    execution_id = arn.rsplit("/", 1)[-1]
    print(f"console: {console_url(region, f'pipelines/{pipeline_name}/executions/{execution_id}')}")
    if not wait:
        return 0
    sm = session.client("sagemaker")
    status = wait_for_execution(arn, lambda a: sm.describe_pipeline_execution(PipelineExecutionArn=a),
                                _list_steps(sm), poll_seconds=poll_seconds)
    return 0 if status == "Succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())
