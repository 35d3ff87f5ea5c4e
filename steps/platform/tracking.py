"""MLflow tracking of a run: the config as params, every metrics record, the reports as artifacts, the
evaluations' rollouts as tables.

Off unless configured, the way MLflow itself is configured: ``MLFLOW_TRACKING_URI`` names the
tracking server (a SageMaker MLflow tracking server ARN, which the ``sagemaker-mlflow`` plugin
resolves and signs requests for with the job's role; locally a ``sqlite:///`` store) and
``MLFLOW_EXPERIMENT_NAME`` the experiment. The pipeline hands both to TrainDAPO when
``pipeline.mlflow_tracking_arn`` is set, plus the execution's ARN: an execution started with
``make start-pipeline EXPERIMENT=name`` carries that experiment in its ``MLflowConfig``
(DescribePipelineExecution), and the run goes there.

Tracking never fails or slows training: :class:`MlflowTracker` hands records to a bounded queue
that one daemon thread drains into MLflow in batches; the first error (or a full queue) logs one
warning and every later record is dropped. ``finish`` waits a bounded time.
"""
from __future__ import annotations

import json
import logging
import math
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from steps.platform import files

log = logging.getLogger("steps.tracking")

ENV_TRACKING_URI = "MLFLOW_TRACKING_URI"
ENV_EXPERIMENT = "MLFLOW_EXPERIMENT_NAME"
#: Set by the pipeline on TrainDAPO: where the execution's own MLflow experiment is read.
ENV_EXECUTION_ARN = "DAPO_PIPELINE_EXECUTION_ARN"
DEFAULT_EXPERIMENT = "dapo"
#: In the checkpoint dir: a retried or restarted training job continues its MLflow run.
RUN_FILE = "mlflow-run.json"
QUEUE_SIZE = 10_000
FINISH_TIMEOUT_SECONDS = 30.0
_METRICS_BATCH = 1000  # MLflow's limits per LogBatch request
_PARAMS_BATCH = 100
_RECORDS_PER_WRITE = 50  # records the thread takes off the queue at once


@dataclass(frozen=True)
class RunRef:
    """Where a run lives; model.json carries it so that EvaluateModel logs to the same run."""

    tracking_uri: str
    experiment: str
    run_id: str

    def to_dict(self) -> dict[str, str]:
        return {"tracking_uri": self.tracking_uri, "experiment": self.experiment, "run_id": self.run_id}


@dataclass(frozen=True)
class Settings:
    tracking_uri: str
    experiment: str
    execution_arn: str | None = None
    run_name: str | None = None


def settings_from_env(env: Mapping[str, str] = os.environ) -> Settings | None:
    """None unless ``MLFLOW_TRACKING_URI`` is set. The run is named after the training job
    (SageMaker sets ``TRAINING_JOB_NAME`` in the container)."""
    uri = env.get(ENV_TRACKING_URI, "").strip()
    if not uri:
        return None
    return Settings(tracking_uri=uri, experiment=env.get(ENV_EXPERIMENT) or DEFAULT_EXPERIMENT,
                    execution_arn=env.get(ENV_EXECUTION_ARN) or None, run_name=env.get("TRAINING_JOB_NAME") or None)


