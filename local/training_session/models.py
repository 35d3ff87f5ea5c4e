"""The backend of the local service: its state and the operations' effects, as moto's ``models.py``.

It knows nothing of HTTP. ``responses`` parses and validates every request before
calling here, and shapes the answer: runtime results from the :class:`Outcome` an
operation returns; the control plane's descriptions from the objects' ``describe()``,
``summary()`` and ``detail()`` (moto's ``response_object``). Four parts:

* the **model package registry**: groups, versions, their weights on disk and
  approval status; ``saveState`` / ``saveWeights`` register a version here, as
  the real service does in the session's group;
* **the operations' work**: what each runtime operation does to a session and its
  toy model (a :class:`Work` that ``responses`` builds from a validated request), what
  it returns (an :class:`Outcome`) and what it bills (:class:`Billed`, the session's
  ``BillableTokenUsage``);
* **sessions and their operations**: sequencing, idempotency, lifecycle:

  - training operations run one at a time on the session's own worker thread,
    strictly in ``sequenceNumber`` order: an operation whose predecessor has not
    arrived waits for it (the session fails, naming the number, if it was
    refused or does not come), and a repeated ``clientToken`` is the same operation;
  - sampling operations run concurrently on a shared pool.

  Results are published the moment they exist, but a result is only *visible*
  (``Completed``) once the service's latency has passed and the hooks let it be
  (the cost model: once the session's simulated GPUs have done the work); see
  :meth:`Session.wait`;
* :class:`Hooks`, the seam where what wraps or observes the backend plugs in from
  outside it: ``faults`` wraps each operation's run, ``metering`` (the cost model)
  watches submits and runs and holds results back, ``sickness`` may rewrite a
  sampling operation's work. Nothing here imports them; the
  :class:`TrainingSessionBackend` holds the sessions, the registry and the hooks.

Lifecycle events and failed operations are logged (logger ``local.training_session.models``).
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
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterator, Mapping, Sequence

import numpy as np

from local.training_session.exceptions import NotFound, ServiceError, invalid
from local.training_session.toy.adam import AdamConfig
from local.training_session.toy.policy import DatumArrays, Policy, SampledSeq
from steps.platform import files

logger = logging.getLogger(__name__)


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
                        metadata: dict[str, str] | None = None, remove: list[str] | None = None) -> ModelPackage:
        """SageMaker's semantics: what a request omits is kept; metadata keys are added or replaced, and those in
        ``remove`` (CustomerMetadataPropertiesToRemove) removed."""
        with self._lock:
            if arn not in self._packages:
                raise invalid(f"Model package {arn!r} does not exist")
            old = self._packages[arn]
            new = dataclasses.replace(
                old, approval_status=status or old.approval_status,
                approval_description=old.approval_description if description is None else description,
                customer_metadata={k: v for k, v in {**old.customer_metadata, **(metadata or {})}.items()
                                   if k not in (remove or ())}, modified=time.time())
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


# -- the operations' work ---------------------------------------------------------
@dataclass(frozen=True)
class Billed:
    """Tokens billed, as ``BillableTokenUsage`` counts them: prompt tokens prefilled (a request's prompt once,
    however many samples share it; computeLogprobs too), tokens generated, and datum tokens trained (every
    model-input token of a forward or forward_backward datum, prompt positions included)."""

    prefill: int = 0
    sample: int = 0
    training: int = 0

    def __add__(self, other: Billed) -> Billed:
        return Billed(self.prefill + other.prefill, self.sample + other.sample, self.training + other.training)


class Outcome:
    """What an operation returns; ``responses`` shapes it into the operation's result."""

    @property
    def billed(self) -> Billed:
        return Billed()


@dataclass(frozen=True)
class LossOutcome(Outcome):
    """forward / forward_backward: metrics and per-datum loss outputs."""

    metrics: Mapping[str, float]
    outputs: list[dict[str, list[float]]]
    tokens: int  # the datums' model-input tokens

    @property
    def billed(self) -> Billed:
        return Billed(training=self.tokens)


@dataclass(frozen=True)
class Metrics(Outcome):
    """optim_step's metrics."""

    metrics: Mapping[str, float]


@dataclass(frozen=True)
class Saved(Outcome):
    model_package_arn: str


@dataclass(frozen=True)
class Done(Outcome):
    """loadState / loadWeightsForSampling: nothing to return."""


@dataclass(frozen=True)
class Sampled(Outcome):
    sequences: list[SampledSeq]
    prompt_logprobs: list[float | None] | None
    prompt_tokens: int

    @property
    def lengths(self) -> list[int]:
        return [len(s.tokens) for s in self.sequences]

    @property
    def billed(self) -> Billed:
        return Billed(prefill=self.prompt_tokens, sample=sum(self.lengths))


@dataclass(frozen=True)
class Logprobs(Outcome):
    logprobs: list[float | None]
    prompt_tokens: int

    @property
    def billed(self) -> Billed:
        return Billed(prefill=self.prompt_tokens)


