"""HTTP front of the local training-session service: one port, both planes.

* Control plane (:mod:`control_plane`): ``POST /`` with ``X-Amz-Target:
  SageMaker.<Op>``; errors are HTTP 400 ``{"__type", "message"}``.
* Runtime (:mod:`runtime`): rest-json under ``/v1/training-sessions/{name}/...``;
  errors carry their status, an ``x-amzn-ErrorType`` header and ``{"message"}``.
* Admin (not AWS): ``GET /_admin/sessions``, ``GET|POST /_admin/faults``.
"""
from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from local.training_session import runtime
from local.training_session.control_plane import CONTROL_PLANE, Request
from local.training_session.faults import Faults
from local.training_session.state import GAP_TIMEOUT_S, ServiceState
from local.training_session.wire import ServiceError, invalid

logger = logging.getLogger(__name__)

#: Longest a result poll is held waiting for its operation (botocore's read timeout is 60 s).
POLL_HOLD_S = 20.0
_RUNTIME_PATH = re.compile(r"^/v1/training-sessions/(?P<name>[^/]+)/"
                           r"(?P<plane>operations|sampling-operations)(?:/(?P<op>[^/]+))?$")
_CREDENTIAL_REGION = re.compile(r"Credential=[^/]+/\d{8}/(?P<region>[\w-]+)/")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # listen backlog: a sampling burst opens many connections at once
    state: ServiceState
    poll_hold_s: float


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the SDK reuses pooled connections
    # Headers and body go out in separate writes; with Nagle on, the body waits
    # for the client's delayed ACK and every response costs ~40 ms.
    disable_nagle_algorithm = True
    server: _Server

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        self._handle("POST")

    def do_GET(self) -> None:  # noqa: N802
        self._handle("GET")

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        logger.debug("%s " + format, self.address_string(), *args)

    def _handle(self, method: str) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        path = urlsplit(self.path).path
        try:
            if method == "POST" and path == "/":
                self._control_plane(raw)
            elif path.startswith("/_admin/"):
                self._admin(method, path, raw)
            else:
                self._runtime(method, path, raw)
        except Exception as e:  # a bug here: answer 500 rather than drop the connection
            logger.exception("%s %s failed", method, path)
            self._send(500, {"__type": "InternalFailure", "message": f"{type(e).__name__}: {e}"},
                       error_type="InternalServerException")

    def _request(self, raw: bytes) -> Request:
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            raise invalid("request body is not valid JSON") from None
        if not isinstance(body, dict):
            raise invalid("request body must be a JSON object")
        match = _CREDENTIAL_REGION.search(self.headers.get("Authorization") or "")
        return Request(body=body, region=match["region"] if match else "us-west-2")

    def _control_plane(self, raw: bytes) -> None:
        target = self.headers.get("X-Amz-Target") or ""
        op = target.split(".", 1)[1] if target.startswith("SageMaker.") else target
        try:
            handler = CONTROL_PLANE.get(op)
            if handler is None:
                raise ServiceError("UnknownOperationException", f"the local training-session service does not "
                                   f"implement {target or '(no X-Amz-Target)'}; it serves SageMaker."
                                   f"{{{', '.join(CONTROL_PLANE)}}}")
            payload = handler(self.server.state, self._request(raw))
            self._send(200, payload, content_type="application/x-amz-json-1.1")
        except ServiceError as e:
            self._send(400, {"__type": e.code, "message": e.message}, content_type="application/x-amz-json-1.1")

    def _runtime(self, method: str, path: str, raw: bytes) -> None:
        state = self.server.state
        try:
            match = _RUNTIME_PATH.match(path)
            if match is None or (method == "POST") == bool(match["op"]):
                raise ServiceError("UnknownOperationException", f"no runtime operation at {method} {path}", 404)
            session_name, training = unquote(match["name"]), match["plane"] == "operations"
            if method == "GET":
                payload = runtime.find_session(state, session_name).wait(
                    unquote(match["op"]), training, self.server.poll_hold_s)
            else:
                # A retry resends the same path and body, so that pair identifies it.
                if state.injector.throttle(path + hashlib.sha256(raw).hexdigest()):
                    raise ServiceError("ThrottlingException", "Rate exceeded (injected fault)", 429)
                body, session = self._request(raw).body, runtime.find_session(state, session_name)
                submit = runtime.submit_training if training else runtime.submit_sampling
                payload = submit(state, session, body)
            self._send(200, payload)
        except ServiceError as e:
            self._send(e.status, {"message": e.message}, error_type=e.code)

    def _admin(self, method: str, path: str, raw: bytes) -> None:
        state = self.server.state
        if method == "GET" and path == "/_admin/sessions":
            return self._send(200, {"sessions": state.snapshot()})
        if path == "/_admin/faults" and method == "POST":
            try:
                state.injector.set(Faults.from_mapping(json.loads(raw or b"{}")))
            except (ValueError, TypeError) as e:
                return self._send(400, {"message": str(e)}, error_type="ValidationException")
        if path == "/_admin/faults":
            return self._send(200, {"faults": state.injector.faults.to_dict(), "injected": state.injector.injected})
        self._send(404, {"message": f"no admin route {method} {path}; try GET /_admin/sessions, "
                                    "GET or POST /_admin/faults"}, error_type="UnknownOperationException")

    def _send(self, status: int, payload: dict[str, Any], *, content_type: str = "application/json",
              error_type: str | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("x-amzn-RequestId", str(uuid.uuid4()))
        if error_type:
            self.send_header("x-amzn-ErrorType", error_type)
        self.end_headers()
        self.wfile.write(data)


class RunningService:
    """A service serving on a background thread; :func:`start_service` makes one."""

    def __init__(self, httpd: _Server) -> None:
        self._httpd = httpd
        host, port = httpd.server_address[:2]
        self.url = f"http://{host}:{port}"
        self.port = port
        self._thread = threading.Thread(target=httpd.serve_forever, name="ts-http", daemon=True)
        self._thread.start()

    @property
    def state(self) -> ServiceState:
        return self._httpd.state

    def set_faults(self, faults: Faults) -> None:
        self._httpd.state.injector.set(faults)

    def sessions(self) -> list[dict[str, Any]]:
        """Name, status and operation counts of every session."""
        return self._httpd.state.snapshot()

    def stop(self) -> None:
        self._httpd.shutdown()  # stop accepting; handler threads are daemons
        self._httpd.state.close()  # release held polls and the session workers
        self._httpd.server_close()
        self._thread.join()

    def __enter__(self) -> "RunningService":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def start_service(host: str = "127.0.0.1", port: int = 0, faults: Faults | None = None, *,
                  state_dir: Path | str | None = None, poll_hold_s: float = POLL_HOLD_S,
                  gap_timeout_s: float = GAP_TIMEOUT_S) -> RunningService:
    """Serve on ``host:port`` (0 picks a free port) until ``.stop()``."""
    httpd = _Server((host, port), _Handler)
    httpd.state = ServiceState(faults, Path(state_dir) if state_dir else None, gap_timeout_s=gap_timeout_s)
    httpd.poll_hold_s = poll_hold_s
    return RunningService(httpd)