def config_params(config: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """``{"dapo": {"batch_size": 16}}`` -> ``{"dapo.batch_size": "16"}`` (MLflow params are strings)."""
    return {f"{section}.{key}": value if isinstance(value, str) else json.dumps(value)
            for section, values in config.items() for key, value in (values or {}).items()}


def execution_experiment(execution_arn: str) -> str | None:
    """The MLflow experiment of a pipeline execution (its own, or the one `start` overrode it with)."""
    import boto3

    region = execution_arn.split(":")[3]
    described = boto3.client("sagemaker", region_name=region).describe_pipeline_execution(
        PipelineExecutionArn=execution_arn)
    return (described.get("MLflowConfig") or {}).get("MlflowExperimentName") or None


def _experiment_id(client: Any, name: str) -> str:
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    from mlflow.exceptions import MlflowException

    try:
        return client.create_experiment(name)
    except MlflowException:  # created meanwhile by another step
        return client.get_experiment_by_name(name).experiment_id


def _metrics(record: Mapping[str, Any], step: int, timestamp_ms: int) -> list[Any]:
    from mlflow.entities import Metric

    return [Metric(key, float(value), timestamp_ms, step) for key, value in record.items()
            if isinstance(value, (int, float)) and not (isinstance(value, float) and math.isinf(value))]


@dataclass
class MlflowTracker:
    """A :class:`steps.dapo.metrics.Tracker` writing to one MLflow run from a background thread.

    ``run_id`` continues an existing run (EvaluateModel, a restarted TrainDAPO); otherwise the
    thread creates one in the experiment and logs ``params`` first. ``client_factory`` builds the
    MLflow client in the thread instead of ``MlflowClient`` (a test passes one that hangs).
    """

    settings: Settings
    params: dict[str, str] = field(default_factory=dict)
    run_id: str | None = None
    resume_file: Path | None = None
    queue_size: int = QUEUE_SIZE
    client_factory: Callable[[str], Any] | None = None

    def __post_init__(self) -> None:
        self._queue: queue.Queue[tuple[str, Any]] = queue.Queue(self.queue_size)
        self._broken = threading.Event()
        self._warned = threading.Lock()
        self._result: RunRef | None = None
        self._finished = False
        self.experiment = self.settings.experiment
        self._thread = threading.Thread(target=self._work, name="mlflow-tracker", daemon=True)
        self._thread.start()

    # -- the caller's side: never blocks, never raises ---------------------------------------------
    def log_metrics(self, record: dict[str, Any], step: int) -> None:
        self._put(("metrics", (record, step, int(time.time() * 1000))))

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        if Path(path).is_file():
            self._put(("artifact", (str(path), artifact_path)))

    def log_table(self, data: dict[str, list[Any]], artifact_file: str) -> None:
        """A table artifact (MLflow's ``log_table``: column -> values), e.g. an evaluation's rollouts."""
        self._put(("table", (data, artifact_file)))

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        self._put(("tags", {k: str(v) for k, v in tags.items()}))

    def finish(self, status: str = "FINISHED", timeout: float = FINISH_TIMEOUT_SECONDS) -> RunRef | None:
        """End the run with ``status`` once the queue is drained; at most ``timeout`` seconds.
        Returns where the run lives, or None if tracking failed. Only the first call acts."""
        if not self._finished and not self._broken.is_set():
            self._finished = True
            self._put(("end", status))
            self._thread.join(timeout)
            if self._thread.is_alive():
                self._warn(f"MLflow did not finish within {timeout:.0f}s; the records still queued are dropped")
                self._broken.set()
        return None if self._broken.is_set() else self._result

    def _put(self, item: tuple[str, Any]) -> None:
        if self._broken.is_set():
            return
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self._warn(f"the MLflow queue is full ({self.queue_size} records): {self.settings.tracking_uri} "
                       "is too slow; tracking stops, training goes on")
            self._broken.set()

    def _warn(self, message: str) -> None:
        if self._warned.acquire(blocking=False):  # one warning per tracker, never released
            log.warning("%s", message)

    # -- the thread's side ---------------------------------------------------------------------------
    def _work(self) -> None:
        try:
            client = self._connect()
            while True:
                items = [self._queue.get()]
                while items[-1][0] == "metrics" and len(items) < _RECORDS_PER_WRITE:
                    try:
                        items.append(self._queue.get_nowait())
                    except queue.Empty:
                        break
                if self._handle(client, items):
                    return
        except Exception as exc:  # noqa: BLE001 - tracking must never fail training
            self._warn(f"MLflow tracking to {self.settings.tracking_uri} failed ({type(exc).__name__}: {exc}); "
                       "training goes on without it")
            self._broken.set()

    def _connect(self) -> Any:
        for name in ("mlflow", "alembic"):  # their INFO lines (database migrations) are not ours
            logging.getLogger(name).setLevel(logging.WARNING)
        if self.client_factory is not None:
            client = self.client_factory(self.settings.tracking_uri)
        else:
            import mlflow
            from mlflow.tracking import MlflowClient

            # Process-wide, not only the client's: the sagemaker-mlflow plugin signs requests for the ARN
            # it reads from mlflow.get_tracking_uri() (EvaluateModel's job has no MLFLOW_TRACKING_URI).
            mlflow.set_tracking_uri(self.settings.tracking_uri)
            client = MlflowClient(tracking_uri=self.settings.tracking_uri)
        saved = self._saved_run()
        if saved.get("tracking_uri") == self.settings.tracking_uri:
            self.run_id, self.experiment = saved["run_id"], saved["experiment"]
        if self.run_id is None:
            self._start_run(client)
        self._result = RunRef(self.settings.tracking_uri, self.experiment, self.run_id)
        if self.resume_file is not None:
            files.write_json(self.resume_file, self._result.to_dict())  # atomic: a kill never leaves it cut
        return client

    def _saved_run(self) -> dict[str, Any]:
        """The run a restarted job continues (its resume file), {} when there is none. A damaged file (cut by a
        kill while an older version wrote it in place) is named in one warning and a new run is started: the
        MLflow run is not worth the training run."""
        if self.run_id is not None or self.resume_file is None or not self.resume_file.is_file():
            return {}
        try:
            saved = files.read_json(self.resume_file, "Logging to a new MLflow run.")
            if not (isinstance(saved, dict) and {"tracking_uri", "run_id", "experiment"} <= saved.keys()):
                raise files.Damaged(f"{self.resume_file} is damaged (not a saved MLflow run). "
                                    "Logging to a new MLflow run.")
            return saved
        except files.Damaged as exc:
            log.warning("%s", exc)
            return {}

    def _start_run(self, client: Any) -> None:
        if self.settings.execution_arn:
            try:
                self.experiment = execution_experiment(self.settings.execution_arn) or self.experiment
            except Exception as exc:  # noqa: BLE001 - fall back to the configured experiment
                log.warning("could not read the MLflow experiment of %s (%s); logging to '%s'",
                            self.settings.execution_arn, exc, self.experiment)
        tags = {"sagemaker.pipeline_execution_arn": self.settings.execution_arn} if self.settings.execution_arn else {}
        run = client.create_run(_experiment_id(client, self.experiment), run_name=self.settings.run_name, tags=tags)
        self.run_id = run.info.run_id
        from mlflow.entities import Param

        params = [Param(k, v) for k, v in self.params.items()]
        for i in range(0, len(params), _PARAMS_BATCH):
            client.log_batch(self.run_id, params=params[i:i + _PARAMS_BATCH])

    def _handle(self, client: Any, items: list[tuple[str, Any]]) -> bool:
        """Log ``items``; True once the run has ended."""
        metrics = [m for kind, value in items if kind == "metrics" for m in _metrics(*value)]
        for i in range(0, len(metrics), _METRICS_BATCH):
            client.log_batch(self.run_id, metrics=metrics[i:i + _METRICS_BATCH])
        kind, value = items[-1]
        if kind == "artifact":
            client.log_artifact(self.run_id, value[0], value[1])
        elif kind == "table":
            client.log_table(self.run_id, data=value[0], artifact_file=value[1])
        elif kind == "tags":
            from mlflow.entities import RunTag

            client.log_batch(self.run_id, tags=[RunTag(k, v) for k, v in value.items()])
        elif kind == "end":
            client.set_terminated(self.run_id, status=value)
            return True
        return False


def start(params: Mapping[str, str], resume_file: Path | None = None,
          env: Mapping[str, str] = os.environ) -> MlflowTracker | None:
    """TrainDAPO's tracker, or None when MLflow is not configured."""
    settings = settings_from_env(env)
    if settings is None:
        return None
    log.info("MLflow tracking to %s, experiment %s", settings.tracking_uri, settings.experiment)
    return MlflowTracker(settings, params=dict(params), resume_file=resume_file)


def resume(ref: Mapping[str, str] | None) -> MlflowTracker | None:
    """A tracker continuing the run model.json names (EvaluateModel), or None if training was not tracked."""
    if not ref:
        return None
    return MlflowTracker(Settings(ref["tracking_uri"], ref["experiment"]), run_id=ref["run_id"])
