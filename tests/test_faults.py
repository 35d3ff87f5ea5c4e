"""The fault suite: the training step under injected faults, against the local service.

For every fault the run either finishes with the right number of steps or stops
with a clear error that says how to resume, and always:

* no step is applied twice: the saved state's Adam step count equals the
  steps the checkpoint claims (and, at the end, the steps completed);
* checkpoint.json always parses, read while the training process is writing it;
* no session is left running. A SIGKILLed process can stop nothing: the next
  start of the step stops its session (steps/platform/ownership.py), before it
  creates its own, as a pipeline's training job would (the test keeps the local
  register of running jobs that the local runner keeps).

The helpers (argv, start_training, step_records, the toy_data fixture) are test_train's; this
module adds the faults and the stronger assertions, and prints a table of the
faults tried and their outcomes in pytest's terminal summary.
"""
from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from local.training_session.faults import Faults
from steps import train
from steps.dapo import metrics as metrics_io
from steps.dapo import state as ckpt_io
from steps.platform import billing
from steps.platform.ownership import ENV_JOB, ENV_LOCAL_JOBS, ENV_PIPELINE, LocalJobs, Owner
from tests import test_train
from tests.test_service_wire import control_client
from tests.test_train import ROOT, argv, start_training, step_records, subprocess_env

pytestmark = pytest.mark.usefixtures("local_service")
toy_data = test_train.toy_data  # the fixture, shared with test_train
# Small and fast: 8 prompts x 8 samples per step on the toy task, a checkpoint every 2 steps.
SETS = ("batch_size=8", "save_every=2", "eval_every=0")


# -- the table of faults and outcomes -----------------------------------------------------
@dataclass(frozen=True)
class Row:
    fault: str
    injected: str
    outcome: str


ROWS: list[Row] = []


class _FaultTable:
    """A plugin registered by this module: pytest prints its table in the terminal summary."""

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not ROWS:
            return
        w = max(len(r.fault) for r in ROWS)
        v = max(len(r.injected) for r in ROWS)
        terminalreporter.write_sep("-", "fault suite: faults tried and outcomes")
        for r in ROWS:
            terminalreporter.write_line(f"{r.fault:<{w}}  {r.injected:<{v}}  {r.outcome}")


@pytest.fixture(scope="module", autouse=True)
def fault_table(request):
    manager = request.config.pluginmanager
    if not manager.has_plugin("fault-table"):
        manager.register(_FaultTable(), "fault-table")


# -- invariants -------------------------------------------------------------------------
def adam_steps(service, arn: str) -> int:
    """Optimizer steps contained in a saved training state."""
    return int(service.state.registry.weights(arn)["adam_step"])


def checked_checkpoint(service, ckpt_dir: Path) -> ckpt_io.LoopState | None:
    """checkpoint.json parses (read raises CheckpointError otherwise), and its saved
    state holds exactly the steps it claims: none applied twice, none lost."""
    ckpt = ckpt_io.read(ckpt_dir)
    if ckpt is not None:
        assert adam_steps(service, ckpt.state_model_package_arn) == ckpt.step
    return ckpt


def new_sessions(service, before: set[str]) -> list[dict]:
    return [s for s in service.sessions() if s["name"] not in before]


def running(sessions: list[dict]) -> list[dict]:
    return [s for s in sessions if s["status"] not in ("Stopped", "Failed")]


def assert_finished(tmp_path: Path, service, n_steps: int) -> ckpt_io.LoopState:
    """Every step logged exactly once, and the final state holds exactly n_steps optimizer steps."""
    assert [r["step"] for r in step_records(tmp_path)] == list(range(1, n_steps + 1))
    ckpt = checked_checkpoint(service, tmp_path / "ckpt")
    assert ckpt is not None and ckpt.step == n_steps
    assert json.loads((tmp_path / "model" / "model.json").read_text())["steps_completed"] == n_steps
    return ckpt


