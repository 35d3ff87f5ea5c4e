"""The backend of the local service: its state and behaviour, as moto's ``models.py``.

Knows nothing of HTTP or wire shapes, and validates no request (``responses``
does, before calling here). Three parts:

* the **model package registry**: groups, versions, their weights on disk and
  approval status; ``saveState`` / ``saveWeights`` register a version here, as
  the real service does in the session's group;
* **sessions and their operations**: sequencing, idempotency, lifecycle. An
  operation arrives as a :data:`Runner`, a closure ``responses`` built from the
  request, which a session runs at the right time:

  - training operations run one at a time on the session's own worker thread,
    strictly in ``sequenceNumber`` order: an operation whose predecessor has not
    arrived waits for it (the session fails, naming the number, if it was
    refused or does not come), and a repeated ``clientToken`` is the same operation;
  - sampling operations run concurrently on a shared pool.

  Results are published the moment they exist, but a result is only *visible*
  (``Completed``) once the service's latency has passed and, with the cost model
  on (``costs``), once the session's simulated GPUs have done the work; see
  :meth:`Session.wait`;
* the :class:`TrainingSessionBackend` holding both, the fault injector that
  wraps every runner it dispatches, and the :class:`RequestLog` of what was asked.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import re
import shutil
import tempfile
import threading
import time
import uuid
from collections import Counter, OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from local.training_session.costs import Costs, Gpus, Job, VirtualClock, WallClock, request_tokens
from local.training_session.toy.policy import Policy
from steps.platform import files

if TYPE_CHECKING:  # faults wraps this module's runners, so it imports this module
    from local.training_session.faults import FaultInjector

logger = logging.getLogger(__name__)


# -- errors ---------------------------------------------------------------------
class ServiceError(Exception):
    """An error answered on the wire: an error code, an HTTP status and a message."""

    def __init__(self, code: str, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status


def invalid(message: str) -> ServiceError:
    return ServiceError("ValidationException", message, 400)


# -- the model package registry -------------------------------------------------
_GROUP_ARN = re.compile(r"^arn:(?P<partition>[\w-]+):sagemaker:(?P<region>[\w-]+):(?P<account>\d{12}):"
                        r"model-package-group/(?P<name>[A-Za-z0-9][A-Za-z0-9-]{0,62})$")
#: Policies kept loaded for sampling: the current sampler and a few before it.
LOADED_POLICIES = 3


@dataclass(frozen=True)
class PackageGroup:
    name: str
    arn: str
    created: float
    description: str = ""

    def describe(self) -> dict[str, Any]:
        return {"ModelPackageGroupName": self.name, "ModelPackageGroupArn": self.arn,
                "ModelPackageGroupDescription": self.description, "CreationTime": self.created,
                "CreatedBy": {}, "ModelPackageGroupStatus": "Completed"}


@dataclass(frozen=True)
class ModelPackage:
    arn: str
    group_name: str
    version: int
    created: float
    description: str
    is_checkpoint: bool  # saveState (weights + optimizer) vs saveWeights (weights only)
    base_model_name: str
    base_model_version: str
    session_name: str
    s3_uri: str
    approval_status: str = "PendingManualApproval"
    approval_description: str = ""
    modified: float = 0.0
    # UpdateModelPackage's CustomerMetadataProperties (the approve step's figures), beside the session's name.
    customer_metadata: dict[str, str] = dataclasses.field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        return {"ModelPackageName": self.group_name, "ModelPackageGroupName": self.group_name,
                "ModelPackageVersion": self.version, "ModelPackageArn": self.arn,
                "ModelPackageDescription": self.description, "CreationTime": self.created,
                "ModelPackageStatus": "Completed", "ModelApprovalStatus": self.approval_status}

    def describe(self) -> dict[str, Any]:
        """DescribeModelPackage: what the SDK reads (base model, IsCheckpoint, location)."""
        container = {
            "Image": "local-training-session",
            "IsCheckpoint": self.is_checkpoint,
            "BaseModel": {"HubContentName": self.base_model_name,
                          "HubContentVersion": self.base_model_version},
            "ModelDataSource": {"S3DataSource": {"S3Uri": self.s3_uri, "S3DataType": "S3Prefix",
                                                 "CompressionType": "None"}},
        }
        out = {**self.summary(), "InferenceSpecification": {"Containers": [container]},
               "ModelPackageStatusDetails": {"ValidationStatuses": [], "ImageScanStatuses": []},
               "LastModifiedTime": self.modified or self.created,
               "CustomerMetadataProperties": {"TrainingSessionName": self.session_name, **self.customer_metadata}}
        if self.approval_description:
            out["ApprovalDescription"] = self.approval_description
        return out


def group_name_of(name_or_arn: str) -> str:
    """A group's name from its name or ARN (botocore's model has checked which it is)."""
    return name_or_arn.rsplit("/", 1)[-1]


def parse_group_arn(arn: str) -> re.Match[str]:
    """Account and name of a group ARN. botocore's model allows any non-blank name after
    ``model-package-group/``; a group that can exist has a name as CreateModelPackageGroup's."""
    match = _GROUP_ARN.match(arn)
    if not match:
        raise invalid(f"ModelPackageGroupArn {arn!r} must name a group that can exist: "
                      "arn:aws:sagemaker:REGION:ACCOUNT:model-package-group/NAME, NAME 1-63 letters, "
                      "digits and hyphens")
    return match


