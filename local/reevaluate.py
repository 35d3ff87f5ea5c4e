"""``python -m local.run --reevaluate RUN_ID [--param Name=Value ...] [--eval-data PATH]``: EvaluateModel and the
gate again, on a finished local run, without training again.

The local twin of ``make reevaluate`` (pipeline/reevaluate.py, SageMaker's selective execution): the run's own
definition (runs/<id>/pipeline.json) runs as a new execution (``<run-id>-r<n>``) in which ValidateData and
TrainDAPO are kept from the run: their recorded properties stand, and their outputs are uploaded to S3 from the
run's work dir, read and never written, so TrainDAPO's work dir, model.json, metrics.jsonl and checkpoints stay
byte for byte as they were. EvaluateModel, CheckAccuracy and its branch run with the run's parameters and the
overrides (only those the selected steps read; the same check as on AWS), against the local service started on
the run's ``service-state/`` (the adapter's model package). Everything new goes to
``runs/<id>/reevaluations/<n>/``: evaluation.json, evaluation_base.json, predictions.jsonl, rollouts.jsonl, the
steps' logs, reevaluation.json (what ran, with what, and the verdict before and after) and summary.txt. The model
package records the new verdict, the earlier one kept (steps/approve.py); its approval status stays as it was unless
``--update-approval`` (``make local-run REEVALUATE=<id> UPDATE_APPROVAL=1``) lets the verdict set it.

``--eval-data PATH`` (a .jsonl file or a folder of them) is new held-out data: copied to
``reevaluations/<n>/data/`` and uploaded as the execution's ``EvalDataS3Uri``, as on AWS. EvaluateModel checks it
(the task's row rules, the grader agreement, the prompt lengths) and removes every question the adapter trained
on (the run's ValidateData train.jsonl) before evaluating; its report is ``reevaluations/<n>/validation.json``.
Without it the run's own held-out data (runs/<id>/data/eval.jsonl, or data/eval/ with DATA=) is uploaded again:
the files ValidateData checked, so EvaluateModel evaluates ValidateData's checked copy as the run did.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, ContextManager

from local import console, report
from local.sample import SERVICE_STATE, finished_run
from pipeline.aws import UserError
from pipeline.reevaluate import KEPT, approval, check_overrides, overrides_text, selected_steps
from steps.cli import Refused, option, parameter, parse_pairs
from steps.platform import files
from steps.tasks.reader import DataError, data_files

FOLDER = "reevaluations"
RECORD = "reevaluation.json"
HELD_OUT = "EvalDataS3Uri"


@dataclass(frozen=True)
class LocalRun:
    """What a re-evaluation shares with a local run: local.run hands it in (it imports this module, so this module
    does not import it)."""

    check_params: Callable[[dict[str, str], str], Any]  # names, types and ranges of the parameters
    progress: Callable[[bool, Path], Any]  # the console's step lines
    announcements: Callable[[dict[str, Any]], dict[str, str]]
    run_log: Callable[[Path], ContextManager[None]]
    bucket_of: Callable[[dict[str, Any]], str]
    fresh_options: tuple[str, ...]  # the options of a new run or a resume, which a re-evaluation does not take
    run_file: str = "run.json"
    steps_file: str = "steps.json"


@dataclass(frozen=True)
class Reevaluation:
    """What a re-evaluation runs with, all checked before anything is started."""

    run_dir: Path
    number: int
    params: dict[str, str]  # the overrides
    values: dict[str, str]  # the run's parameters with the overrides in place
    config: str
    definition: dict[str, Any] = field(repr=False)
    kept: dict[str, dict[str, Any]] = field(repr=False)  # the kept steps' records (steps.json)
    eval_data: tuple[Path, ...] = ()  # --eval-data: the new held-out files; () the run's own

    @property
    def execution_id(self) -> str:
        return f"{self.run_dir.name}-r{self.number}"


def say(text: str) -> None:
    """A line (or block) of the re-evaluation's own, within the terminal's 100 columns, as a local run's."""
    print("\n".join(console.fit(text)), flush=True)


