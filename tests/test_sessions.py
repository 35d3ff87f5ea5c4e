"""Sessions you can find and orphans stopped: names from owners, the sweep TrainDAPO runs before it creates a
session, the running-jobs seam (SageMaker's ListTrainingJobs against moto, the local register), and
``make sessions`` / ``make stop-orphans``, all against the local training-session service through the SDK."""
from __future__ import annotations

import io
import logging
import re
import subprocess
import sys
import uuid
from pathlib import Path

import boto3
import botocore.session
import pytest
import yaml
from moto import mock_aws
from moto.sagemaker.models import sagemaker_backends

from pipeline import sessions as sessions_cmd
from steps import evaluate, train
from steps.platform import ownership
from steps.platform.ownership import (
    ENV_JOB,
    ENV_LOCAL_JOBS,
    ENV_PIPELINE,
    ENV_PROCESSING_JOB,
    NAME_MAX,
    LocalJobs,
    Owner,
    SageMakerJobs,
    claim_session_name,
    job_key,
    orphans,
    owner_job,
    parse,
    pipeline_key,
    pipeline_sessions,
)
from steps.platform.tracking import ENV_EXECUTION_ARN
from tests.local_service import ACCOUNT, BASE_MODEL_ARN, REGION
from tests.test_service_wire import PROMPT, SAMPLING, control_client
from tests.test_train import argv

ROOT = Path(__file__).resolve().parents[1]
NAME_PATTERN = botocore.session.get_session().get_service_model("sagemaker").shape_for(
    "TrainingSessionName").metadata["pattern"]
#: A pipeline's TrainDAPO job: pipelines-<execution id>-<step name>-<10 characters> (pipeline/checks.py).
PIPELINE_JOB = "pipelines-abc123def456-TrainDAPO-0123456789"
#: Its EvaluateModel job, 47 characters: a processing job, named the same way.
EVALUATE_JOB = "pipelines-abc123def456-EvaluateModel-0123456789"


def a_pipeline() -> str:
    """A pipeline name of this test's own: the service is shared by the whole test run."""
    return f"dapo-test-{uuid.uuid4().hex[:8]}"


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def statuses(service, pipeline: str) -> dict[str, str]:
    return {s.name: s.status for s in pipeline_sessions(service, pipeline)}


# -- names -------------------------------------------------------------------------------------
@pytest.mark.parametrize("job", [PIPELINE_JOB, EVALUATE_JOB, "TrainDAPO-20261202-162126", "j", "x" * 63,
                                 "pipelines-abc123def456-" + "A-very-long-step-name" * 2])
@pytest.mark.parametrize("attempt", [1, 999])
def test_a_name_fits_the_api_and_reads_back_as_its_owner(job, attempt):
    owner = Owner("dapo-gsm8k", job)
    name = owner.session_name(attempt)
    assert len(name) <= NAME_MAX and re.fullmatch(NAME_PATTERN, name), name
    assert parse(name, pipeline_key("dapo-gsm8k")) == (job_key(job), attempt)


def test_a_pipeline_jobs_name_is_carried_whole_but_its_pipelines_prefix_and_reads_back_as_the_job():
    """The session names of a real execution's two session-creating jobs, within the API's 63 characters."""
    key = pipeline_key("dapo-gsm8k")
    train, evaluate = (Owner("dapo-gsm8k", job).session_name(1) for job in (PIPELINE_JOB, EVALUATE_JOB))
    assert train == f"{key}-abc123def456-TrainDAPO-0123456789-1" and len(train) == 49
    assert evaluate == f"{key}-abc123def456-EvaluateModel-0123456789-1" and len(evaluate) == 53
    for job in (PIPELINE_JOB, EVALUATE_JOB, "TrainDAPO-20261202-162126", "job-gone"):
        assert owner_job(job_key(job)) == job  # what `make sessions` shows under "owner job"
    # A step name of up to 21 characters fits whole; a longer job name keeps its start and a hash of the whole.
    assert job_key(f"pipelines-abc123def456-{'S' * 21}-0123456789") == f"abc123def456-{'S' * 21}-0123456789"
    long_a, long_b = (f"pipelines-abc123def456-{'S' * 22}-012345678{c}" for c in "ab")
    assert job_key(long_a) != job_key(long_b) and job_key(long_a).startswith(f"abc123def456-{'S' * 22}")


