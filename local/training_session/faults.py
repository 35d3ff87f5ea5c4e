"""Fault injection for the local training-session service.

Tests and benchmarks use these to reproduce what a real service does under
load: slow operations, throttled submits, operations that fail, and a session
that dies part-way through a run. Every rate draws from one seeded RNG, so a
run with a given seed and a single client sees the same faults every time
(rates of 0.0 and 1.0 are deterministic regardless).

Faults wrap the service from outside it, they do not live in its state: the
server asks :meth:`FaultInjector.throttled` before it dispatches a runtime submit,
and the injector is one of the backend's hooks (``sessions.Hooks``): its
:meth:`~FaultInjector.wrap` wraps every operation's runner (it may fail, and a
session dies once it has run enough). The latency setting is the service's
timing, read by the operation scheduler in ``models``. Every fault injected is
logged (logger ``local.training_session.faults``), one line each.

Settable three ways, all validated the same (``settings``): CLI flags
(``__main__``), environment variables (:data:`ENV_VARS`), and ``POST /_admin/faults``.
"""
from __future__ import annotations

import hashlib
import logging
import random
import threading
import weakref
from collections import Counter
from dataclasses import dataclass
from typing import ClassVar, Mapping

from local.training_session.exceptions import ServiceError
from local.training_session.responses import Request, Response, error_response
from local.training_session.sessions import Hooks, Operation, Runner, Session
from local.training_session.settings import Settings, require
from local.training_session.work import Outcome

logger = logging.getLogger(__name__)

#: Each field's environment variable, flag of ``python -m local.training_session`` and help: the ways to set it.
SETTINGS = {
    "latency_ms": ("LOCAL_TS_LATENCY_MS", "--latency-ms", "service time added to every runtime operation"),
    "throttle_rate": ("LOCAL_TS_THROTTLE_RATE", "--throttle-rate", "fraction of runtime submits answered 429"),
    "throttle_limit": ("LOCAL_TS_THROTTLE_LIMIT", "--throttle-limit", "most throttles of one request (default 2)"),
    "fail_rate": ("LOCAL_TS_FAIL_RATE", "--fail-rate", "fraction of operations that end Failed"),
    "sampling_fail_rate": ("LOCAL_TS_SAMPLING_FAIL_RATE", "--sampling-fail-rate",
                          "fraction of sampling operations that end Failed"),
    "fail_session_after": ("LOCAL_TS_FAIL_SESSION_AFTER", "--fail-session-after",
                          "a session fails after this many operations"),
    "seed": ("LOCAL_TS_FAULT_SEED", "--fault-seed", "seed for the fault rates"),
}
ENV_VARS = {name: var for name, (var, _, _) in SETTINGS.items()}


@dataclass(frozen=True)
class Faults(Settings):
    """What to inject. The default injects nothing.

    Attributes:
        latency_ms: Service time added to every runtime operation. Training
            operations of one session serialise, so each adds this much to the
            session's timeline; sampling operations overlap.
        throttle_rate: Fraction of runtime submits answered 429 ThrottlingException.
        throttle_limit: Most times one request (same path and body, i.e. the
            SDK's retry of it) is throttled, so the SDK's retry always gets through.
        fail_rate: Fraction of runtime operations that end ``Failed``.
        sampling_fail_rate: Fraction of sampling operations that end ``Failed``
            (drawn on top of ``fail_rate``); training operations are unaffected,
            so a run sees failed rollouts without failed optimizer steps.
        fail_session_after: A session fails once it has run this many runtime
            operations; ``None`` never.
        seed: Seed for the rate draws.
    """

    latency_ms: int = 0
    throttle_rate: float = 0.0
    throttle_limit: int = 2
    fail_rate: float = 0.0
    sampling_fail_rate: float = 0.0
    fail_session_after: int | None = None
    seed: int = 0
    KIND: ClassVar[str] = "fault"
    SETTINGS: ClassVar[Mapping[str, tuple[str, str, str]]] = SETTINGS

    def __post_init__(self) -> None:
        require("fault", isinstance(self.latency_ms, int) and self.latency_ms >= 0,
                "latency_ms", self.latency_ms, "a whole number of milliseconds >= 0")
        for name in ("throttle_rate", "fail_rate", "sampling_fail_rate"):
            value = getattr(self, name)
            require("fault", isinstance(value, (int, float)) and 0.0 <= value <= 1.0,
                    name, value, "a fraction between 0 and 1")
        require("fault", isinstance(self.throttle_limit, int) and self.throttle_limit >= 0,
                "throttle_limit", self.throttle_limit, "a whole number >= 0")
        require("fault", self.fail_session_after is None
                or (isinstance(self.fail_session_after, int) and self.fail_session_after >= 0),
                "fail_session_after", self.fail_session_after,
                "a whole number of operations >= 0, or null to never fail")
        require("fault", isinstance(self.seed, int), "seed", self.seed, "a whole number")


