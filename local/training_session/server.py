"""HTTP transport of the local training-session service: one port, both planes.

Transport and routing: it reads a request, finds its route in the tables below,
lets the fault injector throttle a runtime submit, hands the request to
``responses.dispatch``, records the answer in the request log and writes it.
It also assembles the service (:class:`ServiceState`): the backend (``models``)
with what wraps and observes it from outside, the fault injector (``faults``) and
the cost model (``metering``).

* Control plane: ``POST /`` with ``X-Amz-Target: SageMaker.<Op>``.
* Runtime: the method and ``requestUri`` of each operation in botocore's model,
  e.g. ``POST /v1/training-sessions/{trainingSessionName}/operations``.
* Admin (not AWS): ``GET /_admin/sessions``, ``GET|POST /_admin/faults``,
  ``GET|POST /_admin/costs`` (the cost model's settings for new sessions, and each
  costed session's simulated clock and GPU use), ``GET|POST /_admin/sickness`` (the
  knobs that drive the toy sick, for the health guards' tests), ``GET /_admin/requests``
  (requests and errors per operation and kind).
"""
from __future__ import annotations

import json
import logging
import re
import threading
import uuid
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable
from urllib.parse import unquote, urlsplit

from local.training_session import responses
from local.training_session.costs import Costs
from local.training_session.exceptions import ServiceError
from local.training_session.faults import FaultInjector, Faults
from local.training_session.metering import CostMeter
from local.training_session.models import TrainingSessionBackend
from local.training_session.registry import PackageRegistry
from local.training_session.responses import CONTROL_PLANE, RUNTIME, Request, Response
from local.training_session.sessions import GAP_TIMEOUT_S, POLL_HOLD_S, Session
from local.training_session.sickness import Sickness, SicknessHook
from pipeline.shapes import service_model

logger = logging.getLogger(__name__)


# -- the service's parts ---------------------------------------------------------------------
class RequestLog:
    """Requests answered, per API operation and per runtime operation kind (the member
    of ``operationConfig``), with the error codes of those refused."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: Counter[str] = Counter()
        self._errors: dict[str, Counter[str]] = {}

    def record(self, operation: str, kind: str | None, error: str | None) -> None:
        with self._lock:
            for key in (operation, kind) if kind else (operation,):
                self._requests[key] += 1
                if error:
                    self._errors.setdefault(key, Counter())[error] += 1

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """``{operation or kind: {"requests": n, "errors": {code: n}}}`` for ``GET /_admin/requests``."""
        with self._lock:
            return {key: {"requests": n, "errors": dict(self._errors.get(key, {}))}
                    for key, n in sorted(self._requests.items())}


@dataclass
class ServiceState:
    """One running service: the backend, what wraps and observes it, and the request log."""

    backend: TrainingSessionBackend
    injector: FaultInjector
    meter: CostMeter
    sick: SicknessHook = field(default_factory=SicknessHook)
    requests: RequestLog = field(default_factory=RequestLog)

    def find(self, name: str) -> Session | None:
        return self.backend.find(name)

    @property
    def registry(self) -> PackageRegistry:
        return self.backend.registry


# -- routing -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Route:
    service: str
    operation: str
    throttled: bool = False  # a runtime submit: the fault injector may answer it 429


@dataclass(frozen=True)
class RuntimeRoute:
    method: str
    path: re.Pattern[str]  # named groups: the URI members
    route: Route


#: X-Amz-Target -> route.
CONTROL_PLANE_ROUTES = {f"SageMaker.{op}": Route(CONTROL_PLANE, op) for op in responses.CONTROL_PLANE_OPERATIONS}


def _runtime_route(operation: str) -> RuntimeRoute:
    """The operation's method and path from botocore's model. A URI member matches an
    empty segment too, so the model's length rule answers it rather than a 404."""
    http = service_model(RUNTIME).operation_model(operation).http
    path = re.compile("^" + re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]*)", http["requestUri"]) + "$")
    return RuntimeRoute(http["method"], path, Route(RUNTIME, operation, throttled=http["method"] == "POST"))


RUNTIME_ROUTES = tuple(_runtime_route(op) for op in responses.RUNTIME_OPERATIONS)
#: The result polls, which the service holds while their operation runs.
POLLS = frozenset({"GetTrainingOperationResult", "GetSamplingOperationResult"})


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # listen backlog: a sampling burst opens many connections at once
    state: ServiceState


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the SDK reuses pooled connections
    # Headers and body leave in one write (http.server sends them in two, unbuffered): botocore reads a body cut
    # short as empty (it does not enforce Content-Length), so a service killed between the two writes answered a
    # submit with "no operationId" and the SDK raised KeyError instead of seeing the service gone. A body up to
    # the buffer's size (every submit's answer) is all or nothing: `_send` flushes the two writes together.
    wbufsize = 1 << 16
    # With Nagle on, a response larger than the buffer (headers, then body) waits for the client's delayed ACK.
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
        state = self.server.state
        try:
            if path.startswith("/_admin/"):
                return self._send(_admin(state, method, path, raw))
            routed = self._route(method, path, raw)
            if isinstance(routed, Response):
                return self._send(routed)
            route, request = routed
            # Counted for the cost model's virtual time: the client is at work unless its polls are all waiting.
            with state.meter.clock.request(submits=route.operation not in POLLS):
                response = (route.throttled and state.injector.throttled(request)) or \
                    responses.dispatch(state.backend, request)
            state.requests.record(route.operation, request.kind, response.error_code)
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
        self.wfile.flush()


