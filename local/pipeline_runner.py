"""Run a SageMaker pipeline definition (build/pipeline.json) on this machine.

A small interpreter for the step types our definition uses, so `make local-run`
follows the same DAG, arguments and data flow SageMaker would, instead of a
second hand-wired copy:

- Processing: download each `ProcessingInputs` S3 prefix to its local path, run
  the `ContainerEntrypoint` + `ContainerArguments` (the job's name in
  PROCESSING_JOB_NAME), upload each output.
- Training: download the channels, write hyperparameters.json, run the image's
  `train` command under the SageMaker training contract (SM_* variables),
  sync the checkpoint dir, upload `model.tar.gz`.
- While a job runs it is in the register of running jobs (`<workdir>/jobs`,
  DAPO_LOCAL_JOBS_DIR) that stands in for ListTrainingJobs and ListProcessingJobs
  when a step looks for orphaned sessions.
- Condition: evaluate the conditions (Parameters, step properties, JsonGet on
  property files) and run the chosen branch.
- Fail: stop the execution with the resolved error message.
- Each step's whole output (stdout and stderr, SDK logging included) goes to
  ``<log_dir>/<step>.log``; ``on_line`` sees every line as it comes (the local run
  shows the step's own prefixed lines). A failed step's reason is its one
  ``error:`` line (steps/cli.py), not whatever an exiting interpreter printed after it.
- Resume: the steps ``previous`` records as Succeeded (a Processing or Training step of an
  earlier execution with this id and work dir) are not run again; their outputs are
  uploaded again from the work dir, as S3 held them, and later steps read their
  recorded properties. A training job run again first finds its checkpoint dir in S3,
  as SageMaker's checkpoint sync would have left it.
- Re-evaluation (selective execution): ``previous`` holds only the steps kept from another execution, whose
  work dir is ``kept_from``; their outputs are uploaded from there, read and never written, and every other
  step runs in this execution's own work dir.

Container paths (/opt/ml/...) are mapped under a per-step work directory.
S3 is whatever the boto3 client points at (moto locally).
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from local.stack import stop_process
from pipeline.expressions import (
    Environment,
    ExpressionError,
    all_hold,
    evaluate,
    parameter_values,
    property_files,
    walk,
)
from steps.platform import files
from steps.platform.ownership import ENV_LOCAL_JOBS, ENV_PROCESSING_JOB, LocalJobs
from steps.supervise import GRACE_SECONDS

# What the step image runs for `docker run IMAGE train` (containers/entrypoint.sh): the step under its supervisor.
IMAGE_COMMANDS = {"train": [sys.executable, "-m", "steps.supervise", "--", sys.executable, "-m", "steps.train"]}
#: Seconds an interrupted step has to exit after SIGTERM before it is killed: longer than its supervisor's grace
#: (steps/supervise.py), which kills a hung step and then stops its training sessions itself.
STOP_GRACE_SECONDS = GRACE_SECONDS + 25


class PipelineFailed(RuntimeError):
    def __init__(self, step: str, message: str) -> None:
        super().__init__(f"{step}: {message}")
        self.step = step
        self.message = message


@dataclass
class StepRecord:
    name: str
    type: str
    status: str = "Executing"
    message: str = ""
    properties: dict[str, Any] = field(default_factory=dict)


# -- the executor -------------------------------------------------------------------
@dataclass
class LocalExecution:
    definition: dict[str, Any]
    parameters: dict[str, Any]
    s3: Any  # boto3 S3 client
    workdir: Path
    env: dict[str, str]
    execution_id: str
    pipeline_name: str
    on_line: Callable[[str, str], None] = lambda step, line: None  # streamed step output
    on_status: Callable[[StepRecord], None] = lambda rec: None
    records: dict[str, StepRecord] = field(default_factory=dict)
    log_dir: Path | None = None  # each step's whole output, <step>.log
    previous: dict[str, StepRecord] = field(default_factory=dict)  # resume: the interrupted execution's records
    kept_from: Path | None = None  # the work dir of the execution ``previous`` ran in, when it is not this one
    kept_message: str = "kept from the interrupted run (its outputs restored to S3)"

    def __post_init__(self) -> None:
        try:
            self.values = parameter_values(self.definition, self.parameters)
        except ExpressionError as exc:
            raise ValueError(str(exc)) from None
        self.expressions = Environment(
            parameters=self.values,
            execution={"PipelineExecutionId": self.execution_id, "PipelineName": self.pipeline_name,
                       "PipelineExecutionArn": f"arn:local:pipeline-execution/{self.execution_id}"},
            step_property=self._step_property, read_json=self._read_json,
            property_files=property_files(self.definition))

    # expressions: pipeline/expressions.py evaluates them, over this execution's step records and S3
    def resolve(self, node: Any, where: str = "Arguments") -> Any:
        return evaluate(node, self.expressions, where)

    def _step_property(self, step: str, path: str) -> Any:
        rec = self.records.get(step)
        if rec is None or rec.status != "Succeeded":
            raise ExpressionError(f"step {step} has not succeeded")
        return walk(rec.properties, path)

    def _read_json(self, uri: str) -> Any:
        bucket, key = _split(uri)
        try:
            body = self.s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        except self.s3.exceptions.NoSuchKey:
            raise ExpressionError(f"there is no file {uri}") from None
        try:
            return json.loads(body)
        except json.JSONDecodeError as exc:
            raise ExpressionError(f"{uri} is not JSON ({exc})") from None

    # running
    def run(self) -> None:
        for step in self._ordered(self.definition["Steps"]):
            self._run_step(step)

    def _ordered(self, steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Topological order from `Get Steps.X` references and DependsOn."""
        names = {s["Name"] for s in steps}
        deps = {s["Name"]: ({d for d in re.findall(r'"Steps\.(\w+)', json.dumps(s["Arguments"])) if d in names}
                            | set(s.get("DependsOn", []))
                            | {d for d in _property_file_steps(s) if d in names}) - {s["Name"]}
                for s in steps}
        order: list[dict[str, Any]] = []
        done: set[str] = set()
        while len(order) < len(steps):
            ready = [s for s in steps if s["Name"] not in done and deps[s["Name"]] <= done]
            if not ready:
                raise ValueError(f"cycle or dangling reference among steps {sorted(names - done)}")
            for s in ready:
                order.append(s)
                done.add(s["Name"])
        return order

    def _run_step(self, step: dict[str, Any]) -> None:
        done = self.previous.get(step["Name"])
        if done is not None and done.status == "Succeeded" and step["Type"] in ("Processing", "Training"):
            self._restore(step, done)
            return
        rec = StepRecord(step["Name"], step["Type"])
        self.records[rec.name] = rec
        self.on_status(rec)
        runner = {"Processing": self._processing, "Training": self._training,
                  "Condition": self._condition, "Fail": self._fail}.get(step["Type"])
        if runner is None:
            raise ValueError(f"step {rec.name}: type {step['Type']} is not supported by the local runner")
        try:
            try:
                branch = runner(step, rec)
            except ExpressionError as exc:  # SageMaker fails the step whose expression has no value
                raise PipelineFailed(rec.name, str(exc)) from None
        except PipelineFailed as exc:
            rec.status, rec.message = "Failed", exc.message
            self.on_status(rec)
            raise
        rec.status = "Succeeded"
        self.on_status(rec)
        for nxt in self._ordered(branch or []):  # a condition's chosen branch
            self._run_step(nxt)

    def _container_path(self, rec: StepRecord, path: str) -> Path:
        return self.workdir / rec.name / path.lstrip("/")

    def _kept_path(self, rec: StepRecord, path: str) -> Path:
        """Where a kept step's files are: the work dir of the execution that ran it."""
        return (self.kept_from or self.workdir) / rec.name / path.lstrip("/")

    def _map_args(self, rec: StepRecord, args: list[Any]) -> list[str]:
        return [str(self._container_path(rec, a)) if str(a).startswith("/opt/ml/") else str(a) for a in args]

    def _exec(self, rec: StepRecord, cmd: list[str], env: dict[str, str]) -> None:
        log_path = self.log_dir / f"{rec.name}.log" if self.log_dir else Path(os.devnull)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        proc: subprocess.Popen[str] | None = None
        tail: list[str] = []
        error: list[str] = []  # the step's `error:` line and the lines continuing it (indented, "- " items)
        ended = False  # a line after the error message that does not continue it
        with open(log_path, "a", encoding="utf-8") as log:
            shown = " ".join(cmd).replace("\n", "\\n")
            log.write(f"== {rec.name} of {self.execution_id}: {shown}\n")
            try:
                with _sigint_deferred():  # a Ctrl-C while it starts is raised once `proc` is set: the finally stops it
                    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                            env={**self.env, **env}, cwd=str(Path(__file__).resolve().parents[1]))
                assert proc.stdout is not None
                for line in proc.stdout:
                    log.write(line)
                    log.flush()
                    line = line.rstrip("\n")
                    tail = (tail + [line])[-5:]
                    if not error and line.startswith("error:"):
                        error = [line]
                    elif error and not ended and (not line.strip() or line.startswith((" ", "\t", "- "))):
                        error.append(line)
                    elif error:
                        ended = True
                    self.on_line(rec.name, line)
                code = proc.wait()
            finally:
                if proc is not None and proc.poll() is None:  # interrupted: SIGTERM, and the step stops its session
                    stop_process(proc, STOP_GRACE_SECONDS, out=log)  # a supervised step dies with its supervisor
                log.write(f"== exit code {proc.returncode if proc else 'none: not started'}\n")
        if code != 0:
            # The step's own `error:` message (steps/cli.py prints one), not what its interpreter printed on
            # the way out; else the last lines it printed.
            message = " | ".join(line.strip() for line in error or tail if line.strip())
            raise PipelineFailed(rec.name, f"exit code {code}: {message}")

    def _restore(self, step: dict[str, Any], done: StepRecord) -> None:
        """A step an earlier execution completed: its outputs back in S3 from the work dir, its record kept."""
        rec = StepRecord(done.name, done.type, "Executing", done.message, done.properties)
        self.records[rec.name] = rec
        if rec.type == "Processing":
            for out in rec.properties.get("ProcessingOutputConfig", {}).get("Outputs", []):
                self._upload(self._kept_path(rec, out["S3Output"]["LocalPath"]), out["S3Output"]["S3Uri"])
        else:
            self._upload_training_outputs(rec, rec.properties, checkpoint=True, at=self._kept_path)
        rec.status, rec.message = "Succeeded", self.kept_message
        self.on_status(rec)

    def _processing(self, step: dict[str, Any], rec: StepRecord) -> None:
        args = self.resolve(step["Arguments"])
        rec.properties = args
        for inp in args.get("ProcessingInputs", []):
            s3in = inp["S3Input"]
            self._download(s3in["S3Uri"], self._container_path(rec, s3in["LocalPath"]))
        outputs = args.get("ProcessingOutputConfig", {}).get("Outputs", [])
        for out in outputs:
            self._container_path(rec, out["S3Output"]["LocalPath"]).mkdir(parents=True, exist_ok=True)
        app = args["AppSpecification"]
        cmd = [sys.executable if a == "python" else a for a in app["ContainerEntrypoint"]]
        # SageMaker tells a processing job its name in /opt/ml/config/processingjobconfig.json; here, the variable.
        job = f"{rec.name}-{self.execution_id}"
        jobs = LocalJobs(self.workdir / "jobs")
        env = {**args.get("Environment", {}), ENV_PROCESSING_JOB: job, ENV_LOCAL_JOBS: str(jobs.directory)}
        with jobs.running(job):
            self._exec(rec, cmd + self._map_args(rec, app.get("ContainerArguments", [])), env)
        for out in outputs:
            self._upload(self._container_path(rec, out["S3Output"]["LocalPath"]), out["S3Output"]["S3Uri"])

    def _training(self, step: dict[str, Any], rec: StepRecord) -> None:
        args = self.resolve(step["Arguments"])
        job = f"{rec.name}-{self.execution_id}"
        root = self._container_path(rec, "/opt/ml")
        env = {**args.get("Environment", {}), "SM_MODEL_DIR": str(root / "model"),
               "SM_OUTPUT_DATA_DIR": str(root / "output/data"), "SM_TRAINING_JOB_NAME": job, "TRAINING_JOB_NAME": job}
        for ch in args.get("InputDataConfig", []):
            local = root / "input/data" / ch["ChannelName"]
            self._download(ch["DataSource"]["S3DataSource"]["S3Uri"], local)
            env[f"SM_CHANNEL_{ch['ChannelName'].upper()}"] = str(local)
        hp = root / "input/config/hyperparameters.json"
        files.write_json(hp, args.get("HyperParameters", {}))
        ckpt = args.get("CheckpointConfig")
        ckpt_dir = (self._container_path(rec, ckpt.get("LocalPath", "/opt/ml/checkpoints")) if ckpt
                    else root / "checkpoints")
        if ckpt:
            if rec.name in self.previous:  # resumed: S3 held what the last sync uploaded, which is this dir
                self._upload(ckpt_dir, ckpt["S3Uri"])
            self._download(ckpt["S3Uri"], ckpt_dir)
        cmd = IMAGE_COMMANDS["train"] + ["--hyperparameters", str(hp), "--checkpoint-dir", str(ckpt_dir)]
        jobs = LocalJobs(self.workdir / "jobs")
        env[ENV_LOCAL_JOBS] = str(jobs.directory)
        try:
            with jobs.running(job):
                self._exec(rec, cmd, env)
        finally:
            if ckpt:  # SageMaker syncs checkpoints whether or not the job succeeded
                self._upload(ckpt_dir, ckpt["S3Uri"])
        model_uri = f"{args['OutputDataConfig']['S3OutputPath'].rstrip('/')}/{job}/output/model.tar.gz"
        rec.properties = {**args, "TrainingJobName": job, "ModelArtifacts": {"S3ModelArtifacts": model_uri}}
        self._upload_training_outputs(rec, rec.properties, checkpoint=False)  # synced above

    def _upload_training_outputs(self, rec: StepRecord, properties: dict[str, Any], checkpoint: bool,
                                 at: Callable[[StepRecord, str], Path] | None = None) -> None:
        """The job's model tarball, output data and (``checkpoint``) checkpoint dir to S3, from ``at`` (default:
        this execution's work dir); a kept job's tarball is uploaded as its run packed it."""
        kept = at is not None
        at = at or self._container_path
        root, output = at(rec, "/opt/ml"), properties["OutputDataConfig"]["S3OutputPath"].rstrip("/")
        self._upload_tar(root / "model", properties["ModelArtifacts"]["S3ModelArtifacts"], reuse=kept)
        self._upload(root / "output/data", f"{output}/{properties['TrainingJobName']}/output/data")
        ckpt = properties.get("CheckpointConfig")
        if ckpt and checkpoint:
            self._upload(at(rec, ckpt.get("LocalPath", "/opt/ml/checkpoints")), ckpt["S3Uri"])

    def _condition(self, step: dict[str, Any], rec: StepRecord) -> list[dict[str, Any]]:
        args = step["Arguments"]
        ok = all_hold(args["Conditions"], self.expressions, "Arguments.Conditions")
        rec.properties = {"Outcome": ok}
        rec.message = "true" if ok else "false"
        return args["IfSteps"] if ok else args["ElseSteps"]

    def _fail(self, step: dict[str, Any], rec: StepRecord) -> None:
        message = self.resolve(step["Arguments"].get("ErrorMessage", ""), "Arguments.ErrorMessage")
        raise PipelineFailed(rec.name, str(message))

    # S3 transfer
    def _download(self, uri: str, local: Path) -> None:
        bucket, prefix = _split(uri)
        local.mkdir(parents=True, exist_ok=True)
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                rel = obj["Key"][len(prefix):].lstrip("/") or Path(obj["Key"]).name
                target = local / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                self.s3.download_file(bucket, obj["Key"], str(target))

    def _upload(self, local: Path, uri: str) -> None:
        bucket, prefix = _split(uri)
        for path in sorted(p for p in local.rglob("*") if p.is_file()):
            self.s3.upload_file(str(path), bucket, f"{prefix.rstrip('/')}/{path.relative_to(local).as_posix()}")

    def _upload_tar(self, local: Path, uri: str, reuse: bool = False) -> None:
        """``local`` packed as model.tar.gz beside it, and uploaded; with ``reuse``, the tarball already there is
        uploaded as it is (a kept step's files are read, never written)."""
        tar_path = local.parent / "model.tar.gz"
        if not (reuse and tar_path.is_file()):
            local.mkdir(parents=True, exist_ok=True)
            with tarfile.open(tar_path, "w:gz") as tar:
                for path in sorted(local.rglob("*")):
                    tar.add(path, arcname=path.relative_to(local).as_posix())
        bucket, key = _split(uri)
        self.s3.upload_file(str(tar_path), bucket, key)


@contextmanager
def _sigint_deferred() -> Iterator[None]:
    """SIGINT (Ctrl-C) that arrives inside the block is handled as the block ends. A KeyboardInterrupt raised inside
    subprocess.Popen leaves its process started with nobody holding it: a step's supervisor that nobody stops."""
    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
        yield
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, _frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught and callable(previous):  # the run's handler (local/run.py), or Python's KeyboardInterrupt
            previous(signal.SIGINT, None)
        elif caught and previous == signal.SIG_DFL:
            os.kill(os.getpid(), signal.SIGINT)


def _property_file_steps(step: dict[str, Any]) -> set[str]:
    return set(re.findall(r'Steps\.(\w+)\.PropertyFiles', json.dumps(step["Arguments"])))


def _split(uri: str) -> tuple[str, str]:
    if not uri.startswith("s3://"):
        raise ValueError(f"not an S3 URI: {uri!r}")
    bucket, _, key = uri[5:].partition("/")
    return bucket, key
