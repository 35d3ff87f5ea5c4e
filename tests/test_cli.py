"""steps/cli.py's exit-code policy under SIGTERM: the step stops even when the first Terminated is swallowed (a
signal handler can run inside a garbage collector's weakref callback, whose exceptions Python drops), and the
cleanup it does on the way out is never interrupted by the repeats."""
from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

from local.stack import ROOT

STEP = textwrap.dedent("""
    import sys, time
    from steps.cli import Terminated, run_step

    def body():
        try:
            print("ready", flush=True)
            time.sleep(60)
        except Terminated:  # what a weakref callback does with it: drop it, and the step goes on
            print("swallowed", flush=True)
        try:
            time.sleep(60)  # training on, as if nothing had happened
        finally:
            time.sleep(2.5)  # stopping the session: a repeated SIGTERM must not cut this short
            print("cleaned up", flush=True)
        return 0

    sys.exit(run_step(body, hint=lambda: "the session was stopped"))
""")


def test_a_swallowed_sigterm_is_raised_again_and_the_cleanup_runs_whole():
    proc = subprocess.Popen([sys.executable, "-c", STEP], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=str(ROOT))
    assert proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)  # not the 60 s sleep: the repeat ended it
    assert proc.returncode == 143, err
    assert out.splitlines() == ["swallowed", "cleaned up"]
    assert err.strip().splitlines()[-1] == "error: SIGTERM received; the session was stopped"


INTERRUPTED = textwrap.dedent("""
    import sys
    from steps.cli import run_step

    def body():
        try:
            print("ready", flush=True)
            sys.stdin.readline()  # training, until the test lets it end
        finally:
            print("stopping the session", flush=True)
            sys.stdin.readline()  # the stop, under way when the runner's SIGTERM comes
            print("session stopped", flush=True)
        return 0

    sys.exit(run_step(body, hint=lambda: "the session was stopped"))
""")


def test_ctrl_c_then_the_runners_sigterm_stop_the_step_once_and_the_stop_runs_whole():
    """A Ctrl-C reaches a local run's step as SIGINT (forwarded by its supervisor) and, a moment later, as the
    runner's SIGTERM: the first stops the step; the second finds it stopping and leaves the stop of its session
    alone (it used to cut that stop short, and an interrupted step then left its session running)."""
    proc = subprocess.Popen([sys.executable, "-c", INTERRUPTED], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=str(ROOT))
    assert proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGINT)
    assert proc.stdout.readline() == "stopping the session\n"
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate("\n", timeout=30)
    assert proc.returncode == 130, err
    assert out == "session stopped\n"
    assert err.strip().splitlines()[-1] == "error: SIGINT received; the session was stopped"


def test_a_message_names_each_setting_as_the_user_typed_it(monkeypatch):
    """make's variables under make (the Makefile sets DAPO_CALLER), the command line's options otherwise; a step
    run by hand names its own option and the pipeline parameter it comes from."""
    from local import run
    from steps.cli import ENV_CALLER, Refused, option, parameter

    monkeypatch.delenv(ENV_CALLER, raising=False)
    assert (option("--data", "d"), parameter("BatchSize", 8)) == ("--data d", "--param BatchSize=8")
    assert parameter("BatchSize", 8, "--batch-size") == "--batch-size 8, the pipeline's BatchSize parameter"
    monkeypatch.setenv(ENV_CALLER, "local.run")  # a step of python -m local.run
    assert parameter("BatchSize", 8, "--batch-size") == "--param BatchSize=8"
    monkeypatch.setenv(ENV_CALLER, "make")
    assert (option("--data", "d"), option("--config", "c.yaml"), option("--param")) == ("DATA=d", "CONFIG=c.yaml",
                                                                                         "PARAMS=")
    assert parameter("BatchSize", 8, "--batch-size") == 'PARAMS="BatchSize=8"'
    # make local-run's refusals, before anything starts: the folder as DATA= (not make data's SOURCE=), the batch
    # size as PARAMS=, a misspelled task with the closest task and the list of them.
    for argv, said in ((["--data", "/nowhere"], "DATA=/nowhere: not a directory"),
                       (["--param", "BatchSize=5000"], '(PARAMS="BatchSize=N")'),
                       (["--task", "gms8k"], "TASK=gms8k: there is no task 'gms8k'; did you mean 'gsm8k'?\n"
                                             "  the built-in tasks: gsm8k, hash, boxed, answer_is, choice")):
        try:
            run.fresh_plan(run.parse_args(argv))
        except Refused as exc:
            assert said in str(exc) and "SOURCE=" not in str(exc) and not str(exc).startswith("--"), exc
        else:
            raise AssertionError(f"{argv} was not refused")