class PackageRegistry:
    """Thread-safe store of groups and packages, persisted under a directory.

    Weights live on disk (an ``.npz`` per package beside its metadata JSON), not in
    memory: a DAPO run saves sampler weights every step, and a few MB per step adds
    up. Only the policies recently sampled from are kept loaded. Without a state
    directory the files go to a temporary one removed at :meth:`close`; with one, a
    restarted service still serves the packages an earlier one saved.
    """

    def __init__(self, state_dir: Path | None = None) -> None:
        self._lock = threading.Lock()
        self._groups: dict[str, PackageGroup] = {}
        self._packages: dict[str, ModelPackage] = {}
        self._last_version: dict[str, int] = {}  # per group; never reused, even after a delete
        self._policies: OrderedDict[str, Policy] = OrderedDict()  # LRU
        self._temporary = state_dir is None
        self._dir = Path(tempfile.mkdtemp(prefix="local-ts-")) if state_dir is None else Path(state_dir)
        self._load()

    def close(self) -> None:
        """Remove the weights if they were only ever meant to last this run."""
        if self._temporary:
            shutil.rmtree(self._dir, ignore_errors=True)

    # -- groups -------------------------------------------------------------
    def create_group(self, name: str, region: str, account: str, description: str = "") -> PackageGroup:
        with self._lock:
            if name in self._groups:
                raise invalid(f"Model Package Group {name!r} already exists")
            arn = f"arn:aws:sagemaker:{region}:{account}:model-package-group/{name}"
            return self._put_group(PackageGroup(name, arn, time.time(), description))

    def ensure_group(self, arn: str) -> PackageGroup:
        """The group an ARN names, created on first use (the local service needs no setup)."""
        name = parse_group_arn(arn)["name"]
        with self._lock:
            return self._groups.get(name) or self._put_group(PackageGroup(name, arn, time.time()))

    def group(self, name_or_arn: str) -> PackageGroup:
        name = group_name_of(name_or_arn)
        with self._lock:
            if name not in self._groups:
                raise invalid(f"Model Package Group {name!r} does not exist")
            return self._groups[name]

    def _put_group(self, group: PackageGroup) -> PackageGroup:
        self._groups[group.name] = group
        self._write_json(self._dir / "groups" / f"{group.name}.json", dataclasses.asdict(group))
        return group

    # -- packages -----------------------------------------------------------
    def add(self, group: PackageGroup, weights: dict[str, np.ndarray], *, is_checkpoint: bool,
            description: str, base_model: tuple[str, str], session_name: str, s3_prefix: str) -> ModelPackage:
        """Register ``weights`` as the group's next version."""
        with self._lock:
            version = self._last_version.get(group.name, 0) + 1
            self._last_version[group.name] = version
            arn = f"{group.arn.replace(':model-package-group/', ':model-package/')}/{version}"
            package = ModelPackage(
                arn=arn, group_name=group.name, version=version, created=time.time(),
                description=description or ("training state" if is_checkpoint else "sampler weights"),
                is_checkpoint=is_checkpoint, base_model_name=base_model[0],
                base_model_version=base_model[1], session_name=session_name,
                s3_uri=f"{s3_prefix.rstrip('/')}/{group.name}/{version}/")
            np.savez(self._package_path(package, ".npz"), **weights)
            self._write_meta(package)
            self._packages[arn] = package
            return package

    def get(self, arn: str) -> ModelPackage:
        with self._lock:
            if arn not in self._packages:
                raise invalid(f"Model package {arn!r} does not exist")
            return self._packages[arn]

    def list(self, group_name_or_arn: str) -> list[ModelPackage]:
        """A group's packages, oldest first (callers sort and page)."""
        name = group_name_of(group_name_or_arn)
        with self._lock:
            return sorted((p for p in self._packages.values() if p.group_name == name),
                          key=lambda p: (p.created, p.version))

    def update_approval(self, arn: str, status: str | None, description: str | None,
                        metadata: dict[str, str] | None = None) -> ModelPackage:
        """SageMaker's semantics: what a request omits is kept; metadata keys are added or replaced."""
        with self._lock:
            if arn not in self._packages:
                raise invalid(f"Model package {arn!r} does not exist")
            old = self._packages[arn]
            new = dataclasses.replace(
                old, approval_status=status or old.approval_status,
                approval_description=old.approval_description if description is None else description,
                customer_metadata={**old.customer_metadata, **(metadata or {})}, modified=time.time())
            self._packages[arn] = new
            self._write_meta(new)
            return new

    def delete(self, arn: str) -> None:
        with self._lock:
            package = self._packages.pop(arn, None)
            if package is None:
                raise invalid(f"Model package {arn!r} does not exist")
            self._policies.pop(arn, None)
            for suffix in (".json", ".npz"):
                self._package_path(package, suffix).unlink(missing_ok=True)

    def weights(self, arn: str) -> dict[str, np.ndarray]:
        """The arrays saved with the package (read from disk each time: loads are rare)."""
        path = self._package_path(self.get(arn), ".npz")
        with np.load(path) as data:
            return {k: data[k] for k in data.files}

    def policy(self, arn: str) -> Policy:
        """The package's weights as a Policy, kept loaded while it is among the latest used."""
        with self._lock:
            if arn in self._policies:
                self._policies.move_to_end(arn)
                return self._policies[arn]
        policy = Policy.from_state_dict(self.weights(arn))
        with self._lock:
            self._policies[arn] = policy
            while len(self._policies) > LOADED_POLICIES:
                self._policies.popitem(last=False)
        return policy

    # -- persistence ----------------------------------------------------------
    def _package_path(self, package: ModelPackage, suffix: str) -> Path:
        path = self._dir / "packages" / package.group_name / f"{package.version}{suffix}"
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def _write_meta(self, package: ModelPackage) -> None:
        self._write_json(self._package_path(package, ".json"), dataclasses.asdict(package))

    @staticmethod
    def _write_json(path: Path, payload: dict[str, Any]) -> None:
        files.write_json(path, payload)  # atomic: a crash never leaves half a file

    def _load(self) -> None:
        for path in sorted((self._dir / "groups").glob("*.json")):
            group = PackageGroup(**json.loads(path.read_text()))
            self._groups[group.name] = group
        for path in sorted((self._dir / "packages").glob("*/*.json")):
            package = ModelPackage(**json.loads(path.read_text()))
            self._packages[package.arn] = package
            self._last_version[package.group_name] = max(package.version,
                                                         self._last_version.get(package.group_name, 0))


