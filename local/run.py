"""`make local-run`: the whole pipeline on this machine, offline.

Starts moto (server mode) and the local training-session service on
127.0.0.1, generates the toy GSM8K-format dataset and uploads it to moto S3,
builds build/pipeline.json exactly as `make pipeline-definition` does, runs
that definition with the local interpreter (EvaluateModel grades the base model
and the trained adapter on the same questions), and leaves runs/<run-id>/ with
the reports (evaluation_base.json: the base model's half of evaluation.json),
the rollouts, curves.png, every step's whole log (logs/), the service's log and
a summary. Every process it started is stopped, also on Ctrl-C; the summary is
printed however the run ends.

Parameters are checked against the one parameter table (steps/config/parameters.py)
before anything is created. ``--resume RUN_ID`` continues an interrupted or failed run
(see :func:`resume_plan`).
"""
from __future__ import annotations

import argparse
import json
import logging
import secrets
import signal
import sys
import textwrap
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from local import console
from local.console import say
from local.sample import keep_only_the_adapter
from local.stack import ROOT
from steps.cli import Refused, option, parameter, parse_pairs
from steps.config import RunConfig, config_from_dict, load_yaml
from steps.config.load import task_name_problem
from steps.config.parameters import PARAMETERS
from steps.platform import files

DEFAULT_CONFIG = str(ROOT / "config" / "local.yaml")
DEFAULTS = {"train_rows": 2000, "eval_rows": 200, "seed": 0}
#: Set by the local run itself: the data it generates and uploads.
DATA_PARAMETERS = ("TrainDataS3Uri", "EvalDataS3Uri")
RUN_FILE = "run.json"  # what a resume needs: the run's parameters and data
STEPS_FILE = "steps.json"  # each step's record (status, properties), written as it changes


# -- the command line ---------------------------------------------------------------
def parameter_help(config: str) -> str:
    """The pipeline parameters with their meaning and default (``config``'s values), from the one table."""
    try:
        run: RunConfig | None = config_from_dict(load_yaml(config), source=config)
    except Refused:
        run = None
    width = max(len(p.name) for p in PARAMETERS)
    lines = [f"pipeline parameters (--param NAME=VALUE; defaults from {Path(config).name}):"]
    for p in PARAMETERS:
        default = ("the run's generated toy data" if p.name in DATA_PARAMETERS else
                   "see the config" if run is None else p.default(run))
        lines += textwrap.wrap(f"{p.name:<{width}}  {p.meaning} ({p.kind}, default {default})", width=100,
                               initial_indent="  ", subsequent_indent=" " * (width + 4), break_long_words=False,
                               break_on_hyphens=False)
    lines += ["", "examples: make local-run PARAMS=\"MaxSteps=10 BatchSize=8\" VERBOSE=1",
              "          make local-run RESUME=20261204-184207-a3f2   (continue an interrupted run)",
              "          make local-run DATA=my-data TASK=answer_is   (your own files, a built-in task)",
              "          make local-run REEVALUATE=20261204-184207-a3f2 PARAMS=\"MinImprovement=0.1\"",
              "          .venv/bin/python -m local.run --param MaxSteps=10 --verbose   (the same, without make)"]
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    # The help lists the parameters' defaults of the --config given (read before the full parse).
    early = argparse.ArgumentParser(add_help=False)
    early.add_argument("--config", default=DEFAULT_CONFIG)
    return parser(early.parse_known_args(argv)[0].config).parse_args(argv)


