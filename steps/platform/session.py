"""The SDK's ServiceClient, built from the session config.

Passing the model package group and the S3 output path keeps the SDK from
calling STS/S3 to invent defaults; a Hub ARN as base model keeps it from
listing the Hub. Locally the two SAGEMAKER_TRAINING_SESSION_* endpoint
variables point the same SDK at `python -m local.training_session`.
"""
from __future__ import annotations

from typing import Any

from steps.cli import Refused
from steps.config import SessionConfig


def service_client(cfg: SessionConfig) -> Any:
    from sagemaker.train.training_session import ServiceClient

    missing = [key for key in ("base_model", "role_arn") if not getattr(cfg, key)]
    if missing:
        raise Refused(
            f"session.{missing[0]} is not set: a training session needs its base model (a SageMaker Public Hub "
            "model ARN) and an IAM role ARN (see config/iam/README.md); set them in the config or pass "
            f"--set {missing[0]}=..."
        )
    return ServiceClient(
        region=cfg.region,
        role_arn=cfg.role_arn,
        model_package_group_arn=cfg.model_package_group_arn,
        s3_output_path=cfg.s3_output_path,
    )


def lora_kwargs(cfg: SessionConfig) -> dict[str, Any]:
    return {"base_model": cfg.base_model, "rank": cfg.lora_rank, "alpha": cfg.lora_alpha}
