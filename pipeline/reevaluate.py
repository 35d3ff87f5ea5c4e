"""``python -m pipeline.reevaluate --config X --execution ARN [--param Name=Value ...] [--wait]``: evaluate and gate
an adapter again, without training it again.

SageMaker's own mechanism, **selective execution**: a new execution of the pipeline that runs only the selected
steps, EvaluateModel and the gate after it (CheckAccuracy, ApproveModel, RecordRejection, AccuracyTooLow), and
takes every other step's outputs from the source execution: ValidateData's checked data and TrainDAPO's model
artifact are reused as they are, nothing is trained and TrainDAPO's session is never created. The execution's
parameters are the source execution's (ListPipelineParametersForExecution) with the overrides in place: a
selective execution otherwise runs with the pipeline's defaults.

Why not step caching of ValidateData and TrainDAPO: a cache hit needs the step's arguments unchanged, but every
step writes under the execution's id (its S3 outputs, TrainDAPO's checkpoint prefix), so no later execution
could hit; and TrainDAPO reads ``EvalSize`` for its in-training evaluations, so the one change a re-evaluation
most often makes would retrain. Selective execution names the execution to reuse, explicitly, and the
console shows the reused steps as such.

Only a parameter the selected steps read may change (``EvalSize``, ``AccuracyThreshold``, ``MinImprovement``,
``EvalDataS3Uri``, the processing instance and image): one only ValidateData or TrainDAPO read would be silently
ignored, so it is refused, naming who reads it.

New held-out data (``EvalDataS3Uri``) is checked by EvaluateModel, not by a re-run ValidateData: SageMaker's
selected steps must include "all step(s) in all path(s) between two selected steps" (the API's
SelectiveExecutionConfig.SelectedSteps), and TrainDAPO lies on the path ValidateData -> TrainDAPO ->
EvaluateModel, so selecting ValidateData would train again. EvaluateModel reads the data ``EvalDataS3Uri`` names
and ValidateData's output; when the data is not the files ValidateData checked (their sha256s), it applies the
task's row rules, the grader agreement and the prompt-length check itself, removes every question the adapter
trained on (ValidateData's train.jsonl of the source execution) from the held-out rows, and writes its own
validation.json beside evaluation.json (steps/validate.py ``validate_held_out``).

The package's approval status is not changed by a re-evaluation unless asked (``--update-approval``, ``make
reevaluate UPDATE_APPROVAL=1``): the execution runs with ``UpdateApproval=false``, so ApproveModel and
RecordRejection record the new verdict and its figures on the package and leave its status (a package's approval
drives deployments). :func:`approval` says which, before the execution starts.

The local twin is ``python -m local.run --reevaluate RUN_ID``: the same selection and the same check, on a
finished local run (local/run.py).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any, Iterable, Mapping, Sequence

from pipeline.aws import UserError, aws_session, cli_main, resolve_region
from pipeline.config import load
from pipeline.expressions import all_steps
from steps.cli import parse_pairs
from steps.platform.versions import require_training_session_sdk

#: The steps a re-evaluation keeps from the execution it re-evaluates: the checked data and the trained adapter.
KEPT = ("ValidateData", "TrainDAPO")
_PARAMETER = re.compile(r'"Get":\s*"Parameters\.(\w+)"')


def selected_steps(definition: Mapping[str, Any]) -> list[str]:
    """Every step of the definition but the kept ones, in the definition's order (the gate's branches included):
    EvaluateModel, CheckAccuracy, ApproveModel, RecordRejection, AccuracyTooLow."""
    names = [step["Name"] for step in all_steps(definition)]
    missing = [name for name in KEPT if name not in names]
    if missing:
        raise UserError(f"the pipeline has no step {', '.join(missing)}: it is not the DAPO pipeline this command "
                        "re-evaluates (its steps: " + ", ".join(names) + ")")
    return [name for name in names if name not in KEPT]


def _own_arguments(step: Mapping[str, Any]) -> Any:
    """What a step itself reads: a condition step's conditions, not the steps of its branches."""
    if step.get("Type") == "Condition":
        return step["Arguments"].get("Conditions", [])
    return step.get("Arguments", {})


