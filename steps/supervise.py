"""``python -m steps.supervise -- COMMAND [ARG ...]``: run a step's process; if it dies, stop its training session.

A training session has no idle timeout, and a step process killed where it cannot clean up
(SIGKILL from the out-of-memory killer, the interpreter crashing) leaves its session billing
until the next job's sweep or ``make stop-orphans``. So the container's entry point runs the
steps that create sessions under this supervisor (containers/entrypoint.sh for TrainDAPO's
``train``; EvaluateModel's ContainerEntrypoint in pipeline/pipeline.py). It

* starts COMMAND as its child, in a process group of its own, and forwards SIGTERM and SIGINT
  to it (the step stops its session on those itself; a terminal's Ctrl-C reaches it once);
* when the child dies by a signal, or exits non-zero, stops the job's sessions that are still
  active: it finds them by name, as steps/platform/ownership.py names them (pipeline key, job,
  attempt), and logs each one it stopped;
* exits with the child's code, 128 + N for death by signal N, so SageMaker records the step's
  own outcome.

As a container's PID 1 it also reaps the orphaned processes the kernel hands it. Outside a
pipeline's job (no DAPO_PIPELINE_NAME or job name) the SDK names the step's session and
nothing tells it apart: the supervisor then only passes the exit code on.
"""
from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from typing import Sequence

from steps.cli import Refused
from steps.platform.ownership import Owner, stop_jobs_sessions

#: What an entry point puts before a step's command to run it under the supervisor.
ENTRYPOINT = ("python", "-m", "steps.supervise", "--")
FORWARDED = (signal.SIGTERM, signal.SIGINT)
USAGE = "usage: python -m steps.supervise -- COMMAND [ARG ...]"


def say(message: str) -> None:
    print(f"supervise: {message}", file=sys.stderr, flush=True)


def shell_code(returncode: int) -> int:
    """A child's return code as a shell (and SageMaker) reports it: 128 + N for death by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:  # a real-time signal has no name
        return f"signal {number}"


def run(command: Sequence[str]) -> int:
    """Run ``command`` to its end with SIGTERM and SIGINT forwarded; its return code (-N: killed by signal N)."""
    child = subprocess.Popen(list(command), start_new_session=True)

    def forward(signum: int, _frame: object) -> None:
        if child.returncode is None:
            child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    try:
        child.returncode = reap_until(child.pid)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return child.returncode


def reap_until(pid: int) -> int:
    """Reap every child that ends until ``pid`` does (PID 1 inherits orphans); its return code, -N for signal N."""
    while True:
        done, status = os.waitpid(-1, 0)  # retried after a forwarded signal (PEP 475)
        if done == pid:
            return os.waitstatus_to_exitcode(status)


def service_client() -> object:
    """The SDK's ServiceClient, to list and stop sessions only: the Region of the job's environment (SageMaker
    sets AWS_REGION; the sessions are the job's Region's), and no role, as it creates none."""
    from sagemaker.train.training_session import ServiceClient

    return ServiceClient(role_arn="")


def stop_what_is_left(owner: Owner) -> None:
    """Stop the owner's job's active sessions, naming each; a failure is logged, never raised: the step's exit
    code must reach SageMaker whatever happens here."""
    try:
        stopped = stop_jobs_sessions(service_client(), owner)
    except Exception as exc:  # whatever it is: say so, and leave the sessions to the sweep
        say(f"could not stop the training sessions of job {owner.job} ({type(exc).__name__}: {exc}); the pipeline's "
            "next job stops them, or run make stop-orphans")
        return
    for s in stopped:
        say(f"stopped training session {s.name} (job {owner.job}, attempt {s.attempt}, was {s.status}): "
            "the step's process ended without stopping it")


def main(argv: Sequence[str] | None = None) -> int:
    command = list(sys.argv[1:] if argv is None else argv)
    command = command[1:] if command[:1] == ["--"] else command
    if not command:
        say(USAGE)
        return 64
    try:
        owner = Owner.from_env()  # before the child runs: what it names its sessions by
    except Refused as exc:
        say(f"{exc}; its training sessions cannot be found if it dies")
        owner = None
    code = run(command)
    if code < 0:
        shown = shlex.join(command[:3]) + (" ..." if len(command) > 3 else "")  # `python -m steps.x ...`
        say(f"the step's process ({shown}) was killed by {signal_name(-code)}")
    if code != 0 and owner is not None:
        stop_what_is_left(owner)
    return shell_code(code)


if __name__ == "__main__":
    sys.exit(main())