def parser(config: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m local.run", description=__doc__.split("\n")[0],
                                epilog=parameter_help(config), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                   help="override a pipeline parameter (repeatable; the parameters are listed below)")
    p.add_argument("--config", default=None,
                   help="the run's config: the parameters' defaults and everything else (default config/local.yaml)")
    p.add_argument("--train-rows", type=int, default=None,
                   help=f"rows of the generated toy train split (default {DEFAULTS['train_rows']})")
    p.add_argument("--eval-rows", type=int, default=None,
                   help=f"rows of the generated toy held-out split (default {DEFAULTS['eval_rows']})")
    p.add_argument("--seed", type=int, default=None, help=f"seed of the toy data (default {DEFAULTS['seed']})")
    p.add_argument("--data", metavar="DIR",
                   help="train and evaluate on your own files instead of the toy data (JSONL, JSON, CSV or "
                        "parquet): DIR holds a train split and a test, validation, eval, val or dev split")
    p.add_argument("--task", metavar="NAME",
                   help="the task (the Task parameter): gsm8k, hash, boxed, answer_is, choice, number, or "
                        "custom (task.grader in --config)")
    p.add_argument("--runs-dir", default=str(ROOT / "runs"),
                   help="where runs/<run-id>/ and the MLflow store (mlflow.db) go (default: runs/)")
    p.add_argument("--definition-out", default=str(ROOT / "build" / "pipeline.json"),
                   help="where the pipeline definition is written, as `make pipeline-definition` does "
                        "(default: build/pipeline.json; runs/<run-id>/pipeline.json keeps the run's copy)")
    p.add_argument("--quiet", action="store_true", help="print step status and errors only, no progress lines")
    p.add_argument("--verbose", action="store_true",
                   help="print the steps' full key=value lines (as their logs keep them) instead of one compact line "
                        "per training step, and status lines unwrapped")
    p.add_argument("--resume", metavar="RUN_ID",
                   help="continue the interrupted or failed run runs/RUN_ID/ with its parameters and data: the steps "
                        "it completed are kept, the rest run, TrainDAPO from its last checkpoint")
    p.add_argument("--reevaluate", metavar="RUN_ID",
                   help="run EvaluateModel and the gate again on the finished run runs/RUN_ID/ with its parameters and "
                        "the --param overrides (EvalSize, AccuracyThreshold, MinImprovement), without training again; "
                        "writes runs/RUN_ID/reevaluations/<n>/")
    p.add_argument("--eval-data", metavar="PATH",
                   help="with --reevaluate: new held-out data, a .jsonl file or a folder of them; the questions the "
                        "adapter trained on are removed from it (reevaluations/<n>/validation.json)")
    p.add_argument("--update-approval", action="store_true",
                   help="with --reevaluate: let the new verdict set the model package's approval status (default: "
                        "recorded on the package, the status left as it is)")
    return p


# -- the plan: everything checked before anything is created -------------------------
@dataclass(frozen=True)
class Plan:
    """What a run runs with; kept as runs/<id>/run.json so that a resume runs with the same."""

    config: str
    params: dict[str, str]  # the user's overrides, as given
    train_rows: int
    eval_rows: int
    seed: int
    run_id: str | None = None  # set for a resume
    data: str | None = None  # --data: the user's folder, copied into runs/<id>/data/
    previous: dict[str, Any] = field(default_factory=dict)  # a resume: the interrupted run's step records

    def overrides(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.params.items())


def check_params(params: dict[str, str], config: str) -> RunConfig:
    """Names and types from the one parameter table, ranges from the config models; the config with the
    overrides in place. The local run sets the data prefixes itself."""
    from pipeline.start import check_params as check

    for name in DATA_PARAMETERS:
        if name in params:
            raise Refused(f"{parameter(name)}: the local run uploads its data and sets {name} itself; your own "
                          f"files: {option('--data', '<dir>')}; the toy data's size: --train-rows, --eval-rows, --seed")
    return check(params, {p.name: p.kind for p in PARAMETERS}, config)


def fresh_plan(args: argparse.Namespace) -> Plan:
    from local.toy_data import MAX_ROWS

    params = parse_pairs(args.param, "--param", "BatchSize=64")
    if args.task is not None:
        if params.get("Task", args.task) != args.task:
            raise Refused(f"{option('--task', args.task)} and {parameter('Task', params['Task'])}: give the task once")
        params["Task"] = args.task
    if "Task" in params:  # a misspelled task, named as typed, before the config's own error
        typed = option("--task", args.task) if args.task is not None else parameter("Task", params["Task"])
        problem = task_name_problem(params["Task"], typed)
        if problem:
            raise Refused(problem)
    plan = Plan(config=args.config or DEFAULT_CONFIG, params=params, data=args.data,
                **{k: v if getattr(args, k) is None else getattr(args, k) for k, v in DEFAULTS.items()})
    if args.data is not None:
        shaped = [f"--{k.replace('_', '-')}" for k in DEFAULTS if getattr(args, k) is not None]
        if shaped:
            raise Refused(f"{option('--data', args.data)}: the run trains on your files; {' and '.join(shaped)} "
                          "shape the generated toy data only, drop them")
        splits = data_files(args.data)
    elif plan.train_rows < 0 or plan.eval_rows < 0 or plan.train_rows + plan.eval_rows > MAX_ROWS:
        raise Refused(f"--train-rows {plan.train_rows} and --eval-rows {plan.eval_rows}: each at least 0, "
                      f"together at most {MAX_ROWS} (the toy task's distinct questions)")
    run_config = check_params(plan.params, plan.config)
    task = task_of(run_config, toy_data=args.data is None)
    if args.data is not None:  # a field the task cannot find: said now, not by ValidateData once the stack is up
        from local import user_data

        user_data.precheck(task, splits)
    else:
        check_batch_size(run_config.dapo.batch_size, plan.train_rows)
    return plan