def test_names_of_one_pipeline_are_never_read_as_anothers():
    name = Owner("dapo-gsm8k", PIPELINE_JOB).session_name(1)
    assert pipeline_key("dapo-gsm8k") != pipeline_key("dapo-gsm8k-2")
    assert parse(name, pipeline_key("dapo-gsm8k-2")) is None
    assert parse("sagemaker-training-session-1a2b3c4d", pipeline_key("dapo-gsm8k")) is None  # the SDK's own names
    assert pipeline_key("DAPO-GSM8K") == pipeline_key("dapo-gsm8k")  # a pipeline ARN lowercases its name


def test_the_owner_comes_from_the_job_environment():
    env = {ENV_PIPELINE: "dapo-gsm8k", ENV_JOB: PIPELINE_JOB, ENV_EXECUTION_ARN: "arn:x"}
    assert Owner.from_env(env) == Owner("dapo-gsm8k", PIPELINE_JOB, "arn:x")
    assert Owner.from_env({ENV_JOB: PIPELINE_JOB}) is None  # a training job outside a pipeline
    assert Owner.from_env({}) is None  # a step run by hand


def test_a_processing_jobs_owner_is_named_by_sagemakers_job_config(tmp_path, monkeypatch):
    """EvaluateModel is a processing job: SageMaker gives it no TRAINING_JOB_NAME, but writes its name into
    /opt/ml/config/processingjobconfig.json; a runner may set PROCESSING_JOB_NAME instead."""
    job = "pipelines-abc123def456-EvaluateModel-0123456789"
    assert Owner.from_env({ENV_PIPELINE: "dapo-gsm8k", ENV_PROCESSING_JOB: job}) == Owner("dapo-gsm8k", job)
    config = tmp_path / "processingjobconfig.json"
    config.write_text('{"ProcessingJobName": "%s", "RoleArn": "arn:aws:iam::123456789012:role/r"}' % job)
    monkeypatch.setattr(ownership, "PROCESSING_JOB_CONFIG", config)
    assert Owner.from_env({ENV_PIPELINE: "dapo-gsm8k"}) == Owner("dapo-gsm8k", job)
    config.write_text("{half a file")
    with pytest.raises(Exception, match="processingjobconfig.json: cannot read the processing job's name"):
        Owner.from_env({ENV_PIPELINE: "dapo-gsm8k"})


# -- which jobs run ----------------------------------------------------------------------------
def test_the_local_register_holds_the_jobs_whose_runner_is_alive(tmp_path):
    jobs = LocalJobs(tmp_path / "jobs")
    assert jobs.names() == set()
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "killed-with-its-runner").write_text(str(dead_pid()))
    with jobs.running("job-a"):
        assert jobs.names() == {"job-a"}
    assert jobs.names() == set()


@mock_aws
def test_sagemaker_jobs_are_the_in_progress_training_and_processing_jobs():
    sm = boto3.client("sagemaker", region_name=REGION)
    for name in ("running-job", "completed-job"):
        sm.create_training_job(
            TrainingJobName=name, RoleArn=f"arn:aws:iam::{ACCOUNT}:role/r",
            AlgorithmSpecification={"TrainingImage": "img", "TrainingInputMode": "File"},
            OutputDataConfig={"S3OutputPath": "s3://b/o"},
            ResourceConfig={"InstanceType": "ml.m5.large", "InstanceCount": 1, "VolumeSizeInGB": 1},
            StoppingCondition={"MaxRuntimeInSeconds": 60})
    # moto completes every job at once; this one is still running.
    for name in ("running-evaluation", "completed-evaluation"):
        sm.create_processing_job(
            ProcessingJobName=name, RoleArn=f"arn:aws:iam::{ACCOUNT}:role/r", AppSpecification={"ImageUri": "img"},
            ProcessingResources={"ClusterConfig": {"InstanceCount": 1, "InstanceType": "ml.m5.large",
                                                   "VolumeSizeInGB": 1}})
    # moto completes every job at once; these are still running.
    backend = sagemaker_backends[ACCOUNT][REGION]
    backend.training_jobs["running-job"].training_job_status = "InProgress"
    backend.processing_jobs["running-evaluation"].processing_job_status = "InProgress"
    assert SageMakerJobs(sm).names() == {"running-job", "running-evaluation"}


