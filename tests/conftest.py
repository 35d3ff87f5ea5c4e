"""Shared fixtures. Every test is offline: sockets may only reach loopback."""
from __future__ import annotations

import ipaddress
import os
import socket

import pytest

# Dummy credentials and region so boto3 never looks for real ones, and no SDK
# telemetry or config lookups leave the machine.
os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_SESSION_TOKEN", "testing")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-west-2")
os.environ.setdefault("AWS_REGION", "us-west-2")
os.environ["SAGEMAKER_VALIDATE_ROLE"] = "false"
os.environ.pop("AWS_PROFILE", None)

_real_connect = socket.socket.connect
_real_connect_ex = socket.socket.connect_ex


def _is_loopback(address) -> bool:
    if isinstance(address, (str, bytes)):  # AF_UNIX path
        return True
    host = address[0]
    if host in ("localhost",):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _guarded_connect(self, address):
    if self.family in (socket.AF_INET, socket.AF_INET6) and not _is_loopback(address):
        raise ConnectionRefusedError(f"tests may only connect to loopback, not {address!r}")
    return _real_connect(self, address)


def _guarded_connect_ex(self, address):
    if self.family in (socket.AF_INET, socket.AF_INET6) and not _is_loopback(address):
        raise ConnectionRefusedError(f"tests may only connect to loopback, not {address!r}")
    return _real_connect_ex(self, address)


socket.socket.connect = _guarded_connect  # type: ignore[method-assign]
socket.socket.connect_ex = _guarded_connect_ex  # type: ignore[method-assign]



# The local training-session service fixtures (local_service, service_client, ...), and the toy model one
# training run teaches for the whole test run (learned_toy).
pytest_plugins = ["tests.local_service", "tests.learned_toy"]


def pytest_collection_modifyitems(items: list) -> None:
    """The tests of the toy one training run teaches (tests/learned_toy.py, 17 s per worker that computes it), then
    the end-to-end runs (marked ``slow``, 10-50 s each), first, each in their files' order: under ``make test``'s
    two workers (``--dist worksteal``) the learned toy's tests run together on one worker, the short tests fill in
    around the long ones, and neither worker is left with a 50 s run when the other has nothing to do. A stable
    sort: every worker collects the same order."""
    def rank(item: pytest.Item) -> int:
        return 0 if "learned_toy" in item.fixturenames else 1 if item.get_closest_marker("slow") else 2

    items.sort(key=rank)