def data_files(directory: str) -> Any:
    """The train and held-out files of ``--data`` (local/user_data.py); a folder that does not fit is refused
    before anything is created."""
    from local import user_data

    return user_data.find(directory)


def task_of(run_config: RunConfig, toy_data: bool) -> Any:
    """The run's task, built as the steps will build it (a grader that does not import is refused here); with the
    generated toy data, a task that cannot read its GSM8K-format rows is refused too."""
    from local.toy_data import PLUS_VERBS, make_row
    from steps.tasks import build_task

    task = build_task(run_config.task)
    if toy_data:
        row = make_row(0, "apples", PLUS_VERBS[0], 3, 4)
        try:
            task.read(row, task.fields_for(row))
        except ValueError:
            raise Refused(f"task {task.name}: the generated toy data is GSM8K's format (answers end '#### N'), which "
                          f"this task cannot read; give your own files in its format: {option('--data', '<dir>')}") \
                from None
    return task


def task_notes(task: Any) -> list[str]:
    """What the first screen says about the task: a built-in format other than the default's, what it asks and
    rewards; a grader the toy model cannot learn still runs end to end."""
    if task.toy_learns:
        if task.name == "gsm8k":  # the default run's first screen stays as it was
            return []
        return [f"task {task.name}: each prompt ends '{task.format.instruction}' and only that form earns the "
                "reward (strict); the local toy model learns this format"]
    return [f"note: task {task.name} ({task.cfg.grader}): the local toy model learns only the built-in answer "
            "formats (gsm8k, hash, boxed, answer_is, choice), not your grader's; this run checks the plumbing end "
            "to end (validation, training, evaluation and the gate all grade with your grader), and its accuracy "
            "is not expected to improve: the toy keeps answering '#### N', so training may stop early (a step "
            "needs groups whose rewards differ) and the gate is expected to reject the model"]


def check_batch_size(batch_size: int, train_rows: int) -> None:
    """A step needs batch_size distinct prompts: refused here, before any process starts, rather than by
    ValidateData after the stack is up (the toy's row count is known before it is generated)."""
    if batch_size > train_rows:
        raise Refused(f"BatchSize {batch_size} is larger than the toy train split ({train_rows} rows, --train-rows): "
                      f"lower BatchSize ({parameter('BatchSize', 'N')}) or raise --train-rows")


def resume_plan(args: argparse.Namespace) -> Plan:
    """A resume runs the same definition with the same parameters and data, in the same run dir, with the same
    run id (so the same execution id, job and session names, and MLflow run). moto's state and the service's
    sessions ended with their processes; what runs/<id>/ kept is enough to go on: the toy data is uploaded
    again, the definition is the run's copy, the steps that succeeded are not run again (their outputs are
    uploaded again from the work dir), and TrainDAPO, run again, resumes from the checkpoint it synced (its
    checkpoint dir under work/, put back in S3; the model packages it names are in service-state/)."""
    given = [f"--{k.replace('_', '-')}" for k in ("config", *DEFAULTS, "data", "task") if getattr(args, k) is not None]
    if args.param or given:
        raise Refused(f"{option('--resume', args.resume)} runs with the parameters and data the run started with; "
                      f"drop {' '.join(option(flag) for flag in given + ['--param'] * bool(args.param))}")
    run_dir = Path(args.runs_dir) / args.resume
    if not (run_dir / RUN_FILE).is_file():
        runs = sorted(p.parent.name for p in Path(args.runs_dir).glob(f"*/{RUN_FILE}"))
        raise Refused(f"{option('--resume', args.resume)}: {run_dir / RUN_FILE} does not exist; the runs there: "
                      f"{', '.join(runs) or 'none'}")
    # What a resume cannot do without: a damaged one is refused in one line (steps/platform/files.py).
    again = f"Start a new run: make local-run (this run's parameters are in {run_dir / 'logs'})."
    kept = files.read_json(run_dir / RUN_FILE, again)
    if kept.get("outcome") == "succeeded":
        raise Refused(f"{option('--resume', args.resume)}: that run succeeded; there is nothing left to run")
    steps = run_dir / STEPS_FILE
    previous = files.read_json(steps, f"Delete it to run every step again: make local-run RESUME={args.resume}") \
        if steps.exists() else {}
    plan = Plan(kept["config"], kept["params"], kept["train_rows"], kept["eval_rows"], kept["seed"],
                run_id=args.resume, previous=previous, data=kept.get("data"))
    check_params(plan.params, plan.config)
    return plan


