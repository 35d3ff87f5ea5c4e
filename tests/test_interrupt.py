"""Ctrl-C in the terminal of `make local-run`: SIGINT to the run's whole process group, as a terminal sends it, at
points of TrainDAPO. Every session ends Stopped (by the step itself), the service stops after the steps (so the
summary can say so), and no process of the run is left.

A terminal's Ctrl-C reaches every process of the foreground group: the runner, its step's supervisor (which
forwards it to the step, in a group of its own) and, before, the local service, which then exited first. Each run
costs 10-20 s of CPU, so rather than many runs at random points, one per phase: here, while TrainDAPO starts; while
it saves a checkpoint and evaluates, tests/test_local_run.py's Ctrl-C test (which resumes after it, and checks the
same order with :func:`assert_the_step_stopped_its_session_before_the_service_stopped`). The exact moment within
each phase still varies with the machine's timing.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from local.stack import ROOT

#: Where the Ctrl-C lands: the console line of TrainDAPO after which it is pressed. The runner starting TrainDAPO:
#: downloading its channels, starting its supervisor (a Ctrl-C inside Popen is held until the process is in hand),
#: or the step importing; which of them depends on the machine's timing.
STARTING = "[TrainDAPO] started"


def interrupted_run(tmp_path: Path, point: str) -> tuple[int, str, str]:
    """A small local run in a process group of its own (a terminal's foreground job), SIGINT to the whole group once
    ``point`` is printed; its exit code, stdout and stderr."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "local.run", "--runs-dir", str(tmp_path / "runs"), "--definition-out",
         str(tmp_path / "pipeline.json"), "--train-rows", "60",
         "--eval-rows", "10", "--param", "MaxSteps=6", "--param", "BatchSize=4", "--param", "EvalSize=4",
         "--verbose"],  # the full step lines: the point is one of them
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(ROOT), start_new_session=True)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith(point):
            os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the runner, the supervisor, a step; not the service
            break
    out, err = proc.communicate(timeout=120)
    return proc.returncode, "".join(lines) + out, err


@pytest.mark.slow
def test_ctrl_c_stops_the_steps_then_the_service_and_leaves_no_session_or_process(tmp_path):
    code, out, err = interrupted_run(tmp_path, STARTING)
    assert code == 130 and "interrupted: every process this run started has been stopped" in err, out[-3000:] + err
    # No process of the run is left: every one of them names a path under its runs dir.
    left = subprocess.run(["pgrep", "-af", str(tmp_path / "runs")], capture_output=True, text=True).stdout
    assert left == "", left
    # The service answered after the steps had stopped: the summary has every session, none running.
    assert "training sessions: unknown" not in out and "service exited during the run" not in out
    created = int(re.search(r"training sessions created: (\d+), left running: 0\n", out).group(1))
    statuses = re.findall(r"(dapo-\S+-TrainDAPO-\S+) (\w+)", out.split("training sessions created:", 1)[1])
    assert [status for _, status in statuses] == ["Stopped"] * created
    run_dir = tmp_path / "runs" / re.search(r"^local-run (\S+):", out, re.M).group(1)
    if created:  # the Ctrl-C came after the step had created its session
        assert_the_step_stopped_its_session_before_the_service_stopped(run_dir, statuses[0][0])


def assert_the_step_stopped_its_session_before_the_service_stopped(run_dir: Path, session: str) -> None:
    """The step stopped its own session (its supervisor found nothing to stop, nor had to kill it), and the service
    stopped after it: its own log has the session's stop before its own."""
    step_log = (run_dir / "logs" / "TrainDAPO.log").read_text()
    # The supervisor forwards the terminal's SIGINT, and the runner's SIGTERM follows it by milliseconds; under
    # load the step's handler may raise for the second (a CI run on a loaded machine saw SIGTERM). Either way the
    # step itself stopped its session, which is what this checks.
    assert re.search(r"error: SIG(INT|TERM) received; the training session was stopped", step_log), step_log[-3000:]
    assert "supervise: stopped training session" not in step_log and "has not exited" not in step_log
    service_log = (run_dir / "training-session-service.log").read_text()
    assert service_log.index(f"session {session} stopped") < service_log.index("stopping: ")


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="waits on a process that is not its child: Linux pidfd")
def test_the_service_runs_in_a_group_of_its_own_and_ends_with_the_process_that_started_it(tmp_path):
    """A terminal's Ctrl-C to the runner's group does not reach the service; a SIGKILL of the runner, which cannot
    stop it, ends it too: its stdin, a pipe from the runner, closes."""
    starter = ("import os, sys, signal\n"
               "from pathlib import Path\n"
               "from local.stack import LocalStack\n"
               f"with LocalStack(log_path=Path({str(tmp_path / 'service.log')!r})) as stack:\n"
               "    print(stack._service.pid, flush=True)\n"
               "    signal.pause()\n")
    proc = subprocess.Popen([sys.executable, "-c", starter], stdout=subprocess.PIPE, text=True, cwd=str(ROOT),
                            start_new_session=True)
    service = int(proc.stdout.readline())
    assert os.getpgid(service) == service != os.getpgid(proc.pid)
    os.killpg(proc.pid, signal.SIGKILL)  # the runner's whole group, at once: the service is not in it
    assert proc.wait(timeout=30) == -signal.SIGKILL
    wait_for_exit(service)
    assert "stdin closed: the process that started the service has ended" in (tmp_path / "service.log").read_text()


def wait_for_exit(pid: int, timeout: float = 30) -> None:
    """Until the process ``pid``, not a child of this one, has exited (a Linux pidfd is readable then)."""
    import select

    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        readable, _, _ = select.select([pidfd], [], [], timeout)
        assert readable == [pidfd], f"process {pid} still running after {timeout}s"
    finally:
        os.close(pidfd)
