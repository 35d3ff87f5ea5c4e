"""Sessions and their operations: sequencing, idempotency, lifecycle, fault hooks.

Knows nothing of HTTP or wire shapes. An operation arrives as a ``Runner``, a
closure :mod:`runtime` built (and validated) from the request, which this
module runs at the right time:

* training operations run one at a time on the session's own worker thread,
  strictly in ``sequenceNumber`` order: an operation whose predecessor has not
  arrived waits for it (the session fails, naming the number, if it was
  refused or does not come), and a repeated ``clientToken`` is the same operation;
* sampling operations run concurrently on a shared pool.

Results are published the moment they exist, but a result is only *visible*
(``Completed``) once its injected latency has passed; see :meth:`Session.wait`.
"""
from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

from local.training_session.faults import Faults, FaultInjector
from local.training_session.policy import Policy
from local.training_session.registry import PackageGroup, PackageRegistry
from local.training_session.wire import ServiceError, invalid

logger = logging.getLogger(__name__)

TERMINAL = frozenset({"Completed", "Failed", "Skipped"})
#: How long operations may wait behind a sequence number that never arrives
#: (its submit was rejected or lost) before the session fails, naming it.
GAP_TIMEOUT_S = 30.0
#: A Runner computes one operation's ``operationResult`` against a session.
Runner = Callable[["Session"], dict[str, Any]]


class Operation:
    """One runtime operation's lifecycle; mutated only under its session's lock."""

    def __init__(self, kind: str, *, training: bool, seq: int | None = None,
                 token: str | None = None, fingerprint: str = "") -> None:
        self.id = str(uuid.uuid4())
        self.kind = kind
        self.training = training
        self.seq = seq
        self.token = token
        self.fingerprint = fingerprint  # tells a retry from a different request reusing a token
        self.status = "Pending"
        self.result: dict[str, Any] | None = None
        self.error: str | None = None
        self.not_before = 0.0  # monotonic time before which a finished result still reads InProgress
        self.submitted = time.monotonic()

    def view(self, now: float) -> dict[str, Any]:
        """Get*OperationResult body. ``operationResult`` only once Completed (botocore
        rejects an empty union), ``errorDetails`` only on a failure."""
        status = self.status
        if status in TERMINAL and now < self.not_before:
            status = "InProgress"  # injected latency not yet served
        body: dict[str, Any] = {"status": status}
        if status == "Completed":
            body["operationResult"] = self.result
        elif status in TERMINAL and self.error:
            body["errorDetails"] = self.error
        return body


