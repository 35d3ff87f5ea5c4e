"""`python -m steps.evaluate`: the EvaluateModel step, a paired evaluation.

The base model and the trained adapter answer the same held-out questions (the first ``eval_size``;
0: all), in one training session of this job's own: one sampling client on the session's fresh weights
(the base model), one on the adapter's model package. Greedy answers give each model's strict and
lenient accuracy with 95% Wilson intervals and its format-error rate; ``eval_k`` samples per question at
the training temperature give pass@k, pass@1 and maj@k; the questions one model got right and the other
wrong give the paired difference (trained - base) with an exact McNemar-compatible 95% interval
(steps/dapo/stats.py names the methods).

``evaluation.json`` follows SageMaker's model-quality layout, so CheckAccuracy reads it with JsonGet:
``metrics.accuracy.value`` (the trained adapter, strict), ``training.steps_completed``,
``improvement.ci95_low`` and ``training.guard_stopped``. The base model's figures sit under ``base`` in
the same layout; ``billing``, the tokens the session billed (steps/platform/billing.py), beside them.
Every answer both models gave is written beside it, graded (:data:`ANSWER_FILES`; the rows are
steps/dapo/heldout.py's ``greedy_rows`` and ``sample_rows``): ``predictions.jsonl`` and
``predictions_base.jsonl`` the greedy answers, ``samples.jsonl`` and ``samples_base.jsonl`` the k sampled
ones, so every figure of evaluation.json can be recomputed from the folder alone:
``python -m steps.evaluate --recompute DIR`` (:func:`recompute`). ``rollouts.jsonl`` holds the first
``eval_rollouts`` answers of both models (steps/dapo/rollouts.py).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any, Sequence

from steps.cli import Refused, run_step
from steps.config import config_from_dict
from steps.dapo import heldout, rollouts, stats
from steps.dapo.heldout import EvalResult
from steps.dapo.sampling import RewardShaping
from steps.platform import billing, files, tracking
from steps.platform.artifacts import read_model_json
from steps.platform.ownership import this_jobs_session_name
from steps.platform.session import lora_kwargs, service_client, stop_session
from steps.platform.tokenizer import load_tokenizer
from steps.platform.versions import require_training_session_sdk
from steps.tasks import build_task, load_examples

MODELS = ("base", "trained")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m steps.evaluate", description=__doc__.split("\n")[0])
    p.add_argument("--model", help="model dir, model.tar.gz, or a dir holding it")
    p.add_argument("--eval", help="held-out .jsonl file or directory")
    p.add_argument("--output",
                   help="directory for evaluation.json, the answer files (predictions*.jsonl, samples*.jsonl) and "
                        "rollouts.jsonl")
    p.add_argument("--recompute", metavar="DIR",
                   help="instead of evaluating: recompute evaluation.json's figures in DIR from the answer files "
                        "beside it and compare (exit 1 on a mismatch)")
    p.add_argument("--eval-size", type=int, default=None,
                   help="questions to evaluate, 0 for all (default: dapo.eval_size of the run)")
    p.add_argument("--tokenizer", help="directory of the base model's tokenizer files (pipeline.tokenizer_s3_uri); "
                                       "default: the tokenizer the Hub names for the base model")
    p.add_argument("--task", help="the task (the Task parameter; default: task.name of the run's model.json)")
    p.add_argument("--held-out", help="the held-out data EvalDataS3Uri names now (with --validated): when it is not "
                                      "what ValidateData checked (a re-evaluation on new data), it is checked here "
                                      "and evaluated instead of --eval (steps/validate.py validate_held_out)")
    p.add_argument("--validated", help="ValidateData's output: its validation.json and train.jsonl, the questions "
                                       "the adapter trained on")
    args = p.parse_args(argv)
    missing = [f"--{name}" for name in ("model", "eval", "output") if getattr(args, name) is None]
    if args.recompute is None and missing:
        p.error(f"the following arguments are required: {', '.join(missing)} (or --recompute DIR)")
    return args


def held_out(args: argparse.Namespace, task: Any, tokenizer: Any, cfg: Any) -> tuple[str, dict[str, Any]]:
    """The held-out data to evaluate and how it was checked (evaluation.json's ``held_out``): ValidateData's
    checked copy (``--eval``) unless ``--held-out`` holds other data than ValidateData checked, which a
    re-evaluation on new held-out data does; that is checked here, the questions the adapter trained on removed."""
    from steps.validate import checked_by_validate, validate_held_out

    if not args.held_out or not args.validated:
        return args.eval, {"checked_by": "ValidateData"}
    validated = Path(args.validated)
    if checked_by_validate(args.held_out, validated):
        return args.eval, {"checked_by": "ValidateData"}
    out = Path(args.output)
    checked = validate_held_out(args.held_out, validated, out, task, tokenizer, cfg.session.chat_template_kwargs)
    print(checked["message"], flush=True)
    scan = checked["splits"]["eval"]
    return str(out / "eval.jsonl"), {"checked_by": "EvaluateModel", "validation": "validation.json",
                                     "rows": scan["rows"], "kept": scan["kept"],
                                     "trained_on_removed": checked["overlap"]["count"]}


def run_task(model_config: dict[str, Any], name: str | None) -> dict[str, Any]:
    """The run's task section (model.json), with ``--task`` in place of its name when given."""
    section = dict(model_config.get("task") or {})
    if name:
        section["name"] = name
    return {**model_config, "task": section}


def _rate(successes: int, n: int) -> dict[str, float]:
    interval = stats.wilson(successes, n)
    return {"value": successes / n if n else 0.0, "ci95_low": interval.low, "ci95_high": interval.high}


def figures(result: EvalResult) -> dict[str, Any]:
    """One model's ``metrics``: accuracies with their 95% Wilson intervals, format errors, pass@k and maj@k."""
    n, predictions = result.n, result.predictions
    metrics: dict[str, Any] = {
        "accuracy": _rate(sum(p.correct for p in predictions), n),
        "accuracy_lenient": _rate(sum(p.correct_lenient for p in predictions), n),
        "format_error_rate": {"value": result.format_error_rate},
    }
    sampled = result.sampled
    if sampled is not None:
        at = {"k": sampled.k, "temperature": sampled.temperature}
        metrics["pass_at_k"] = {"value": sampled.pass_at_k, **at}
        metrics["maj_at_k"] = {"value": sampled.maj_at_k, **at}
        metrics["pass_at_1"] = {"value": sampled.pass_at_1, "k": 1, "temperature": sampled.temperature}
    return metrics


def improvement(trained: EvalResult, base: EvalResult) -> dict[str, Any]:
    """Trained minus base strict accuracy on the same questions, with its exact McNemar-compatible interval."""
    pairs = list(zip(trained.predictions, base.predictions))
    b = sum(t.correct and not s.correct for t, s in pairs)  # only the trained adapter right
    c = sum(s.correct and not t.correct for t, s in pairs)  # only the base model right
    n = len(pairs)
    interval = stats.paired_difference(b, c, n)
    return {"value": (b - c) / n if n else 0.0, "ci95_low": interval.low, "ci95_high": interval.high,
            "method": stats.PAIRED_METHOD, "p_value": stats.exact_mcnemar_p(b, c),
            "trained_only_correct": b, "base_only_correct": c, "n": n}


def training_outcome(model: dict[str, Any]) -> dict[str, Any]:
    """How training ended, beside the figures: the gate reads ``training.steps_completed`` (a run that never
    took an optimizer step evaluated the base weights) and ``training.guard_stopped`` (a run a health guard
    stopped is never approved); the approve step records them. ``guard`` and ``guard_stopped`` are 0/"" for a
    model.json written before TrainDAPO had guards."""
    outcome = {key: model.get(key) for key in ("steps_completed", "stopped_early", "stop_reason")}
    return {**outcome, "guard": model.get("guard") or "", "guard_stopped": int(bool(model.get("guard_stopped")))}


def report(results: dict[str, EvalResult], model: dict[str, Any], cfg: Any,
           bill: dict[str, Any] | None = None) -> dict[str, Any]:
    trained, base = results["trained"], results["base"]
    return {
        "metrics": figures(trained),
        "n": trained.n,
        "failed_requests": trained.failed,
        "model_package_arn": model["model_package_arn"],
        "evaluated": "model_package",
        "base": {"metrics": figures(base), "n": base.n, "failed_requests": base.failed,
                 "model": cfg.session.base_model},
        "improvement": improvement(trained, base),
        "training": training_outcome(model),
        **({"billing": bill} if bill is not None else {}),  # this step's session (steps/platform/billing.py)
    }


def log_to_mlflow(tracker: tracking.MlflowTracker, model: dict[str, Any], evaluation: dict[str, Any],
                  out: Path, shown: list[dict[str, Any]], prices: Any = None) -> None:
    """The figures, the reports and the rollouts into the training run: ``final_eval/...`` at the last
    step, the base model's ``base_eval/...`` at step 0 (where the curves start)."""
    def flat(block: dict[str, Any]) -> dict[str, float]:
        values = {name: m["value"] for name, m in block["metrics"].items()}
        values.update({f"{name}_ci95_{end}": m[f"ci95_{end}"] for name, m in block["metrics"].items()
                       for end in ("low", "high") if f"ci95_{end}" in m})
        return {**values, "n": block["n"]}

    step = int(model.get("steps_completed") or 0)
    gain = evaluation["improvement"]
    tracker.log_metrics({f"base_eval/{k}": v for k, v in flat(evaluation["base"]).items()}, step=0)
    tracker.log_metrics(billing_metrics(model, evaluation, prices), step=step)
    tracker.log_metrics({**{f"final_eval/{k}": v for k, v in flat(evaluation).items()},
                         **{f"final_eval/improvement{suffix}": gain[key] for suffix, key in
                            (("", "value"), ("_ci95_low", "ci95_low"), ("_ci95_high", "ci95_high"))}}, step=step)
    for name in ("evaluation.json", "predictions.jsonl"):
        tracker.log_artifact(out / name)
    if shown:
        tracker.log_table(rollouts.table(shown), rollouts.artifact_file(None))
    tracker.finish()


def billing_metrics(model: dict[str, Any], evaluation: dict[str, Any], prices: Any) -> dict[str, float]:
    """MLflow's figures of what was billed: ``eval_billing/...`` this step's session, ``run_billing/...`` the
    run's (TrainDAPO's session, logged as ``billing/...``, and this one), with ``cost_usd`` at ``prices``."""
    out: dict[str, float] = {}
    for prefix, blocks in (("eval_billing", (evaluation.get("billing"),)),
                           ("run_billing", (model.get("billing"), evaluation.get("billing")))):
        count, _ = billing.totals(*blocks)
        usd = billing.cost_usd(count, prices)
        out.update({f"{prefix}/{k}": v for k, v in count.fields().items()})
        out.update({f"{prefix}/cost_usd": usd} if usd is not None else {})
    return out


#: Each model's graded answers: (its greedy answers, its k sampled answers per question). predictions.jsonl was the
#: only one before the paired evaluation: the trained adapter's keeps its name.
ANSWER_FILES = {"trained": ("predictions.jsonl", "samples.jsonl"),
                "base": ("predictions_base.jsonl", "samples_base.jsonl")}


def write_outputs(out: Path, evaluation: dict[str, Any], results: dict[str, EvalResult],
                  shown: list[dict[str, Any]]) -> None:
    for model, names in ANSWER_FILES.items():
        for name, rows in zip(names, (heldout.greedy_rows(results[model]), heldout.sample_rows(results[model]))):
            with files.atomic_open(out / name) as f:
                f.write("".join(json.dumps(r) + "\n" for r in rows))
    with files.atomic_open(out / rollouts.FILE) as f:
        f.write("".join(json.dumps(r) + "\n" for r in shown))
    # evaluation.json last: its presence means the evaluation finished.
    files.write_json(out / "evaluation.json", evaluation, indent=2)


def evaluate_in_session(service: Any, cfg: Any, model_package_arn: str, tokenizer: Any,
                        examples: Sequence[Any], task: Any = None) -> tuple[dict[str, EvalResult], dict[str, Any]]:
    """Both models' answers in one session of this job's own, stopped however this ends, and what the session
    billed (read once stopped; the client's count beside it, steps/platform/billing.py).

    Named after the job like TrainDAPO's (steps/platform/ownership.py): after a SIGKILL, the next job of the
    pipeline finds it and stops it, where the SDK's implicit sampling session would bill unnoticed. The two
    sampling clients share it: ``""`` samples the session's fresh weights (the base model), the package ARN
    the trained adapter. Every request of both is submitted before any is awaited, and both draw their
    samples with the run's seed (the same random numbers for the pair).
    """
    d = cfg.dapo
    task = task or build_task(cfg.task)
    name = this_jobs_session_name(service, cfg.session.region)
    meter = billing.TokenMeter(prices=cfg.session.prices)
    training_client = service.create_lora_training_client(**lora_kwargs(cfg.session, name))
    results: dict[str, EvalResult] | None = None
    try:
        arns = {"base": "", "trained": model_package_arn}
        shaping = RewardShaping(d.max_tokens, d.overlong_buffer, d.overlong_penalty, d.reward_format)
        pending = {
            model: heldout.launch(training_client.create_sampling_client(model_package_arn=arns[model]), task,
                                  tokenizer, examples, d.max_tokens, d.sample_retries,
                                  cfg.session.chat_template_kwargs, k=d.eval_k, temperature=d.temperature,
                                  seed=d.seed, shaping=shaping, meter=meter)
            for model in MODELS}
        results = {model: pending[model].result() for model in MODELS}
    finally:  # first: the session is what is billed
        stop_session(training_client, failing=results is None)
    name = training_client.training_session_name
    return results, billing.block(meter.total, billing.service_count(name, cfg.session.region), name,
                                  cfg.session.prices)


def summary_line(evaluation: dict[str, Any]) -> str:
    """The step's one line: the trained figures first (the fields of the line before the paired evaluation),
    then the base model's and the difference."""
    m, base, gain = evaluation["metrics"], evaluation["base"]["metrics"], evaluation["improvement"]
    line = (f"eval: accuracy={m['accuracy']['value']:.4f} format_error_rate={m['format_error_rate']['value']:.4f} "
            f"n={evaluation['n']} failed_requests={evaluation['failed_requests']} "
            f"accuracy_lenient={m['accuracy_lenient']['value']:.4f} "
            f"base_accuracy={base['accuracy']['value']:.4f} improvement={gain['value']:.4f} "
            f"improvement_ci95_low={gain['ci95_low']:.4f} improvement_ci95_high={gain['ci95_high']:.4f}")
    if "pass_at_k" in m:
        k = m["pass_at_k"]["k"]
        line += (f" pass_at_{k}={m['pass_at_k']['value']:.4f} maj_at_{k}={m['maj_at_k']['value']:.4f}"
                 f" base_pass_at_{k}={base['pass_at_k']['value']:.4f}")
    return line


def recompute(directory: str | Path) -> dict[str, Any]:
    """evaluation.json's figures (both models' accuracies with their intervals, format errors, pass@k, maj@k, the
    paired difference with its interval, discordant pairs and p-value) recomputed from the answer files alone
    (:data:`ANSWER_FILES`), in evaluation.json's layout."""
    d = Path(directory)

    def rows(name: str) -> list[dict[str, Any]]:
        path = d / name
        if not path.exists():
            raise Refused(f"{path}: missing; an evaluation of before the answer files cannot be recomputed")
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]

    results = {}
    for model, (greedy, sampled) in ANSWER_FILES.items():
        try:
            results[model] = heldout.from_rows(rows(greedy), rows(sampled))
        except (KeyError, TypeError, ValueError) as exc:
            raise Refused(f"{d / greedy}, {d / sampled}: not EvaluateModel's answer files ({exc})") from None
    trained, base = results["trained"], results["base"]
    return {"metrics": figures(trained), "n": trained.n, "failed_requests": trained.failed,
            "base": {"metrics": figures(base), "n": base.n, "failed_requests": base.failed},
            "improvement": improvement(trained, base)}