def read_until_checking(proc, prefix: str, service, ckpt_dir: Path) -> list[str]:
    """Read the process's output up to a line starting with ``prefix``, checking
    checkpoint.json at every line, i.e. while the process may be writing it."""
    lines = []
    for line in proc.stdout:
        lines.append(line)
        checked_checkpoint(service, ckpt_dir)
        if line.startswith(prefix):
            return lines
    raise AssertionError(f"process ended before printing {prefix!r}:\n{''.join(lines)}")


def finish(proc, service, ckpt_dir: Path, timeout: float = 120) -> str:
    lines = []
    for line in proc.stdout:
        lines.append(line)
        checked_checkpoint(service, ckpt_dir)
    proc.wait(timeout=timeout)
    return "".join(lines)


# -- faults the run absorbs ---------------------------------------------------------------
def test_throttling_of_a_fifth_of_the_operations_is_absorbed(tmp_path, toy_data, local_service):
    before = {s["name"] for s in local_service.sessions()}
    local_service.set_faults(Faults(throttle_rate=0.2, seed=3))
    assert train.main(argv(tmp_path, toy_data, *SETS, "max_steps=4")) == 0
    throttled = local_service.state.injector.injected["throttled"]
    local_service.set_faults(Faults())

    assert throttled > 0
    assert_finished(tmp_path, local_service, 4)
    assert not running(new_sessions(local_service, before))
    ROWS.append(Row("throttling 20% of submits", f"{throttled} throttled (429)",
                    "finished 4/4 steps; Adam steps 4; session stopped"))


def test_failed_sampling_operations_are_resampled(tmp_path, toy_data, local_service):
    before = {s["name"] for s in local_service.sessions()}
    local_service.set_faults(Faults(sampling_fail_rate=0.05, seed=4))
    assert train.main(argv(tmp_path, toy_data, *SETS, "max_steps=4")) == 0
    failed = local_service.state.injector.injected["failed_operations"]
    local_service.set_faults(Faults())

    (mine,) = new_sessions(local_service, before)
    ops = local_service.state.find(mine["name"]).operations()
    failed_sampling = sum(1 for op in ops if not op.training and op.status == "Failed")
    assert failed > 0 and failed_sampling == failed
    assert not any(op.training and op.status != "Completed" for op in ops)  # the knob spares training ops
    assert_finished(tmp_path, local_service, 4)
    # A failed request is resubmitted, so (at 5%) no group is lost and every step trains on a full batch.
    assert all(r["kept_groups"] == 8 for r in step_records(tmp_path))
    assert mine["status"] == "Stopped"
    assert_billed_as_the_service_counts(tmp_path, local_service, mine["name"])
    ROWS.append(Row("5% of sampling ops fail", f"{failed} sampling ops failed",
                    "resampled; finished 4/4 steps; Adam steps 4; session stopped"))


def assert_billed_as_the_service_counts(tmp_path: Path, service, name: str) -> None:
    """What the run reports it billed is the session's own BillableTokenUsage (through boto3), and the client's
    count (what the loop sent and received: failed sampling requests bill nothing) is the same figure."""
    usage = control_client(service.url).describe_training_session(TrainingSessionName=name)[
        "TrainingSessionDetail"]["BillableTokenUsage"]
    counted = {"prefill_tokens": usage["PrefillTokenCount"], "sample_tokens": usage["SampleTokenCount"],
               "train_tokens": usage["TrainingTokenCount"]}
    assert min(counted.values()) > 0
    bill = json.loads((tmp_path / "model" / "model.json").read_text())["billing"]
    assert bill == {**counted, "source": billing.SERVICE, "session": name, "client_count": counted}
    # Running totals per step, in the train line's order; the final evaluation's sampling comes after the last.
    steps, [final] = step_records(tmp_path), [r for r in metrics_io.read(tmp_path / "out" / "metrics.jsonl")
                                              if r["kind"] == "billing"]
    for kind in counted:
        totals = [r[kind] for r in steps]
        assert totals == sorted(totals) and totals[0] > 0 and totals[-1] <= counted[kind] == final[kind]
    assert steps[-1]["train_tokens"] == counted["train_tokens"]  # only the steps train


