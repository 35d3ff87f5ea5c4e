"""`python -m steps.approve`: write the evaluation onto the trained model package and approve it (idempotent).

The registry entry explains itself: ``CustomerMetadataProperties`` carry the trained adapter's figures
(``accuracy`` with ``accuracy_ci95_low``/``_high``, ``accuracy_lenient``, ``format_error_rate``,
``pass_at_k`` and ``maj_at_k`` with their ``k``, ``n``), the base model's (``base_accuracy`` with its
interval, ``base_pass_at_k``), the paired difference (``improvement`` with ``improvement_ci95_low``/``_high``
and ``improvement_method``), the bars (``accuracy_threshold``, ``min_improvement``), how training ended
(``steps_completed``, ``stopped_early``, ``guard``), the ``base_model``, the ``pipeline_execution_arn``, the
MLflow run, and what the run's training sessions billed (``billed_prefill_tokens``, ``billed_sample_tokens``,
``billed_train_tokens``: TrainDAPO's and EvaluateModel's sessions together; ``billed_source``, where the
counts come from; ``billed_usd`` with ``session.prices``); the approval description says the same in a
sentence. ApproveModel runs it when CheckAccuracy holds. RecordRejection runs it with ``--reject`` on the other
branch, before AccuracyTooLow fails the execution: the package then carries the same figures, the status
``Rejected`` and why (``rejection_reason``: each condition of the gate that failed), and ``--output`` writes
``verdict.json``, whose ``message`` (the failed conditions in words, then those that held, figures to 4
decimals) is AccuracyTooLow's error message.

``--update-approval false`` (the UpdateApproval parameter; a re-evaluation's default) records the verdict, its
figures and ``verdict`` (Approved or Rejected) on the package and leaves its approval status as it is: a package's
approval drives deployments, and a re-evaluation on other data or another bar never changes it by surprise. The
step's ``approve:`` line says what it did: ``recorded (verdict V), approval left at S`` or ``... changed from S
to V``.

Whether a package may be approved is the pipeline's condition alone (pipeline/pipeline.py); this step only
explains it. :func:`failed_conditions` reads the same four figures the condition reads, against the same
bars, and tests/test_gate.py holds the two to agreement.

The model registry is reached through the same endpoint the training-session SDK registered the
package with (SAGEMAKER_TRAINING_SESSION_ENDPOINT when set, otherwise the Region's SageMaker
endpoint), so it updates the package the session wrote, not a namesake in another registry.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from steps.cli import Refused, run_step
from steps.config.models import Prices
from steps.platform import billing, files
from steps.platform.artifacts import read_model_json
from steps.platform.versions import require_training_session_sdk

APPROVED, REJECTED = "Approved", "Rejected"
VERDICT_FILE = "verdict.json"
# What CustomerMetadataValue admits (botocore's pattern: letters, separators, numbers, _.:/=+-@), and its length.
_NOT_A_METADATA_CHARACTER = re.compile(r"[^\w .:/=+\-@]")
_METADATA_VALUE_MAX = 256
_DESCRIPTION_MAX = 1024
_METADATA_KEYS_MAX = 50  # CustomerMetadataMap's, botocore's model
#: A re-evaluation keeps each earlier verdict as ``verdict_<n>``: its status, execution and these figures.
VERDICT_PREFIX = "verdict_"
VERDICT_FIGURES = ("accuracy", "n", "improvement_ci95_low", "accuracy_threshold", "min_improvement",
                   "rejection_reason")
#: Keys a verdict sets or not depending on itself, not on the adapter: an approval after a rejection removes them.
_VERDICT_ONLY = ("rejection_reason",)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m steps.approve", description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="model dir, model.tar.gz, or a dir holding it")
    p.add_argument("--evaluation", required=True, help="evaluation.json, or the directory holding it")
    p.add_argument("--execution-arn", help="the pipeline execution, recorded on the package")
    p.add_argument("--accuracy-threshold", type=float, help="the bar the accuracy was held to, recorded")
    p.add_argument("--min-improvement", type=float,
                   help="the bar the improvement's 95%% lower bound was held to, recorded")
    p.add_argument("--reject", action="store_true",
                   help="record the figures and set the package Rejected instead of Approved")
    p.add_argument("--update-approval", type=_switch, default=True, metavar="true|false",
                   help="true (default): set the package's approval status to the verdict; false: record the "
                        "verdict and leave the status as it is (the UpdateApproval parameter)")
    p.add_argument("--output", help=f"directory for {VERDICT_FILE}: the gate's verdict in words ({{\"status\", "
                                    "\"message\"}}; AccuracyTooLow's message reads it)")
    return p.parse_args(argv)


def _switch(text: str) -> bool:
    """The UpdateApproval parameter as the pipeline renders a Boolean: true or false."""
    if text.lower() not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"{text!r}: must be true or false")
    return text.lower() == "true"


def read_evaluation(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    p = p / "evaluation.json" if p.is_dir() else p
    try:
        evaluation = json.loads(p.read_text(encoding="utf-8"))
        float(evaluation["metrics"]["accuracy"]["value"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise Refused(f"{p}: not an evaluation.json with metrics.accuracy.value ({exc})") from None
    return evaluation


def registry_client(region: str | None) -> Any:
    import boto3

    endpoint = os.environ.get("SAGEMAKER_TRAINING_SESSION_ENDPOINT") or None
    return boto3.client("sagemaker", region_name=region, endpoint_url=endpoint)


def _figure(block: dict[str, Any], name: str, field: str = "value") -> float | None:
    metric = block.get("metrics", {}).get(name)
    return None if metric is None or field not in metric else float(metric[field])


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.4f}"
    return _NOT_A_METADATA_CHARACTER.sub("_", str(value))[:_METADATA_VALUE_MAX]


@dataclass(frozen=True)
class Bars:
    """What the gate holds the figures to: the execution's AccuracyThreshold and MinImprovement."""

    accuracy_threshold: float | None = None
    min_improvement: float | None = None