def create_run_dir(runs_dir: Path, clock: Callable[[], float] = time.time,
                   suffix: Callable[[], str] = lambda: secrets.token_hex(2)) -> Path:
    """runs/<date>-<time>-<4 hex digits>/, created here and by no one else: the directory is the claim, so two
    runs started in the same second (or drawing the same digits) never share it, nor what is named after it
    (the execution id, job and session names, the MLflow run)."""
    runs_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(clock()))
    while True:
        run_dir = runs_dir / f"{stamp}-{suffix()}"
        try:
            run_dir.mkdir()
            return run_dir
        except FileExistsError:
            continue


@contextmanager
def run_log(path: Path) -> Iterator[None]:
    """This process's own logging (boto, MLflow, warnings) to runs/<id>/local-run.log, not the console; with
    what the run said on the terminal (:func:`say`), timestamped. The runner's logger has its own level: building
    the definition imports pipeline/pipeline.py, which sets the root logger to WARNING (the SageMaker SDK's INFO
    lines), and the file stayed empty."""
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root, own = logging.getLogger(), logging.getLogger("local.run")
    levels = root.level, own.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    own.setLevel(logging.INFO)
    logging.captureWarnings(True)
    try:
        yield
    finally:
        logging.captureWarnings(False)
        root.removeHandler(handler)
        root.setLevel(levels[0])
        own.setLevel(levels[1])
        handler.close()


# -- the run ------------------------------------------------------------------------
def build_definition(config: str, out: str) -> dict[str, Any]:
    from pipeline.definition import write_definition

    path = write_definition(config, out)
    return json.loads(Path(path).read_text())


@dataclass
class Ended:
    """How the execution ended, and what could not be read after it."""

    failure: Any = None  # PipelineFailed
    interrupted: bool = False
    stopping: bool = False  # the steps are over or being stopped: a Ctrl-C no longer interrupts anything
    records: dict[str, Any] = field(default_factory=dict)
    sessions: list[dict[str, Any]] | None = None
    package: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def outcome(self) -> str:
        return "interrupted" if self.interrupted else "failed" if self.failure else "succeeded"


@dataclass
class CtrlC:
    """The run's SIGINT handler. The first Ctrl-C raises KeyboardInterrupt: a running step is stopped (its
    supervisor forwards the terminal's SIGINT to it, the runner sends SIGTERM, and the step stops its training
    session). Once the steps are over or being stopped (``ended.stopping``), a Ctrl-C is said, not raised: the
    steps stop whole, the service stops after them, and the summary, the sessions' statuses in it, is printed.
    Each of those waits is bounded (local/pipeline_runner.py's STOP_GRACE_SECONDS, the service's grace)."""

    ended: Ended

    def __call__(self, signum: int, frame: Any) -> None:
        if not self.ended.stopping:
            self.ended.stopping = True
            raise KeyboardInterrupt
        print("local-run: already stopping (the steps first, then the service); the summary follows",
              file=sys.stderr, flush=True)


@contextmanager
def ctrl_c(ended: Ended) -> Iterator[None]:
    previous = signal.signal(signal.SIGINT, CtrlC(ended))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def main(argv: Sequence[str] | None = None) -> int:
    from steps.platform.versions import require_training_session_sdk

    require_training_session_sdk()
    args = parse_args(argv)
    if args.reevaluate:
        from local.reevaluate import LocalRun, reevaluate

        return reevaluate(args, LocalRun(check_params, console.Progress, console.announcements, run_log, _bucket_of,
                                         ("config", "resume", *DEFAULTS), RUN_FILE, STEPS_FILE))
    if args.eval_data is not None:
        raise Refused(f"{option('--eval-data', args.eval_data)} is new held-out data for a re-evaluation: add "
                      f"{option('--reevaluate', '<run id>')} (a new run takes its data with "
                      f"{option('--data', '<dir>')})")
    if args.update_approval:
        raise Refused(f"{option('--update-approval')} is for a re-evaluation ({option('--reevaluate', '<run id>')}): a "
                      "run's own verdict always sets its new package's approval status")
    plan = resume_plan(args) if args.resume else fresh_plan(args)  # refusals: nothing is created before here
    run_dir = Path(args.runs_dir) / plan.run_id if plan.run_id else create_run_dir(Path(args.runs_dir))
    with run_log(run_dir / "local-run.log"):
        return run(plan, run_dir, args)


