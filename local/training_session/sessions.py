"""Sessions and their operations: sequencing, idempotency, lifecycle, and the hooks that plug in from outside.

- training operations run one at a time on the session's own worker thread, strictly in ``sequenceNumber``
  order: an operation whose predecessor has not arrived waits for it (the session fails, naming the number, if
  it was refused or does not come), and a repeated ``clientToken`` is the same operation;
- sampling operations run concurrently on a shared pool.

Results are published the moment they exist, but a result is only *visible* (``Completed``) once the service's
latency has passed and the hooks let it be (the cost model: once the session's simulated GPUs have done the
work); see :meth:`Session.wait`.

:class:`Hooks` is the seam where what wraps or observes the backend plugs in from outside it: ``faults`` wraps
each operation's run, ``metering`` (the cost model) watches submits and runs and holds results back,
``sickness`` may rewrite a sampling operation's work. Nothing here imports them.
"""
from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

from local.training_session.exceptions import NotFound, ServiceError, invalid
from local.training_session.registry import PackageGroup, PackageRegistry
from local.training_session.toy.policy import Policy
from local.training_session.work import Billed, Outcome, Work

# The service's log has named this logger so since the backend was one module; its lines stay as they were.
logger = logging.getLogger("local.training_session.models")


# -- hooks: what wraps or observes the backend, from outside it ---------------------
#: A Runner computes one operation's outcome against a session (a Work's ``run``, as the hooks wrap it).
Runner = Callable[["Session"], Outcome]


class Hooks:
    """Called by a :class:`Session` at points of an operation's life; every default does nothing."""

    def session_created(self, session: Session) -> None:
        """A session was created, before any operation can reach it."""

    def sampling_work(self, session: Session, work: Work) -> Work:
        """The work a sampling operation will do; a hook may replace it (``sickness`` drives the toy sick)."""
        return work

    def wrap(self, session: Session, op: Operation, runner: Runner) -> Runner:
        """The runner as it will run (a fault injector may make it fail)."""
        return runner

    def submitted(self, session: Session, op: Operation, work: Work) -> None:
        """A new operation was accepted; under the session's lock, before it can run."""

    def ran(self, session: Session, op: Operation, outcome: Outcome | None) -> None:
        """It ran (``outcome`` None: it failed or was skipped), before its result is published."""

    @contextmanager
    def holding(self) -> Iterator[None]:
        """Around a result poll's wait for its operation."""
        yield

    def ready(self, session: Session, op: Operation, deadline: float, stopped: threading.Event) -> bool:
        """Block until ``op``'s finished result may be shown (True), or the wall-clock ``deadline`` passes."""
        return True


class HookChain(Hooks):
    """Several hooks, each called in turn (``wrap``: the first one wraps innermost)."""

    def __init__(self, hooks: Sequence[Hooks] = ()) -> None:
        self.hooks = tuple(hooks)

    def session_created(self, session: Session) -> None:
        for hook in self.hooks:
            hook.session_created(session)

    def sampling_work(self, session: Session, work: Work) -> Work:
        for hook in self.hooks:
            work = hook.sampling_work(session, work)
        return work

    def wrap(self, session: Session, op: Operation, runner: Runner) -> Runner:
        for hook in self.hooks:
            runner = hook.wrap(session, op, runner)
        return runner

    def submitted(self, session: Session, op: Operation, work: Work) -> None:
        for hook in self.hooks:
            hook.submitted(session, op, work)

    def ran(self, session: Session, op: Operation, outcome: Outcome | None) -> None:
        for hook in self.hooks:
            hook.ran(session, op, outcome)

    @contextmanager
    def holding(self) -> Iterator[None]:
        with ExitStack() as stack:
            for hook in self.hooks:
                stack.enter_context(hook.holding())
            yield

    def ready(self, session: Session, op: Operation, deadline: float, stopped: threading.Event) -> bool:
        return all(hook.ready(session, op, deadline, stopped) for hook in self.hooks)



# -- sessions and their operations ----------------------------------------------
TERMINAL = frozenset({"Completed", "Failed", "Skipped"})
#: How long operations may wait behind a sequence number that never arrives
#: (its submit was rejected or lost) before the session fails, naming it.
GAP_TIMEOUT_S = 30.0
#: Longest a result poll is held waiting for its operation (botocore's read timeout is 60 s).
POLL_HOLD_S = 20.0


