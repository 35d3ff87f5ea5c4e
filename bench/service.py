"""The local training-session service in its own process, for benchmarks.

A separate process, as a real service would be: its numpy work and HTTP
handling do not compete with the client for the client's GIL. Its cost model is
set between runs through ``POST /_admin/costs`` (sessions keep the settings they
were created with) and read through ``GET /_admin/costs``.

It is stopped as ``make local-run`` stops its own (``local/stack.py``): SIGTERM, then SIGKILL after a grace,
and it ends by itself if this process dies (its stdin closes). A service slow to stop (sampling operations
a finished run left computing) never fails a measurement that is done, nor outlives it.
"""
from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from contextlib import contextmanager
from typing import Iterator

from local.stack import SERVICE_GRACE_SECONDS, environment, stop_process
from local.training_session.costs import Costs

ENDPOINT_ENV_VARS = ("SAGEMAKER_TRAINING_SESSION_ENDPOINT", "SAGEMAKER_TRAINING_SESSION_RUNTIME_ENDPOINT")
# Dummy credentials: the SDK signs requests, the local service ignores the signature.
AWS_ENV = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-west-2",
           "AWS_REGION": "us-west-2", "SAGEMAKER_VALIDATE_ROLE": "false"}


class Service:
    def __init__(self, url: str) -> None:
        self.url = url

    def set_costs(self, costs: Costs) -> None:
        self._admin("costs", costs.to_dict())

    def costs(self) -> dict:
        """The cost model's settings and each costed session's simulated clock and GPU use."""
        return self._admin("costs")

    def _admin(self, route: str, body: dict | None = None) -> dict:
        data = None if body is None else json.dumps(body).encode()
        with urllib.request.urlopen(urllib.request.Request(f"{self.url}/_admin/{route}", data=data), timeout=10) as r:
            return json.loads(r.read())


@contextmanager
def local_service() -> Iterator[Service]:
    """Start ``python -m local.training_session`` on 127.0.0.1, point the SDK at it, stop it after."""
    proc = subprocess.Popen([sys.executable, "-m", "local.training_session", "--host", "127.0.0.1", "--port", "0",
                             "--stop-when-stdin-closes"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()  # blocks until the service prints it is ready (or exits)
        if not line.startswith("listening on "):
            raise RuntimeError(f"the local service did not start: {line!r}")
        url = line.split()[-1]
        with environment({**AWS_ENV, **{k: url for k in ENDPOINT_ENV_VARS}}):
            yield Service(url)
    finally:
        stop_process(proc, SERVICE_GRACE_SECONDS)