class FaultInjector(Hooks):
    """Thread-safe fault decisions drawn from the current :class:`Faults`."""

    def __init__(self, faults: Faults | None = None) -> None:
        self._lock = threading.Lock()
        # Operations each session has run, for fail_session_after; forgotten with the session.
        self._ops_run: weakref.WeakKeyDictionary[Session, int] = weakref.WeakKeyDictionary()
        self.set(faults or Faults())

    def set(self, faults: Faults) -> None:
        """Replace the settings, reseed the RNG and forget earlier throttles."""
        with self._lock:
            self._faults = faults
            self._rng = random.Random(faults.seed)
            self._throttled: Counter[str] = Counter()
            self._injected: Counter[str] = Counter()

    @property
    def faults(self) -> Faults:
        return self._faults

    @property
    def injected(self) -> dict[str, int]:
        """How many faults were injected since the last :meth:`set`, by kind."""
        with self._lock:
            return {"throttled": self._injected["throttled"], "failed_operations": self._injected["failed"]}

    @property
    def latency_s(self) -> float:
        return self._faults.latency_ms / 1000.0

    def throttled(self, request: Request) -> Response | None:
        """The 429 ThrottlingException a loaded service would answer this runtime submit with, or None to
        dispatch it. The SDK retries it (the same path and body), at most ``throttle_limit`` times throttled."""
        if not self.throttle(request.path + hashlib.sha256(request.raw).hexdigest()):
            return None
        logger.info("injected fault: %s %s throttled (429)", request.operation, request.path)
        return error_response(request.service, ServiceError("ThrottlingException", "Rate exceeded (injected fault)",
                                                            429))

    def throttle(self, request_key: str) -> bool:
        """Whether to answer this submit 429. ``request_key`` identifies a retry."""
        with self._lock:
            f = self._faults
            if f.throttle_rate <= 0 or self._throttled[request_key] >= f.throttle_limit:
                return False
            if self._rng.random() >= f.throttle_rate:
                return False
            self._throttled[request_key] += 1
            self._injected["throttled"] += 1
            return True

    def wrap(self, session: Session, op: Operation, runner: Runner) -> Runner:
        """``runner`` as the faults would run it: it may end Failed, and the session
        dies once it has run ``fail_session_after`` operations (this one counted)."""

        def run(session: Session) -> Outcome:
            try:
                if self._fail_operation(op.training):
                    logger.info("injected fault: session %s: %s operation %s fails", session.name, op.kind, op.id)
                    raise ServiceError("InternalServerError", "injected operation failure")
                return runner(session)
            finally:
                self._count_run(session)
        return run

    def _fail_operation(self, training: bool) -> bool:
        """Whether the operation about to run should end ``Failed``."""
        with self._lock:
            f = self._faults
            fail = f.fail_rate > 0 and self._rng.random() < f.fail_rate
            if not training and not fail:
                fail = f.sampling_fail_rate > 0 and self._rng.random() < f.sampling_fail_rate
            self._injected["failed"] += fail
            return fail

    def _count_run(self, session: Session) -> None:
        """Count an operation run; the session dies once it has run ``fail_session_after``."""
        with self._lock:
            ran = self._ops_run[session] = self._ops_run.get(session, 0) + 1
        limit = self._faults.fail_session_after
        if limit is not None and ran >= limit and session.status == "Running":
            logger.info("injected fault: session %s fails after %d operations", session.name, ran)
            session.fail(f"injected fault: session failed after {ran} operations")
