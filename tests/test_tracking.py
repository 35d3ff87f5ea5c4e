"""MLflow tracking: the real train and evaluate steps against the local service, logging to a real MLflow store.

The store is the one `make local-run` uses (local.report.mlflow_store: sqlite, artifacts beside it) in a
temporary directory; what the steps logged is read back with MlflowClient. The SageMaker path (a tracking
server ARN, requests signed by the sagemaker-mlflow plugin, artifacts to S3) runs against MLflow's own REST
server and moto's S3 (:func:`managed_mlflow`, which tests/test_iam.py uses to record what logging calls).
"""
from __future__ import annotations

import contextlib
import json
import logging
import shutil
import threading
from pathlib import Path
from typing import Any, Iterator

import boto3
import pytest
from mlflow.tracking import MlflowClient
from moto import mock_aws

from local.report import mlflow_store
from local.toy_data import write_split
from pipeline import start as start_cmd
from pipeline.aws import UserError
from pipeline.config import load
from steps import evaluate, train
from steps.dapo import metrics as metrics_io
from steps.platform import tracking
from tests.local_service import client_kwargs
from tests.test_pipeline_deploy import account, aws, config  # noqa: F401 - fixtures: moto with the data and role
from tests.test_preflight import REGION, answer

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENT = "dapo-tests"
pytestmark = pytest.mark.usefixtures("local_service")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    return write_split(d, 200, 40, seed=7)


@pytest.fixture(scope="module")
def mlflow_tables(tmp_path_factory) -> Path:
    """An MLflow sqlite database with MLflow's tables and nothing else: MLflow creates them by running every
    migration (about a second); each test's store starts from a copy."""
    db = tmp_path_factory.mktemp("mlflow-tables") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{db}").search_experiments()
    return db


@pytest.fixture
def store(tmp_path, monkeypatch, mlflow_tables):
    (tmp_path / "runs").mkdir()
    shutil.copyfile(mlflow_tables, tmp_path / "runs" / "mlflow.db")
    uri = mlflow_store(tmp_path / "runs", EXPERIMENT)  # creates the experiment, artifacts beside the database
    monkeypatch.setenv(tracking.ENV_TRACKING_URI, uri)
    monkeypatch.setenv(tracking.ENV_EXPERIMENT, EXPERIMENT)
    return MlflowClient(tracking_uri=uri)


SERVER_ARN = "arn:aws:sagemaker:us-west-2:123456789012:mlflow-tracking-server/dapo"
ARTIFACT_BUCKET = "mlflow-artifacts"