@dataclass(frozen=True)
class Condition:
    """One condition of the gate, judged: whether it held, and in words (the figures to 4 decimals)."""

    held: bool
    short: str  # failed: for the metadata's rejection_reason and AccuracyTooLow's message; held: what held
    sentence: str = ""  # failed: for the approval description
    cause: bool = False  # failed, and the cause of the others (a guard's stop): named first in the verdict


def conditions(evaluation: dict[str, Any], bars: Bars) -> list[Condition]:
    """The four conditions CheckAccuracy reads (pipeline/pipeline.py), in its order, each only where its figure
    and bar are known."""
    training = evaluation.get("training") or {}
    gain = evaluation.get("improvement") or {}
    accuracy, steps = _figure(evaluation, "accuracy"), training.get("steps_completed")
    judged = []
    if bars.accuracy_threshold is not None and accuracy is not None:
        bar = f"AccuracyThreshold {bars.accuracy_threshold:g}"
        judged.append(Condition(True, f"accuracy {accuracy:.4f} >= {bar}") if accuracy >= bars.accuracy_threshold
                      else Condition(False, f"accuracy {accuracy:.4f} below {bar}",
                                     f"the accuracy {accuracy:.4f} is below the threshold {bars.accuracy_threshold:g}"))
    if steps is not None:
        judged.append(Condition(True, f"{steps} optimizer steps completed") if steps >= 1 else Condition(
            False, "no optimizer step completed", "no optimizer step completed, so these are the base weights"))
    low = gain.get("ci95_low")
    if bars.min_improvement is not None and low is not None:
        bar = f"MinImprovement {bars.min_improvement:g}"
        judged.append(Condition(True, f"improvement lower bound {low:+.4f} >= {bar}") if low >= bars.min_improvement
                      else Condition(False, f"improvement lower bound {low:+.4f} below {bar}",
                                     f"the improvement over the base model is not shown: its 95% lower bound "
                                     f"{low:+.4f} is below {bar}"))
    if training.get("guard_stopped"):
        guard = training.get("guard") or "a health"
        judged.append(Condition(False, f"stopped by the {guard} guard", f"the health guard {guard} stopped training",
                                cause=True))
    elif "guard_stopped" in training:
        judged.append(Condition(True, "no health guard stopped training"))
    return judged


