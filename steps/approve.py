"""`python -m steps.approve`: approve the trained model package (idempotent).

The model registry is reached through the same endpoint the training-session
SDK registered the package with (SAGEMAKER_TRAINING_SESSION_ENDPOINT when set,
otherwise the Region's SageMaker endpoint), so it updates the package the
session wrote, not a namesake in another registry.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from steps.cli import Refused, run_step
from steps.platform.artifacts import read_model_json

APPROVED = "Approved"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m steps.approve", description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="model dir, model.tar.gz, or a dir holding it")
    p.add_argument("--evaluation", required=True, help="evaluation.json, or the directory holding it")
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


def approve(client: Any, arn: str, evaluation: dict[str, Any]) -> str:
    """Set the package Approved; returns what happened ("approved" or "already approved")."""
    current = client.describe_model_package(ModelPackageName=arn).get("ModelApprovalStatus")
    if current == APPROVED:
        return "already approved"
    accuracy = float(evaluation["metrics"]["accuracy"]["value"])
    n = evaluation.get("n", "?")
    description = f"DAPO pipeline: greedy accuracy {accuracy:.4f} on {n} held-out GSM8K questions"
    client.update_model_package(ModelPackageArn=arn, ModelApprovalStatus=APPROVED, ApprovalDescription=description)
    return "approved"


def main(argv: Sequence[str] | None = None) -> int:
    return run_step(lambda: run(parse_args(argv)))


def run(args: argparse.Namespace) -> int:
    model = read_model_json(args.model)
    evaluation = read_evaluation(args.evaluation)
    region = (model.get("config", {}).get("session", {}) or {}).get("region")
    outcome = approve(registry_client(region), model["model_package_arn"], evaluation)
    print(f"approve: {model['model_package_arn']} {outcome}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
