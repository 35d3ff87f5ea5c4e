"""HTTP transport of the local training-session service: one port, both planes.

Transport only: it reads a request, finds its route in the tables below, hands it
to the route's dispatch (``responses``; runtime submits through the fault
injector's :func:`~local.training_session.faults.throttled`), records the answer
in the backend's request log and writes it.

* Control plane: ``POST /`` with ``X-Amz-Target: SageMaker.<Op>``.
* Runtime: the method and ``requestUri`` of each operation in botocore's model,
  e.g. ``POST /v1/training-sessions/{trainingSessionName}/operations``.
* Admin (not AWS): ``GET /_admin/sessions``, ``GET|POST /_admin/faults``,
  ``GET|POST /_admin/costs`` (the cost model's settings for new sessions, and each
  costed session's simulated clock and GPU use), ``GET /_admin/requests``
  (requests and errors per operation and kind).
"""
from __future__ import annotations

import json
import logging
import re
import threading
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable
from urllib.parse import unquote, urlsplit

from local.training_session import responses
from local.training_session.costs import Costs
from local.training_session.faults import Dispatch, FaultInjector, Faults, throttled
from local.training_session.models import GAP_TIMEOUT_S, POLL_HOLD_S, ServiceError, TrainingSessionBackend
from local.training_session.responses import CONTROL_PLANE, RUNTIME, Request, Response
from pipeline.shapes import service_model

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Route:
    service: str
    operation: str
    dispatch: Dispatch


@dataclass(frozen=True)
class RuntimeRoute:
    method: str
    path: re.Pattern[str]  # named groups: the URI members
    route: Route


#: X-Amz-Target -> route.
CONTROL_PLANE_ROUTES = {f"SageMaker.{op}": Route(CONTROL_PLANE, op, responses.dispatch)
                        for op in responses.CONTROL_PLANE_OPERATIONS}


def _runtime_route(operation: str) -> RuntimeRoute:
    """The operation's method and path from botocore's model. A URI member matches an
    empty segment too, so the model's length rule answers it rather than a 404."""
    http = service_model(RUNTIME).operation_model(operation).http
    path = re.compile("^" + re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]*)", http["requestUri"]) + "$")
    dispatch = throttled(responses.dispatch) if http["method"] == "POST" else responses.dispatch
    return RuntimeRoute(http["method"], path, Route(RUNTIME, operation, dispatch))


