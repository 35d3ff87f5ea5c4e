"""The DAPO pipeline: ValidateData -> TrainDAPO -> EvaluateModel -> CheckAccuracy -> ApproveModel | AccuracyTooLow.

Laid out like the SageMaker MLOps "modelbuild" template: :func:`get_pipeline`
builds the :class:`Pipeline` and calls nothing on AWS. Every step runs the one
step image with its code baked in (no ``code=`` upload, no ``source_code``), so
``Pipeline.definition()`` needs no S3 either.

Each step reads its inputs from the previous step's properties, so SageMaker
draws the DAG from the data flow. The step contract (names, arguments, local
paths, hyperparameter keys) is also what ``local/`` interprets offline, so it
stays plain: an entrypoint, container arguments, S3 inputs/outputs with local
paths, hyperparameters and two channels.
"""
from __future__ import annotations

import logging
import warnings
from typing import Any

import boto3
import yaml
from sagemaker.core.processing import Processor
from sagemaker.core.shapes import ProcessingInput, ProcessingOutput, ProcessingS3Input, ProcessingS3Output, Tag
from sagemaker.core.training.configs import (
    CheckpointConfig,
    Compute,
    InputData,
    MetricDefinition,
    OutputDataConfig,
    StoppingCondition,
)
from sagemaker.core.workflow.conditions import ConditionGreaterThanOrEqualTo
from sagemaker.core.workflow.execution_variables import ExecutionVariables
from sagemaker.core.workflow.functions import Join, JsonGet
from sagemaker.core.workflow.parameters import ParameterFloat, ParameterInteger, ParameterString
from sagemaker.core.workflow.pipeline_context import PipelineSession
from sagemaker.core.workflow.properties import PropertyFile
from sagemaker.mlops.workflow.condition_step import ConditionStep
from sagemaker.mlops.workflow.fail_step import FailStep
from sagemaker.mlops.workflow.pipeline import Pipeline
from sagemaker.mlops.workflow.retry import (
    SageMakerJobExceptionTypeEnum,
    SageMakerJobStepRetryPolicy,
    StepExceptionTypeEnum,
    StepRetryPolicy,
)
from sagemaker.mlops.workflow.steps import ProcessingStep, TrainingStep
from sagemaker.train.model_trainer import ModelTrainer

from steps.config import PipelineConfig, RunConfig, to_dict
from steps.config.parameters import HYPERPARAMETERS, PARAMETERS

# Importing the SDK sets the root logger to INFO; put it back so the commands
# print only what matters, and drop the notices every pipeline build triggers
# ("Popping out 'ProcessingJobName'", "Running within a PipelineSession").
logging.getLogger().setLevel(logging.WARNING)
logging.getLogger("sagemaker.config").setLevel(logging.WARNING)
logging.getLogger("sagemaker.core.workflow.utilities").setLevel(logging.ERROR)
warnings.filterwarnings("ignore", message="Running within a PipelineSession")

# Keeps the SDK from reading /etc/xdg/sagemaker/config.yaml and from sending
# telemetry in the background: building the definition must stay offline.
SAGEMAKER_CONFIG = {"SchemaVersion": "1.0", "SageMaker": {"PythonSDK": {"Modules": {"TelemetryOptOut": True}}}}

# Container paths of the SageMaker processing contract.
PROC = "/opt/ml/processing"
VALIDATED_DIR = f"{PROC}/output/validated"
EVALUATION_DIR = f"{PROC}/output/evaluation"
CHECKPOINT_DIR = "/opt/ml/checkpoints"

# A number as Python logs it: 3, -0.0123, 0.4219, 1.5e-05, 2E+3.
_NUM = r"([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"


def _metric(line: str, key: str) -> MetricDefinition:
    # Anchored on the line's prefix so train:accuracy never matches an eval line.
    return MetricDefinition(name=f"{line}:{key}", regex=rf"{line}: step=[0-9]+ .*\b{key}={_NUM}")


# Regexes over the log lines steps.train prints (steps/dapo/metrics.py), e.g.
#   sampling: step=3 gen_batches=2 groups_sampled=64 filtered_frac=0.4531 kept_groups=35 empty_rollouts=0
#   train: step=3 reward_mean=0.4219 accuracy=0.4219 loss=-0.0123 tokens=12345 seconds=4.21
#   eval: step=10 accuracy=0.5300
METRIC_DEFINITIONS = [
    *(_metric("train", k) for k in ("reward_mean", "accuracy", "loss", "tokens", "seconds")),
    *(_metric("sampling", k) for k in ("gen_batches", "groups_sampled", "filtered_frac", "kept_groups", "empty_rollouts")),
    _metric("eval", "accuracy"),
]