def _definition(plan: Plan, run_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The run's pipeline definition: built (and kept in the run's folder), or the kept one on a resume."""
    run_id = run_dir.name
    if plan.run_id:
        definition = files.read_json(run_dir / "pipeline.json", "Start a new run: make local-run")
        done = [name for name, rec in plan.previous.items() if rec["status"] == "Succeeded"]
        say(f"local-run {run_id}: resuming ({', '.join(done) or 'no step'} completed before; "
            f"parameters: {plan.overrides() or 'the defaults'})")
    else:
        definition = build_definition(plan.config, args.definition_out)
        files.write_json(run_dir / "pipeline.json", definition, indent=1)
        say(f"local-run {run_id}: definition ({len(definition['Steps'])} top-level steps) {args.definition_out}")
    return definition


def run(plan: Plan, run_dir: Path, args: argparse.Namespace) -> int:
    ended = Ended()
    with ctrl_c(ended):
        return _run(plan, run_dir, args, ended)


def _run(plan: Plan, run_dir: Path, args: argparse.Namespace, ended: Ended) -> int:
    from local import report
    from pipeline import budget
    from pipeline.config import load
    from steps.platform import tracking

    run_id, t0 = run_dir.name, time.monotonic()
    definition = _definition(plan, run_dir, args)
    files.write_json(run_dir / RUN_FILE, {**asdict(plan), "run_id": run_id, "previous": None, "outcome": "running"})
    cfg = load(plan.config)[0]
    execution_config = check_params(plan.params, plan.config)
    say(budget.describe_toy(execution_config.dapo))  # the toy's own figures: its model is not served on AWS
    task = task_of(execution_config, toy_data=False)
    if plan.data:  # checked before anything was created; a resume reads the copies
        say(f"data: your files from {plan.data}, copied to {run_dir / 'data'} (train/, eval/)")
        if not plan.run_id:
            from local import user_data

            for line in user_data.precheck(task, data_files(plan.data)):
                say(f"data: {line}")
    for note in task_notes(task):
        say(note)
    # What SageMaker's MLflow tracking server is on AWS: a local store every local run logs to.
    tracking_env = {tracking.ENV_TRACKING_URI: report.mlflow_store(Path(args.runs_dir), cfg.experiment_name),
                    tracking.ENV_EXPERIMENT: cfg.experiment_name}
    if plan.run_id:  # its MLflow run, KILLED or FAILED when the run was interrupted, is running again
        _after(ended, "the MLflow run", lambda: report.reopen_mlflow_run(run_dir / "work"))
    try:
        execute(plan, run_dir, args, definition, cfg.name, tracking_env, ended)
    except KeyboardInterrupt:  # while starting the stack
        ended.interrupted = True
    except Exception as exc:  # noqa: BLE001 - a bug or the machine: said in the summary, the traceback in the log
        from local.pipeline_runner import PipelineFailed

        logging.getLogger("local.run").exception("the local run failed")
        ended.failure = PipelineFailed("local run", f"{type(exc).__name__}: {exc} (see {run_dir / 'local-run.log'})")
    status = {"interrupted": "KILLED", "failed": "FAILED"}.get(ended.outcome)
    outcome = (f"failed at {ended.failure.step}: {ended.failure.message}" if ended.outcome == "failed"
               else ended.outcome)
    mlflow = _after(ended, "the MLflow run", lambda: report.finish_mlflow_run(run_dir / "work", run_id, plan.params,
                                                                             status, outcome))
    files.write_json(run_dir / RUN_FILE, {**asdict(plan), "run_id": run_id, "previous": None,
                                          "outcome": ended.outcome})
    if ended.outcome == "succeeded":  # nothing left to resume: only the adapter's package stays (sample, re-evaluate)
        keep_only_the_adapter(run_dir)
    summary = report.summarize(run_dir, ended.records, ended.failure, time.monotonic() - t0, ended.sessions,
                               ended.package, parameters=plan.params, notes=ended.notes, mlflow_status=mlflow,
                               interrupted=ended.interrupted)
    say(summary)
    if ended.interrupted:
        say(f"interrupted: every process this run started has been stopped; continue it with:\n"
            f"  {report.resume_command(run_dir)}", file=sys.stderr)
        return 130
    return 0 if ended.failure is None else 1


def execute(plan: Plan, run_dir: Path, args: argparse.Namespace, definition: dict[str, Any], pipeline_name: str,
            tracking_env: dict[str, str], ended: Ended) -> None:
    """Start the stack, run the definition, read what the run left while the stack is up; ``ended`` learns how
    it went, whatever happens (a failed step, Ctrl-C, a dead service)."""
    from local import report, user_data
    from local.pipeline_runner import LocalExecution, PipelineFailed, StepRecord
    from local.stack import LocalStack

    workdir, progress = run_dir / "work", console.Progress(args.quiet, run_dir / "logs", args.verbose)
    previous = {name: StepRecord(**rec) for name, rec in plan.previous.items()}

    with LocalStack(log_path=run_dir / "training-session-service.log", state_dir=run_dir / "service-state") as stack:
        def on_status(rec: StepRecord) -> None:
            if rec.status == "Failed":  # a dead service fails the step that calls it: said first, not the model
                rec.message = report.blame_dead_service(rec.message, stack.service_exit())
            progress.status(rec)  # the records so far over the interrupted run's: a resume may be interrupted too
            records = {n: asdict(r) for n, r in ended.records.items()}
            files.write_json(run_dir / STEPS_FILE, {**plan.previous, **records})

        say(f"local-run {run_dir.name}: moto {stack.moto_url}, training-session service {stack.service_url}")
        env = {**stack.env(), **tracking_env}
        uris = user_data.upload(stack.s3(), _bucket_of(definition), run_dir, (plan.train_rows, plan.eval_rows),
                                plan.seed, plan.data)
        params = {"TrainDataS3Uri": uris["train"], "EvalDataS3Uri": uris["eval"], **plan.params}
        execution = LocalExecution(definition, params, stack.s3(), workdir, env, execution_id=run_dir.name,
                                   pipeline_name=pipeline_name, on_line=progress.line, on_status=on_status,
                                   records=ended.records, log_dir=run_dir / "logs", previous=previous)
        progress.about = console.announcements(execution.values)
        try:
            execution.run()
        except PipelineFailed as exc:
            ended.failure = PipelineFailed(exc.step, report.blame_dead_service(exc.message, stack.service_exit()))
        except KeyboardInterrupt:  # the step was stopped (SIGTERM: it stopped its session); collect what is left
            ended.interrupted = True
        finally:
            ended.stopping = True  # from here on a Ctrl-C cuts nothing short
        _after(ended, "the reports", lambda: report.collect(workdir, run_dir, title=report.title(run_dir.name,
                                                                                               plan.params)))
        dead = stack.service_exit()
        if dead is not None:
            ended.notes.append(f"the training-session service exited during the run (exit code {dead}); its log: "
                               f"{run_dir / 'training-session-service.log'}")
            return
        ended.sessions = _after(ended, "the training sessions", stack.sessions)
        ended.package = _after(ended, "the model package", lambda: report.registry_entry(run_dir, env))


def _after(ended: Ended, what: str, read: Callable[[], Any]) -> Any:
    """``read()``, or None with a note: what a run left is read however the run ended, and a failure to read
    one thing never hides the rest of the summary."""
    try:
        return read()
    except Exception as exc:  # noqa: BLE001 - the summary says what could not be read
        logging.getLogger("local.run").warning("could not read %s", what, exc_info=True)
        ended.notes.append(f"could not read {what}: {type(exc).__name__}: {exc}")
        return None


def _bucket_of(definition: dict[str, Any]) -> str:
    """The bucket the pipeline's own outputs go to (from the definition's S3 URIs)."""
    import re

    buckets = re.findall(r"s3://([a-z0-9.\-]+)/", json.dumps(definition))
    if not buckets:
        raise SystemExit("error: the pipeline definition names no S3 bucket; set pipeline.default_bucket in the config")
    return max(set(buckets), key=buckets.count)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Refused as exc:
        say(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted: every process this run started has been stopped", file=sys.stderr)
        sys.exit(130)
