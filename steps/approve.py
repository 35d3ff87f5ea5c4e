"""`python -m steps.approve`: write the evaluation onto the trained model package and approve it (idempotent).

The registry entry explains itself: ``CustomerMetadataProperties`` carry the figures
(``accuracy``, ``accuracy_lenient`` when evaluated, ``format_error_rate``, ``n``), how training
ended (``steps_completed``, ``stopped_early``), the ``base_model``, the ``pipeline_execution_arn``,
the ``accuracy_threshold`` and the MLflow run; the approval description says the same in a
sentence. ApproveModel runs it when CheckAccuracy holds. RecordRejection runs it with
``--reject`` on the other branch, before AccuracyTooLow fails the execution: the package then
carries the same figures, the status ``Rejected`` and why.

Whether a package may be approved is the pipeline's condition alone (pipeline/pipeline.py):
accuracy at or above the threshold *and* at least one optimizer step completed.

The model registry is reached through the same endpoint the training-session SDK registered the
package with (SAGEMAKER_TRAINING_SESSION_ENDPOINT when set, otherwise the Region's SageMaker
endpoint), so it updates the package the session wrote, not a namesake in another registry.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import Any, Sequence

from steps.cli import Refused, run_step
from steps.platform.artifacts import read_model_json

APPROVED, REJECTED = "Approved", "Rejected"
# What CustomerMetadataValue admits (botocore's pattern: letters, separators, numbers, _.:/=+-@), and its length.
_NOT_A_METADATA_CHARACTER = re.compile(r"[^\w .:/=+\-@]")
_METADATA_VALUE_MAX = 256
_DESCRIPTION_MAX = 1024


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m steps.approve", description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="model dir, model.tar.gz, or a dir holding it")
    p.add_argument("--evaluation", required=True, help="evaluation.json, or the directory holding it")
    p.add_argument("--execution-arn", help="the pipeline execution, recorded on the package")
    p.add_argument("--accuracy-threshold", type=float, help="the bar the accuracy was held to, recorded")
    p.add_argument("--reject", action="store_true",
                   help="record the figures and set the package Rejected instead of Approved")
    return p.parse_args(argv)


def read_evaluation(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    p = p / "evaluation.json" if p.is_dir() else p
    try:
        evaluation = json.loads(p.read_text(encoding="utf-8"))
        float(evaluation["metrics"]["accuracy"]["value"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise Refused(f"{p}: not an evaluation.json with metrics.accuracy.value ({exc})") from None
    return evaluation


def registry_client(region: str | None) -> Any:
    import boto3

    endpoint = os.environ.get("SAGEMAKER_TRAINING_SESSION_ENDPOINT") or None
    return boto3.client("sagemaker", region_name=region, endpoint_url=endpoint)


def _figure(evaluation: dict[str, Any], name: str) -> float | None:
    metric = evaluation.get("metrics", {}).get(name)
    return None if metric is None else float(metric["value"])


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.4f}"
    return _NOT_A_METADATA_CHARACTER.sub("_", str(value))[:_METADATA_VALUE_MAX]


def metadata(model: dict[str, Any], evaluation: dict[str, Any], execution_arn: str | None,
             threshold: float | None) -> dict[str, str]:
    """The package's CustomerMetadataProperties; a figure or fact that is not known is left out."""
    facts: dict[str, Any] = {name: _figure(evaluation, name) for name in evaluation.get("metrics", {})}
    mlflow = model.get("mlflow") or {}
    facts.update({
        "n": evaluation.get("n"),
        "accuracy_threshold": threshold,
        "steps_completed": model.get("steps_completed"),
        "stopped_early": model.get("stopped_early"),
        "base_model": model.get("base_model"),
        "pipeline_execution_arn": execution_arn,
        "mlflow_run_id": mlflow.get("run_id"),
        "mlflow_experiment": mlflow.get("experiment"),
    })
    return {key: _text(value) for key, value in facts.items() if value is not None and str(value) != ""}


def description(model: dict[str, Any], evaluation: dict[str, Any], threshold: float | None, reject: bool) -> str:
    """One sentence for the registry: the verdict, why (when rejected), the figures, how training ended."""
    accuracy, lenient = _figure(evaluation, "accuracy"), _figure(evaluation, "accuracy_lenient")
    steps = model.get("steps_completed")
    why = []
    if reject and not steps:
        why.append("no optimizer step completed, so these are the base weights")
    if reject and threshold is not None and accuracy < threshold:
        why.append(f"the accuracy is below the threshold {threshold:g}")
    figures = f"greedy accuracy {accuracy:.4f}" + (f" (lenient {lenient:.4f})" if lenient is not None else "")
    figures += f" on {evaluation.get('n', '?')} held-out questions"
    if threshold is not None:
        figures += f", threshold {threshold:g}"
    training = f"{steps} optimizer steps from {model.get('base_model')}"
    if model.get("stopped_early"):
        training += f"; training stopped early: {model.get('stop_reason') or 'see the TrainDAPO log'}"
    verdict = (REJECTED if reject else APPROVED) + " by the DAPO pipeline"
    return "; ".join([verdict + (": " + " and ".join(why) if why else ""), figures, training])[:_DESCRIPTION_MAX]


def record(client: Any, arn: str, status: str, properties: dict[str, str], text: str) -> str:
    """Set ``status`` with the figures; returns what happened. moto resets the description and the
    metadata when a request omits them, so both always go together. The registry keeps metadata keys
    it set itself (the training session's name), so ours need only be among them."""
    current = client.describe_model_package(ModelPackageName=arn)
    if (current.get("ModelApprovalStatus") == status
            and properties.items() <= (current.get("CustomerMetadataProperties") or {}).items()):
        return f"already {status.lower()}"
    client.update_model_package(ModelPackageArn=arn, ModelApprovalStatus=status, ApprovalDescription=text,
                                CustomerMetadataProperties=properties)
    return status.lower()


def run(args: argparse.Namespace) -> int:
    model = read_model_json(args.model)
    evaluation = read_evaluation(args.evaluation)
    region = (model.get("config", {}).get("session", {}) or {}).get("region")
    properties = metadata(model, evaluation, args.execution_arn, args.accuracy_threshold)
    status = REJECTED if args.reject else APPROVED
    text = description(model, evaluation, args.accuracy_threshold, args.reject)
    outcome = record(registry_client(region), model["model_package_arn"], status, properties, text)
    print(f"approve: {model['model_package_arn']} {outcome}: {text}", flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_step(lambda: run(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
