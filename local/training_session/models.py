"""The backend of the local service: its state and the operations' effects, as moto's ``models.py``.

It knows nothing of HTTP. ``responses`` parses and validates every request before calling here, and shapes the
answer: runtime results from the :class:`~local.training_session.work.Outcome` an operation returns; the control
plane's descriptions from the objects' ``describe()``, ``summary()`` and ``detail()`` (moto's
``response_object``). The backend is in four modules, one per thing it models:

* ``registry``, the **model package registry**: groups, versions, their weights on disk and approval status;
  ``saveState`` / ``saveWeights`` register a version here, as the real service does in the session's group;
* ``work``, **the operations' work**: what each runtime operation does to a session and its toy model (a
  ``Work`` that ``responses`` builds from a validated request), what it returns (an ``Outcome``) and what it
  bills (``Billed``, the session's ``BillableTokenUsage``);
* ``sessions``, **sessions and their operations** (sequencing, idempotency, lifecycle) and ``Hooks``, the seam
  where ``faults``, ``metering`` and ``sickness`` plug in from outside;
* this module, the :class:`TrainingSessionBackend` that holds the sessions, the registry and the hooks.

Lifecycle events and failed operations are logged (logger ``local.training_session.models``).
"""
from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Sequence

from local.training_session.exceptions import NotFound, ServiceError, invalid
from local.training_session.registry import PackageRegistry, parse_group_arn
from local.training_session.sessions import (
    GAP_TIMEOUT_S,
    POLL_HOLD_S,
    HookChain,
    Hooks,
    Operation,
    OperationState,
    Session,
)
from local.training_session.work import Work

logger = logging.getLogger(__name__)


class TrainingSessionBackend:
    """Every session and the model package registry; ``hooks`` wrap and observe its operations."""

    def __init__(self, state_dir: Path | None = None, sample_workers: int = 8,
                 gap_timeout_s: float = GAP_TIMEOUT_S, poll_hold_s: float = POLL_HOLD_S,
                 hooks: Sequence[Hooks] = (), latency_s: Callable[[], float] = lambda: 0.0) -> None:
        self.hooks = HookChain(hooks)
        self.registry = PackageRegistry(state_dir)
        self.poll_hold_s = poll_hold_s
        self._latency_s = latency_s  # the service's time added to every runtime operation
        self._gap_timeout_s = gap_timeout_s
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()
        self._shutdown = threading.Event()
        self._pool = ThreadPoolExecutor(sample_workers, thread_name_prefix="ts-sample")

    # -- sessions -------------------------------------------------------------
    def create_session(self, *, name: str, region: str, group_arn: str, base_model: tuple[str, str],
                       output_path: str, request: dict[str, Any]) -> Session:
        account = parse_group_arn(group_arn)["account"]
        group = self.registry.ensure_group(group_arn)
        with self._lock:
            if name in self._sessions:
                raise ServiceError("ResourceInUse", f"Training session {name!r} already exists")
            session = Session(
                name=name, arn=f"arn:aws:sagemaker:{region}:{account}:training-session/{name}",
                group=group, base_model=base_model, output_path=output_path, request=request,
                registry=self.registry, latency_s=self._latency_s, pool=self._pool, shutdown=self._shutdown,
                gap_timeout_s=self._gap_timeout_s, hooks=self.hooks)
            self.hooks.session_created(session)
            self._sessions[name] = session
        session.start()
        logger.info("session %s created (base model %s %s, group %s)", name, *base_model, group.name)
        return session

    def find(self, name: str) -> Session | None:
        with self._lock:
            return self._sessions.get(name)

    def session(self, name: str) -> Session:
        session = self.find(name)
        if session is None:
            raise NotFound(f"Training session {name!r} does not exist")
        return session

    def sessions(self) -> list[Session]:
        with self._lock:
            return list(self._sessions.values())

    def stop_session(self, name: str) -> None:
        self.session(name).stop()

    def delete_session(self, name: str) -> None:
        session = self.session(name)
        if session.status not in ("Stopped", "Failed"):
            raise invalid(f"invalid session state transition from {session.status} to Deleting; "
                          "stop the session first")
        session.close()
        with self._lock:
            self._sessions.pop(session.name, None)
        logger.info("session %s deleted", name)

    # -- runtime operations -----------------------------------------------------
    def submit_training(self, name: str, seq: int, token: str | None, fingerprint: str, work: Work) -> Operation:
        session = self.session(name)
        work.check(self.registry)
        return session.submit_training(seq, token, fingerprint, work)

    def submit_sampling(self, name: str, work: Work) -> Operation:
        session = self.session(name)
        work.check(self.registry)
        return session.submit_sampling(work)

    def operation_state(self, name: str, op_id: str, training: bool) -> OperationState:
        return self.session(name).wait(op_id, training, self.poll_hold_s)

    def refused(self, name: str, seq: int, error: ServiceError) -> None:
        """A training submit of session ``name`` was refused: its sequence number is spent (see
        :meth:`Session.note_rejected`). Nothing to do if there is no such session."""
        session = self.find(name)
        if session is not None:
            session.note_rejected(seq, error)

    # -- the service ------------------------------------------------------------------
    def snapshot(self) -> list[dict[str, Any]]:
        return [s.snapshot() for s in self.sessions()]

    def close(self) -> None:
        self._shutdown.set()
        for session in self.sessions():
            session.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.registry.close()