# Capacity and limit errors clear up with time; a retried TrainDAPO resumes from
# its checkpoint because the checkpoint URI is fixed per execution.
JOB_RETRY_POLICIES = [
    SageMakerJobStepRetryPolicy(
        exception_types=[
            SageMakerJobExceptionTypeEnum.CAPACITY_ERROR,
            SageMakerJobExceptionTypeEnum.RESOURCE_LIMIT,
            SageMakerJobExceptionTypeEnum.INTERNAL_ERROR,
        ],
        interval_seconds=60,
        backoff_rate=2.0,
        max_attempts=3,
    ),
    StepRetryPolicy(
        exception_types=[StepExceptionTypeEnum.THROTTLING, StepExceptionTypeEnum.SERVICE_FAULT],
        interval_seconds=10,
        backoff_rate=2.0,
        max_attempts=5,
    ),
]


_PARAMETER_TYPES = {"String": ParameterString, "Integer": ParameterInteger, "Float": ParameterFloat}


def make_parameters(run: RunConfig) -> dict[str, Any]:
    """Every pipeline parameter of the one table in steps.config.parameters, defaulting to its config key."""
    return {p.name: _PARAMETER_TYPES[p.kind](p.name, default_value=p.default(run)) for p in PARAMETERS}


def make_session(region: str, default_bucket: str, boto_session: boto3.Session | None = None) -> PipelineSession:
    """A PipelineSession that records job requests instead of sending them.

    ``default_bucket`` is given so the SDK never lists or creates one.
    """
    boto_session = boto_session or boto3.Session(region_name=region)
    return PipelineSession(
        boto_session=boto_session, default_bucket=default_bucket, sagemaker_config=SAGEMAKER_CONFIG
    )


def _yaml_scalar(value: Any) -> str:
    # Hyperparameters are strings that steps.config parses back with YAML's
    # scalar rules, so write them in YAML's own spelling (1e-05 -> 1.0e-05,
    # which YAML reads as a float; "1e-05" it would read as a string).
    if isinstance(value, str):
        return value
    return yaml.safe_dump(value, default_flow_style=True).splitlines()[0]


def _hyperparameters(run: RunConfig, params: dict[str, Any]) -> dict[str, Any]:
    """Every session/dapo setting of the config, the parameterised ones as pipeline variables.

    Passing all of them (not only the parameters) makes the definition carry
    the whole configuration it was built from, whatever config the image bakes in.
    """
    flat = {k: v for section in to_dict(run).values() for k, v in section.items()}
    hps: dict[str, Any] = {k: _yaml_scalar(v) for k, v in flat.items()}
    for name, key in HYPERPARAMETERS.items():
        p = params[name]
        hps[key] = p if isinstance(p, ParameterString) else p.to_string()
    return hps


def _run_prefix(cfg: PipelineConfig, *parts: str) -> Join:
    """s3://<output>/<execution id>/<parts...>: each execution writes under its own prefix."""
    return Join(on="/", values=[cfg.output_prefix, ExecutionVariables.PIPELINE_EXECUTION_ID, *parts])


def _processor(cfg: PipelineConfig, params: dict[str, Any], module: str, session: PipelineSession) -> Processor:
    return Processor(
        role=cfg.role_arn,
        image_uri=params["ImageUri"],
        instance_count=1,
        instance_type=params["ProcessingInstanceType"],
        entrypoint=["python", "-m", f"steps.{module}"],
        base_job_name=f"dapo-{module}",
        max_runtime_in_seconds=cfg.processing_max_runtime_seconds,
        tags=_tags(cfg),
        sagemaker_session=session,
    )


def _s3_input(name: str, source: Any, local_dir: str) -> ProcessingInput:
    return ProcessingInput(
        input_name=name,
        s3_input=ProcessingS3Input(s3_uri=source, local_path=local_dir, s3_data_type="S3Prefix", s3_input_mode="File"),
    )


def _s3_output(name: str, destination: Join, local_dir: str) -> ProcessingOutput:
    return ProcessingOutput(
        output_name=name,
        s3_output=ProcessingS3Output(s3_uri=destination, local_path=local_dir, s3_upload_mode="EndOfJob"),
    )


def _tags(cfg: PipelineConfig) -> list[dict[str, str]] | None:
    # Processor takes boto-style dicts; ModelTrainer wants Tag models (see _train_step).
    return [{"Key": k, "Value": v} for k, v in cfg.tags.items()] or None


def _validate_step(cfg: PipelineConfig, params: dict[str, Any], session: PipelineSession) -> ProcessingStep:
    args = _processor(cfg, params, "validate", session).run(
        inputs=[
            _s3_input("train", params["TrainDataS3Uri"], f"{PROC}/input/train"),
            _s3_input("eval", params["EvalDataS3Uri"], f"{PROC}/input/eval"),
        ],
        outputs=[_s3_output("validated", _run_prefix(cfg, "ValidateData", "validated"), VALIDATED_DIR)],
        arguments=[
            "--train", f"{PROC}/input/train",
            "--eval", f"{PROC}/input/eval",
            "--batch-size", params["BatchSize"].to_string(),
            "--output", VALIDATED_DIR,
        ],
    )
    return ProcessingStep(name="ValidateData", step_args=args, retry_policies=JOB_RETRY_POLICIES)