# -- the sweep ---------------------------------------------------------------------------------
def create(service, name: str):
    """A Running session of that name. Keep the client: the SDK stops a session once its client is collected."""
    return service.create_lora_training_client(base_model=BASE_MODEL_ARN, rank=4, alpha=8, training_session_name=name)


def test_a_start_stops_the_pipelines_orphans_before_naming_its_own_session(service_client, tmp_path, caplog):
    pipeline = a_pipeline()
    me = Owner(pipeline, PIPELINE_JOB)  # this job: its process starts again
    retried = Owner(pipeline, "pipelines-abc123def456-TrainDAPO-9876543210")  # an earlier job of it, failed
    other = Owner(pipeline, "pipelines-fedcba654321-TrainDAPO-0123456789")  # another execution, running
    stranger = Owner(a_pipeline(), PIPELINE_JOB)  # another pipeline's
    clients = [create(service_client, o.session_name(n)) for o, n in ((me, 1), (retried, 1), (other, 1),
                                                                       (stranger, 1), (me, 2))]
    service_client.stop_session(me.session_name(2))  # attempt 2 ended properly
    jobs = LocalJobs(tmp_path / "jobs")
    with jobs.running(me.job), jobs.running(other.job), caplog.at_level(logging.WARNING, "steps.ownership"):
        name = claim_session_name(service_client, me, jobs)

    assert name == me.session_name(3)
    assert statuses(service_client, pipeline) == {
        me.session_name(1): "Stopped",  # its own earlier attempt: the job runs, but this process is all of it
        retried.session_name(1): "Stopped",  # its job is not running
        other.session_name(1): "Running",  # its job is running
        me.session_name(2): "Stopped",
    }
    assert statuses(service_client, stranger.pipeline) == {stranger.session_name(1): "Running"}
    stopped = [r.getMessage() for r in caplog.records]
    assert len(stopped) == 2 and all(re.search(r"stopped orphaned training session \S+ \(job \S+, attempt 1, "
                                               r"created \d+s ago\): nothing runs it any more", m) for m in stopped)
    for client in clients:
        client.stop()


def test_the_step_names_its_session_after_its_owner(tmp_path, service_client, monkeypatch, caplog):
    from local.toy_data import write_split

    data = write_split(tmp_path / "data", 40, 10, seed=3)
    pipeline = a_pipeline()
    execution = f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:pipeline/{pipeline}/execution/abc123def456"
    for key, value in {ENV_PIPELINE: pipeline, ENV_JOB: PIPELINE_JOB, ENV_EXECUTION_ARN: execution,
                       ENV_LOCAL_JOBS: str(tmp_path / "jobs")}.items():
        monkeypatch.setenv(key, value)
    with caplog.at_level(logging.INFO, "steps.ownership"):
        assert train.main(argv(tmp_path, data, "batch_size=4", "max_steps=1", "eval_size=2")) == 0
    name = Owner(pipeline, PIPELINE_JOB).session_name(1)
    assert statuses(service_client, pipeline) == {name: "Stopped"}
    assert f"training session {name}: pipeline {pipeline}, execution {execution}, training job {PIPELINE_JOB}" \
        in caplog.messages