class Work:
    """What one runtime operation does, built by ``responses`` from a request it has validated."""

    kind: ClassVar[str]  # the operationConfig member (an instance field where one class does two kinds)
    training: ClassVar[bool] = True

    @property
    def tokens(self) -> int:
        """What its cost is proportional to: datum tokens of a forward(_backward), prompt tokens of a sample or
        computeLogprobs; 0 for the rest."""
        return 0

    def check(self, registry: PackageRegistry) -> None:
        """What must hold of the backend's state at submit: a model package it names exists."""

    def run(self, session: Session) -> Outcome:
        raise NotImplementedError


@dataclass(frozen=True)
class LossWork(Work):
    kind: str  # type: ignore[misc]  # forward | forwardBackward
    datums: tuple[DatumArrays, ...]
    loss_fn: str
    loss_fn_config: dict[str, float] | None

    @property
    def tokens(self) -> int:
        return sum(len(d.tokens) for d in self.datums)

    def run(self, session: Session) -> Outcome:
        policy = session.current_policy()
        fn = policy.forward_backward if self.kind == "forwardBackward" else policy.forward
        metrics, outputs = fn(list(self.datums), loss_fn=self.loss_fn, loss_fn_config=self.loss_fn_config)
        return LossOutcome(metrics, outputs, self.tokens)


@dataclass(frozen=True)
class OptimWork(Work):
    adam: AdamConfig
    kind: ClassVar[str] = "optimizerStep"

    def run(self, session: Session) -> Outcome:
        return Metrics({k: float(v) for k, v in session.current_policy().optim_step(self.adam).items()})


@dataclass(frozen=True)
class SaveWork(Work):
    kind: str  # type: ignore[misc]  # saveState: weights and Adam moments (a checkpoint); saveWeights: weights
    description: str

    def run(self, session: Session) -> Outcome:
        checkpoint = self.kind == "saveState"
        package = session.registry.add(
            session.group, session.current_policy().state_dict(include_optimizer=checkpoint),
            is_checkpoint=checkpoint, description=self.description, base_model=session.base_model,
            session_name=session.name, s3_prefix=session.output_path)
        return Saved(package.arn)


@dataclass(frozen=True)
class LoadWork(Work):
    model_package_arn: str
    with_optimizer: bool
    kind: ClassVar[str] = "loadState"

    def check(self, registry: PackageRegistry) -> None:
        package = registry.get(self.model_package_arn)
        if self.with_optimizer and not package.is_checkpoint:
            raise invalid(f"operationConfig.loadState.modelPackageArn: {package.arn} holds sampler weights "
                          "(saveWeights) and no optimizer state; load it with loadOptimizer false, or load a "
                          "saveState checkpoint")

    def run(self, session: Session) -> Outcome:
        policy = Policy.from_state_dict(session.registry.weights(self.model_package_arn))
        session.policy = policy if self.with_optimizer else policy.weights_copy()  # weights_copy: fresh Adam
        return Done()


def _sampler(session: Session, model_package_arn: str | None) -> Policy:
    """Which weights a sampling operation reads: a saved package's, else the session's current ones."""
    return session.registry.policy(model_package_arn) if model_package_arn else session.current_policy()


def _require_package(registry: PackageRegistry, arn: str | None) -> None:
    if arn:
        registry.get(arn)  # checked at submit, not when the operation runs


@dataclass(frozen=True)
class SampleWork(Work):
    prompt: tuple[int, ...]
    num_samples: int
    max_tokens: int
    temperature: float | None = None
    top_k: int | None = None  # None: no top-k (the API's -1)
    top_p: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    model_package_arn: str | None = None
    with_prompt_logprobs: bool = False
    kind: ClassVar[str] = "sample"
    training: ClassVar[bool] = False

    @property
    def tokens(self) -> int:
        return len(self.prompt)

    def check(self, registry: PackageRegistry) -> None:
        _require_package(registry, self.model_package_arn)

    def run(self, session: Session) -> Outcome:
        policy = _sampler(session, self.model_package_arn)
        prompt = list(self.prompt)
        seqs = policy.sample(prompt, self.num_samples, self.max_tokens, temperature=self.temperature,
                             top_k=self.top_k, top_p=self.top_p, seed=self.seed, stop=list(self.stop) or None)
        prompt_logprobs = policy.compute_logprobs(prompt) if self.with_prompt_logprobs else None
        return Sampled(seqs, prompt_logprobs, len(prompt))


@dataclass(frozen=True)
class LogprobsWork(Work):
    prompt: tuple[int, ...]
    model_package_arn: str | None = None
    kind: ClassVar[str] = "computeLogprobs"
    training: ClassVar[bool] = False

    @property
    def tokens(self) -> int:
        return len(self.prompt)

    def check(self, registry: PackageRegistry) -> None:
        _require_package(registry, self.model_package_arn)

    def run(self, session: Session) -> Outcome:
        return Logprobs(_sampler(session, self.model_package_arn).compute_logprobs(list(self.prompt)),
                        len(self.prompt))


@dataclass(frozen=True)
class LoadSamplerWork(Work):
    model_package_arn: str
    kind: ClassVar[str] = "loadWeightsForSampling"
    training: ClassVar[bool] = False

    def check(self, registry: PackageRegistry) -> None:
        _require_package(registry, self.model_package_arn)

    def run(self, session: Session) -> Outcome:
        session.registry.policy(self.model_package_arn)  # build it now, so the first sample does not pay for it
        return Done()


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


# -- the backend ------------------------------------------------------------------
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
