"""Pytest fixtures running the local training-session service in-process.

One service serves the whole test run (starting it is cheap, but sessions are
isolated by name and model package groups by a per-test group). Each test that
asks for ``local_service`` gets the SDK's two endpoint overrides pointed at it
and fault injection, the cost model and the toy's sickness reset before and after.

Load with ``pytest_plugins = ["tests.local_service"]`` in ``tests/conftest.py``.
"""
from __future__ import annotations

import uuid
from typing import Any, Iterator

import pytest

from local.training_session.costs import Costs
from local.training_session.faults import Faults
from local.training_session.responses import base_model_arn
from local.training_session.server import RunningService, start_service
from local.training_session.sickness import Sickness

REGION = "us-west-2"
ACCOUNT = "123456789012"
ROLE_ARN = f"arn:aws:iam::{ACCOUNT}:role/LocalTrainingSessionRole"
S3_OUTPUT_PATH = "s3://local-training-session/output"
#: The Hub ARN that selects the local base model (``local-toy-arith``).
BASE_MODEL_ARN = base_model_arn(REGION, "1.0.0")
ENDPOINT_ENV_VARS = ("SAGEMAKER_TRAINING_SESSION_ENDPOINT", "SAGEMAKER_TRAINING_SESSION_RUNTIME_ENDPOINT")


def group_arn(name: str) -> str:
    return f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:model-package-group/{name}"


def client_kwargs(group_name: str | None = None) -> dict[str, Any]:
    """``ServiceClient(**client_kwargs())``: everything set, so the SDK never calls STS, S3 or the Hub."""
    return {"region": REGION, "role_arn": ROLE_ARN,
            "model_package_group_arn": group_arn(group_name or f"tests-{uuid.uuid4().hex[:12]}"),
            "s3_output_path": S3_OUTPUT_PATH}


@pytest.fixture(scope="session")
def training_service() -> Iterator[RunningService]:
    """The service itself, for the whole run. Prefer ``local_service``."""
    service = start_service("127.0.0.1", 0)
    yield service
    service.stop()


@pytest.fixture
def local_service(training_service: RunningService, monkeypatch: pytest.MonkeyPatch) -> Iterator[RunningService]:
    """The running service, with the SDK's endpoint overrides set, no faults, no cost model and a healthy toy."""
    for var in ENDPOINT_ENV_VARS:
        monkeypatch.setenv(var, training_service.url)
    training_service.set_faults(Faults())
    training_service.set_costs(Costs())
    training_service.set_sickness(Sickness())
    yield training_service
    training_service.set_faults(Faults())
    training_service.set_costs(Costs())
    training_service.set_sickness(Sickness())


@pytest.fixture
def service_client_kwargs(local_service: RunningService) -> dict[str, Any]:
    """ServiceClient constructor arguments with a model package group of this test's own."""
    return client_kwargs()


@pytest.fixture
def service_client(service_client_kwargs: dict[str, Any]) -> Any:
    """A ServiceClient of this test's own (its own model package group)."""
    from sagemaker.train.training_session import ServiceClient

    return ServiceClient(**service_client_kwargs)


@pytest.fixture(scope="module")
def module_service_client(training_service: RunningService) -> Iterator[Any]:
    """One ServiceClient for a whole test module: building one parses botocore's
    service models (~0.7 s). The endpoint overrides stay set for the module."""
    from sagemaker.train.training_session import ServiceClient

    with pytest.MonkeyPatch.context() as mp:
        for var in ENDPOINT_ENV_VARS:
            mp.setenv(var, training_service.url)
        yield ServiceClient(**client_kwargs())