def failed_conditions(evaluation: dict[str, Any], bars: Bars) -> list[tuple[str, str]]:
    """The gate's conditions that ``evaluation`` fails, as (short reason for the metadata, sentence)."""
    return [(c.short, c.sentence) for c in conditions(evaluation, bars) if not c.held]


def verdict(evaluation: dict[str, Any], bars: Bars) -> str:
    """The gate's verdict in one line, the failed conditions first: what AccuracyTooLow's message says (it reads
    ``message`` from RecordRejection's verdict.json)."""
    judged = conditions(evaluation, bars)
    # A guard's stop first: it is the cause of the others (a sick run's accuracy, its steps, its improvement).
    failed = [c.short for c in sorted(judged, key=lambda c: not c.cause) if not c.held]
    held = [c.short for c in judged if c.held]
    if not failed:
        return "Approved: " + ", ".join(held) + "."
    return "Not approved: " + "; ".join(failed) + (f" (held: {', '.join(held)})" if held else "") + (
        ". The model package records the figures and the rejection.")


def billed(model: dict[str, Any], evaluation: dict[str, Any]) -> dict[str, Any]:
    """The run's billed tokens: TrainDAPO's session (model.json ``billing``) and EvaluateModel's (evaluation.json
    ``billing``) together, where the counts come from and, with the run's ``session.prices``, the money; empty
    for steps of before billing."""
    count, sources = billing.totals(model.get("billing"), evaluation.get("billing"))
    if not sources:
        return {}
    prices = ((model.get("config") or {}).get("session") or {}).get("prices")
    usd = billing.cost_usd(count, Prices(**prices) if prices else None)
    return {**{f"billed_{k}": v for k, v in count.fields().items()}, "billed_usd": usd,
            "billed_source": " + ".join(sources)}


def metadata(model: dict[str, Any], evaluation: dict[str, Any], execution_arn: str | None, bars: Bars,
             reject: bool = False) -> dict[str, str]:
    """The package's CustomerMetadataProperties (at most 50, botocore's limit, the session's own
    TrainingSessionName among them; at most 33 here); a figure or fact that is not known is left out."""
    base, gain = evaluation.get("base") or {}, evaluation.get("improvement") or {}
    sampled = (evaluation.get("metrics") or {}).get("pass_at_k") or {}
    mlflow = model.get("mlflow") or {}
    training = evaluation.get("training") or {}
    facts: dict[str, Any] = {
        "accuracy": _figure(evaluation, "accuracy"),
        "accuracy_ci95_low": _figure(evaluation, "accuracy", "ci95_low"),
        "accuracy_ci95_high": _figure(evaluation, "accuracy", "ci95_high"),
        "accuracy_lenient": _figure(evaluation, "accuracy_lenient"),
        "format_error_rate": _figure(evaluation, "format_error_rate"),
        "pass_at_k": _figure(evaluation, "pass_at_k"),
        "maj_at_k": _figure(evaluation, "maj_at_k"),
        "k": sampled.get("k"),
        "n": evaluation.get("n"),
        "base_accuracy": _figure(base, "accuracy"),
        "base_accuracy_ci95_low": _figure(base, "accuracy", "ci95_low"),
        "base_accuracy_ci95_high": _figure(base, "accuracy", "ci95_high"),
        "base_pass_at_k": _figure(base, "pass_at_k"),
        "improvement": gain.get("value"),
        "improvement_ci95_low": gain.get("ci95_low"),
        "improvement_ci95_high": gain.get("ci95_high"),
        "improvement_method": gain.get("method"),
        "accuracy_threshold": bars.accuracy_threshold,
        "min_improvement": bars.min_improvement,
        "steps_completed": model.get("steps_completed"),
        "stopped_early": model.get("stopped_early"),
        "guard": training.get("guard"),
        "base_model": model.get("base_model"),
        "pipeline_execution_arn": execution_arn,
        "mlflow_run_id": mlflow.get("run_id"),
        "mlflow_experiment": mlflow.get("experiment"),
        **billed(model, evaluation),
    }
    # The gate's verdict itself: with UpdateApproval false the status may be another (an earlier verdict's).
    facts["verdict"] = REJECTED if reject else APPROVED
    if reject:
        reasons = [short for short, _ in failed_conditions(evaluation, bars)]
        facts["rejection_reason"] = " / ".join(reasons) or "the pipeline's condition did not hold"
    return {key: _text(value) for key, value in facts.items() if value is not None and str(value) != ""}