def readers(definition: Mapping[str, Any]) -> dict[str, list[str]]:
    """Parameter name -> the steps whose arguments read it (``{"Get": "Parameters.N"}``)."""
    found: dict[str, list[str]] = {}
    for step in all_steps(definition):
        for name in sorted(set(_PARAMETER.findall(json.dumps(_own_arguments(step))))):
            found.setdefault(name, []).append(step["Name"])
    return found


def check_overrides(params: Mapping[str, str], definition: Mapping[str, Any]) -> None:
    """Refuse a parameter no selected step reads: the re-evaluation would ignore it. Its name and type are
    checked against the definition elsewhere (pipeline.start.check_params)."""
    selected, read = set(selected_steps(definition)), readers(definition)
    for name in params:
        steps = read.get(name, [])
        if steps and not selected & set(steps):
            extra = (" in this definition (built before EvaluateModel read the held-out data itself: deploy the "
                     "pipeline again, make deploy-pipeline, train, and re-evaluate that execution on new data)"
                     if name == "EvalDataS3Uri" else "")
            raise UserError(f"parameter {name} is read only by {' and '.join(steps)}, which a re-evaluation keeps "
                            f"from the execution it re-evaluates{extra}; it would change nothing here. Train again "
                            f"with it in a new execution (make start-pipeline PARAMS=\"{name}=...\"); a re-evaluation "
                            "changes " + ", ".join(sorted(n for n, s in read.items() if selected & set(s))))


UPDATE = "UpdateApproval"


def approval(declared: Iterable[str], params: Mapping[str, str], update: bool) -> tuple[dict[str, str], str]:
    """The UpdateApproval value a re-evaluation runs with (false unless ``update`` or given as a parameter) and the
    line that says what it will do to the package's status. A definition without the parameter (deployed before
    it) would set the status: refused unless ``update``."""
    if UPDATE in params:
        update = params[UPDATE].lower() == "true"
    sets = "approval: the new verdict sets the model package's approval status (UPDATE_APPROVAL=1)"
    if UPDATE not in declared:
        if not update:
            raise UserError(f"this pipeline's definition has no {UPDATE} parameter (built before it): its ApproveModel "
                            "and RecordRejection would set the model package's approval status to the new verdict. "
                            "Deploy it again (make deploy-pipeline) to re-evaluate without changing the approval, or "
                            "let the verdict set it: UPDATE_APPROVAL=1 (--update-approval)")
        return {}, sets
    if update:
        return {UPDATE: "true"}, sets
    return {UPDATE: "false"}, ("approval: the new verdict is recorded on the model package; its approval status is "
                               "left as it is (UPDATE_APPROVAL=1 sets it to the verdict)")


