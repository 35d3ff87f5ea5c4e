"""steps.supervise, the container's entry point for the steps that create training sessions: the step's process
killed (SIGKILL, as the out-of-memory killer does) has its session stopped by the supervisor before it exits,
with the step's code; SIGTERM reaches the step; a step that does not exit within the grace is killed and its
session stopped; the step does not outlive its supervisor. Processes started as the image starts them, against the local
training-session service."""
from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from steps.platform.ownership import ENV_JOB, ENV_LOCAL_JOBS, ENV_PIPELINE, LocalJobs, Owner, pipeline_sessions
from steps.supervise import ENV_GRACE, shell_code
from tests import test_train
from tests.test_sessions import EVALUATE_JOB, PIPELINE_JOB, a_pipeline, create
from tests.test_train import ROOT, argv, subprocess_env

toy_data = test_train.toy_data  # the fixture, shared with test_train
SUPERVISED = [sys.executable, "-m", "steps.supervise", "--"]


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Linux /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # it ended while we looked
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def read_until(proc: subprocess.Popen, prefix: str) -> list[str]:
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith(prefix):
            return lines
    raise AssertionError(f"process ended before printing {prefix!r}:\n{''.join(lines)}")


def test_a_sigkilled_step_has_its_session_stopped_by_the_supervisor(tmp_path, toy_data, local_service,
                                                                     service_client):
    pipeline = a_pipeline()
    me, other = Owner(pipeline, PIPELINE_JOB), Owner(pipeline, EVALUATE_JOB)
    jobs = LocalJobs(tmp_path / "jobs")
    env = {**subprocess_env(local_service), ENV_PIPELINE: pipeline, ENV_JOB: me.job,
           ENV_LOCAL_JOBS: str(jobs.directory)}
    with jobs.running(me.job), jobs.running(other.job):
        running_elsewhere = create(service_client, other.session_name(1))  # another running job's: not touched
        proc = subprocess.Popen([*SUPERVISED, sys.executable, "-m", "steps.train",
                                 *argv(tmp_path, toy_data, "batch_size=4", "max_steps=50", "eval_every=0")],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=str(ROOT))
        read_until(proc, "train: step=1 ")
        (step,) = children(proc.pid)
        assert {s.name: s.status for s in pipeline_sessions(service_client, pipeline)}[me.session_name(1)] == "Running"
        subprocess.run(["kill", "-KILL", str(step)], check=True)  # the step's Python process, not the supervisor
        out = "".join(proc.stdout)
        assert proc.wait(timeout=60) == 137, out

    statuses = {s.name: s.status for s in pipeline_sessions(service_client, pipeline)}
    assert statuses == {me.session_name(1): "Stopped", other.session_name(1): "Running"}
    assert re.search(r"^supervise: the step's process \(\S+ -m steps\.train \.\.\.\) was killed by SIGKILL$", out, re.M)
    assert f"supervise: stopped training session {me.session_name(1)} (job {me.job}, attempt 1, was Running): " \
           "the step's process ended without stopping it" in out
    running_elsewhere.stop()


def test_sigterm_reaches_the_step_and_its_code_is_the_supervisors():
    """SageMaker stops a job with SIGTERM to the container's PID 1, the supervisor: the step gets it. Outside a
    pipeline's job (no owner) there is no session to look for."""
    child = "import signal, sys; print('ready', flush=True); signal.pause()"
    proc = subprocess.Popen([*SUPERVISED, sys.executable, "-c", child], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=str(ROOT), env=environment_without_owner())
    assert proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGTERM)
    out = proc.stdout.read()
    assert proc.wait(timeout=30) == 143
    assert "was killed by SIGTERM" in out and "stopped training session" not in out


def environment_without_owner() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in (ENV_PIPELINE, ENV_JOB, ENV_LOCAL_JOBS)}


@pytest.mark.parametrize("returncode, code", [(0, 0), (1, 1), (2, 2), (-9, 137), (-15, 143), (-2, 130)])
def test_the_exit_code_is_the_childs_as_a_shell_reports_it(returncode, code):
    assert shell_code(returncode) == code


def test_without_a_command_it_explains_itself():
    result = subprocess.run([*SUPERVISED], capture_output=True, text=True, cwd=str(ROOT))
    assert result.returncode == 64 and "usage: python -m steps.supervise -- COMMAND" in result.stderr


def test_a_step_still_running_after_its_grace_is_killed_and_its_session_stopped(tmp_path, local_service,
                                                                                 service_client):
    """A step that hangs on its way out (here: it ignores SIGTERM) is killed, with its process group, once the
    supervisor's grace is over, and the supervisor stops its session before it exits: not the runner's (or
    SageMaker's) SIGKILL of the supervisor, which would leave the session billing."""
    pipeline = a_pipeline()
    me = Owner(pipeline, PIPELINE_JOB)
    jobs = LocalJobs(tmp_path / "jobs")
    env = {**subprocess_env(local_service), ENV_PIPELINE: pipeline, ENV_JOB: me.job,
           ENV_LOCAL_JOBS: str(jobs.directory), ENV_GRACE: "1"}
    hung = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); signal.pause()"
    with jobs.running(me.job):
        client = create(service_client, me.session_name(1))  # the step's session, Running
        proc = subprocess.Popen([*SUPERVISED, sys.executable, "-c", hung], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, env=env, cwd=str(ROOT))
        assert proc.stdout.readline() == "ready\n"
        proc.send_signal(signal.SIGTERM)
        out = proc.stdout.read()
        assert proc.wait(timeout=60) == 137, out
    assert "supervise: the step's process has not exited 1s after SIGTERM: killing it and its process group\n" in out
    assert "was killed by SIGKILL" in out and f"stopped training session {me.session_name(1)}" in out
    assert {s.name: s.status for s in pipeline_sessions(service_client, pipeline)} == {me.session_name(1): "Stopped"}
    del client


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="waits on a process that is not its child: Linux pidfd")
def test_the_step_dies_with_its_supervisor_though_it_runs_in_a_group_of_its_own():
    """A SIGKILL of the supervisor's process group (a local run's hard stop) does not reach the step, which the
    supervisor starts in a group of its own: the kernel kills it when the supervisor dies (PR_SET_PDEATHSIG).
    Before, it lived on as an orphan until its calls to the vanished service failed."""
    child = "import os, signal; print(os.getpid(), flush=True); signal.pause()"
    proc = subprocess.Popen([*SUPERVISED, sys.executable, "-c", child], stdout=subprocess.PIPE, text=True,
                            cwd=str(ROOT), env=environment_without_owner(), start_new_session=True)
    step = int(proc.stdout.readline())
    assert os.getpgid(step) == step != os.getpgid(proc.pid)
    pidfd = os.pidfd_open(step)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
        readable, _, _ = select.select([pidfd], [], [], 30)  # readable once the step's process has exited
        assert readable == [pidfd], "the step outlived its supervisor"
    finally:
        os.close(pidfd)