def plan(args: argparse.Namespace, local: LocalRun) -> Reevaluation:
    typed = option("--reevaluate", args.reevaluate)  # REEVALUATE=<id> from make
    given = [f"--{k.replace('_', '-')}" for k in local.fresh_options if getattr(args, k, None) is not None]
    if given:
        raise Refused(f"{typed} runs the run's own definition, data and config; drop "
                      f"{' '.join(given)} (--param sets what changes)")
    run_dir, _ = finished_run(Path(args.runs_dir), args.reevaluate)
    kept_run = files.read_json(run_dir / local.run_file, "That run cannot be re-evaluated; train a new one.")
    if kept_run.get("outcome") not in ("succeeded", "failed"):
        raise Refused(f"{typed}: that run is {kept_run.get('outcome')}; re-evaluate a run that "
                      f"ended (succeeded or failed), or continue it with: {report.resume_command(run_dir)}")
    steps_file = run_dir / local.steps_file
    records = files.read_json(steps_file, "That run cannot be re-evaluated; train a new one.") \
        if steps_file.exists() else {}
    missing = [name for name in KEPT if (records.get(name) or {}).get("status") != "Succeeded"]
    if missing:
        raise Refused(f"{typed}: {' and '.join(missing)} did not succeed in that run, so there "
                      "is no adapter to re-evaluate")
    definition = files.read_json(run_dir / "pipeline.json", "That run cannot be re-evaluated; train a new one.")
    params = parse_pairs(args.param, "--param", "MinImprovement=0.1")
    if HELD_OUT in params:
        raise Refused(f"{parameter(HELD_OUT)}: a local re-evaluation takes new held-out data as a file or folder: "
                      f"{option('--eval-data', '<path>')}")
    try:
        update, _ = approval({p["Name"] for p in definition.get("Parameters", [])}, params,
                             bool(getattr(args, "update_approval", False)))
    except UserError:
        raise Refused(f"{typed}: that run's definition has no UpdateApproval parameter (built "
                      "before it), so its ApproveModel and RecordRejection would set the model package's approval "
                      "status to the new verdict; to accept that, add UPDATE_APPROVAL=1 (--update-approval)") from None
    values = {**kept_run["params"], **params, **update}
    local.check_params(values, kept_run["config"])  # names, types, the config's ranges; the data is the run's
    eval_data = held_out_files(getattr(args, "eval_data", None))
    # New held-out data is EvalDataS3Uri's new value, as on AWS: EvaluateModel must read it in this definition.
    check_overrides({**params, **({HELD_OUT: "--eval-data"} if eval_data else {})}, definition)
    folder = run_dir / FOLDER
    number = 1 + max((int(p.name) for p in folder.glob("*") if p.name.isdigit()), default=0) if folder.exists() else 1
    return Reevaluation(run_dir, number, params, values, kept_run["config"], definition,
                        {name: records[name] for name in KEPT}, eval_data)


def held_out_files(path: str | None) -> tuple[Path, ...]:
    """--eval-data's data files (the file, or every .jsonl, .json, .csv, .parquet under the folder); refused when
    there are none."""
    if path is None:
        return ()
    try:
        return tuple(data_files(path))
    except DataError as exc:
        raise Refused(f"--eval-data {exc}") from None


def upload_held_out(rv: Reevaluation, out: Path, s3: Any, bucket: str) -> str:
    """EvalDataS3Uri of the re-evaluation: --eval-data's files, copied to ``out/data/`` (what was evaluated stays
    with the re-evaluation) and uploaded; else the run's own held-out file, uploaded where the run put it."""
    if rv.eval_data:
        data = out / "data"
        data.mkdir()
        prefix = f"{FOLDER}/{rv.execution_id}/eval"
        for i, path in enumerate(rv.eval_data):
            name = f"{i:03d}-{path.name}" if len(rv.eval_data) > 1 else path.name  # sorted as given, never clashing
            shutil.copyfile(path, data / name)
            s3.upload_file(str(data / name), bucket, f"{prefix}/{name}")
        return f"s3://{bucket}/{prefix}/"
    held_out = rv.run_dir / "data" / "eval"  # the user's files (DATA=), as they are; the toy's: eval.jsonl
    for path in sorted(held_out.iterdir()) if held_out.is_dir() else [held_out.with_suffix(".jsonl")]:
        s3.upload_file(str(path), bucket, f"data/eval/{path.name}")
    return f"s3://{bucket}/data/eval/"