def _accuracy(metric: dict[str, Any], lenient: float | None = None) -> str:
    """``0.8300 (95% CI 0.7700 to 0.8800; lenient 0.9000)``, with what is known."""
    inside = [f"95% CI {metric['ci95_low']:.4f} to {metric['ci95_high']:.4f}"] if "ci95_low" in metric else []
    inside += [f"lenient {lenient:.4f}"] if lenient is not None else []
    return f"{metric['value']:.4f}" + (f" ({'; '.join(inside)})" if inside else "")


def description(model: dict[str, Any], evaluation: dict[str, Any], bars: Bars, reject: bool) -> str:
    """One sentence for the registry: the verdict, why (when rejected), the figures, how training ended."""
    metrics, base = evaluation.get("metrics", {}), evaluation.get("base") or {}
    gain, steps = evaluation.get("improvement"), model.get("steps_completed")
    why = [sentence for _, sentence in failed_conditions(evaluation, bars)] if reject else []
    figures = (f"greedy accuracy {_accuracy(metrics['accuracy'], _figure(evaluation, 'accuracy_lenient'))}"
               f" on {evaluation.get('n', '?')} held-out questions")
    if bars.accuracy_threshold is not None:
        figures += f", threshold {bars.accuracy_threshold:g}"
    parts = [figures]
    if base.get("metrics"):
        parts.append(f"base model {_accuracy(base['metrics']['accuracy'])}")
    if gain:
        parts.append(f"improvement {gain['value']:+.4f}, 95% CI {gain['ci95_low']:+.4f} to {gain['ci95_high']:+.4f}"
                     " by exact McNemar" + (f", MinImprovement {bars.min_improvement:g}"
                                           if bars.min_improvement is not None else ""))
    if "pass_at_k" in metrics:
        k = metrics["pass_at_k"]["k"]
        base_pass = _figure(base, "pass_at_k")
        parts.append(f"pass@{k} {metrics['pass_at_k']['value']:.4f}"
                     + (f" (base {base_pass:.4f})" if base_pass is not None else "")
                     + f", maj@{k} {metrics['maj_at_k']['value']:.4f}")
    training = f"{steps} optimizer steps from {model.get('base_model')}"
    if model.get("stopped_early"):
        training += f"; training stopped early: {model.get('stop_reason') or 'see the TrainDAPO log'}"
    bill = billed(model, evaluation)
    if bill:
        training += (f"; billed {bill['billed_prefill_tokens']:,} prefill, {bill['billed_sample_tokens']:,} sample "
                     f"and {bill['billed_train_tokens']:,} train tokens"
                     + (f" (USD {bill['billed_usd']:.2f})" if bill["billed_usd"] is not None else ""))
    verdict = (REJECTED if reject else APPROVED) + " by the DAPO pipeline"
    return "; ".join([verdict + (": " + " and ".join(why) if why else ""), *parts, training])[:_DESCRIPTION_MAX]


def earlier_verdict(current: dict[str, Any]) -> str:
    """A verdict recorded on the package, in one metadata value: its status, the execution that gave it, and the
    figures the gate read against its bars."""
    have = current.get("CustomerMetadataProperties") or {}
    parts = [have.get("verdict") or current.get("ModelApprovalStatus") or "unknown"]
    if have.get("pipeline_execution_arn"):
        parts.append(f"execution={have['pipeline_execution_arn'].rsplit('/', 1)[-1]}")
    parts += [f"{key}={have[key]}" for key in VERDICT_FIGURES if key in have]
    return _text(" ".join(parts))