def differences(recomputed: Any, recorded: Any, path: str = "") -> list[str]:
    """Where ``recorded`` (evaluation.json) differs from ``recomputed``: each figure of ``recomputed``, by its path
    (numbers to 1e-9, the rest exactly)."""
    if isinstance(recomputed, dict):
        if not isinstance(recorded, dict):
            return [f"{path or '.'}: recorded {recorded!r}, recomputed a block"]
        return [line for key, value in recomputed.items()
                for line in differences(value, recorded.get(key), f"{path}.{key}" if path else key)]
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (recomputed, recorded))
    if (numbers and math.isclose(recomputed, recorded, rel_tol=1e-9, abs_tol=1e-12)) or recomputed == recorded:
        return []
    return [f"{path}: recorded {recorded!r}, recomputed {recomputed!r}"]


def _count(block: Any) -> int:
    return sum(_count(v) for v in block.values()) if isinstance(block, dict) else 1


def run_recompute(directory: str) -> int:
    path = Path(directory) / "evaluation.json"
    if not path.exists():
        raise Refused(f"{path}: missing; --recompute needs the directory EvaluateModel wrote")
    recomputed = recompute(directory)
    wrong = differences(recomputed, json.loads(path.read_text(encoding="utf-8")))
    checked = _count(recomputed)
    for line in wrong:
        print(f"recompute: MISMATCH {line}", flush=True)
    print(f"recompute: {checked - len(wrong)} of {checked} figures of {path} match its answer files", flush=True)
    return 1 if wrong else 0