# -- sessions and their operations ----------------------------------------------
TERMINAL = frozenset({"Completed", "Failed", "Skipped"})
#: How long operations may wait behind a sequence number that never arrives
#: (its submit was rejected or lost) before the session fails, naming it.
GAP_TIMEOUT_S = 30.0
#: Longest a result poll is held waiting for its operation (botocore's read timeout is 60 s).
POLL_HOLD_S = 20.0
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
        self.cost: Job | None = None  # its work on the simulated GPUs, with the cost model on
        self.submitted = time.monotonic()

    def view(self, now: float, simulated_done: bool = True) -> dict[str, Any]:
        """Get*OperationResult body. ``operationResult`` only once Completed (botocore
        rejects an empty union), ``errorDetails`` only on a failure."""
        status = self.status
        if status in TERMINAL and (now < self.not_before or not simulated_done):
            status = "InProgress"  # the service's latency, or its simulated GPU time, not yet served
        body: dict[str, Any] = {"status": status}
        if status == "Completed":
            body["operationResult"] = self.result
        elif status in TERMINAL and self.error:
            body["errorDetails"] = self.error
        return body


class Session:
    """One training session: its policy, its operations and its status."""

    def __init__(self, *, name: str, arn: str, group: PackageGroup, base_model: tuple[str, str],
                 output_path: str, request: dict[str, Any], latency_s: Callable[[], float],
                 pool: ThreadPoolExecutor, shutdown: threading.Event, gap_timeout_s: float = GAP_TIMEOUT_S,
                 costs: Costs | None = None, virtual_clock: VirtualClock | None = None) -> None:
        self.name, self.arn, self.group = name, arn, group
        self.base_model, self.output_path, self.request = base_model, output_path, request
        self._latency_s, self._pool, self._shutdown = latency_s, pool, shutdown
        self._gap_timeout_s = gap_timeout_s
        # The session's own GPUs in simulated time, with the cost model on (it keeps the settings of its creation).
        self._virtual_clock = virtual_clock or VirtualClock()  # counts this session's held polls either way
        self.gpus = None
        if costs is not None and costs.enabled:
            self.gpus = Gpus(costs, self._virtual_clock if costs.virtual_time else WallClock(costs.time_scale))
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
                        runner: Runner, tokens: int = 0) -> Operation:
        """``tokens``: what the operation's cost is proportional to (``costs.request_tokens``)."""
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
            if self.gpus is not None:
                op.cost = self.gpus.training_arrives(kind, tokens)
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

    def submit_sampling(self, kind: str, runner: Runner, tokens: int = 0) -> Operation:
        """``tokens``: the prompt's, for the cost model's prefill."""
        with self._cond:
            self._require_running()
            op = Operation(kind, training=False)
            # Sampling overlaps, so its latency runs from the submit, not from a turn.
            op.not_before = time.monotonic() + self._latency_s()
            if self.gpus is not None and kind != "loadWeightsForSampling":
                op.cost = self.gpus.sampling_arrives(tokens)
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
                self._finish(op, "Skipped", error=f"Training session {self.name!r} is {self.status}")
                self._sampled(op, None)
                return
            op.status = "InProgress"
        status, result, error = self._run(op, runner)
        self._sampled(op, result)
        with self._cond:
            self._finish(op, status, result, error)

    def _sampled(self, op: Operation, result: dict[str, Any] | None) -> None:
        """Hand a sampling operation's decode work (its generated lengths) to the simulated GPUs."""
        if op.cost is not None and not op.training and self.gpus is not None:
            sequences = (result or {}).get("sample", {}).get("sequences", [])
            self.gpus.sampled(op.cost, [len(seq["tokens"]) for seq in sequences])

    def _run(self, op: Operation, runner: Runner) -> tuple[str, dict[str, Any] | None, str | None]:
        try:
            return "Completed", runner(self), None
        except ServiceError as e:
            return "Failed", None, f"{e.code}: {e.message}"
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
        with self._cond, self._virtual_clock.holding():
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
        with self._virtual_clock.holding():
            self._shutdown.wait(max(0.0, min(op.not_before, deadline) - time.monotonic()))
            simulated_done = op.cost is None or self.gpus is None or self.gpus.wait(op.cost, deadline, self._shutdown)
        with self._cond:
            return op.view(time.monotonic(), simulated_done)

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


