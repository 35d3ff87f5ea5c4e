"""``python -m steps.supervise -- COMMAND [ARG ...]``: run a step's process; if it dies, stop its training session.

A training session has no idle timeout, and a step process killed where it cannot clean up
(SIGKILL from the out-of-memory killer, the interpreter crashing) leaves its session billing
until the next job's sweep or ``make stop-orphans``. So the container's entry point runs the
steps that create sessions under this supervisor (containers/entrypoint.sh for TrainDAPO's
``train``; EvaluateModel's ContainerEntrypoint in pipeline/pipeline.py). It

* starts COMMAND as its child, in a process group of its own, and forwards SIGTERM and SIGINT
  to it (the step stops its session on those itself; a terminal's Ctrl-C reaches it once);
* gives the child :data:`GRACE_SECONDS` from the first signal it forwards: a child still alive then
  is killed, with its whole process group, and its sessions are stopped as below, so a step that
  hangs on its way out does not outlast the grace of whoever stops the supervisor (SageMaker's
  120 s, the local runner's);
* on Linux, has the kernel kill the child when the supervisor dies (PR_SET_PDEATHSIG): a SIGKILL
  of the supervisor, or of the process group it shares with a local run, then leaves no step
  process running on in its own group;
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
import threading
from typing import Callable, Sequence

from steps.cli import Refused
from steps.platform.ownership import Owner, stop_jobs_sessions

#: What an entry point puts before a step's command to run it under the supervisor.
ENTRYPOINT = ("python", "-m", "steps.supervise", "--")
FORWARDED = (signal.SIGTERM, signal.SIGINT)
USAGE = "usage: python -m steps.supervise -- COMMAND [ARG ...]"
#: Seconds the step has to exit after the first SIGTERM or SIGINT, before the supervisor kills it and stops its
#: sessions itself. A step stops its session in a few seconds; SageMaker kills the container 120 s after its
#: SIGTERM and the local runner waits :data:`GRACE_SECONDS` + 25 s, so both leave the supervisor time to stop the
#: sessions. ``DAPO_SUPERVISE_GRACE_SECONDS`` overrides it (a test's hung step).
GRACE_SECONDS = 20.0
ENV_GRACE = "DAPO_SUPERVISE_GRACE_SECONDS"
PR_SET_PDEATHSIG = 1  # linux/prctl.h


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


def grace_seconds() -> float:
    value = os.environ.get(ENV_GRACE, "")
    try:
        return float(value) if value else GRACE_SECONDS
    except ValueError:
        raise SystemExit(f"supervise: {ENV_GRACE}={value!r} is not a number of seconds") from None


def run(command: Sequence[str], grace: float = GRACE_SECONDS) -> int:
    """Run ``command`` to its end with SIGTERM and SIGINT forwarded, killing it ``grace`` seconds after the first;
    its return code (-N: killed by signal N)."""
    child = subprocess.Popen(list(command), start_new_session=True, preexec_fn=die_with_parent(os.getpid()))
    deadline: threading.Timer | None = None

    def forward(signum: int, _frame: object) -> None:
        nonlocal deadline
        if child.returncode is None:  # not reaped yet, so its pid is still its own (a zombie's at worst)
            os.kill(child.pid, signum)  # not Popen.send_signal: its poll() could reap the child under reap_until
            if deadline is None:  # the grace runs from the first signal
                deadline = threading.Timer(grace, kill_after_grace, args=(child.pid, grace, signum))
                deadline.daemon = True
                deadline.start()

    # Installed for good: once the child has ended they do nothing, so a late SIGTERM or Ctrl-C cannot cut short
    # the stop of its sessions that follows.
    for sig in FORWARDED:
        signal.signal(sig, forward)
    try:
        child.returncode = reap_until(child.pid)
    finally:
        if deadline is not None:
            deadline.cancel()
        kill_group(child.pid)  # what the step left in its group (a process of its own) ends with it
    return child.returncode


def kill_after_grace(pgid: int, grace: float, signum: int) -> None:
    say(f"the step's process has not exited {grace:g}s after {signal_name(signum)}: killing it and its process group")
    kill_group(pgid)


def kill_group(pgid: int) -> None:
    """SIGKILL to the process group the step leads; nothing if it is empty."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # nothing left in it (nothing this process may signal)
        pass


def die_with_parent(parent: int) -> Callable[[], None] | None:
    """Run in the child before it execs (Linux; None elsewhere): the kernel SIGKILLs it when ``parent`` dies.

    Without it, a step, in a process group of its own, outlived a SIGKILL of its supervisor's group by 14-20 s,
    until its calls to the vanished service failed. The child itself is killed, not asked to stop: its
    supervisor, who would stop its sessions, is gone, and so is a local run's service. The signal follows the thread
    that forked the child, here the main thread, which lives as long as the supervisor. ``libc.prctl`` is looked
    up here, before the fork, so the child only calls it."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def set_death_signal() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before the line above: nobody would kill this child
            os.kill(os.getpid(), signal.SIGKILL)

    return set_death_signal


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

    from steps.platform.failfast import fail_fast

    return fail_fast(ServiceClient(role_arn=""))  # a dead service: a logged failure in seconds, not minutes


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
    code = run(command, grace_seconds())
    if code < 0:
        shown = shlex.join(command[:3]) + (" ..." if len(command) > 3 else "")  # `python -m steps.x ...`
        say(f"the step's process ({shown}) was killed by {signal_name(-code)}")
    if code != 0 and owner is not None:
        stop_what_is_left(owner)
    return shell_code(code)


if __name__ == "__main__":
    sys.exit(main())
