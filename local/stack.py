"""The embedded stand-ins for AWS: moto in server mode and the local training-session service.

Both listen on 127.0.0.1 only and are stopped when the `with` block ends, however it ends
(error, Ctrl-C), and after everything in it: the steps it ran have stopped their training
sessions by then. So a terminal's Ctrl-C, sent to the runner's whole process group, must not
reach the service first: it runs in a session (and process group) of its own, and stops when
the runner tells it to or when the runner dies (its stdin is a pipe from the runner, which a
SIGKILL of the runner closes). moto is a thread of the runner, and a signal reaches only the
runner's main thread. The service writes its own log to ``log_path`` and,
with ``state_dir``, keeps its model packages there: a later stack on the same
directory serves them again (what a resumed local run's checkpoint refers to).
"""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Iterator, Mapping

from steps.cli import ENV_CALLER

REGION = "us-west-2"
ROOT = Path(__file__).resolve().parents[1]


#: Seconds the service has to stop on SIGTERM before it is killed.
SERVICE_GRACE_SECONDS = 10


def _start_service(extra_args: list[str], log: Any) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "local.training_session", "--host", "127.0.0.1", "--port", "0",
         "--stop-when-stdin-closes", *extra_args],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True, cwd=str(ROOT),
        start_new_session=True,  # a terminal's Ctrl-C to the runner's group does not reach it
    )
    assert proc.stdout is not None
    try:
        line = proc.stdout.readline()  # blocks until the service is ready (or died)
    except BaseException:  # Ctrl-C while it starts
        stop_process(proc, 0)
        raise
    if not line.startswith("listening on "):
        stop_process(proc, 0)
        raise RuntimeError(f"local training-session service did not start: {line!r} (see {log.name})")
    return proc, line.split("listening on ", 1)[1].strip()


def stop_process(proc: subprocess.Popen, grace: float, out: IO[str] | None = None) -> None:
    """SIGTERM (and the end of its stdin), then SIGKILL after ``grace`` seconds, or at once if the wait is
    interrupted: the process never outlives the call. What it still prints on its way out goes to ``out`` (reading
    its pipe also keeps it from filling and blocking the process's exit)."""
    try:
        proc.terminate()
        printed = proc.communicate(timeout=grace)[0]  # it closes the stdin pipe, if there is one
        if out is not None and printed:
            out.write(printed)
    except subprocess.TimeoutExpired:
        pass
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@contextmanager
def environment(values: Mapping[str, str]) -> Iterator[None]:
    """This process's environment with ``values`` set (the SDK and boto3 read their endpoints and credentials
    there), restored afterwards: a variable that was unset is unset again."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@dataclass
class LocalStack:
    log_path: Path
    service_args: list[str] = field(default_factory=list)
    state_dir: Path | None = None

    def __enter__(self) -> "LocalStack":
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no per-request lines from moto
        self._moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._moto.start()
        host, port = self._moto.get_host_and_port()
        self.moto_url = f"http://{host}:{port}"
        # moto keeps its accounts per process: start every run from an empty one.
        urllib.request.urlopen(urllib.request.Request(f"{self.moto_url}/moto-api/reset", method="POST"), timeout=10)
        self._log = open(self.log_path, "a")  # the service's own log (a resumed run continues it)
        try:
            state = ["--state-dir", str(self.state_dir)] if self.state_dir else []
            self._service, self.service_url = _start_service([*state, *self.service_args], self._log)
        except BaseException:
            self._moto.stop()
            self._log.close()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            stop_process(self._service, SERVICE_GRACE_SECONDS)
        finally:
            self._moto.stop()
            self._log.close()

    def env(self) -> dict[str, str]:
        """The environment every step process gets: all AWS calls stay on this machine."""
        base = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        return {
            **base,
            "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "testing",
            "AWS_DEFAULT_REGION": REGION, "AWS_REGION": REGION,
            "AWS_ENDPOINT_URL": self.moto_url,
            "SAGEMAKER_TRAINING_SESSION_ENDPOINT": self.service_url,
            "SAGEMAKER_TRAINING_SESSION_RUNTIME_ENDPOINT": self.service_url,
            "SAGEMAKER_VALIDATE_ROLE": "false",
            "PYTHONUNBUFFERED": "1",
            # The steps name a setting as the user typed it: make's PARAMS=, else the local run's --param.
            ENV_CALLER: os.environ.get(ENV_CALLER) or "local.run",
        }

    def s3(self) -> Any:
        import boto3

        return boto3.client("s3", region_name=REGION, endpoint_url=self.moto_url,
                            aws_access_key_id="testing", aws_secret_access_key="testing")

    def service_exit(self) -> int | None:
        """The service's exit code if it has died (a negative one: the signal that killed it), else None."""
        return self._service.poll()

    def sessions(self) -> list[dict[str, Any]]:
        """The service's sessions (name, status), read through its admin route."""
        with urllib.request.urlopen(f"{self.service_url}/_admin/sessions", timeout=10) as resp:
            return json.loads(resp.read())["sessions"]