def run(args: argparse.Namespace) -> int:
    if args.recompute is not None:
        return run_recompute(args.recompute)
    model = read_model_json(args.model)
    cfg = config_from_dict(run_task(model["config"], args.task), source=f"{args.model}: model.json config")
    task = build_task(cfg.task)
    size = cfg.dapo.eval_size if args.eval_size is None else args.eval_size
    if size < 0:
        raise Refused(f"--eval-size must be >= 0 (0: every question), got {size}")
    tokenizer = load_tokenizer(cfg.session.base_model, cfg.session.region, args.tokenizer)
    eval_path, checked = held_out(args, task, tokenizer, cfg)
    examples = load_examples(eval_path, task)[: size or None]
    if not examples:
        raise Refused(f"{eval_path}: no evaluation examples")
    service = service_client(cfg.session)
    tracker = tracking.resume(model.get("mlflow"))  # the training run, if it was tracked; connects meanwhile
    results, bill = evaluate_in_session(service, cfg, model["model_package_arn"], tokenizer, examples, task)
    evaluation = {**report(results, model, cfg, bill), "held_out": checked}
    step = int(model.get("steps_completed") or 0)
    # The base model's answers are those of step 0.
    shown = [row for name in MODELS for row in rollouts.rows(results[name].predictions, step if name == "trained"
                                                             else 0, name, cfg.dapo.eval_rollouts)]
    out = Path(args.output)
    write_outputs(out, evaluation, results, shown)
    if tracker:
        log_to_mlflow(tracker, model, evaluation, out, shown, cfg.session.prices)
    print(summary_line(evaluation), flush=True)
    print(billing.line(bill), flush=True)
    failed = sum(r.failed for r in results.values())
    if failed:
        print(f"warning: {failed} of {2 * len(examples)} greedy requests failed after retries and were counted as "
              "wrong", file=sys.stderr, flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    require_training_session_sdk()  # exits 2 naming the fix, before the step does anything
    return run_step(lambda: run(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