# -- what was asked ---------------------------------------------------------------
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


# -- the backend ------------------------------------------------------------------
class TrainingSessionBackend:
    """Every session, the model package registry, the fault injector and the request log."""

    def __init__(self, injector: FaultInjector, state_dir: Path | None = None, sample_workers: int = 8,
                 gap_timeout_s: float = GAP_TIMEOUT_S, poll_hold_s: float = POLL_HOLD_S,
                 costs: Costs | None = None) -> None:
        self.injector = injector
        self.costs = costs or Costs()  # for sessions created from now on
        self.clock = VirtualClock()  # the simulated time of sessions with costs.virtual_time
        self.registry = PackageRegistry(state_dir)
        self.requests = RequestLog()
        self.poll_hold_s = poll_hold_s
        self._gap_timeout_s = gap_timeout_s
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
                latency_s=lambda: self.injector.latency_s, pool=self._pool, shutdown=self._shutdown,
                gap_timeout_s=self._gap_timeout_s, costs=self.costs, virtual_clock=self.clock)
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

    def submit_training(self, session: Session, seq: int, token: str | None, fingerprint: str, kind: str,
                        runner: Runner, config: dict[str, Any]) -> Operation:
        """``config``: the validated operationConfig member, for the cost model."""
        return session.submit_training(seq, token, fingerprint, kind, self.injector.wrap(runner, training=True),
                                       request_tokens(kind, config))

    def submit_sampling(self, session: Session, kind: str, runner: Runner, config: dict[str, Any]) -> Operation:
        return session.submit_sampling(kind, self.injector.wrap(runner, training=False), request_tokens(kind, config))

    def cost_snapshot(self) -> dict[str, Any]:
        """For ``GET /_admin/costs``: the settings new sessions get, and each costed session's GPUs so far."""
        return {"costs": self.costs.to_dict(), "virtual_clock": self.clock.snapshot(),
                "sessions": {s.name: s.gpus.snapshot() for s in self.sessions() if s.gpus is not None}}

    def snapshot(self) -> list[dict[str, Any]]:
        return [s.snapshot() for s in self.sessions()]

    def close(self) -> None:
        self._shutdown.set()
        for session in self.sessions():
            session.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.registry.close()