def create_folder(rv: Reevaluation) -> tuple[Reevaluation, Path]:
    """runs/<id>/reevaluations/<n>/, claimed as local.run claims a run dir: two at once get their own."""
    number = rv.number
    while True:
        out = rv.run_dir / FOLDER / str(number)
        try:
            out.mkdir(parents=True)
            break
        except FileExistsError:
            number += 1
    rv = Reevaluation(rv.run_dir, number, rv.params, rv.values, rv.config, rv.definition, rv.kept, rv.eval_data)
    return rv, out


def verdict(package: dict[str, Any] | None) -> str:
    """The gate's latest verdict on the package (its ``verdict`` key; a package of before it: its status)."""
    if not package:
        return "unknown"
    return (package.get("CustomerMetadataProperties") or {}).get("verdict") or package["ModelApprovalStatus"]


def status(package: dict[str, Any] | None) -> str:
    return package["ModelApprovalStatus"] if package else "unknown"


def approval_text(before: dict[str, Any] | None, after: dict[str, Any] | None) -> str:
    """What the re-evaluation did to the package's approval, in a clause."""
    if status(before) != status(after):
        return f"recorded on the model package, approval changed from {status(before)} to {status(after)}"
    left = f"recorded on the model package, approval left at {status(after)}"
    return left + (" (UPDATE_APPROVAL=1 sets it to the verdict)" if verdict(after) != status(after) else "")


def reevaluate(args: argparse.Namespace, local: LocalRun) -> int:
    """Plan (refusals: nothing created), run, summarize; the exit code of a local run (0: approved)."""
    rv, out = create_folder(plan(args, local))
    with local.run_log(out / "local-run.log"):
        return _run(rv, out, args, local)


def _run(rv: Reevaluation, out: Path, args: argparse.Namespace, local: LocalRun) -> int:
    from local.pipeline_runner import LocalExecution, PipelineFailed, StepRecord
    from local.stack import REGION, LocalStack
    from pipeline.config import load

    t0 = time.monotonic()
    run_id, progress = rv.run_dir.name, local.progress(args.quiet, out / "logs")
    records: dict[str, Any] = {}
    failure, interrupted, sessions, before, after = None, False, None, None, None
    held_out = None
    say(f"re-evaluation {rv.number} of local run {run_id}: {overrides_text(rv.params)}"
        f"{held_out_text(rv)}; runs {', '.join(selected_steps(rv.definition))}; keeps {' and '.join(KEPT)} from "
        "the run (nothing is trained)")
    with LocalStack(log_path=out / "training-session-service.log", state_dir=rv.run_dir / SERVICE_STATE) as stack:
        env = stack.env()
        before = report.registry_entry(rv.run_dir, env)
        bucket = local.bucket_of(rv.definition)
        stack.s3().create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": REGION})
        held_out = upload_held_out(rv, out, stack.s3(), bucket)
        execution = LocalExecution(
            rv.definition, {**rv.values, HELD_OUT: held_out}, stack.s3(), out / "work", env,
            execution_id=rv.execution_id,
            pipeline_name=load(rv.config)[0].name, on_line=progress.line, on_status=progress.status,
            records=records, log_dir=out / "logs",
            previous={name: StepRecord(**rec) for name, rec in rv.kept.items()}, kept_from=rv.run_dir / "work",
            kept_message=f"kept from run {run_id} (not run again: its outputs are re-used)")
        progress.about = local.announcements(execution.values)
        try:
            execution.run()
        except PipelineFailed as exc:
            failure = exc
        except KeyboardInterrupt:
            interrupted = True
        report.collect(out / "work", out)
        checked = [p for p in (out / "work" / "EvaluateModel").rglob("validation.json") if "input" not in p.parts] \
            if (out / "work" / "EvaluateModel").exists() else []
        if checked:  # EvaluateModel's check of new held-out data
            shutil.copy(checked[0], out / "validation.json")
        sessions = stack.sessions()
        after = report.registry_entry(rv.run_dir, env)
    outcome = "interrupted" if interrupted else "failed" if failure else "succeeded"
    files.write_json(out / RECORD, {
        "run_id": run_id, "number": rv.number, "execution_id": rv.execution_id, "parameters": rv.params,
        "values": rv.values, "selected_steps": selected_steps(rv.definition), "kept_steps": list(KEPT),
        "eval_data": {"given": [str(p) for p in rv.eval_data], "copied_to": "data/", "s3_uri": held_out,
                      "validation": "validation.json"} if rv.eval_data else None,
        "outcome": outcome, "failure": None if failure is None else {"step": failure.step, "message": failure.message},
        "verdict_before": verdict(before), "verdict_after": verdict(after),
        "approval": {"before": status(before), "after": status(after), "update": rv.values.get("UpdateApproval")},
        "model_package": after,
        "steps": {name: asdict(rec) for name, rec in records.items()}}, indent=2)
    say(summary(rv, out, records, failure, interrupted, sessions, before, after, time.monotonic() - t0))
    if interrupted:
        print("interrupted: every process this re-evaluation started has been stopped", file=sys.stderr, flush=True)
        return 130
    return 0 if failure is None else 1


