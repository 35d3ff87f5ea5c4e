"""`python -m steps.evaluate`: the EvaluateModel step.

Greedy answers from the trained model package (or, with --base, from the base
model it was trained from) on the first `eval_size` held-out questions.
`evaluation.json` follows SageMaker's model-quality layout so the pipeline's
ConditionStep reads `metrics.accuracy.value` with JsonGet: the strict accuracy
(only '#### N' or '\\boxed{N}' in the answer region counts), with
`metrics.accuracy_lenient.value` and `metrics.format_error_rate.value` beside it.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

from steps.cli import Refused, run_step
from steps.config import config_from_dict
from steps.dapo.heldout import EvalResult, evaluate_greedy
from steps.gsm8k.data import load_examples
from steps.gsm8k.task import GSM8K
from steps.platform import files, tracking
from steps.platform.artifacts import read_model_json
from steps.platform.ownership import this_jobs_session_name
from steps.platform.session import lora_kwargs, service_client
from steps.platform.tokenizer import load_tokenizer


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m steps.evaluate", description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="model dir, model.tar.gz, or a dir holding it")
    p.add_argument("--eval", required=True, help="held-out .jsonl file or directory")
    p.add_argument("--output", required=True, help="directory for evaluation.json and predictions.jsonl")
    p.add_argument("--eval-size", type=int, default=None,
                   help="questions to evaluate (default: dapo.eval_size of the run)")
    p.add_argument("--base", action="store_true", help="evaluate the base model the run started from instead")
    p.add_argument("--tokenizer", help="directory of the base model's tokenizer files (pipeline.tokenizer_s3_uri); "
                                       "default: the tokenizer the Hub names for the base model")
    return p.parse_args(argv)


def report(result: EvalResult, model_arn: str, evaluated: str) -> dict[str, Any]:
    return {
        "metrics": {"accuracy": {"value": result.accuracy}, "accuracy_lenient": {"value": result.accuracy_lenient},
                    "format_error_rate": {"value": result.format_error_rate}},
        "n": result.n,
        "failed_requests": result.failed,
        "model_package_arn": model_arn,
        "evaluated": evaluated,
    }


def training_outcome(model: dict[str, Any]) -> dict[str, Any]:
    """How training ended, beside the figures: the pipeline's condition reads ``training.steps_completed``
    (no package of a run that never took an optimizer step is approved) and the approve step records it."""
    return {key: model.get(key) for key in ("steps_completed", "stopped_early", "stop_reason")}


def log_to_mlflow(tracker: tracking.MlflowTracker, model: dict[str, Any], evaluation: dict[str, Any],
                  out: Path) -> None:
    """The figures and the reports into the training run. The base model's figures go beside them
    as ``base_eval/...`` at step 0, without artifacts."""
    base = evaluation["evaluated"] == "base_model"
    figures = {**{name: m["value"] for name, m in evaluation["metrics"].items()}, "n": evaluation["n"]}
    prefix = "base_eval" if base else "final_eval"
    tracker.log_metrics({f"{prefix}/{k}": v for k, v in figures.items()},
                        step=0 if base else int(model.get("steps_completed") or 0))
    if not base:
        for name in ("evaluation.json", "predictions.jsonl"):
            tracker.log_artifact(out / name)
    tracker.finish()


def write_outputs(out: Path, evaluation: dict[str, Any], result: EvalResult) -> None:
    with files.atomic_open(out / "predictions.jsonl") as f:
        for p in result.predictions:
            f.write(json.dumps(asdict(p)) + "\n")
    # evaluation.json last: its presence means the evaluation finished.
    files.write_json(out / "evaluation.json", evaluation, indent=2)


def evaluate_in_session(service: Any, cfg: Any, model_package_arn: str, tokenizer: Any,
                        examples: Sequence[Any]) -> EvalResult:
    """Greedy answers in a session of this job's own, stopped however this ends.

    Named after the job like TrainDAPO's (steps/platform/ownership.py): after a SIGKILL, the next job of the
    pipeline finds it and stops it, where the SDK's implicit sampling session would bill unnoticed. Its
    sampler serves the trained weights (``model_package_arn``), or the base model's for ``""``.
    """
    name = this_jobs_session_name(service, cfg.session.region)
    training_client = service.create_lora_training_client(**lora_kwargs(cfg.session, name))
    try:
        client = training_client.create_sampling_client(model_package_arn=model_package_arn)
        return evaluate_greedy(client, GSM8K, tokenizer, examples, cfg.dapo.max_tokens, cfg.dapo.sample_retries,
                               cfg.session.chat_template_kwargs)
    finally:
        training_client.stop()  # first: the session is what is billed


def run(args: argparse.Namespace) -> int:
    model = read_model_json(args.model)
    cfg = config_from_dict(model["config"], source=f"{args.model}: model.json config")
    size = cfg.dapo.eval_size if args.eval_size is None else args.eval_size
    if size < 1:
        raise Refused(f"--eval-size must be >= 1, got {size}")
    examples = load_examples(args.eval)[:size]
    if not examples:
        raise Refused(f"{args.eval}: no evaluation examples")
    tokenizer = load_tokenizer(cfg.session.base_model, cfg.session.region, args.tokenizer)
    service = service_client(cfg.session)
    tracker = tracking.resume(model.get("mlflow"))  # the training run, if it was tracked; connects meanwhile
    evaluated = "base_model" if args.base else "model_package"
    arn = cfg.session.base_model if args.base else model["model_package_arn"]
    result = evaluate_in_session(service, cfg, "" if args.base else arn, tokenizer, examples)
    evaluation = {**report(result, arn, evaluated), "training": training_outcome(model)}
    write_outputs(Path(args.output), evaluation, result)
    if tracker:
        log_to_mlflow(tracker, model, evaluation, Path(args.output))
    print(f"eval: accuracy={result.accuracy:.4f} format_error_rate={result.format_error_rate:.4f} "
          f"n={result.n} failed_requests={result.failed} accuracy_lenient={result.accuracy_lenient:.4f} "
          f"({evaluated})", flush=True)
    if result.failed:
        print(f"warning: {result.failed} of {result.n} requests failed after retries and were counted as wrong",
              file=sys.stderr, flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_step(lambda: run(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