def _train_step(
    cfg: PipelineConfig, run: RunConfig, params: dict[str, Any], validated: Any, session: PipelineSession
) -> TrainingStep:
    trainer = ModelTrainer(
        training_image=params["ImageUri"],  # the image's `train` entrypoint runs steps.train
        role=cfg.role_arn,
        base_job_name="dapo-train",
        compute=Compute(instance_type=params["TrainingInstanceType"], instance_count=1, volume_size_in_gb=30),
        stopping_condition=StoppingCondition(max_runtime_in_seconds=cfg.max_runtime_seconds),
        output_data_config=OutputDataConfig(
            s3_output_path=_run_prefix(cfg, "TrainDAPO", "output"), compression_type="GZIP"
        ),
        hyperparameters=_hyperparameters(run, params),
        tags=[Tag(key=k, value=v) for k, v in cfg.tags.items()] or None,
        sagemaker_session=session,
    )
    trainer = trainer.with_checkpoint_config(
        CheckpointConfig(s3_uri=_run_prefix(cfg, "TrainDAPO", "checkpoints"), local_path=CHECKPOINT_DIR)
    ).with_metric_definitions(METRIC_DEFINITIONS)
    args = trainer.train(
        input_data_config=[
            InputData(channel_name="train", data_source=Join(on="/", values=[validated, "train.jsonl"])),
            InputData(channel_name="eval", data_source=Join(on="/", values=[validated, "eval.jsonl"])),
        ]
    )
    return TrainingStep(name="TrainDAPO", step_args=args, retry_policies=JOB_RETRY_POLICIES)


def _evaluate_step(
    cfg: PipelineConfig, params: dict[str, Any], validated: Any, model: Any, report: PropertyFile, session: PipelineSession
) -> ProcessingStep:
    args = _processor(cfg, params, "evaluate", session).run(
        inputs=[
            _s3_input("model", model, f"{PROC}/input/model"),
            _s3_input("eval", Join(on="/", values=[validated, "eval.jsonl"]), f"{PROC}/input/eval"),
        ],
        outputs=[_s3_output("evaluation", _run_prefix(cfg, "EvaluateModel", "evaluation"), EVALUATION_DIR)],
        arguments=[
            "--model", f"{PROC}/input/model",
            "--eval", f"{PROC}/input/eval",
            "--output", EVALUATION_DIR,
            "--eval-size", params["EvalSize"].to_string(),
        ],
    )
    return ProcessingStep(
        name="EvaluateModel", step_args=args, property_files=[report], retry_policies=JOB_RETRY_POLICIES
    )


def _approve_step(
    cfg: PipelineConfig, params: dict[str, Any], model: Any, evaluation: Any, session: PipelineSession
) -> ProcessingStep:
    args = _processor(cfg, params, "approve", session).run(
        inputs=[
            _s3_input("model", model, f"{PROC}/input/model"),
            _s3_input("evaluation", evaluation, f"{PROC}/input/evaluation"),
        ],
        arguments=["--model", f"{PROC}/input/model", "--evaluation", f"{PROC}/input/evaluation"],
    )
    return ProcessingStep(name="ApproveModel", step_args=args, retry_policies=JOB_RETRY_POLICIES)


def get_pipeline(cfg: PipelineConfig, run: RunConfig, *, session: PipelineSession | None = None) -> Pipeline:
    """Build the pipeline; no AWS call happens here or in ``definition()``."""
    session = session or make_session(run.session.region or "us-east-1", cfg.default_bucket)
    params = make_parameters(run)

    validate = _validate_step(cfg, params, session)
    validated = validate.properties.ProcessingOutputConfig.Outputs["validated"].S3Output.S3Uri

    train = _train_step(cfg, run, params, validated, session)
    model = train.properties.ModelArtifacts.S3ModelArtifacts

    report = PropertyFile(name="EvaluationReport", output_name="evaluation", path="evaluation.json")
    evaluate = _evaluate_step(cfg, params, validated, model, report, session)
    evaluation = evaluate.properties.ProcessingOutputConfig.Outputs["evaluation"].S3Output.S3Uri
    accuracy = JsonGet(step_name=evaluate.name, property_file=report, json_path="metrics.accuracy.value")

    approve = _approve_step(cfg, params, model, evaluation, session)
    too_low = FailStep(
        name="AccuracyTooLow",
        error_message=Join(
            on="",
            values=["Accuracy ", accuracy, " is below the AccuracyThreshold ", params["AccuracyThreshold"],
                    "; the model was not approved."],
        ),
    )
    check = ConditionStep(
        name="CheckAccuracy",
        conditions=[ConditionGreaterThanOrEqualTo(left=accuracy, right=params["AccuracyThreshold"])],
        if_steps=[approve],
        else_steps=[too_low],
    )
    return Pipeline(
        name=cfg.name,
        parameters=list(params.values()),
        steps=[validate, train, evaluate, check],
        sagemaker_session=session,
        pipeline_experiment_config=None,  # Experiments would need extra permissions
    )