def test_evaluate_names_its_session_after_its_job_and_stops_the_pipelines_orphans(tmp_path, service_client,
                                                                                  monkeypatch, caplog):
    """A SIGKILLed EvaluateModel's session is found like TrainDAPO's: by its name, the next job stops it."""
    from local.toy_data import write_split

    data = write_split(tmp_path / "data", 40, 10, seed=3)
    assert train.main(argv(tmp_path, data, "batch_size=4", "max_steps=1", "eval_size=2")) == 0
    pipeline = a_pipeline()
    killed = Owner(pipeline, "pipelines-abc123def456-EvaluateModel-killed0000")
    orphan = create(service_client, killed.session_name(1))
    me = Owner(pipeline, "pipelines-abc123def456-EvaluateModel-0123456789")
    for key, value in {ENV_PIPELINE: pipeline, ENV_PROCESSING_JOB: me.job, ENV_LOCAL_JOBS: str(tmp_path / "jobs")
                       }.items():
        monkeypatch.setenv(key, value)
    with LocalJobs(tmp_path / "jobs").running(me.job), caplog.at_level(logging.WARNING, "steps.ownership"):
        assert evaluate.main(["--model", str(tmp_path / "model"), "--eval", str(data[1]), "--output",
                              str(tmp_path / "evaluation"), "--eval-size", "4"]) == 0
    assert statuses(service_client, pipeline) == {killed.session_name(1): "Stopped", me.session_name(1): "Stopped"}
    assert any(f"stopped orphaned training session {killed.session_name(1)}" in m for m in caplog.messages)
    assert (tmp_path / "evaluation" / "evaluation.json").is_file()
    orphan.stop()


def test_orphans_are_running_sessions_of_jobs_not_running():
    pipeline = "dapo-gsm8k"
    sessions = pipeline_sessions_of([(Owner(pipeline, "a"), 1, "Running"), (Owner(pipeline, "b"), 1, "Running"),
                                     (Owner(pipeline, "c"), 1, "Stopped"), (Owner(pipeline, "c"), 2, "Failed")])
    assert [s.name for s in orphans(sessions, {"a"})] == [Owner(pipeline, "b").session_name(1)]
    assert [s.job for s in orphans(sessions, {"a", "b"}, own_job="a")] == ["a"]
    # A pipeline job's sessions carry its name without `pipelines-`: still matched to the running job's full name.
    evaluation = pipeline_sessions_of([(Owner(pipeline, EVALUATE_JOB), 1, "Running")])
    assert orphans(evaluation, {EVALUATE_JOB}) == [] and orphans(evaluation, {PIPELINE_JOB}) == evaluation


def pipeline_sessions_of(rows):
    from steps.platform.ownership import OwnedSession

    return [OwnedSession(o.session_name(n), job_key(o.job), n, status, None) for o, n, status in rows]


# -- make sessions / make stop-orphans ------------------------------------------------------------
def write_config(tmp_path: Path, pipeline: str) -> Path:
    raw = yaml.safe_load((ROOT / "config" / "local.yaml").read_text())
    raw["pipeline"]["name"] = pipeline
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.fixture
def two_sessions(service_client, tmp_path):
    """A pipeline with a session whose job runs (in moto) and has sampled once, an orphan, and the config naming
    the pipeline."""
    pipeline = a_pipeline()
    live, dead = Owner(pipeline, PIPELINE_JOB), Owner(pipeline, EVALUATE_JOB)
    clients = [create(service_client, live.session_name(1)), create(service_client, dead.session_name(1))]
    clients[0].create_sampling_client().sample(PROMPT, 2, SAMPLING).result()
    with mock_aws():
        boto3.client("sagemaker", region_name=REGION).create_training_job(
            TrainingJobName=live.job, RoleArn=f"arn:aws:iam::{ACCOUNT}:role/r",
            AlgorithmSpecification={"TrainingImage": "img", "TrainingInputMode": "File"},
            OutputDataConfig={"S3OutputPath": "s3://b/o"},
            ResourceConfig={"InstanceType": "ml.m5.large", "InstanceCount": 1, "VolumeSizeInGB": 1},
            StoppingCondition={"MaxRuntimeInSeconds": 60})
        sagemaker_backends[ACCOUNT][REGION].training_jobs[live.job].training_job_status = "InProgress"
        yield write_config(tmp_path, pipeline), live, dead
    for client in clients:
        client.stop()


