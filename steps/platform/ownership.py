"""Whose training session is whose, and stopping the ones nothing runs any more.

A training session has no idle timeout or maximum runtime (botocore's CreateTrainingSession
takes neither), so a session whose job died without stopping it (SIGKILL: out of memory, a
host failure, the hard kill after SIGTERM's grace) bills until someone stops it. So every
session of the pipeline's jobs (TrainDAPO's, and EvaluateModel's sampling session) is named
after the job that owns it, and every such job stops the sessions of its pipeline whose owning
job is not running before it creates its own.

**Names**: ``<pipeline key>-<job>-<attempt>``, at most 63 characters (the API's pattern):

* pipeline key: ``dapo-`` and 8 hex digits of the pipeline's name, lowercased (its ARN spells
  it so): every session of one pipeline starts with it, no other pipeline's does, and being of
  fixed length it cannot be mistaken for the start of another key;
* job: the training job's name (``TRAINING_JOB_NAME``, set by SageMaker) or the processing
  job's (``ProcessingJobName`` of ``/opt/ml/config/processingjobconfig.json``, which SageMaker
  writes into every processing container; ``PROCESSING_JOB_NAME`` where a runner sets it),
  without the ``pipelines-`` every pipeline job's name starts with (the pipeline key already says
  whose it is): ``<execution id>-<step name>-<10 characters>``, 33 characters for TrainDAPO's
  job and 37 for EvaluateModel's, whole within the 45 left (a step name of up to 21 characters
  fits); a longer one keeps its first characters and 8 hex digits of the whole name;
* attempt: one more than the highest attempt of this job's sessions so far, so a job whose
  process starts again (SageMaker retrying the job, a restart) names its next session anew.

**Why a name and not tags**: CreateTrainingSession takes ``Tags``, but the SDK (sagemaker-train
1.27) sends none, and ``create_lora_training_client`` drops ``user_metadata`` with a warning. A
name is what ListTrainingSessions gives back to any later process. The pipeline also hands the
job its name and its execution's ARN (``DAPO_PIPELINE_NAME``, ``DAPO_PIPELINE_EXECUTION_ARN``);
the step logs them with the session's name.

**Which jobs run**: :class:`SageMakerJobs` lists the InProgress training and processing jobs. Locally there are
no real jobs: :class:`LocalJobs` is the register the local runner (and the tests) keep of the
jobs they run, a file per job naming the process that runs it (``DAPO_LOCAL_JOBS_DIR``).

**Who stops a session** whose job's process died: the step itself on every exit it lives
through; its supervisor (steps/supervise.py, the container's entry point) when the process is
killed, e.g. by the out-of-memory killer; else the next job's sweep, or ``make stop-orphans``.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Protocol

from steps.cli import Refused
from steps.platform import files
from steps.platform.tracking import ENV_EXECUTION_ARN

log = logging.getLogger("steps.ownership")

ENV_JOB = "TRAINING_JOB_NAME"
ENV_PROCESSING_JOB = "PROCESSING_JOB_NAME"
#: What SageMaker writes into a processing container; its ProcessingJobName is the job's name.
PROCESSING_JOB_CONFIG = Path("/opt/ml/config/processingjobconfig.json")
ENV_PIPELINE = "DAPO_PIPELINE_NAME"
ENV_LOCAL_JOBS = "DAPO_LOCAL_JOBS_DIR"
PREFIX = "dapo"
NAME_MAX = 63
HASH_CHARS = 8
MAX_ATTEMPT = 999
#: What is left of a name for the job: prefix, '-', hash, '-', job, '-', attempt.
JOB_ROOM = NAME_MAX - len(PREFIX) - 1 - HASH_CHARS - 1 - 1 - len(str(MAX_ATTEMPT))
#: SageMaker Pipelines names an execution's jobs ``pipelines-<execution id>-<step name>-<10 characters>``.
PIPELINE_JOB_PREFIX = "pipelines-"
_EXECUTION_ID = re.compile(r"[a-z0-9]{12}-")
#: Session states that bill or are about to (botocore's TrainingSessionStatus): what a dead job's supervisor stops.
ACTIVE = frozenset({"Created", "Scheduled", "Blocked", "Running"})


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:HASH_CHARS]


def pipeline_key(pipeline: str) -> str:
    """What the names of one pipeline's sessions start with (before a '-')."""
    return f"{PREFIX}-{_digest(pipeline.lower())}"