def history(current: dict[str, Any], properties: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """What keeps the earlier verdicts when a new one is recorded (a re-evaluation of the same adapter): every
    ``verdict_<n>`` already on the package, the verdict being replaced as the next ``verdict_<n>`` (1: the first)
    and ``verdicts``, how many the package has had with this one; and the keys the new verdict does not set that
    would otherwise linger from the old one (the merge keeps what a request omits)."""
    have = current.get("CustomerMetadataProperties") or {}
    kept = {k: v for k, v in have.items() if k.startswith(VERDICT_PREFIX)}
    if "accuracy" not in have:  # no verdict recorded yet: only the session's own keys
        return kept, []
    number = len(kept) + 1
    kept[f"{VERDICT_PREFIX}{number}"] = earlier_verdict(current)
    kept["verdicts"] = str(number + 1)
    return kept, [key for key in _VERDICT_ONLY if key in have and key not in properties]


def record(client: Any, arn: str, status: str, properties: dict[str, str], text: str, update: bool = True) -> str:
    """Record the verdict ``status`` with the figures and, with ``update``, set the package's approval status to it;
    returns what happened, in a line. moto resets the description and the metadata when a request omits them, so
    both always go together. The registry keeps metadata keys it set itself (the training session's name), so ours
    need only be among them.

    A package that already carries a verdict of another evaluation (a re-evaluation: new ``EvalSize``,
    ``MinImprovement``, ``AccuracyThreshold`` or held-out data, same adapter) gets the new one in the same keys and
    the earlier ones kept (:func:`history`): the package stays the one registry entry of its adapter. Its status
    is the latest verdict's only with ``update``: a package's approval drives deployments, so a re-evaluation
    leaves it unless asked (UpdateApproval, ``make reevaluate UPDATE_APPROVAL=1``)."""
    current = client.describe_model_package(ModelPackageName=arn)
    have = current.get("CustomerMetadataProperties") or {}
    was = current.get("ModelApprovalStatus") or "PendingManualApproval"
    target = status if update else was
    if was == target and properties.items() <= have.items():
        return f"already recorded (verdict {status}), approval left at {was}"
    earlier, remove = history(current, properties)
    properties = {**properties, **earlier}
    if len((set(have) | set(properties)) - set(remove)) > _METADATA_KEYS_MAX:
        raise Refused(f"model package {arn} carries {len(earlier) - 1} earlier verdicts and has no room for another "
                      f"within the registry's {_METADATA_KEYS_MAX} metadata keys: remove old verdict_<n> keys "
                      "(aws sagemaker update-model-package --customer-metadata-properties-to-remove ...) and run "
                      "the step again")
    replaced = "verdicts" in earlier  # a verdict was recorded before this one
    if replaced:
        number = int(earlier["verdicts"])
        text = (f"{text}; verdict {number} of this adapter, the earlier ones kept in its metadata as verdict_1 to "
                f"verdict_{number - 1}")
    if target != status:
        text = f"{text}; approval status left at {target} (UpdateApproval false)"
    client.update_model_package(ModelPackageArn=arn, ModelApprovalStatus=target,
                                ApprovalDescription=text[:_DESCRIPTION_MAX], CustomerMetadataProperties=properties,
                                **({"CustomerMetadataPropertiesToRemove": remove} if remove else {}))
    what = f"recorded (verdict {status}" + (f" {earlier['verdicts']}, the earlier one kept as verdict_{number - 1}"
                                            if replaced else "") + ")"
    if target == was:
        return f"{what}, approval left at {was}" + ("" if was == status else " (UpdateApproval=true sets it)")
    return f"{what}, approval changed from {was} to {target}"


def run(args: argparse.Namespace) -> int:
    model = read_model_json(args.model)
    evaluation = read_evaluation(args.evaluation)
    region = (model.get("config", {}).get("session", {}) or {}).get("region")
    bars = Bars(args.accuracy_threshold, args.min_improvement)
    properties = metadata(model, evaluation, args.execution_arn, bars, args.reject)
    status = REJECTED if args.reject else APPROVED
    text = description(model, evaluation, bars, args.reject)
    outcome = record(registry_client(region), model["model_package_arn"], status, properties, text,
                     args.update_approval)
    print(f"approve: {model['model_package_arn']} {outcome}: {text}", flush=True)
    if args.output:
        files.write_json(Path(args.output) / VERDICT_FILE, {"status": status, "message": verdict(evaluation, bars)})
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    require_training_session_sdk()  # exits 2 naming the fix, before the step does anything
    return run_step(lambda: run(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