# -- admin routes (not AWS) ---------------------------------------------------------------
def _sessions(state: ServiceState, raw: bytes) -> Response:
    return Response(200, {"sessions": state.backend.snapshot()})


def _faults(state: ServiceState, raw: bytes) -> Response:
    return Response(200, {"faults": state.injector.faults.to_dict(), "injected": state.injector.injected})


def _costs(state: ServiceState, raw: bytes) -> Response:
    return Response(200, state.meter.snapshot(state.backend.sessions()))


def _sickness(state: ServiceState, raw: bytes) -> Response:
    return Response(200, {"sickness": state.sick.sickness.to_dict()})


def _setter(parse: Callable[[Any], Any], apply: Callable[[ServiceState, Any], None],
            show: Callable[[ServiceState, bytes], Response]) -> Callable[[ServiceState, bytes], Response]:
    """An admin POST: the JSON body parsed into the knob's settings (a bad one is a 400 naming it), applied,
    and the knob's state answered as its GET would."""
    def handle(state: ServiceState, raw: bytes) -> Response:
        try:
            settings = parse(json.loads(raw or b"{}"))
        except (ValueError, TypeError) as e:
            return Response(400, {"message": str(e)}, error_code="ValidationException")
        apply(state, settings)
        return show(state, raw)
    return handle


def _requests(state: ServiceState, raw: bytes) -> Response:
    return Response(200, {"requests": state.requests.snapshot()})


def set_faults(state: ServiceState, faults: Faults) -> None:
    if faults != state.injector.faults:
        logger.info("faults set: %s", {k: v for k, v in faults.to_dict().items() if v != getattr(Faults(), k)})
    state.injector.set(faults)


def set_costs(state: ServiceState, costs: Costs) -> None:
    """The cost model of sessions created from now on."""
    if costs != state.meter.costs:
        logger.info("cost model set for new sessions: %s",
                    {k: v for k, v in costs.to_dict().items() if v != getattr(Costs(), k)} or "off")
    state.meter.costs = costs


def set_sickness(state: ServiceState, sickness: Sickness) -> None:
    """The toy's sampling from now on (every session's)."""
    if sickness != state.sick.sickness:
        logger.info("sickness set: %s", {k: v for k, v in sickness.to_dict().items()
                                          if v != getattr(Sickness(), k)} or "healthy")
    state.sick.sickness = sickness


ADMIN_ROUTES: dict[tuple[str, str], Callable[[ServiceState, bytes], Response]] = {
    ("GET", "/_admin/sessions"): _sessions,
    ("GET", "/_admin/faults"): _faults,
    ("POST", "/_admin/faults"): _setter(Faults.from_mapping, set_faults, _faults),
    ("GET", "/_admin/costs"): _costs,
    ("POST", "/_admin/costs"): _setter(Costs.from_mapping, set_costs, _costs),
    ("GET", "/_admin/sickness"): _sickness,
    ("POST", "/_admin/sickness"): _setter(Sickness.from_mapping, set_sickness, _sickness),
    ("GET", "/_admin/requests"): _requests,
}


def _admin(state: ServiceState, method: str, path: str, raw: bytes) -> Response:
    handler = ADMIN_ROUTES.get((method, path))
    if handler is None:
        known = ", ".join(f"{m} {p}" for m, p in ADMIN_ROUTES)
        return Response(404, {"message": f"no admin route {method} {path}; try {known}"},
                        error_code="UnknownOperationException")
    return handler(state, raw)


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
        """The backend (sessions, model packages), the fault injector, the cost model and the request log."""
        return self._httpd.state

    def set_faults(self, faults: Faults) -> None:
        set_faults(self._httpd.state, faults)

    def set_costs(self, costs: Costs) -> None:
        """The cost model of sessions created from now on."""
        set_costs(self._httpd.state, costs)

    def set_sickness(self, sickness: Sickness) -> None:
        """The knobs that drive the toy sick (sickness.py), for every sampling operation from now on."""
        set_sickness(self._httpd.state, sickness)

    def sessions(self) -> list[dict[str, Any]]:
        """Name, status and operation counts of every session."""
        return self._httpd.state.backend.snapshot()

    def stop(self) -> None:
        self._httpd.shutdown()  # stop accepting; handler threads are daemons
        self._httpd.state.backend.close()  # release held polls and the session workers
        self._httpd.server_close()
        self._thread.join()

    def __enter__(self) -> "RunningService":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def start_service(host: str = "127.0.0.1", port: int = 0, faults: Faults | None = None, *,
                  costs: Costs | None = None, sickness: Sickness | None = None, state_dir: Path | str | None = None,
                  poll_hold_s: float = POLL_HOLD_S, gap_timeout_s: float = GAP_TIMEOUT_S) -> RunningService:
    """Serve on ``host:port`` (0 picks a free port) until ``.stop()``."""
    httpd = _Server((host, port), _Handler)
    injector, meter, sick = FaultInjector(faults), CostMeter(costs), SicknessHook(sickness)
    backend = TrainingSessionBackend(Path(state_dir) if state_dir else None, gap_timeout_s=gap_timeout_s,
                                     poll_hold_s=poll_hold_s, hooks=(injector, meter, sick),
                                     latency_s=lambda: injector.latency_s)
    httpd.state = ServiceState(backend, injector, meter, sick)
    return RunningService(httpd)