def job_key(job: str) -> str:
    """A job's name as its sessions' names carry it: a pipeline job's without ``pipelines-``; whole when it fits."""
    rest = job[len(PIPELINE_JOB_PREFIX):]
    short = rest if job.startswith(PIPELINE_JOB_PREFIX) and _EXECUTION_ID.match(rest) else job
    return short if len(short) <= JOB_ROOM else short[: JOB_ROOM - HASH_CHARS] + _digest(job)


def owner_job(key: str) -> str:
    """The owning job's name as the console shows it, from the part of a session's name that carries it
    (:func:`job_key`): a pipeline job's gets its ``pipelines-`` back."""
    return PIPELINE_JOB_PREFIX + key if _EXECUTION_ID.match(key) else key


@dataclass(frozen=True)
class Owner:
    """The pipeline and job a TrainDAPO or EvaluateModel process runs for (its training or processing job)."""

    pipeline: str
    job: str
    execution_arn: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Owner | None:
        """None outside a pipeline's job (a step run by hand owns no sessions but its own)."""
        pipeline, job = env.get(ENV_PIPELINE, "").strip(), job_name(env)
        if not pipeline or not job:
            return None
        return cls(pipeline, job, env.get(ENV_EXECUTION_ARN) or None)

    def session_name(self, attempt: int) -> str:
        return f"{pipeline_key(self.pipeline)}-{job_key(self.job)}-{attempt}"


@dataclass(frozen=True)
class OwnedSession:
    """A session of the pipeline, as its name and ListTrainingSessions tell."""

    name: str
    job: str  # the owning job, as the name carries it (job_key)
    attempt: int
    status: str
    created: datetime | None

    def age(self, now: datetime) -> str:
        return "?" if self.created is None else duration((now - self.created).total_seconds())


def job_name(env: Mapping[str, str] = os.environ) -> str:
    """The name of the SageMaker job this process runs in: a training job's, else a processing job's; "" outside."""
    name = env.get(ENV_JOB, "").strip() or env.get(ENV_PROCESSING_JOB, "").strip()
    if name or not PROCESSING_JOB_CONFIG.is_file():
        return name
    try:
        return str(json.loads(PROCESSING_JOB_CONFIG.read_text(encoding="utf-8")).get("ProcessingJobName", "")).strip()
    except (OSError, ValueError) as exc:
        raise Refused(f"{PROCESSING_JOB_CONFIG}: cannot read the processing job's name ({exc})") from None


def duration(seconds: float) -> str:
    """45s, 12m05s, 3h07m, 2d04h."""
    s = max(0, int(seconds))
    for unit, size, sub, sub_size in (("d", 86400, "h", 3600), ("h", 3600, "m", 60), ("m", 60, "s", 1)):
        if s >= size:
            return f"{s // size}{unit}{(s % size) // sub_size:02d}{sub}"
    return f"{s}s"


def parse(name: str, key: str) -> tuple[str, int] | None:
    """(job, attempt) of a session named by :meth:`Owner.session_name` under ``key``; None for any other name."""
    if not name.startswith(key + "-"):
        return None
    job, _, attempt = name[len(key) + 1:].rpartition("-")
    return (job, int(attempt)) if job and attempt.isdigit() else None


def pipeline_sessions(service: Any, pipeline: str) -> list[OwnedSession]:
    """Every session of the pipeline the service still lists, whatever its status, newest first."""
    key = pipeline_key(pipeline)
    found = []
    for summary in service.list_sessions(name_contains=key + "-"):
        parsed = parse(summary.training_session_name, key)
        if parsed is not None:
            status = getattr(summary.status, "value", summary.status)
            found.append(OwnedSession(summary.training_session_name, *parsed, str(status), summary.creation_time))
    return found


# -- which jobs are running --------------------------------------------------------------------
class RunningJobs(Protocol):
    def names(self) -> set[str]:
        """The training and processing jobs running now."""
        ...


@dataclass(frozen=True)
class SageMakerJobs:
    """On AWS: the account's InProgress training and processing jobs in the region (ListTrainingJobs,
    ListProcessingJobs): TrainDAPO is a training job, EvaluateModel a processing job."""

    client: Any  # boto3 "sagemaker" client

    def names(self) -> set[str]:
        training = self.client.get_paginator("list_training_jobs").paginate(StatusEquals="InProgress")
        processing = self.client.get_paginator("list_processing_jobs").paginate(StatusEquals="InProgress")
        return ({job["TrainingJobName"] for page in training for job in page["TrainingJobSummaries"]}
                | {job["ProcessingJobName"] for page in processing for job in page["ProcessingJobSummaries"]})