def held_out_text(rv: Reevaluation) -> str:
    if not rv.eval_data:
        return ""
    return f"; new held-out data {', '.join(map(str, rv.eval_data))}"


def held_out_lines(rv: Reevaluation, out: Path) -> list[str]:
    """What EvaluateModel made of --eval-data: rows kept, questions the adapter trained on removed; or why it
    refused."""
    if not rv.eval_data:
        return []
    path = out / "validation.json"
    if not path.exists():
        return [f"  held-out data: {held_out_text(rv)[2:]} (not checked: EvaluateModel did not get that far)"]
    checked = files.read_json(path, "Re-evaluate again.")
    return [f"  {checked['message'].splitlines()[0] if checked['status'] == 'accepted' else checked['message']}"
            f" ({path})"]


def summary(rv: Reevaluation, out: Path, records: dict[str, Any], failure: Any, interrupted: bool,
            sessions: list[dict[str, Any]] | None, before: dict[str, Any] | None, after: dict[str, Any] | None,
            seconds: float) -> str:
    """The re-evaluation in a screenful, also written to summary.txt."""
    original = files.read_json(rv.run_dir / "run.json", "Train a new run.")["params"]
    lines = [f"== re-evaluation {rv.number} of local run {rv.run_dir.name} ({seconds:.0f}s) ==",
             f"  parameters: {overrides_text(rv.params)} (the run's: {overrides_text(original)})"]
    lines += [f"  {rec.name:<16} {rec.type:<11} {rec.status}{': ' + rec.message if rec.message else ''}"
              for rec in records.values()]
    lines += held_out_lines(rv, out)
    lines += report.evaluation_lines(out)
    if interrupted:
        lines.append(f"  outcome: INTERRUPTED; start it again:\n"
                     f"    {report.resume_command(rv.run_dir, '--reevaluate')}")
    elif failure is not None and failure.step != "AccuracyTooLow":
        lines.append(f"  outcome: FAILED at {failure.step}: {failure.message}")
    else:
        why = ((after or {}).get("CustomerMetadataProperties") or {}).get("rejection_reason")
        lines.append(f"  verdict: {verdict(after)} (was {verdict(before)})" + (f": {why}" if why else ""))
        lines.append(f"  approval: {approval_text(before, after)}")
    if after:
        metadata = after.get("CustomerMetadataProperties") or {}
        earlier = " ".join(f"{k}=[{v}]" for k, v in sorted(metadata.items()) if k.startswith("verdict_"))
        lines.append(f"  model package: {after['ModelApprovalStatus']} {after['ModelPackageArn']}")
        lines.append(f"    earlier verdicts kept on it: {earlier or '(none)'}")
    lines += report.session_lines(sessions)
    names = sorted({p.name for p in out.iterdir() if p.is_file()} | {"summary.txt"})
    lines.append(f"  artifacts: {out}/ ({', '.join(names)}); logs: {out / 'logs'}/")
    lines.append(f"  kept as they were: {rv.run_dir / 'work'}/{{{','.join(KEPT)}}}, {rv.run_dir}/model.json, "
                 "metrics.jsonl, evaluation.json")
    text = "\n".join(lines)
    files.write_text(out / "summary.txt", text + "\n")
    return text