@dataclass(frozen=True)
class OperationState:
    """What a result poll answers: the status, with the outcome once Completed or the error once it failed."""

    kind: str
    training: bool
    status: str
    outcome: Outcome | None = None
    error: str | None = None


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
        self.outcome: Outcome | None = None
        self.error: str | None = None
        self.not_before = 0.0  # monotonic time before which a finished result still reads InProgress
        self.submitted = time.monotonic()

    def state(self, now: float, ready: bool = True) -> OperationState:
        """What a poll answers at ``now``: a finished operation reads InProgress until the service's latency has
        passed and the hooks are ``ready`` to show it (the cost model: its simulated GPU time has passed)."""
        status = self.status
        if status in TERMINAL and (now < self.not_before or not ready):
            status = "InProgress"
        return OperationState(self.kind, self.training, status, self.outcome if status == "Completed" else None,
                              self.error if status in TERMINAL else None)


class Session:
    """One training session: its policy, its operations, its status and what it billed."""

    def __init__(self, *, name: str, arn: str, group: PackageGroup, base_model: tuple[str, str],
                 output_path: str, request: dict[str, Any], registry: PackageRegistry,
                 latency_s: Callable[[], float], pool: ThreadPoolExecutor, shutdown: threading.Event,
                 gap_timeout_s: float = GAP_TIMEOUT_S, hooks: Hooks | None = None) -> None:
        self.name, self.arn, self.group, self.registry = name, arn, group, registry
        self.base_model, self.output_path, self.request = base_model, output_path, request
        self._latency_s, self._pool, self._shutdown = latency_s, pool, shutdown
        self._gap_timeout_s = gap_timeout_s
        self._hooks = hooks or Hooks()
        # Trained by the worker only; Policy lets samplers read it meanwhile.
        # None once the session has ended, which frees its arrays.
        self.policy: Policy | None = Policy.base()
        self.status = "Running"
        self.error: str | None = None
        self.billed = Billed()
        self.created = self.modified = time.time()
        self._cond = threading.Condition()
        self._ops: dict[str, Operation] = {}
        self._by_seq: dict[int, Operation] = {}
        self._by_token: dict[str, Operation] = {}
        self._queued: dict[int, tuple[Operation, Runner]] = {}
        self._rejected: dict[int, str] = {}  # sequence numbers whose submit was refused, and why
        self._next_seq = 1
        self._closed = False

    def start(self) -> None:
        """Start the worker that runs the training operations."""
        threading.Thread(target=self._training_loop, name=f"ts-train-{self.name}", daemon=True).start()

    # -- weights ------------------------------------------------------------
    def current_policy(self) -> Policy:
        """The session's weights, for a runner."""
        policy = self.policy
        if policy is None:
            raise ServiceError("ConflictException", f"Training session {self.name!r} is {self.status}; "
                               "its weights were released", 409)
        return policy

    # -- submits ------------------------------------------------------------
    def submit_training(self, seq: int, token: str | None, fingerprint: str, work: Work) -> Operation:
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
            op = Operation(work.kind, training=True, seq=seq, token=token, fingerprint=fingerprint)
            self._rejected.pop(seq, None)  # a corrected resubmit fills the gap
            self._register(op)
            self._by_seq[seq] = op
            if token:
                self._by_token[token] = op
            self._queued[seq] = (op, self._hooks.wrap(self, op, work.run))
            self._hooks.submitted(self, op, work)
            self._cond.notify_all()
            return op

    def note_rejected(self, seq: int, error: ServiceError) -> None:
        """Remember a refused training submit: the SDK has spent its sequence number,
        so the operations behind it would otherwise wait for it in vain."""
        with self._cond:
            if seq not in self._by_seq:
                self._rejected[seq] = f"{error.code}: {error.message}"
                self._cond.notify_all()

    def submit_sampling(self, work: Work) -> Operation:
        with self._cond:
            self._require_running()
            work = self._hooks.sampling_work(self, work)
            op = Operation(work.kind, training=False)
            # Sampling overlaps, so its latency runs from the submit, not from a turn.
            op.not_before = time.monotonic() + self._latency_s()
            runner = self._hooks.wrap(self, op, work.run)
            self._hooks.submitted(self, op, work)
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
                op.not_before = time.monotonic() + self._latency_s()
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
                self._hooks.ran(self, op, None)
                self._finish(op, "Skipped", error=f"Training session {self.name!r} is {self.status}")
                return
            op.status = "InProgress"
        status, outcome, error = self._run(op, runner)
        self._hooks.ran(self, op, outcome)
        with self._cond:
            self._finish(op, status, outcome, error)
            if outcome is not None:
                self.billed += outcome.billed

    def _run(self, op: Operation, runner: Runner) -> tuple[str, Outcome | None, str | None]:
        try:
            return "Completed", runner(self), None
        except ServiceError as e:
            error = f"{e.code}: {e.message}"
        except Exception as e:  # a bug in the local model: fail the op, keep serving
            logger.exception("session %s: operation %s (%s) crashed", self.name, op.id, op.kind)
            error = f"InternalServerError: {type(e).__name__}: {e}"
        logger.warning("session %s: %s operation %s%s failed: %s", self.name, op.kind, op.id,
                       f" (sequence number {op.seq})" if op.seq is not None else "", error)
        return "Failed", None, error

    def _finish(self, op: Operation, status: str, outcome: Outcome | None = None,
                error: str | None = None) -> None:
        op.status, op.outcome, op.error = status, outcome, error
        self._cond.notify_all()

    def operations(self) -> list[Operation]:
        """Every operation submitted so far, in submit order (for tests and diagnostics)."""
        with self._cond:
            return list(self._ops.values())

    # -- results ------------------------------------------------------------
    def wait(self, op_id: str, training: bool, hold_s: float) -> OperationState:
        """An operation's state, holding the request up to ``hold_s`` for it to finish.

        The SDK polls at once after a submit and then every 2 s; answering
        InProgress would cost every operation 2 s. Holding the first poll until
        the result is visible (latency included) costs the client just the
        operation's own time.
        """
        deadline = time.monotonic() + hold_s
        with self._cond, self._hooks.holding():
            op = self._ops.get(op_id)
            if op is None or op.training != training:
                kind = "training" if training else "sampling"
                raise NotFound(f"No {kind} operation {op_id!r} in training session {self.name!r}")
            while op.status not in TERMINAL and not self._closed:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
        with self._hooks.holding():
            self._shutdown.wait(max(0.0, min(op.not_before, deadline) - time.monotonic()))
            ready = self._hooks.ready(self, op, deadline, self._shutdown)
        with self._cond:
            return op.state(time.monotonic(), ready)

    # -- lifecycle ----------------------------------------------------------
    def stop(self) -> None:
        with self._cond:
            if self.status != "Running":
                # Exactly the message the SDK's stop_session absorbs.
                raise invalid(f"invalid session state transition from {self.status} to Stopping")
            self._end("Stopped", None)

    def fail(self, reason: str) -> None:
        """The session dies (an injected fault): queued operations are skipped, later ones refused."""
        with self._cond:
            if self.status == "Running":
                self._end("Failed", reason)

    def _end(self, status: str, error: str | None) -> None:
        """Move to a terminal status; queued operations will never run."""
        self.status, self.error, self.modified = status, error, time.time()
        skipped = len(self._queued)
        for op, _ in self._queued.values():
            self._finish(op, "Skipped", error=f"Training session {self.name!r} is {status}"
                         + (f" ({error})" if error else ""))
        self._queued.clear()
        self._cond.notify_all()
        logger.log(logging.INFO if status == "Stopped" else logging.WARNING, "session %s %s%s after %d operations%s",
                   self.name, status.lower(), f" ({error})" if error else "", len(self._ops),
                   f"; {skipped} queued operations skipped" if skipped else "")

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
                "BillableTokenUsage": {"PrefillTokenCount": self.billed.prefill,
                                       "SampleTokenCount": self.billed.sample,
                                       "TrainingTokenCount": self.billed.training},
                "RoleArn": req.get("RoleArn"), "LoraConfig": req.get("LoraConfig"),
                "ModelConfig": req.get("ModelConfig"), "OutputConfig": req.get("OutputConfig"),
                "VpcConfig": req.get("VpcConfig"),
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