def overrides_text(params: Mapping[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items()) or "no parameter changed"


def selective_execution_config(source_arn: str, steps: Iterable[str]) -> dict[str, Any]:
    """StartPipelineExecution's SelectiveExecutionConfig, as the SDK's own class writes it."""
    from sagemaker.mlops.workflow.selective_execution_config import SelectiveExecutionConfig

    return SelectiveExecutionConfig(source_pipeline_execution_arn=source_arn, selected_steps=list(steps)).to_request()


def source_execution(sm: Any, pipeline_name: str, arn: str) -> dict[str, Any]:
    """The execution to re-evaluate: one of this pipeline's, Succeeded or Failed (what selective execution takes),
    whose TrainDAPO succeeded."""
    from botocore.exceptions import ClientError

    try:
        execution = sm.describe_pipeline_execution(PipelineExecutionArn=arn)
    except ClientError as exc:
        raise UserError(f"EXECUTION={arn}: {exc.response.get('Error', {}).get('Message', exc)}") from None
    pipeline = execution.get("PipelineArn", "").rsplit("/", 1)[-1]
    if pipeline != pipeline_name:
        raise UserError(f"EXECUTION={arn} is an execution of pipeline '{pipeline}', not of '{pipeline_name}' (the "
                        "config's pipeline.name)")
    status = execution.get("PipelineExecutionStatus")
    if status not in ("Succeeded", "Failed"):
        raise UserError(f"EXECUTION={arn} is {status}: selective execution re-uses a Succeeded or Failed execution; "
                        "wait for it to end")
    return execution


def source_parameters(sm: Any, arn: str) -> dict[str, str]:
    """The values the source execution ran with."""
    pages = sm.get_paginator("list_pipeline_parameters_for_execution").paginate(PipelineExecutionArn=arn)
    return {p["Name"]: p["Value"] for page in pages for p in page.get("PipelineParameters", [])}


def reevaluate(session: Any, name: str, source_arn: str, params: dict[str, str], config_path: str,
               update_approval: bool = False) -> str:
    """Check, start the selective execution and return its ARN."""
    from pipeline.start import check_params

    sm = session.client("sagemaker")
    source_execution(sm, name, source_arn)
    definition = json.loads(sm.describe_pipeline(PipelineName=name)["PipelineDefinition"])
    declared = {p["Name"]: p["Type"] for p in definition.get("Parameters", [])}
    check_params(params, declared, config_path)  # names, types and the config's ranges
    check_overrides(params, definition)
    update, approval_line = approval(declared, params, update_approval)
    # The source's values of the parameters the deployed pipeline still declares, the overrides, UpdateApproval.
    values = {**{n: v for n, v in source_parameters(sm, source_arn).items() if n in declared}, **params, **update}
    steps = selected_steps(definition)
    print(f"re-evaluate: {source_arn} with {overrides_text(params)}; runs {', '.join(steps)}; keeps "
          f"{' and '.join(KEPT)} from it (nothing is trained)", flush=True)
    if "EvalDataS3Uri" in params:
        print(f"held-out data: {params['EvalDataS3Uri']}, checked by EvaluateModel against the questions the adapter "
              "trained on (removed from it; its validation.json says how many)", flush=True)
    print(approval_line, flush=True)
    response = sm.start_pipeline_execution(
        PipelineName=name,
        PipelineExecutionDescription=f"re-evaluation of {source_arn.rsplit('/', 1)[-1]}: {overrides_text(params)}"[
            :3072],
        PipelineParameters=[{"Name": n, "Value": v} for n, v in values.items()],
        SelectiveExecutionConfig=selective_execution_config(source_arn, steps),
    )
    return response["PipelineExecutionArn"]


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    from pipeline.start import follow

    p = argparse.ArgumentParser(prog="python -m pipeline.reevaluate", description=__doc__.split("\n")[0])
    p.add_argument("--config", required=True, help="YAML config with session/dapo/pipeline sections")
    p.add_argument("--execution", required=True, metavar="ARN", help="the pipeline execution to re-evaluate")
    p.add_argument("--param", action="append", default=[], metavar="Name=Value",
                   help="a new value of a parameter EvaluateModel or the gate reads (repeatable)")
    p.add_argument("--update-approval", action="store_true",
                   help="let the new verdict set the model package's approval status (default: recorded on the "
                        "package, the status left as it is)")
    p.add_argument("--wait", action="store_true", help="poll and print each step's status until the execution ends")
    p.add_argument("--poll-seconds", type=float, default=30.0)
    args = p.parse_args(argv)

    require_training_session_sdk()
    cfg, run = load(args.config)
    params = parse_pairs(args.param, "--param", example="MinImprovement=0.1")
    region = resolve_region(run.session.region, args.config)
    session = aws_session(region)
    arn = reevaluate(session, cfg.name, args.execution, params, args.config, args.update_approval)
    return follow(session, cfg.name, region, arn, args.wait, args.poll_seconds)


if __name__ == "__main__":
    sys.exit(main())