RUNTIME_ROUTES = tuple(_runtime_route(op) for op in responses.RUNTIME_OPERATIONS)
#: The result polls, which the service holds while their operation runs.
POLLS = frozenset({"GetTrainingOperationResult", "GetSamplingOperationResult"})


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # listen backlog: a sampling burst opens many connections at once
    backend: TrainingSessionBackend


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
        backend = self.server.backend
        try:
            if path.startswith("/_admin/"):
                return self._send(_admin(backend, method, path, raw))
            routed = self._route(method, path, raw)
            if isinstance(routed, Response):
                return self._send(routed)
            route, request = routed
            # Counted for the cost model's virtual time: the client is at work unless its polls are all waiting.
            with backend.clock.request(submits=route.operation not in POLLS):
                response = route.dispatch(backend, request)
            backend.requests.record(route.operation, request.kind, response.error_code)
            self._send(response)
        except Exception as e:  # a bug here: answer 500 rather than drop the connection
            logger.exception("%s %s failed", method, path)
            self._send(Response(500, {"__type": "InternalFailure", "message": f"{type(e).__name__}: {e}"},
                                error_code="InternalServerException"))

    def _route(self, method: str, path: str, raw: bytes) -> tuple[Route, Request] | Response:
        """The route and request, or the UnknownOperationException answer."""
        authorization = self.headers.get("Authorization") or ""
        if method == "POST" and path == "/":
            target = self.headers.get("X-Amz-Target") or ""
            route = CONTROL_PLANE_ROUTES.get(target)
            if route is None:
                return responses.error_response(CONTROL_PLANE, ServiceError(
                    "UnknownOperationException", f"the local training-session service does not implement "
                    f"{target or '(no X-Amz-Target)'}; it serves SageMaker."
                    f"{{{', '.join(responses.CONTROL_PLANE_OPERATIONS)}}}"))
            return route, Request(CONTROL_PLANE, route.operation, path, raw, authorization=authorization)
        for runtime in RUNTIME_ROUTES:
            match = runtime.path.match(path) if runtime.method == method else None
            if match:
                uri_params = {k: unquote(v) for k, v in match.groupdict().items()}
                return runtime.route, Request(RUNTIME, runtime.route.operation, path, raw, uri_params, authorization)
        return responses.error_response(RUNTIME, ServiceError(
            "UnknownOperationException", f"no runtime operation at {method} {path}", 404))

    def _send(self, response: Response) -> None:
        data = json.dumps(response.payload).encode()
        self.send_response(response.status)
        self.send_header("Content-Type", response.content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("x-amzn-RequestId", str(uuid.uuid4()))
        if response.error_code:
            self.send_header("x-amzn-ErrorType", response.error_code)
        self.end_headers()
        self.wfile.write(data)


# -- admin routes (not AWS) ---------------------------------------------------------------
def _sessions(backend: TrainingSessionBackend, raw: bytes) -> Response:
    return Response(200, {"sessions": backend.snapshot()})


def _faults(backend: TrainingSessionBackend, raw: bytes) -> Response:
    return Response(200, {"faults": backend.injector.faults.to_dict(), "injected": backend.injector.injected})


def _set_faults(backend: TrainingSessionBackend, raw: bytes) -> Response:
    try:
        backend.injector.set(Faults.from_mapping(json.loads(raw or b"{}")))
    except (ValueError, TypeError) as e:
        return Response(400, {"message": str(e)}, error_code="ValidationException")
    return _faults(backend, raw)


def _costs(backend: TrainingSessionBackend, raw: bytes) -> Response:
    return Response(200, backend.cost_snapshot())


def _set_costs(backend: TrainingSessionBackend, raw: bytes) -> Response:
    try:
        backend.costs = Costs.from_mapping(json.loads(raw or b"{}"))
    except (ValueError, TypeError) as e:
        return Response(400, {"message": str(e)}, error_code="ValidationException")
    return _costs(backend, raw)


def _requests(backend: TrainingSessionBackend, raw: bytes) -> Response:
    return Response(200, {"requests": backend.requests.snapshot()})


ADMIN_ROUTES: dict[tuple[str, str], Callable[[TrainingSessionBackend, bytes], Response]] = {
    ("GET", "/_admin/sessions"): _sessions,
    ("GET", "/_admin/faults"): _faults,
    ("POST", "/_admin/faults"): _set_faults,
    ("GET", "/_admin/costs"): _costs,
    ("POST", "/_admin/costs"): _set_costs,
    ("GET", "/_admin/requests"): _requests,
}


def _admin(backend: TrainingSessionBackend, method: str, path: str, raw: bytes) -> Response:
    handler = ADMIN_ROUTES.get((method, path))
    if handler is None:
        known = ", ".join(f"{m} {p}" for m, p in ADMIN_ROUTES)
        return Response(404, {"message": f"no admin route {method} {path}; try {known}"},
                        error_code="UnknownOperationException")
    return handler(backend, raw)


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
    def state(self) -> TrainingSessionBackend:
        """The backend: sessions, model packages, fault injector, request log."""
        return self._httpd.backend

    def set_faults(self, faults: Faults) -> None:
        self._httpd.backend.injector.set(faults)

    def set_costs(self, costs: Costs) -> None:
        """The cost model of sessions created from now on."""
        self._httpd.backend.costs = costs

    def sessions(self) -> list[dict[str, Any]]:
        """Name, status and operation counts of every session."""
        return self._httpd.backend.snapshot()

    def stop(self) -> None:
        self._httpd.shutdown()  # stop accepting; handler threads are daemons
        self._httpd.backend.close()  # release held polls and the session workers
        self._httpd.server_close()
        self._thread.join()

    def __enter__(self) -> "RunningService":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def start_service(host: str = "127.0.0.1", port: int = 0, faults: Faults | None = None, *,
                  costs: Costs | None = None, state_dir: Path | str | None = None, poll_hold_s: float = POLL_HOLD_S,
                  gap_timeout_s: float = GAP_TIMEOUT_S) -> RunningService:
    """Serve on ``host:port`` (0 picks a free port) until ``.stop()``."""
    httpd = _Server((host, port), _Handler)
    httpd.backend = TrainingSessionBackend(FaultInjector(faults), Path(state_dir) if state_dir else None,
                                           gap_timeout_s=gap_timeout_s, poll_hold_s=poll_hold_s, costs=costs)
    return RunningService(httpd)