def test_make_sessions_lists_owner_attempt_state_age_and_billed_tokens(two_sessions, service_client, local_service,
                                                                      capsys):
    config, live, dead = two_sessions
    assert sessions_cmd.main(["--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert f"names start {pipeline_key(live.pipeline)}-): 2, 2 Running, 1 of them orphaned" in out
    assert out.splitlines()[1].split() == ["status", "age", "job", "running", "attempt", "prefill", "sample", "train",
                                           "owner", "job", "session"]
    rows = {line.split()[-1]: line.split() for line in out.splitlines()[2:4]}
    # The tokens each session billed so far, as DescribeTrainingSession counts them.
    usage = control_client(local_service.url).describe_training_session(
        TrainingSessionName=live.session_name(1))["TrainingSessionDetail"]["BillableTokenUsage"]
    billed = [f"{usage[k]:,}" for k in ("PrefillTokenCount", "SampleTokenCount", "TrainingTokenCount")]
    assert usage["PrefillTokenCount"] == len(PROMPT) and usage["SampleTokenCount"] > 0
    assert rows[live.session_name(1)][:1] + rows[live.session_name(1)][2:] == ["Running", "yes", "1", *billed,
                                                                                live.job, live.session_name(1)]
    assert rows[dead.session_name(1)][2:8] == ["no", "1", "0", "0", "0", dead.job]
    assert out.splitlines()[4] == (f"billed by the 2 sessions read: {billed[0]} prefill, {billed[1]} sample and 0 "
                                   "train tokens")
    assert statuses(service_client, live.pipeline)[dead.session_name(1)] == "Running"  # listing stops nothing


def test_make_stop_orphans_asks_once_and_stops_only_orphans(two_sessions, service_client, capsys, monkeypatch):
    config, live, dead = two_sessions
    monkeypatch.setattr(sys, "stdin", io.StringIO("n\n"))
    assert sessions_cmd.main(["--config", str(config), "--stop-orphans"]) == 1
    out = capsys.readouterr().out
    assert out.count("[y/N]") == 1 and "nothing stopped (answer y, or run with YES=1)" in out
    assert statuses(service_client, live.pipeline)[dead.session_name(1)] == "Running"

    monkeypatch.setattr(sys, "stdin", io.StringIO(""))  # no terminal and no YES=1: no
    assert sessions_cmd.main(["--config", str(config), "--stop-orphans"]) == 1

    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))
    assert sessions_cmd.main(["--config", str(config), "--stop-orphans"]) == 0
    out = capsys.readouterr().out
    assert out.count("[y/N]") == 2  # the refused run above, and this one: once each
    assert f"stopped orphaned training session {dead.session_name(1)} (job {dead.job}, attempt 1" in out
    assert statuses(service_client, live.pipeline) == {live.session_name(1): "Running",
                                                        dead.session_name(1): "Stopped"}
    assert sessions_cmd.main(["--config", str(config), "--stop-orphans", "--yes"]) == 0  # nothing left to stop
    assert "0 of them orphaned" in capsys.readouterr().out


def test_make_targets_pass_the_config_and_yes():
    make = subprocess.run(["make", "-n", "sessions", "stop-orphans", "YES=1", "CONFIG=c.yaml"], cwd=ROOT,
                          capture_output=True, text=True, check=True).stdout
    assert "-m pipeline.sessions --config c.yaml\n" in make
    assert "-m pipeline.sessions --config c.yaml --stop-orphans --yes" in make


def test_a_stop_that_fails_is_raised_unless_an_error_is_already_propagating(service_client, local_service, caplog):
    """steps/platform/session.stop_session, which TrainDAPO and EvaluateModel stop their sessions with: a session
    gone behind the step's back refuses the SDK's StopTrainingSession over the wire. With the step's own error
    propagating the refusal is logged and the stop reports False (that error is the one the step names); without,
    the refusal is the step's error."""
    from botocore.exceptions import ClientError

    from steps.platform.session import stop_session

    tc = service_client.create_lora_training_client(base_model=BASE_MODEL_ARN)
    local_service.state.backend.stop_session(tc.training_session_name)
    local_service.state.backend.delete_session(tc.training_session_name)
    with caplog.at_level(logging.WARNING, logger="steps.session"):
        assert stop_session(tc, failing=True) is False
    assert f"stopping training session {tc.training_session_name} failed as well" in caplog.text
    with pytest.raises(ClientError, match="ResourceNotFound"):
        stop_session(tc, failing=False)
    live = service_client.create_lora_training_client(base_model=BASE_MODEL_ARN)
    assert stop_session(live, failing=False) is True
    assert {"name": live.training_session_name, "status": "Stopped"}.items() <= next(
        s for s in local_service.sessions() if s["name"] == live.training_session_name).items()