# -- faults that stop the run, and the resume ----------------------------------------------
@pytest.mark.slow
def test_a_session_that_dies_mid_run_stops_with_a_resume_hint_and_the_rerun_finishes(tmp_path, toy_data, local_service):
    sets = (*SETS, "max_steps=8")
    before = {s["name"] for s in local_service.sessions()}
    proc = start_training(tmp_path, toy_data, local_service, *sets)
    read_until_checking(proc, "train: step=3 ", local_service, tmp_path / "ckpt")
    local_service.set_faults(Faults(fail_session_after=0))  # the session fails at its next operation
    out = finish(proc, local_service, tmp_path / "ckpt")
    local_service.set_faults(Faults())

    ckpt = checked_checkpoint(local_service, tmp_path / "ckpt")
    assert proc.returncode == 1, out
    assert ckpt is not None and 2 <= ckpt.step < 8
    assert "error: the training session failed" in out and "is Failed (injected fault" in out
    assert "stopped:" not in out  # not mistaken for prompts of the wrong difficulty (max_num_gen_batches)
    assert f"running the step again resumes from the checkpoint of step {ckpt.step}" in out
    (died,) = new_sessions(local_service, before)
    assert died["status"] == "Failed" and "injected fault" in died["error"]

    rerun = start_training(tmp_path, toy_data, local_service, *sets)
    out = finish(rerun, local_service, tmp_path / "ckpt")
    assert rerun.returncode == 0, out
    assert f"resuming from {ckpt.state_model_package_arn} (step {ckpt.step})" in out
    assert_finished(tmp_path, local_service, 8)
    assert not running(new_sessions(local_service, before))
    ROWS.append(Row("session fails mid-run", f"failed after step {ckpt.step}'s checkpoint",
                    f"exit 1 with resume hint; rerun resumed at step {ckpt.step}, finished 8/8; Adam steps 8"))


