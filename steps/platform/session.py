"""The SDK's ServiceClient, built from the session config and the job's network and key.

Passing the model package group and the S3 output path keeps the SDK from
calling STS/S3 to invent defaults; a Hub ARN as base model keeps it from
listing the Hub. Locally the two SAGEMAKER_TRAINING_SESSION_* endpoint
variables point the same SDK at `python -m local.training_session`.

With ``pipeline.vpc`` and ``pipeline.kms_key_arn`` set, the pipeline hands the
jobs that create training sessions (TrainDAPO, EvaluateModel) the subnets,
security groups and key in ``DAPO_SESSION_*`` variables: every session they
create runs in that VPC and encrypts what it writes to S3 with that key (the
ServiceClient's ``vpc_config`` and ``kms_key_arn``).
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Mapping

from steps.cli import Refused
from steps.config import SessionConfig

log = logging.getLogger("steps.session")

ENV_SUBNETS = "DAPO_SESSION_SUBNETS"
ENV_SECURITY_GROUPS = "DAPO_SESSION_SECURITY_GROUP_IDS"
ENV_KMS_KEY = "DAPO_SESSION_KMS_KEY_ARN"


@dataclass(frozen=True)
class SessionNetwork:
    """Where a training session runs and the key it encrypts its S3 output with; empty: the service's own."""

    subnets: tuple[str, ...] = ()
    security_group_ids: tuple[str, ...] = ()
    kms_key_arn: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> SessionNetwork:
        def split(name: str) -> tuple[str, ...]:
            return tuple(v for v in env.get(name, "").split(",") if v)

        subnets, groups = split(ENV_SUBNETS), split(ENV_SECURITY_GROUPS)
        if bool(subnets) != bool(groups):
            raise Refused(f"{ENV_SUBNETS}={','.join(subnets)!r} and {ENV_SECURITY_GROUPS}={','.join(groups)!r}: "
                          "a VPC needs both (pipeline.vpc sets both)")
        return cls(subnets, groups, env.get(ENV_KMS_KEY) or None)

    def environment(self) -> dict[str, str]:
        """The job environment :meth:`from_env` reads back; empty when nothing is set."""
        env = {ENV_SUBNETS: ",".join(self.subnets), ENV_SECURITY_GROUPS: ",".join(self.security_group_ids),
               ENV_KMS_KEY: self.kms_key_arn or ""}
        return {k: v for k, v in env.items() if v}

    def client_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {}
        if self.subnets:
            kwargs["vpc_config"] = {"subnets": list(self.subnets), "security_group_ids": list(self.security_group_ids)}
        if self.kms_key_arn:
            kwargs["kms_key_arn"] = self.kms_key_arn
        return kwargs


def service_client(cfg: SessionConfig) -> Any:
    """The ServiceClient of the config; its sessions get the job's :class:`SessionNetwork`, and its calls fail
    within seconds once the service stops answering (steps/platform/failfast.py)."""
    from sagemaker.train.training_session import ServiceClient

    from steps.platform.failfast import fail_fast

    missing = [key for key in ("base_model", "role_arn") if not getattr(cfg, key)]
    if missing:
        raise Refused(
            f"session.{missing[0]} is not set: a training session needs its base model (a SageMaker Public Hub "
            "model ARN) and an IAM role ARN (see config/iam/README.md); set them in the config or pass "
            f"--set {missing[0]}=..."
        )
    return fail_fast(ServiceClient(
        region=cfg.region,
        role_arn=cfg.role_arn,
        model_package_group_arn=cfg.model_package_group_arn,
        s3_output_path=cfg.s3_output_path,
        **SessionNetwork.from_env().client_kwargs(),
    ))


def lora_kwargs(cfg: SessionConfig, name: str | None = None) -> dict[str, Any]:
    """``create_lora_training_client`` arguments; ``name``: the session's (steps/platform/ownership.py), or None
    for the SDK to name it."""
    kwargs = {"base_model": cfg.base_model, "rank": cfg.lora_rank, "alpha": cfg.lora_alpha}
    return {**kwargs, "training_session_name": name} if name else kwargs


def stop_session(training_client: Any, *, failing: bool) -> bool:
    """Stop the billed session; whether it stopped. While a step's error is propagating (``failing``), a stop
    that fails too is logged, not raised: the error that ended the work is the one the step reports (a dead
    service fails both, and the stop's error used to replace the first)."""
    name = training_client.training_session_name
    try:
        training_client.stop()
    except Exception:
        if not failing:
            raise
        log.warning("stopping training session %s failed as well", name, exc_info=True)
        return False
    log.info("training session %s stopped", name)
    return True