class Session:
    """One training session: its policy, its operations and its status."""

    def __init__(self, *, name: str, arn: str, group: PackageGroup, base_model: tuple[str, str],
                 output_path: str, request: dict[str, Any], injector: FaultInjector,
                 pool: ThreadPoolExecutor, shutdown: threading.Event, gap_timeout_s: float = GAP_TIMEOUT_S) -> None:
        self.name, self.arn, self.group = name, arn, group
        self.base_model, self.output_path, self.request = base_model, output_path, request
        self._injector, self._pool, self._shutdown = injector, pool, shutdown
        self._gap_timeout_s = gap_timeout_s
        # Trained by the worker only; Policy lets samplers read it meanwhile.
        # None once the session has ended, which frees its arrays.
        self.policy: Policy | None = Policy.base()
        self.status = "Running"
        self.error: str | None = None
        self.created = self.modified = time.time()
        self._cond = threading.Condition()
        self._ops: dict[str, Operation] = {}
        self._by_seq: dict[int, Operation] = {}
        self._by_token: dict[str, Operation] = {}
        self._queued: dict[int, tuple[Operation, Runner]] = {}
        self._rejected: dict[int, str] = {}  # sequence numbers whose submit was refused, and why
        self._next_seq = 1
        self._ops_run = 0
        self._closed = False
        threading.Thread(target=self._training_loop, name=f"ts-train-{name}", daemon=True).start()

    # -- weights ------------------------------------------------------------
    def current_policy(self) -> Policy:
        """The session's weights, for a runner."""
        policy = self.policy
        if policy is None:
            raise ServiceError("ConflictException", f"Training session {self.name!r} is {self.status}; "
                               "its weights were released", 409)
        return policy

    # -- submits ------------------------------------------------------------
    def submit_training(self, seq: int, token: str | None, fingerprint: str, kind: str,
                        runner: Runner) -> Operation:
        with self._cond:
            self._require_running()
            if token and token in self._by_token:
                op = self._by_token[token]
                if op.fingerprint != fingerprint:
                    raise ServiceError("ConflictException", f"clientToken {token!r} was already used "
                                       f"by operation {op.id} with different parameters", 409)
                return op  # a retry: same operation, not applied twice
            if seq in self._by_seq:
                raise invalid(f"sequenceNumber {seq} was already used by operation "
                              f"{self._by_seq[seq].id} ({self._by_seq[seq].kind}); each "
                              "operation needs the next sequence number")
            op = Operation(kind, training=True, seq=seq, token=token, fingerprint=fingerprint)
            self._rejected.pop(seq, None)  # a corrected resubmit fills the gap
            self._register(op)
            self._by_seq[seq] = op
            if token:
                self._by_token[token] = op
            self._queued[seq] = (op, runner)
            self._cond.notify_all()
            return op

    def note_rejected(self, seq: int, error: ServiceError) -> None:
        """Remember a refused training submit: the SDK has spent its sequence number,
        so the operations behind it would otherwise wait for it in vain."""
        with self._cond:
            if seq not in self._by_seq:
                self._rejected[seq] = f"{error.code}: {error.message}"
                self._cond.notify_all()

    def submit_sampling(self, kind: str, runner: Runner) -> Operation:
        with self._cond:
            self._require_running()
            op = Operation(kind, training=False)
            # Sampling overlaps, so its latency runs from the submit, not from a turn.
            op.not_before = time.monotonic() + self._injector.latency_s
            self._register(op)
        self._pool.submit(self._execute, op, runner)
        return op

    def _register(self, op: Operation) -> None:
        self._ops[op.id] = op
        self.modified = time.time()

    def _require_running(self) -> None:
        if self.status != "Running":
            reason = f" ({self.error})" if self.error else ""
            raise ServiceError("ConflictException", f"Training session {self.name!r} is {self.status}"
                               f"{reason}; it accepts operations only while Running", 409)

    # -- execution ----------------------------------------------------------
    def _training_loop(self) -> None:
        while True:
            with self._cond:
                while not self._closed and self.status == "Running" and self._next_seq not in self._queued:
                    self._wait_for_next_seq()
                if self._closed or self.status != "Running":
                    self.policy = None  # nothing will train it again
                    return
                op, runner = self._queued.pop(self._next_seq)
                self._next_seq += 1
                # Training ops serialise, so each one's latency starts at its turn
                # and the next one waits it out.
                op.not_before = time.monotonic() + self._injector.latency_s
            self._execute(op, runner)
            self._shutdown.wait(max(0.0, op.not_before - time.monotonic()))

    def _wait_for_next_seq(self) -> None:
        """Wait for the next sequence number; fail the session if it will not come.

        The SDK spends a sequence number on a submit the service refuses, so
        without this one rejected operation would leave every later one pending
        forever. A refused number fails the session at once, naming the reason;
        one that is simply missing (a lost request) after ``gap_timeout_s``.
        """
        if not self._queued:
            self._cond.wait()
            return
        if self._next_seq in self._rejected:
            self._end("Failed", f"sequence number {self._next_seq} was rejected at submit "
                                f"({self._rejected[self._next_seq]}), so operations {sorted(self._queued)} "
                                "behind it cannot run")
            return
        waited_since = min(op.submitted for op, _ in self._queued.values())
        remaining = waited_since + self._gap_timeout_s - time.monotonic()
        if remaining > 0:
            self._cond.wait(remaining)
            return
        self._end("Failed", f"sequence number {self._next_seq} never arrived within {self._gap_timeout_s:g} s "
                            f"(its submit was rejected or lost), so operations {sorted(self._queued)} "
                            "behind it cannot run")

    def _execute(self, op: Operation, runner: Runner) -> None:
        with self._cond:
            if self.status != "Running":
                self._finish(op, "Skipped", error=f"Training session {self.name!r} is {self.status}")
                return
            op.status = "InProgress"
        status, result, error = self._run(op, runner)
        with self._cond:
            self._finish(op, status, result, error)
            self._ops_run += 1
            if self._injector.session_dies_after(self._ops_run) and self.status == "Running":
                self._end("Failed", f"injected fault: session failed after {self._ops_run} operations")

    def _run(self, op: Operation, runner: Runner) -> tuple[str, dict[str, Any] | None, str | None]:
        if self._injector.fail_operation(op.training):
            return "Failed", None, "InternalServerError: injected operation failure"
        try:
            return "Completed", runner(self), None
        except ServiceError as e:
            return "Failed", None, f"{e.code}: {e.message}"
        except ValueError as e:  # the Policy's LossInputError and friends: bad inputs
            return "Failed", None, f"ValidationException: {e}"
        except Exception as e:  # a bug in the local model: fail the op, keep serving
            logger.exception("operation %s (%s) crashed", op.id, op.kind)
            return "Failed", None, f"InternalServerError: {type(e).__name__}: {e}"

    def _finish(self, op: Operation, status: str, result: dict[str, Any] | None = None,
                error: str | None = None) -> None:
        op.status, op.result, op.error = status, result, error
        self._cond.notify_all()

    def operations(self) -> list[Operation]:
        """Every operation submitted so far, in submit order (for tests and diagnostics)."""
        with self._cond:
            return list(self._ops.values())

    # -- results ------------------------------------------------------------
    def wait(self, op_id: str, training: bool, hold_s: float) -> dict[str, Any]:
        """An operation's result, holding the request up to ``hold_s`` for it to finish.

        The SDK polls at once after a submit and then every 2 s; answering
        InProgress would cost every operation 2 s. Holding the first poll until
        the result is visible (latency included) costs the client just the
        operation's own time.
        """
        deadline = time.monotonic() + hold_s
        with self._cond:
            op = self._ops.get(op_id)
            if op is None or op.training != training:
                kind = "training" if training else "sampling"
                raise ServiceError("ResourceNotFoundException", f"No {kind} operation {op_id!r} "
                                   f"in training session {self.name!r}", 404)
            while op.status not in TERMINAL and not self._closed:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
        self._shutdown.wait(max(0.0, min(op.not_before, deadline) - time.monotonic()))
        with self._cond:
            return op.view(time.monotonic())

    # -- lifecycle ----------------------------------------------------------
    def stop(self) -> None:
        with self._cond:
            if self.status != "Running":
                # Exactly the message the SDK's stop_session absorbs.
                raise invalid(f"invalid session state transition from {self.status} to Stopping")
            self._end("Stopped", None)

    def _end(self, status: str, error: str | None) -> None:
        """Move to a terminal status; queued operations will never run."""
        self.status, self.error, self.modified = status, error, time.time()
        for op, _ in self._queued.values():
            self._finish(op, "Skipped", error=f"Training session {self.name!r} is {status}"
                         + (f" ({error})" if error else ""))
        self._queued.clear()
        self._cond.notify_all()

    def close(self) -> None:
        """Service shutdown: release the worker and any held polls."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def detail(self) -> dict[str, Any]:
        """DescribeTrainingSession's TrainingSessionDetail."""
        req = self.request
        with self._cond:
            out: dict[str, Any] = {
                "TrainingSessionArn": self.arn, "TrainingSessionName": self.name,
                "TrainingSessionStatus": self.status, "ModelPackageGroupArn": self.group.arn,
                "CreationTime": self.created, "LastModifiedTime": self.modified,
                "LastReceivedSequenceNumber": max(self._by_seq, default=0),
                "RoleArn": req.get("RoleArn"), "LoraConfig": req.get("LoraConfig"),
                "ModelConfig": req.get("ModelConfig"), "OutputConfig": req.get("OutputConfig"),
            }
            if self.error:
                out["ErrorDetails"] = self.error
        return {k: v for k, v in out.items() if v is not None}

    def summary(self) -> dict[str, Any]:
        return {"TrainingSessionArn": self.arn, "TrainingSessionStatus": self.status,
                "CreationTime": self.created, "LastModifiedTime": self.modified}

    def snapshot(self) -> dict[str, Any]:
        """For ``GET /_admin/sessions``: status and operation counts by status."""
        with self._cond:
            counts = Counter(op.status for op in self._ops.values())
            return {"name": self.name, "status": self.status, "error": self.error,
                    "operations": len(self._ops), "by_status": dict(counts),
                    "next_sequence_number": self._next_seq}