def start_job(tmp_path, data, service, owner: Owner, jobs: LocalJobs, *sets):
    """steps.train as the pipeline's training job ``owner.job`` runs it."""
    env = {**subprocess_env(service), ENV_PIPELINE: owner.pipeline, ENV_JOB: owner.job,
           ENV_LOCAL_JOBS: str(jobs.directory)}
    return subprocess.Popen([sys.executable, "-m", "steps.train", *argv(tmp_path, data, *sets)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=str(ROOT))


@pytest.mark.slow
def test_sigkill_twice_then_restart_stops_the_orphans_and_applies_every_step_once(tmp_path, toy_data, local_service):
    """Both kills land right after a checkpoint step's train line, racing that step's save_state and checkpoint
    write. The first restart is the same job starting its process again; after the second kill the job is over
    (the pipeline retries the step as a new job). Each start stops the killed process's session first."""
    sets = (*SETS, "max_steps=6")
    ckpt_dir = tmp_path / "ckpt"
    jobs = LocalJobs(tmp_path / "jobs")
    first, retry = Owner("dapo-faults", "TrainDAPO-kill-1"), Owner("dapo-faults", "TrainDAPO-kill-2")
    before = {s["name"] for s in local_service.sessions()}
    kills, swept = [], []
    with jobs.running(first.job):
        for prefix in ("train: step=2 ", "train: step=4 "):
            proc = start_job(tmp_path, toy_data, local_service, first, jobs, *sets)
            swept += re.findall(r"stopped orphaned training session (\S+)", "".join(
                read_until_checking(proc, prefix, local_service, ckpt_dir)))
            proc.kill()  # SIGKILL: no cleanup, possibly mid-write of checkpoint.json
            proc.wait()
            ckpt = checked_checkpoint(local_service, ckpt_dir)
            kills.append(ckpt.step if ckpt else 0)
        assert [s["status"] for s in new_sessions(local_service, before)] == ["Stopped", "Running"]

    last = start_job(tmp_path, toy_data, local_service, retry, jobs, *sets)
    out = finish(last, local_service, ckpt_dir)
    swept += re.findall(r"stopped orphaned training session (\S+)", out)
    assert last.returncode == 0, out
    assert "resuming from" in out
    assert_finished(tmp_path, local_service, 6)

    # Each killed session was stopped by the start after it, before that start created its own; none is left.
    mine = new_sessions(local_service, before)
    assert [s["name"] for s in mine] == [first.session_name(1), first.session_name(2), retry.session_name(1)]
    assert swept == [first.session_name(1), first.session_name(2)]
    assert not running(mine)
    ROWS.append(Row("SIGKILL x2, then restart", f"killed with checkpoints at steps {kills}",
                    "each start stopped the killed run's session first; restart finished 6/6; Adam steps 6; "
                    "0 sessions left Running"))


@pytest.mark.slow
def test_sigterm_stops_the_session_and_the_rerun_resumes(tmp_path, toy_data, local_service):
    sets = (*SETS, "max_steps=6")
    before = {s["name"] for s in local_service.sessions()}
    proc = start_training(tmp_path, toy_data, local_service, *sets)
    read_until_checking(proc, "train: step=3 ", local_service, tmp_path / "ckpt")
    proc.send_signal(signal.SIGTERM)
    out = finish(proc, local_service, tmp_path / "ckpt", timeout=60)

    ckpt = checked_checkpoint(local_service, tmp_path / "ckpt")
    assert proc.returncode == 143 and ckpt is not None
    assert f"SIGTERM received; the training session was stopped and running the step again resumes " \
           f"from the checkpoint of step {ckpt.step}" in out
    assert [s["status"] for s in new_sessions(local_service, before)] == ["Stopped"]

    rerun = start_training(tmp_path, toy_data, local_service, *sets)
    out = finish(rerun, local_service, tmp_path / "ckpt")
    assert rerun.returncode == 0, out
    assert_finished(tmp_path, local_service, 6)
    assert not running(new_sessions(local_service, before))
    ROWS.append(Row("SIGTERM mid-run", f"after step 3 (checkpoint of step {ckpt.step})",
                    "exit 143, session stopped, resume hint; rerun finished 6/6; Adam steps 6"))


def test_checkpoint_damage(tmp_path, toy_data, local_service, capsys):
    """A leftover temp file of an interrupted write is ignored; a damaged checkpoint.json
    is refused before any session and left as it was."""
    assert train.main(argv(tmp_path, toy_data, *SETS, "max_steps=2")) == 0
    first_two = step_records(tmp_path)
    ckpt_dir = tmp_path / "ckpt"
    (ckpt_dir / ".checkpoint.json.tmp").write_text('{"version": 2, "step": 9')  # a write cut short
    assert train.main(argv(tmp_path, toy_data, *SETS, "max_steps=4")) == 0
    assert_finished(tmp_path, local_service, 4)
    assert step_records(tmp_path)[:2] == first_two  # resumed at step 3: steps 1-2 were not redone

    path = ckpt_dir / "checkpoint.json"
    damaged = path.read_bytes()[: path.stat().st_size // 2]  # what a non-atomic write would leave
    path.write_bytes(damaged)
    before = len(local_service.sessions())
    assert train.main(argv(tmp_path, toy_data, *SETS, "max_steps=6")) == 2
    err = capsys.readouterr().err
    assert "checkpoint.json is not a usable checkpoint" in err and f"Delete {path}" in err
    assert len(local_service.sessions()) == before  # refused before creating a session
    assert path.read_bytes() == damaged  # left for inspection, not overwritten
    ROWS.append(Row("checkpoint damage", "stale .tmp of a cut write; then half a checkpoint.json",
                    ".tmp ignored, resumed 2->4; half file refused (exit 2) before any session, left intact"))