@contextlib.contextmanager
def managed_mlflow(store: Path) -> Iterator[tuple[dict[str, str], list[dict[str, str]]]]:
    """A SageMaker MLflow tracking server as the steps see it: ``MLFLOW_TRACKING_URI`` is its ARN, the
    sagemaker-mlflow plugin signs each request and sends it to the server's endpoint (here MLflow's own REST
    app over a sqlite store, on 127.0.0.1), and run artifacts go to the server's S3 artifact store (here moto).

    Yields the environment the steps need and every request the server received: its MLflow API name (the
    name of its ``sagemaker-mlflow:`` IAM action) and the scope its SigV4 signature was made for.
    """
    import mlflow.server.handlers as handlers
    from mlflow.protos.service_pb2 import MlflowService
    from mlflow.server import app
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore
    from mlflow.utils.rest_utils import extract_api_info_for_service
    from moto.server import ThreadedMotoServer
    from werkzeug.serving import make_server

    endpoints = extract_api_info_for_service(MlflowService, "/api/2.0")
    api = {path: request.__name__ for request, (path, _) in endpoints.items()}
    requests: list[dict[str, str]] = []

    def recording(environ: dict[str, Any], start_response: Any) -> Any:
        requests.append({"api": api.get(environ["PATH_INFO"], environ["PATH_INFO"]),
                         "authorization": environ.get("HTTP_AUTHORIZATION", "")})
        return app(environ, start_response)

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    moto_url = "http://{}:{}".format(*moto.get_host_and_port())
    boto3.client("s3", region_name="us-west-2", endpoint_url=moto_url).create_bucket(
        Bucket=ARTIFACT_BUCKET, CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
    previous = handlers._tracking_store
    # The store set directly: initialize_backend_stores would also set this process's tracking URI.
    handlers._tracking_store = SqlAlchemyStore(f"sqlite:///{store}", f"s3://{ARTIFACT_BUCKET}/runs")
    server = make_server("127.0.0.1", 0, recording, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield {tracking.ENV_TRACKING_URI: SERVER_ARN,
               "SAGEMAKER_MLFLOW_CUSTOM_ENDPOINT": f"http://127.0.0.1:{server.server_port}",
               "MLFLOW_S3_ENDPOINT_URL": moto_url, "AWS_ENDPOINT_URL_SAGEMAKER": moto_url}, requests
    finally:
        server.shutdown()
        handlers._tracking_store = previous
        moto.stop()


def run_train(d: Path, data, *sets: str) -> int:
    train_path, eval_path = data
    return train.main(["--config", str(ROOT / "config/local.yaml"), "--train", str(train_path),
                       "--eval", str(eval_path), "--model-dir", str(d / "model"), "--output-dir", str(d / "out"),
                       "--checkpoint-dir", str(d / "ckpt"), "--hyperparameters", str(d / "none.json"),
                       "--set", "batch_size=4", "--set", "eval_size=8", "--set", "eval_every=2",
                       "--set", f"model_package_group_arn={client_kwargs()['model_package_group_arn']}",
                       *[x for s in sets for x in ("--set", s)]])


def runs(client: MlflowClient) -> list:
    return client.search_runs([client.get_experiment_by_name(EXPERIMENT).experiment_id])


def history(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in client.get_metric_history(run_id, key)]


def test_the_run_has_the_config_every_step_and_the_evaluation(tmp_path, data, store):
    assert run_train(tmp_path / "a", data, "max_steps=3") == 0
    model = json.loads((tmp_path / "a" / "model" / "model.json").read_text())
    assert evaluate.main(["--model", str(tmp_path / "a" / "model"), "--eval", str(data[1]),
                          "--output", str(tmp_path / "a" / "eval"), "--eval-size", "8"]) == 0

    [run] = runs(store)
    assert model["mlflow"] == {"tracking_uri": store.tracking_uri, "experiment": EXPERIMENT,
                               "run_id": run.info.run_id}
    assert run.info.status == "FINISHED"
    # The whole config as params, flattened.
    assert run.data.params["dapo.batch_size"] == "4" and run.data.params["dapo.max_steps"] == "3"
    assert run.data.params["session.base_model"] == model["config"]["session"]["base_model"]
    assert len(run.data.params) == sum(len(v) for v in model["config"].values())
    # One point per step of each figure of metrics.jsonl, the same values (none where a step measured none:
    # sampler_kl of a step that trained no group of the weights it starts from, which says why in sampler_kl_note).
    steps = [r for r in metrics_io.read(tmp_path / "a" / "out" / "metrics.jsonl") if r["kind"] == "step"]
    for key in ("reward_mean", "accuracy", "loss", "tokens", "filtered_frac", "gen_batches", "seconds",
                "entropy", "sampler_kl", "completion_tokens_p95", "repetition_frac", "format_error_rate"):
        assert history(store, run.info.run_id, f"step/{key}") == [
            (r["step"], pytest.approx(float(r[key]), nan_ok=True)) for r in steps if key in r], key
    assert [s for s, _ in history(store, run.info.run_id, "eval/accuracy")] == [2, 3]
    # EvaluateModel continued the same run: its figures at the last step, its reports as artifacts.
    evaluation = json.loads((tmp_path / "a" / "eval" / "evaluation.json").read_text())
    assert history(store, run.info.run_id, "final_eval/accuracy") == [
        (3, pytest.approx(evaluation["metrics"]["accuracy"]["value"]))]
    assert history(store, run.info.run_id, "base_eval/accuracy") == [
        (0, pytest.approx(evaluation["base"]["metrics"]["accuracy"]["value"]))]
    # TrainDAPO's curves, EvaluateModel's reports, and each evaluation's rollouts as a table.
    assert {a.path for a in store.list_artifacts(run.info.run_id)} == {"curves.png", "evaluation.json",
                                                                       "predictions.jsonl", "rollouts"}
    assert {a.path for a in store.list_artifacts(run.info.run_id, "rollouts")} == {
        "rollouts/step_000002.json", "rollouts/step_000003.json", "rollouts/final.json"}
    assert (tmp_path / "a" / "out" / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert run.data.tags["steps_completed"] == "3" and run.data.tags["stopped_early"] == "false"
    assert run.data.tags["guard_stopped"] == "false" and "guard" not in run.data.tags


def test_curves_that_cannot_be_drawn_are_one_warning_not_a_failed_step(tmp_path, data, store, monkeypatch, caplog):
    from steps.dapo import curves

    def no_matplotlib(*_args, **_kwargs):
        raise ModuleNotFoundError("No module named 'matplotlib'")

    monkeypatch.setattr(curves, "plot_curves", no_matplotlib)
    with caplog.at_level(logging.WARNING, "steps.train"):
        assert run_train(tmp_path, data, "max_steps=1") == 0
    assert [m for m in caplog.messages if "curves.png" in m] == [
        "curves.png not drawn (ModuleNotFoundError: No module named 'matplotlib')"]
    [run] = runs(store)
    assert run.info.status == "FINISHED" and [a.path for a in store.list_artifacts(run.info.run_id)] == ["rollouts"]


def test_two_runs_with_different_parameters_are_two_runs_of_one_experiment(tmp_path, data, store):
    assert run_train(tmp_path / "a", data, "max_steps=2") == 0
    assert run_train(tmp_path / "b", data, "max_steps=2", "group_size=4") == 0
    found = runs(store)
    assert len(found) == 2
    assert sorted(r.data.params["dapo.group_size"] for r in found) == ["4", "8"]
    assert all(len(history(store, r.info.run_id, "step/reward_mean")) == 2 for r in found)


def test_a_restarted_training_job_continues_its_run(tmp_path, data, store):
    assert run_train(tmp_path, data, "max_steps=2", "save_every=1") == 0
    assert run_train(tmp_path, data, "max_steps=4", "save_every=1") == 0  # resumes from the checkpoint of step 2
    [run] = runs(store)
    assert [s for s, _ in history(store, run.info.run_id, "step/reward_mean")] == [1, 2, 3, 4]


def test_a_restarted_job_whose_files_a_kill_cut_finishes_without_a_traceback(tmp_path, data, store, caplog):
    """Issue 37: a SIGKILL while an older version wrote mlflow-run.json in place left it empty, and every resume
    then ended in a JSON traceback. Now: one warning naming it, a new MLflow run, and the run finishes; the cut
    last lines of metrics.jsonl and rollouts.jsonl (appends a kill interrupted) are left out and redone."""
    assert run_train(tmp_path, data, "max_steps=2", "save_every=1") == 0
    (tmp_path / "ckpt" / tracking.RUN_FILE).write_text("")
    for name in ("metrics.jsonl", "rollouts.jsonl"):
        path = tmp_path / "out" / name
        path.write_text(path.read_text() + '{"kind": "step", "step": 3, "reward_m')
    caplog.set_level(logging.WARNING, logger="steps.tracking")
    assert run_train(tmp_path, data, "max_steps=4", "save_every=1") == 0
    assert f"{tmp_path / 'ckpt' / tracking.RUN_FILE} is damaged (empty). Logging to a new MLflow run." in caplog.text
    first, second = sorted(runs(store), key=lambda r: r.info.start_time)
    assert [s for s, _ in history(store, second.info.run_id, "step/reward_mean")] == [3, 4]
    assert json.loads((tmp_path / "ckpt" / tracking.RUN_FILE).read_text())["run_id"] == second.info.run_id
    steps = [r["step"] for r in metrics_io.read(tmp_path / "out" / "metrics.jsonl") if r["kind"] == "step"]
    assert steps == [1, 2, 3, 4]


def test_on_sagemaker_the_steps_log_to_the_tracking_server_arn_through_the_plugin(tmp_path, data, monkeypatch):
    with managed_mlflow(tmp_path / "server.db") as (env, requests):
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv(tracking.ENV_EXPERIMENT, EXPERIMENT)
        assert run_train(tmp_path, data, "max_steps=2") == 0
        monkeypatch.delenv(tracking.ENV_TRACKING_URI)  # as in EvaluateModel's job: model.json names the server
        assert evaluate.main(["--model", str(tmp_path / "model"), "--eval", str(data[1]),
                              "--output", str(tmp_path / "eval"), "--eval-size", "8"]) == 0
        model = json.loads((tmp_path / "model" / "model.json").read_text())
        client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'server.db'}")
        run = client.get_run(model["mlflow"]["run_id"])
        artifacts = boto3.client("s3", region_name="us-west-2", endpoint_url=env["MLFLOW_S3_ENDPOINT_URL"]
                                 ).list_objects_v2(Bucket=ARTIFACT_BUCKET)["Contents"]
    assert model["mlflow"]["tracking_uri"] == SERVER_ARN
    assert [m.step for m in client.get_metric_history(run.info.run_id, "step/reward_mean")] == [1, 2]
    assert "final_eval/accuracy" in run.data.metrics
    assert sorted(a["Key"].rsplit("/", 1)[-1] for a in artifacts) == ["curves.png", "evaluation.json", "final.json",
                                                                       "predictions.jsonl", "step_000002.json"]
    # Every request was SigV4-signed for the sagemaker-mlflow service in the server's Region.
    assert requests and all("/us-west-2/sagemaker-mlflow/aws4_request" in r["authorization"] for r in requests)
    assert {r["api"] for r in requests} >= {"GetExperimentByName", "CreateRun", "LogBatch", "UpdateRun"}


def test_a_failing_tracker_warns_once_and_training_finishes(tmp_path, data, monkeypatch, caplog):
    # A store MLflow cannot open (its directory would be inside a file): every call fails.
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv(tracking.ENV_TRACKING_URI, f"sqlite:///{tmp_path}/a-file/mlflow.db")
    with caplog.at_level(logging.WARNING, logger="steps.tracking"):
        assert run_train(tmp_path, data, "max_steps=3") == 0
    warnings = [r for r in caplog.records if r.name == "steps.tracking"]
    assert len(warnings) == 1 and "training goes on without it" in warnings[0].getMessage()
    assert json.loads((tmp_path / "model" / "model.json").read_text())["mlflow"] is None
    assert len([r for r in metrics_io.read(tmp_path / "out" / "metrics.jsonl") if r["kind"] == "step"]) == 3


def test_without_a_tracking_uri_nothing_is_tracked(tmp_path, data, monkeypatch):
    monkeypatch.delenv(tracking.ENV_TRACKING_URI, raising=False)
    assert tracking.settings_from_env({}) is None
    assert run_train(tmp_path, data, "max_steps=1") == 0
    assert json.loads((tmp_path / "model" / "model.json").read_text())["mlflow"] is None


# -- the tracker on its own: never blocks, never raises --------------------------------------------


class BlockingClient:
    """An MLflow client whose run exists at once and whose first LogBatch of metrics hangs until released."""

    def __init__(self) -> None:
        self.entered, self.release = threading.Event(), threading.Event()
        self.batches = 0

    def get_experiment_by_name(self, name):
        return type("Experiment", (), {"experiment_id": "0"})()

    def create_run(self, experiment_id, run_name=None, tags=None):
        return type("Run", (), {"info": type("Info", (), {"run_id": "r1"})()})()

    def log_batch(self, run_id, metrics=(), params=(), tags=()):
        if metrics:
            self.batches += 1
            self.entered.set()
            self.release.wait(30)

    def set_terminated(self, run_id, status=None):
        pass


def test_a_slow_tracker_drops_records_with_one_warning_and_never_blocks(caplog):
    client = BlockingClient()
    tracker = tracking.MlflowTracker(tracking.Settings("http://slow", EXPERIMENT), queue_size=5,
                                     client_factory=lambda uri: client)
    with caplog.at_level(logging.WARNING, logger="steps.tracking"):
        tracker.log_metrics({"step/loss": 1.0}, step=1)
        assert client.entered.wait(30)  # the thread is stuck in LogBatch
        for step in range(2, 20):  # 5 fit in the queue; the 6th finds it full
            tracker.log_metrics({"step/loss": 1.0}, step=step)
        client.release.set()
        assert tracker.finish(timeout=30) is None
    assert [r.getMessage() for r in caplog.records if r.name == "steps.tracking"] == [
        "the MLflow queue is full (5 records): http://slow is too slow; tracking stops, training goes on"]


def test_the_run_goes_to_the_experiment_the_execution_was_started_with(tmp_path, store, monkeypatch):
    """`make start-pipeline EXPERIMENT=x` sets the execution's MLflowConfig; TrainDAPO reads it back."""
    execution = "arn:aws:sagemaker:us-west-2:123456789012:pipeline/dapo/execution/abc123"
    mlflow_store(tmp_path / "runs", "from-the-execution")
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)  # the tracker's boto3.client() uses the one set up here
    with mock_aws():
        boto3.setup_default_session()
        boto3.DEFAULT_SESSION.events.register(  # moto's DescribePipelineExecution has no MLflowConfig
            "before-call.sagemaker.DescribePipelineExecution",
            lambda **_: answer({"PipelineExecutionArn": execution, "MLflowConfig": {
                "MlflowResourceArn": "arn:aws:sagemaker:us-west-2:123456789012:mlflow-tracking-server/t",
                "MlflowExperimentName": "from-the-execution"}}))
        tracker = tracking.MlflowTracker(tracking.Settings(store.tracking_uri, EXPERIMENT, execution_arn=execution))
        tracker.log_metrics({"step/loss": 0.5}, step=1)
        ref = tracker.finish()
    assert ref.experiment == "from-the-execution"
    run = store.get_run(ref.run_id)
    assert run.data.tags["sagemaker.pipeline_execution_arn"] == execution
    assert store.get_experiment(run.info.experiment_id).name == "from-the-execution"


# -- make start-pipeline EXPERIMENT=name ---------------------------------------------------------------


def deploy(session: boto3.Session, path: Path, mlflow: dict[str, str] | None) -> str:
    """The config's pipeline in moto, with or without an MlflowConfig (as get_pipeline builds it)."""
    cfg, _ = load(path)
    definition = {"Version": "2020-12-01", "Parameters": [], "MlflowConfig": mlflow, "Steps": []}
    session.client("sagemaker").create_pipeline(PipelineName=cfg.name, RoleArn=cfg.role_arn,
                                                PipelineDefinition=json.dumps(definition))
    return cfg.name


def test_start_sets_the_executions_mlflow_experiment(account, config):  # noqa: F811
    session, _ = account
    name = deploy(session, config, {"MlflowResourceArn": SERVER_ARN, "MlflowExperimentName": "dapo-gsm8k"})
    sent: list[dict] = []
    session.events.register("provide-client-params.sagemaker.StartPipelineExecution",
                            lambda params, **_: sent.append(dict(params)))
    start_cmd.start(session, name, REGION, {}, str(config), experiment="clip-sweep")
    assert [p["MlflowExperimentName"] for p in sent] == ["clip-sweep"]


@pytest.mark.parametrize(("mlflow", "experiment", "message"), [
    (None, "clip-sweep", "EXPERIMENT=clip-sweep: pipeline 'dapo-local' does not track to MLflow; "
                         "set pipeline.mlflow_tracking_arn"),
    ({"MlflowResourceArn": SERVER_ARN, "MlflowExperimentName": None}, "clip sweep",
     "EXPERIMENT='clip sweep': an MLflow experiment name is 1-256 letters, digits and -_./"),
])
def test_start_refuses_an_experiment_it_cannot_use(account, config, mlflow, experiment, message):  # noqa: F811
    session, calls = account
    name = deploy(session, config, mlflow)
    with pytest.raises(UserError) as err:
        start_cmd.start(session, name, REGION, {}, str(config), experiment=experiment)
    assert message in str(err.value) and "StartPipelineExecution" not in calls