class ServiceState:
    """Every session, the model package registry and the fault settings."""

    def __init__(self, faults: Faults | None = None, state_dir: Path | None = None,
                 sample_workers: int = 8, gap_timeout_s: float = GAP_TIMEOUT_S) -> None:
        self.injector = FaultInjector(faults)
        self._gap_timeout_s = gap_timeout_s
        self.registry = PackageRegistry(state_dir)
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()
        self._shutdown = threading.Event()
        self._pool = ThreadPoolExecutor(sample_workers, thread_name_prefix="ts-sample")

    def create_session(self, *, name: str, region: str, account: str, group: PackageGroup,
                       base_model: tuple[str, str], output_path: str, request: dict[str, Any]) -> Session:
        with self._lock:
            if name in self._sessions:
                raise ServiceError("ResourceInUse", f"Training session {name!r} already exists")
            session = Session(
                name=name, arn=f"arn:aws:sagemaker:{region}:{account}:training-session/{name}",
                group=group, base_model=base_model, output_path=output_path, request=request,
                injector=self.injector, pool=self._pool, shutdown=self._shutdown,
                gap_timeout_s=self._gap_timeout_s)
            self._sessions[name] = session
            return session

    def find(self, name: str) -> Session | None:
        with self._lock:
            return self._sessions.get(name)

    def sessions(self) -> list[Session]:
        with self._lock:
            return list(self._sessions.values())

    def delete_session(self, session: Session) -> None:
        if session.status not in ("Stopped", "Failed"):
            raise invalid(f"invalid session state transition from {session.status} to Deleting; "
                          "stop the session first")
        session.close()
        with self._lock:
            self._sessions.pop(session.name, None)

    def snapshot(self) -> list[dict[str, Any]]:
        return [s.snapshot() for s in self.sessions()]

    def close(self) -> None:
        self._shutdown.set()
        for session in self.sessions():
            session.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.registry.close()
