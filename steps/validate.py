"""ValidateData step: check a task's data (JSONL, JSON, CSV or parquet: steps/tasks/reader.py) and write cleaned
JSONL copies.

    python -m steps.validate --train PATH --eval PATH --batch-size N --output DIR [--on-overlap remove|fail]
        [--max-dropped-share F] [--task NAME] [--question-field F] [--answer-field F] [--choices-field F]
        [--grader MOD:ATTR] [--code-dir DIR]
        [--base-model ARN [--region R] [--tokenizer DIR] --max-tokens N [--max-context-tokens N]
         [--chat-template-kwargs JSON]]

The task (the config's ``task`` section: steps/tasks/) says which fields a row needs and how its gold
answer is read; every row's own gold (reference) answer is graded by the task's grader, and a split whose
gold answers the grader mostly cannot read is refused, naming the first rows and why. Each split's dropped rows
are printed by reason, with the first file:line of each (``data:`` lines, steps/tasks/drops.py), and a split that
loses more than ``--max-dropped-share`` (task.max_dropped_share, 0.5) of its rows is refused.

With a base model (the pipeline always passes one), every question is rendered
with the model's own tokenizer and chat template, as TrainDAPO will render it,
and a question whose prompt tokens plus ``--max-tokens`` exceed the model's
context is rejected, naming the row and the limit. The context is what the
base model's Hub record states, or ``--max-context-tokens`` (session.max_context_tokens)
where the Hub says nothing or the setting is tighter (a larger setting cannot raise
what the service enforces); neither known, the check is skipped and validation.json
says so. ``--tokenizer`` (the pipeline.tokenizer_s3_uri input)
loads the tokenizer from a directory and makes no Hub call.

Writes ``DIR/validation.json`` (accepted or refused) and, only when accepted,
``DIR/train.jsonl`` and ``DIR/eval.jsonl``: the rows that passed, in input
order, with all their fields (extra fields are kept), as compact JSON lines.
Exit codes follow steps.cli: 0 trainable, 2 refused (the message says why and
how to fix it), 1 crashed.

validation.json: ``status``, ``message``, ``batch_size``, ``on_overlap``,
``kept`` per split, ``overlap`` (count, action, first rows), ``prompt_budget``
(the length check: max_tokens, context, its source; null when not checked),
``task`` (its name, and the instruction or the grader), ``grader_agreement`` (``checked``,
``agreed``, ``first_disagreements``: the rows whose gold answer the grader could not read or did not
grade right, with the reason), ``splits`` (per split: input files with sha256, rows read, kept, rejected
counts by reason, the first 20 rejected rows with file, line and reason, the fields read per file and
whether they were set or auto-detected, and the split's grader agreement) and ``outputs``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from steps.cli import Refused, parameter, run_step
from steps.config import ConfigError, TaskConfig, config_from_dict
from steps.config.load import task_name_problem
from steps.platform import files
from steps.platform.tokenizer import describe_base_model, load_tokenizer
from steps.platform.versions import require_training_session_sdk
from steps.tasks import RowTask, build_task, default_task
from steps.tasks.drops import drop_lines, too_many_dropped
from steps.tasks.reader import DataError, data_files
from steps.tasks.rules import (
    SHOWN,
    PromptBudget,
    SplitScan,
    agreement_problem,
    refusal_problems,
    scan_split,
    sha256_file,
)

OUTPUTS = ("validation.json", "train.jsonl", "eval.jsonl")


def build_report(status: str, message: str, batch_size: int, on_overlap: str, scans: dict[str, SplitScan],
                 budget: PromptBudget | None = None, task: RowTask | None = None) -> dict:
    ordered = [name for name in ("train", "eval") if name in scans]
    train = scans.get("train")
    overlap = train.overlap if train else 0
    first = [r for name in ordered for r in scans[name].first_disagreements]
    return {
        "status": status,
        "message": message,
        "batch_size": batch_size,
        "on_overlap": on_overlap,
        "task": (task or default_task()).describe(),
        "grader_agreement": {"checked": sum(scans[n].checked for n in ordered),
                             "agreed": sum(scans[n].agreed for n in ordered),
                             "first_disagreements": [vars(r) for r in first[:20]]},
        "kept": {name: scans[name].kept for name in ordered},
        "overlap": {
            "count": overlap,
            "action": "refused" if on_overlap == "fail" and overlap else "removed",
            "first_rows": [{"file": r.file, "line": r.line} for r in train.first_overlap] if train else [],
        },
        "prompt_budget": None if budget is None else {
            "max_tokens": budget.max_tokens, "context_tokens": budget.context_tokens, "source": budget.source},
        "splits": {name: scans[name].to_json() for name in ordered},
        "outputs": {name: f"{name}.jsonl" for name in ordered} if status == "accepted" else {},
    }


def summary(report: dict) -> str:
    parts = []
    for name, s in report["splits"].items():
        reasons = ", ".join(f"{r} {n}" for r, n in s["rejected_by_reason"].items())
        parts.append(f"{name} {s['kept']}/{s['rows']} rows kept" + (f" (rejected: {reasons})" if reasons else ""))
    if report["overlap"]["count"]:
        parts.append(f"{report['overlap']['count']} train rows also in eval removed")
    agreement = report["grader_agreement"]
    parts.append(f"task {report['task']['name']}: the grader agrees with {agreement['agreed']} of "
                 f"{agreement['checked']} gold answers")
    return "validation accepted: " + "; ".join(parts)


def _check_paths(train: str, eval_: str) -> None:
    """Name every unusable input path at once, not one per run."""
    problems = []
    for flag, path in (("--train", train), ("--eval", eval_)):
        try:
            data_files(path)
        except DataError as exc:
            problems.append(f"{flag} {exc}")
    if problems:
        raise DataError("\n- ".join(problems))


def validate(train: str, eval_: str, batch_size: int, out_dir: Path, on_overlap: str = "remove",
             budget: PromptBudget | None = None, task: RowTask | None = None, max_dropped_share: float = 0.5) -> dict:
    """Validate, write the outputs, and return the report (status accepted/refused; ``drops``: the lines saying
    what each split dropped, by reason).

    ``budget``: reject questions too long for the model (see :class:`PromptBudget`). ``task``: the rows'
    task (steps/tasks; default GSM8K): its row rules, and its grader checked against every gold answer.
    ``max_dropped_share``: a split losing more of its rows is refused.
    """
    task = task or default_task()
    out_dir.mkdir(parents=True, exist_ok=True)
    # A result left by an earlier run must not pass for this run's.
    for name in OUTPUTS:
        (out_dir / name).unlink(missing_ok=True)
    scans: dict[str, SplitScan] = {}
    try:
        _check_paths(train, eval_)
        # The cleaned files appear only if the data can train: a refusal leaves the block by raising.
        with files.atomic_open(out_dir / "eval.jsonl") as eval_out, \
                files.atomic_open(out_dir / "train.jsonl") as train_out:
            scans["eval"] = scan_split("eval", eval_, eval_out, budget=budget, task=task)
            scans["train"] = scan_split("train", train, train_out, eval_digests=scans["eval"].digests, budget=budget,
                                        task=task)
            problems = refusal_problems(scans["train"], scans["eval"], batch_size, on_overlap, task.name)
            problems += [p for p in (too_many_dropped(scans[n], max_dropped_share) for n in ("eval", "train")) if p]
            if problems:
                raise DataError("\n- ".join(problems))
    except DataError as exc:
        message = f"validation refused the data:\n- {exc}"
        report = build_report("refused", message, batch_size, on_overlap, scans, budget, task)
    else:
        report = build_report("accepted", "", batch_size, on_overlap, scans, budget, task)
        report["message"] = summary(report)
    report["drops"] = [line for name in ("train", "eval") if name in scans for line in drop_lines(scans[name])]
    report["max_dropped_share"] = max_dropped_share
    files.write_json(out_dir / "validation.json", report, indent=2)
    return report


# -- re-evaluation: new held-out data for an adapter that has already trained -------------------------------------
#: How a re-evaluation treats a held-out question the adapter trained on (validation.json's on_overlap).
REMOVE_FROM_EVAL = "remove-from-eval"
TRAINED_ON = "trained on"


def checked_by_validate(held_out: str, validated: Path) -> bool:
    """Whether ``held_out`` holds the very files ValidateData checked as its eval split (their sha256s in its
    validation.json): then its checked copy is the held-out data, and nothing is checked again."""
    checked = files.read_json(validated / "validation.json", "Run ValidateData again (a new execution).")
    inputs = ((checked.get("splits") or {}).get("eval") or {}).get("inputs") or []
    try:
        ours = sorted(sha256_file(f) for f in data_files(held_out))
    except (DataError, OSError) as exc:
        raise Refused(f"the held-out data (EvalDataS3Uri): {exc}") from None
    return ours == sorted(i["sha256"] for i in inputs)


def validate_held_out(held_out: str, validated: Path, out_dir: Path, task: RowTask | None = None,
                      tokenizer: Any = None, chat_template_kwargs: dict[str, Any] | None = None) -> dict:
    """New held-out data for an adapter that already trained (a re-evaluation): the task's row rules and grader
    agreement as ValidateData applies them, the prompt-length check against the limits ValidateData used (with
    ``tokenizer``), and every question the adapter trained on (ValidateData's checked ``train.jsonl``, what
    TrainDAPO read) removed from the held-out rows: training cannot be undone, so the overlap leaves the eval
    split, not the train split. Writes ``out_dir/validation.json`` and, when accepted, ``out_dir/eval.jsonl``;
    returns the report. A refusal (no usable row left, or a grader that cannot read the gold answers) raises
    Refused naming the rows, after writing the report."""
    task = task or default_task()
    earlier = files.read_json(validated / "validation.json", "Run ValidateData again (a new execution).")
    limits = earlier.get("prompt_budget")
    budget = (PromptBudget(tokenizer, chat_template_kwargs or {}, limits["max_tokens"], limits["context_tokens"],
                           limits["source"]) if limits and tokenizer is not None else None)
    out_dir.mkdir(parents=True, exist_ok=True)
    trained_path = validated / "train.jsonl"
    with open(os.devnull, "w") as nowhere:  # only the questions' digests are wanted
        trained = scan_split("trained", str(trained_path), nowhere, task=task)
    scans: dict[str, SplitScan] = {}
    try:
        with files.atomic_open(out_dir / "eval.jsonl") as eval_out:
            scan = scans["eval"] = scan_split("eval", held_out, eval_out, eval_digests=trained.digests, budget=budget,
                                              task=task, overlap_reason=TRAINED_ON)
            problems = [p for p in (agreement_problem(scan, task.name),) if p]
            if scan.kept == 0:
                problems.append(f"the held-out data has no usable rows: {scan.rows} read, {scan.rejected} rejected "
                                f"({scan.reasons_text()}), {scan.overlap} asked questions the adapter trained on\n"
                                + "\n".join(f"    {r}" for r in (scan.first_rejected + scan.first_overlap)[:SHOWN])
                                + "\n  fix: give held-out questions the adapter did not train on, in rows the "
                                  f"{task.name} task can read")
            if problems:
                raise DataError("\n- ".join(problems))
    except DataError as exc:
        status, message = "refused", f"validation refused the held-out data:\n- {exc}"
    else:
        status, message = "accepted", ""
    report = build_report(status, message, 0, REMOVE_FROM_EVAL, scans, budget, task)
    report.pop("batch_size")  # nothing trains on this data
    report["mode"] = "re-evaluation"
    report["trained_on"] = {"file": str(trained_path), "sha256": sha256_file(trained_path), "rows": trained.kept}
    scan_ = scans.get("eval")
    report["overlap"] = {"count": scan_.overlap if scan_ else 0, "action": "removed from eval",
                         "first_rows": [{"file": r.file, "line": r.line} for r in scan_.first_overlap] if scan_
                         else []}
    if status == "accepted":
        report["message"] = held_out_summary(report)
    else:
        (out_dir / "eval.jsonl").unlink(missing_ok=True)
    files.write_json(out_dir / "validation.json", report, indent=2)
    if status != "accepted":
        raise Refused(message)
    return report


def held_out_summary(report: dict) -> str:
    s, agreement = report["splits"]["eval"], report["grader_agreement"]
    reasons = ", ".join(f"{r} {n}" for r, n in s["rejected_by_reason"].items())
    return (f"held-out data accepted: {s['kept']}/{s['rows']} rows kept"
            + (f" (rejected: {reasons})" if reasons else "")
            + f"; {report['overlap']['count']} questions the adapter trained on removed from eval; task "
              f"{report['task']['name']}: the grader agrees with {agreement['agreed']} of {agreement['checked']} "
              "gold answers")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number from 0 to 1, got {text!r}") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be from 0 to 1, got {value:g}")
    return value


def prompt_budget(args: argparse.Namespace) -> PromptBudget | None:
    """The length check the arguments ask for: None without a base model or tokenizer, or without a context."""
    if args.base_model is None and args.tokenizer is None:
        return None
    if args.max_tokens is None:
        raise Refused("--max-tokens is required with --base-model or --tokenizer: the prompt must leave room for it")
    # With a tokenizer directory the job may have no network at all: no Hub call, the context from the setting.
    hub = describe_base_model(args.base_model, args.region) if args.tokenizer is None else None
    hub_context = hub.context_tokens if hub is not None else None
    hub_source = f"{args.base_model} (its Hub record's recipe SequenceLength)"
    if hub_context is not None and (args.max_context_tokens is None or hub_context <= args.max_context_tokens):
        # The Hub's figure is what the service enforces: a larger setting cannot raise it.
        if args.max_context_tokens is not None and hub_context < args.max_context_tokens:
            print(f"note: session.max_context_tokens {args.max_context_tokens} exceeds the model's context "
                  f"{hub_context} ({hub_source}); checking against {hub_context}", flush=True)
        context, source = hub_context, hub_source
    elif args.max_context_tokens is not None:  # the Hub says nothing, or the setting tightens it
        context, source = args.max_context_tokens, "session.max_context_tokens"
    else:
        print("note: the model's context is unknown (set session.max_context_tokens): prompt lengths not checked",
              flush=True)
        return None
    tokenizer = load_tokenizer(args.base_model, args.region, args.tokenizer, hub)
    return PromptBudget(tokenizer, args.chat_template_kwargs, args.max_tokens, context, source)


def _json_mapping(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object such as '{{\"enable_thinking\": false}}', "
                                         f"got {text!r}")
    return value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m steps.validate", description=__doc__.split("\n\n")[0])
    p.add_argument("--train", required=True, help="a data file (.jsonl, .json, .csv, .parquet) or a directory of them")
    p.add_argument("--eval", required=True, help="a data file (.jsonl, .json, .csv, .parquet) or a directory of them")
    p.add_argument("--batch-size", required=True, type=_positive_int, help="prompts per step: the minimum train rows")
    p.add_argument("--output", required=True, help="directory for validation.json and the cleaned files")
    p.add_argument(
        "--on-overlap",
        choices=("remove", "fail"),
        default="remove",
        help="a train question also in eval: drop it from train (default) or refuse the data",
    )
    p.add_argument("--max-dropped-share", type=_share, default=0.5,
                   help="refuse a split that loses more than this share of its rows (task.max_dropped_share; "
                        "the MaxDroppedShare parameter; 1: any)")
    task = p.add_argument_group("task", "the rows' task (the config's task section); default gsm8k")
    task.add_argument("--task", default=None,
                      help="gsm8k, hash, boxed, answer_is, choice, number, or custom (with --grader)")
    task.add_argument("--question-field", help="the question's field (task.question_field; default: auto-detected)")
    task.add_argument("--answer-field", help="the answer's field (task.answer_field; default: auto-detected)")
    task.add_argument("--choices-field", help="the options' field of the choice task (task.choices_field)")
    task.add_argument("--grader", help="your grader, package.module:attr (task.grader)")
    task.add_argument("--code-dir", help="the folder holding your grader's module (task.code_dir)")
    model = p.add_argument_group("prompt length", "reject questions the model cannot take with max-tokens to answer")
    model.add_argument("--base-model", help="SageMaker Public Hub model ARN (session.base_model): its tokenizer "
                                            "and context from the Hub")
    model.add_argument("--region", help="region of the Hub lookup when --base-model is not an ARN (session.region)")
    model.add_argument("--tokenizer", help="directory of the model's tokenizer files instead of the Hub's "
                                           "(pipeline.tokenizer_s3_uri)")
    model.add_argument("--max-tokens", type=_positive_int, help="the completion budget (dapo.max_tokens)")
    model.add_argument("--max-context-tokens", type=_positive_int,
                       help="the model's context in tokens (session.max_context_tokens); default: the Hub's")
    model.add_argument("--chat-template-kwargs", type=_json_mapping, default={},
                       help="JSON object passed to apply_chat_template (session.chat_template_kwargs)")
    return p.parse_args(argv)


def task_config(args: argparse.Namespace) -> TaskConfig:
    """The task section the arguments give, checked as the config file's is."""
    keys = ("question_field", "answer_field", "choices_field", "grader", "code_dir")
    section = {k: getattr(args, k) for k in keys if getattr(args, k, None) is not None}
    if getattr(args, "task", None) is not None:
        problem = task_name_problem(args.task, parameter("Task", args.task, "--task"))  # as the user set it
        if problem:
            raise Refused(problem)
        section["name"] = args.task
    try:
        return config_from_dict({"task": section}, source="steps.validate arguments").task
    except ConfigError as exc:
        raise Refused(str(exc)) from None


def main(argv: list[str] | None = None) -> int:
    require_training_session_sdk()  # exits 2 naming the fix, before the step does anything
    return run_step(lambda: run(parse_args(argv)))


def run(args: argparse.Namespace) -> int:
    out_dir = Path(args.output)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise Refused(f"--output {out_dir}: cannot create directory ({exc.strerror})") from None
    task = build_task(task_config(args))
    report = validate(args.train, args.eval, args.batch_size, out_dir, args.on_overlap, prompt_budget(args), task,
                      args.max_dropped_share)
    for line in report["drops"]:  # nothing dropped in silence: the local run's terminal shows these
        print(f"data: {line}", flush=True)
    if report["status"] != "accepted":
        raise Refused(report["message"])
    print(report["message"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
