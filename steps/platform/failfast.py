"""An endpoint that stops answering fails the step in seconds, not minutes.

The SDK retries a connection error as it retries throttling: up to 150 times per submit or
poll, with backoff (``sagemaker/train/training_session/futures.py``), so a dead or unreachable
training-session service held a step for ~5 minutes per call, over 10 minutes in all, before it
failed with a traceback. :class:`FailFast` watches every attempt of the ServiceClient's botocore
clients (botocore's ``needs-retry`` event, which sees each attempt's outcome): once an endpoint
has only refused or timed out connections for :data:`UNREACHABLE_SECONDS`, with no answer of any
kind in between, the next such error is raised as :class:`ServiceUnreachable`, which the SDK
does not retry (its ``is_retryable`` is False for it). Any HTTP answer, a throttle or a 5xx
included, ends the streak: those are retried exactly as before.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from botocore.exceptions import ConnectionClosedError
from botocore.exceptions import ConnectionError as BotoConnectionError
from sagemaker.train.training_session.exceptions import TrainingSessionError

log = logging.getLogger("steps.failfast")

#: Seconds of nothing but failed connections after which an endpoint counts as gone. Long enough for a
#: blip (a restarting load balancer), short enough that a step fails well within 30 s.
UNREACHABLE_SECONDS = 10.0
#: Refused, timed out while connecting, closed before an answer. Not a read timeout: the service is there.
CONNECTION_FAILURES = (BotoConnectionError, ConnectionClosedError)


class ServiceUnreachable(TrainingSessionError):
    """The training-session endpoint has not answered for :data:`UNREACHABLE_SECONDS`."""


@dataclass
class FailFast:
    """A ``needs-retry`` handler: how long each endpoint has done nothing but fail to connect."""

    seconds: float = UNREACHABLE_SECONDS
    clock: Callable[[], float] = time.monotonic
    _since: dict[str, float] = field(default_factory=dict)  # endpoint host -> first failure of the streak
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, response: Any = None, caught_exception: BaseException | None = None, endpoint: Any = None,
                 **_: Any) -> None:
        host = getattr(endpoint, "host", "the endpoint")
        if not isinstance(caught_exception, CONNECTION_FAILURES):
            if caught_exception is None:  # an answer, a throttle or an error too: the endpoint is there
                with self._lock:
                    self._since.pop(host, None)
            return None  # never a retry decision of its own: botocore's and the SDK's policies stand
        now = self.clock()
        with self._lock:
            since = self._since.setdefault(host, now)
        if now - since >= self.seconds:
            raise ServiceUnreachable(
                f"the training-session service at {host} has not answered for {now - since:.0f}s "
                f"({type(caught_exception).__name__}: {caught_exception})") from caught_exception
        return None

    def attach(self, service: Any) -> None:
        """Watch every botocore client the ServiceClient holds or builds later. The SDK keeps them private:
        tests/test_failfast.py checks that these attributes exist on the pinned SDK."""
        session = getattr(service, "_sagemaker_session", None)
        clients = (getattr(session, "sagemaker_client", None), getattr(service, "_sagemaker_client", None),
                   getattr(service, "_runtime", None))
        emitters = [session.boto_session.events if session is not None else None,  # clients built later
                    *(c.meta.events if c is not None else None for c in clients)]
        if not all(emitters):
            log.warning("this SDK's ServiceClient does not hold its botocore clients where expected: an "
                        "unreachable service is retried for minutes before the step fails")
        for emitter in filter(None, emitters):
            emitter.register("needs-retry", self, unique_id="dapo-fail-fast")


def fail_fast(service: Any, seconds: float = UNREACHABLE_SECONDS) -> Any:
    """``service`` (a ServiceClient), its calls failing once its endpoint has not answered for ``seconds``."""
    FailFast(seconds).attach(service)
    return service