@dataclass(frozen=True)
class LocalJobs:
    """Locally: a register of the jobs a runner runs, a file per job holding the runner's process id.

    A job runs while its file exists and that process is alive: a runner that ends the job
    removes the file, one that is killed leaves a file naming a dead process.
    """

    directory: Path

    def names(self) -> set[str]:
        if not self.directory.is_dir():
            return set()
        return {path.name for path in self.directory.iterdir() if _alive(path.read_text().strip())}

    @contextmanager
    def running(self, job: str) -> Iterator[None]:
        """Register ``job`` as run by this process for the ``with`` block."""
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / job
        files.write_text(path, str(os.getpid()))  # atomic: a reader never sees an empty pid
        try:
            yield
        finally:
            path.unlink(missing_ok=True)


def _alive(pid: str) -> bool:
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def running_jobs(region: str | None) -> RunningJobs:
    """The local register when the local runner set one (``DAPO_LOCAL_JOBS_DIR``), else SageMaker's jobs."""
    local = os.environ.get(ENV_LOCAL_JOBS)
    if local:
        return LocalJobs(Path(local))
    import boto3

    return SageMakerJobs(boto3.client("sagemaker", region_name=region))


# -- orphans -------------------------------------------------------------------------------------
def orphans(sessions: list[OwnedSession], running: set[str], own_job: str | None = None) -> list[OwnedSession]:
    """The Running sessions whose owning job is not running. ``own_job``: the job of the process asking,
    which owns nothing alive before it creates its session, so its earlier attempts are orphans too."""
    live = {job_key(job) for job in running} - ({job_key(own_job)} if own_job else set())
    return [s for s in sessions if s.status == "Running" and s.job not in live]


def stop_sessions(service: Any, sessions: list[OwnedSession], say: Callable[[str], Any] = log.warning) -> None:
    now = datetime.now(timezone.utc)
    for s in sessions:
        service.stop_session(s.name)
        say(f"stopped orphaned training session {s.name} (job {owner_job(s.job)}, attempt {s.attempt}, "
            f"created {s.age(now)} ago): nothing runs it any more")


def stop_jobs_sessions(service: Any, owner: Owner) -> list[OwnedSession]:
    """Stop every session of the owner's job that bills or is about to, once the job's step process is dead
    (a job runs one step process at a time, so nothing uses them any more); returns the ones it stopped."""
    mine = job_key(owner.job)
    left = [s for s in pipeline_sessions(service, owner.pipeline) if s.job == mine and s.status in ACTIVE]
    for s in left:
        service.stop_session(s.name)
    return left


def claim_session_name(service: Any, owner: Owner, jobs: RunningJobs) -> str:
    """Stop the pipeline's orphaned sessions, then name the owner's next session.

    The sessions are listed before the running jobs: a session seen was created by a job that
    was running then, so a job still running when the jobs are listed after it owns it, and a
    job that starts between the two calls has no session in the list to lose.
    """
    sessions = pipeline_sessions(service, owner.pipeline)
    stop_sessions(service, orphans(sessions, jobs.names(), own_job=owner.job))
    mine = job_key(owner.job)
    attempt = 1 + max((s.attempt for s in sessions if s.job == mine), default=0)
    if attempt > MAX_ATTEMPT:
        raise Refused(f"job {owner.job} has created {MAX_ATTEMPT} training sessions already; "
                      "start a new execution")
    return owner.session_name(attempt)


def this_jobs_session_name(service: Any, region: str | None) -> str | None:
    """In a pipeline's job: stop the pipeline's orphaned sessions and name this job's next session.
    Outside one (a step run by hand): None, and the SDK names the session."""
    owner = Owner.from_env()
    if owner is None:
        log.info("%s or the job's name unset (not a pipeline's job): no orphaned sessions stopped", ENV_PIPELINE)
        return None
    name = claim_session_name(service, owner, running_jobs(region))
    log.info("training session %s: pipeline %s, execution %s, training job %s", name, owner.pipeline,
             owner.execution_arn or "(not set)", owner.job)
    return name
