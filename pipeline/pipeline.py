"""The DAPO pipeline: ValidateData -> TrainDAPO -> EvaluateModel (trained against base) -> CheckAccuracy
-> ApproveModel | RecordRejection -> AccuracyTooLow.

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

import json
import logging
import warnings
from typing import Any

import boto3
import yaml
from sagemaker.core.network import NetworkConfig
from sagemaker.core.processing import Processor
from sagemaker.core.shapes import (
    MlflowConfig,
    ProcessingInput,
    ProcessingOutput,
    ProcessingS3Input,
    ProcessingS3Output,
    Tag,
)
from sagemaker.core.training.configs import (
    CheckpointConfig,
    Compute,
    InputData,
    MetricDefinition,
    Networking,
    OutputDataConfig,
    StoppingCondition,
)
from sagemaker.core.workflow.conditions import ConditionEquals, ConditionGreaterThanOrEqualTo
from sagemaker.core.workflow.execution_variables import ExecutionVariables
from sagemaker.core.workflow.functions import Join, JsonGet
from sagemaker.core.workflow.parameters import ParameterBoolean, ParameterFloat, ParameterInteger, ParameterString
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

from steps import supervise
from steps.config import PipelineConfig, RunConfig, to_dict
from steps.config.parameters import HYPERPARAMETERS, PARAMETERS
from steps.platform import tracking
from steps.platform.ownership import ENV_PIPELINE
from steps.platform.session import SessionNetwork

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
VERDICT_DIR = f"{PROC}/output/verdict"
TOKENIZER_DIR = f"{PROC}/input/tokenizer"
CHECKPOINT_DIR = "/opt/ml/checkpoints"

# A number as Python logs it: 3, -0.0123, 0.4219, 1.5e-05, 2E+3.
_NUM = r"([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"


def _metric(line: str, key: str) -> MetricDefinition:
    # Anchored on the line's prefix so train:accuracy never matches an eval line.
    return MetricDefinition(name=f"{line}:{key}", regex=rf"{line}: step=[0-9]+ .*\b{key}={_NUM}")


# Regexes over the log lines steps.train prints (steps/dapo/metrics.py), e.g.
#   sampling: step=3 gen_batches=2 groups_sampled=64 filtered_frac=0.4531 kept_groups=35 empty_rollouts=0
#   train: step=3 reward_mean=0.4219 accuracy=0.4219 loss=-0.0123 tokens=12345 seconds=4.21 accuracy_lenient=0.4531
#          ... entropy=0.4120 sampler_kl=1.2e-05 completion_tokens_p50=210.0 completion_tokens_p95=880.0
#          completion_tokens_max=1024 repetition_frac=0.0000 format_error_rate=0.0312   (steps/dapo/health.py)
#   eval: step=10 accuracy=0.5300
# A figure printed "nan" matches no regex: no datapoint, not 0 (sampler_kl, where a step cannot measure it, is absent).
HEALTH_METRICS = ("entropy", "sampler_kl", "completion_tokens_p50", "completion_tokens_p95", "completion_tokens_max",
                  "truncated_frac", "repetition_frac", "format_error_rate")
METRIC_DEFINITIONS = [
    *(_metric("train", k) for k in ("reward_mean", "accuracy", "loss", "tokens", "seconds", "accuracy_lenient")),
    *(_metric("train", k) for k in HEALTH_METRICS),
    *(_metric("sampling", k)
      for k in ("gen_batches", "groups_sampled", "filtered_frac", "kept_groups", "empty_rollouts")),
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


# What the Studio console shows for each step (DisplayName, Description); the names themselves are the stable
# interface. The published schema allows a DisplayName only of StepName's characters (letters, digits, - and _,
# at most 64); pipeline/checks.py refuses one that breaks the schema's or botocore's limits.
STEP_TEXTS: dict[str, tuple[str, str]] = {
    "ValidateData": (
        "Validate-task-data",
        "Checks the data (JSONL, JSON, CSV or parquet) under TrainDataS3Uri and EvalDataS3Uri for the Task (each "
        "row a question and an answer in "
        "the task's format; gsm8k: ending '#### N'), grades every row's own gold answer with the task's grader, drops "
        "train questions that also appear in eval, renders every prompt with BaseModel's tokenizer and chat template "
        "and drops one whose prompt plus max_tokens exceeds the model's context, prints each split's drops by reason, "
        "refuses a split losing more than MaxDroppedShare of its rows, and needs at least BatchSize usable train "
        "rows. Writes the rows that pass (train.jsonl, eval.jsonl) and validation.json; bad data, or gold "
        "answers the grader cannot read, fail this step, naming the file, row and fix, before anything is billed."),
    "TrainDAPO": (
        "Train-DAPO-LoRA-in-a-training-session",
        "DAPO reinforcement learning of BaseModel's LoRA adapter on a SageMaker training session. Each optimizer "
        "step samples GroupSize completions per prompt, keeps groups whose rewards differ until BatchSize are "
        "filled (drawing at most MaxNumGenBatches generation batches), and updates with the PPO ratio clipped to "
        "[ClipLowThreshold, ClipHighThreshold] at LearningRate, for MaxSteps steps. This job's small CPU "
        "instance (TrainingInstanceType) drives the session, which holds the GPUs and is stopped on every exit. "
        "Checkpoints go to S3, so a retry resumes; the model package goes to the configured group."),
    "EvaluateModel": (
        "Evaluate-trained-against-base",
        "The base model and the trained model package answer the same first EvalSize held-out questions (0: all) "
        "in one training session of this job's own: greedy answers, and k samples per question at the training "
        "temperature. Writes evaluation.json (for both: strict and lenient accuracy with 95% Wilson intervals, "
        "format error rate, pass@k, maj@k; trained minus base accuracy with an exact McNemar 95% interval; how "
        "training ended) and rollouts.jsonl; CheckAccuracy reads it as the property file EvaluationReport. When "
        "EvalDataS3Uri names other files than ValidateData checked (a re-evaluation on new held-out data), checks "
        "them itself first and leaves out the questions the adapter trained on (validation.json)."),
    "CheckAccuracy": (
        "Gate-on-accuracy-improvement-and-health",
        "True when all hold: the strict greedy accuracy (metrics.accuracy.value) is at least AccuracyThreshold; "
        "at least one optimizer step completed (training.steps_completed; a run stopped before its first step "
        "evaluated the base weights); the 95% lower bound of trained minus base accuracy "
        "(improvement.ci95_low) is at least MinImprovement; no health guard stopped training "
        "(training.guard_stopped is 0). True: ApproveModel. False: RecordRejection, then AccuracyTooLow."),
    "ApproveModel": (
        "Approve-model-package",
        "Writes the evaluation figures (both models' accuracies with intervals, the improvement and its interval, "
        "pass@k), how training ended, the base model and this execution onto the trained model package and sets "
        "it Approved."),
    "RecordRejection": (
        "Record-rejection-on-model-package",
        "Writes the same figures onto the trained model package and sets it Rejected, naming the conditions that "
        "failed, and writes the verdict in words (verdict.json) before AccuracyTooLow fails the execution."),
    "AccuracyTooLow": (
        "Fail-not-approved",
        "Fails the execution with RecordRejection's verdict: the gate's conditions that failed, in words (the "
        "accuracy against AccuracyThreshold, the improvement's 95% lower bound against MinImprovement, the optimizer "
        "steps completed, a guard's stop: stopped by the entropy_collapse guard), then those that held, figures to 4 "
        "decimals; the model package records it too."),
}


def _texts(name: str) -> dict[str, str]:
    display_name, description = STEP_TEXTS[name]
    return {"name": name, "display_name": display_name, "description": description}


_PARAMETER_TYPES = {"String": ParameterString, "Integer": ParameterInteger, "Float": ParameterFloat,
                    "Boolean": ParameterBoolean}


def make_parameters(run: RunConfig) -> dict[str, Any]:
    """Every pipeline parameter of the one table in steps.config.parameters, defaulting to its config key."""
    return {p.name: _PARAMETER_TYPES[p.kind](p.name, default_value=p.default(run)) for p in PARAMETERS}


def _check_sdk_config_against_a_checked_schema() -> None:
    """The SDK validates the session's config at each of its config lookups (some 70 in one definition build)
    with ``jsonschema.validate``, which first checks the SDK's constant schema against the JSON Schema
    meta-schema, every time: ~6 s of a ~9 s build. The same validation of the config, with the schema checked
    once (the first call) instead of at every lookup."""
    from jsonschema import exceptions, validators
    from sagemaker.core.config import config_manager

    if getattr(config_manager.SageMakerConfig.validate_sagemaker_config, "schema_checked_once", False):
        return
    schema = config_manager.SAGEMAKER_PYTHON_SDK_CONFIG_SCHEMA
    checked: list[Any] = []

    def validate_sagemaker_config(sagemaker_config: dict | None = None) -> None:
        if not checked:
            cls = validators.validator_for(schema)
            cls.check_schema(schema)
            checked.append(cls(schema))
        if (error := exceptions.best_match(checked[0].iter_errors(sagemaker_config))) is not None:
            raise error

    validate_sagemaker_config.schema_checked_once = True  # type: ignore[attr-defined]
    config_manager.SageMakerConfig.validate_sagemaker_config = staticmethod(validate_sagemaker_config)


def make_session(region: str, default_bucket: str, boto_session: boto3.Session | None = None) -> PipelineSession:
    """A PipelineSession that records job requests instead of sending them.

    ``default_bucket`` is given so the SDK never lists or creates one.
    """
    _check_sdk_config_against_a_checked_schema()
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
    return yaml.safe_dump(value, default_flow_style=True, width=float("inf")).splitlines()[0]


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


def _processor(cfg: PipelineConfig, params: dict[str, Any], module: str, session: PipelineSession, *,
               isolated: bool = False, env: dict[str, str] | None = None) -> Processor:
    """``isolated``: the job needs no network at all (EnableNetworkIsolation)."""
    return Processor(
        role=cfg.role_arn,
        image_uri=params["ImageUri"],
        instance_count=1,
        instance_type=params["ProcessingInstanceType"],
        # EvaluateModel creates a training session: run under steps.supervise, as the image's `train` is.
        entrypoint=[*(supervise.ENTRYPOINT if module == "evaluate" else ()), "python", "-m", f"steps.{module}"],
        base_job_name=f"dapo-{module}",
        max_runtime_in_seconds=cfg.processing_max_runtime_seconds,
        volume_kms_key=cfg.volume_kms_key_arn,
        output_kms_key=cfg.kms_key_arn,
        env=env or None,
        tags=_tags(cfg),
        network_config=_network_config(cfg, isolated),
        sagemaker_session=session,
    )


def _network_config(cfg: PipelineConfig, isolated: bool) -> NetworkConfig | None:
    """pipeline.vpc's subnets and security groups with traffic between instances encrypted; None (SageMaker's
    network, as without the setting) unless there is a VPC or isolation to ask for."""
    vpc = cfg.vpc
    if vpc is None:
        return NetworkConfig(enable_network_isolation=True) if isolated else None
    return NetworkConfig(enable_network_isolation=isolated, subnets=vpc.subnets,
                         security_group_ids=vpc.security_group_ids, encrypt_inter_container_traffic=True)


def _session_network(cfg: PipelineConfig) -> SessionNetwork:
    """What the jobs that create training sessions (TrainDAPO, EvaluateModel) hand the SDK: the VPC and the
    output key, as environment variables (steps/platform/session.py)."""
    vpc = cfg.vpc
    return SessionNetwork(subnets=tuple(vpc.subnets) if vpc else (),
                          security_group_ids=tuple(vpc.security_group_ids) if vpc else (),
                          kms_key_arn=cfg.kms_key_arn)


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


def _tokenizer_input(cfg: PipelineConfig) -> tuple[list[ProcessingInput], list[str]]:
    """The tokenizer files of pipeline.tokenizer_s3_uri as a processing input and its argument; none when unset
    (the step then loads the tokenizer the Hub names)."""
    if not cfg.tokenizer_s3_uri:
        return [], []
    return [_s3_input("tokenizer", cfg.tokenizer_s3_uri, TOKENIZER_DIR)], ["--tokenizer", TOKENIZER_DIR]


def _validate_step(cfg: PipelineConfig, run: RunConfig, params: dict[str, Any],
                   session: PipelineSession) -> ProcessingStep:
    # The prompt-length check renders every question as TrainDAPO will: the base model's tokenizer, the
    # configured chat-template arguments, and room for max_tokens within the model's context.
    tokenizer_inputs, tokenizer_args = _tokenizer_input(cfg)
    # With the tokenizer files from S3, ValidateData makes no Hub call and downloads nothing: no network at all.
    isolated = bool(cfg.tokenizer_s3_uri)
    length_check = ["--base-model", params["BaseModel"], "--max-tokens", str(run.dapo.max_tokens),
                    "--chat-template-kwargs", json.dumps(run.session.chat_template_kwargs), *tokenizer_args]
    if run.session.region:
        length_check += ["--region", run.session.region]
    if run.session.max_context_tokens:
        length_check += ["--max-context-tokens", str(run.session.max_context_tokens)]
    task_args = _task_arguments(run, params)
    args = _processor(cfg, params, "validate", session, isolated=isolated).run(
        inputs=[
            _s3_input("train", params["TrainDataS3Uri"], f"{PROC}/input/train"),
            _s3_input("eval", params["EvalDataS3Uri"], f"{PROC}/input/eval"),
            *tokenizer_inputs,
        ],
        outputs=[_s3_output("validated", _run_prefix(cfg, "ValidateData", "validated"), VALIDATED_DIR)],
        arguments=[
            "--train", f"{PROC}/input/train",
            "--eval", f"{PROC}/input/eval",
            "--batch-size", params["BatchSize"].to_string(),
            "--output", VALIDATED_DIR,
            *length_check,
            *_drop_argument(params),
            *task_args,
        ],
    )
    return ProcessingStep(**_texts("ValidateData"), step_args=args, retry_policies=JOB_RETRY_POLICIES)


def _task_arguments(run: RunConfig, params: dict[str, Any]) -> list[Any]:
    """The task (the Task parameter) and the task section's other settings that are set: ValidateData reads the
    rows with them, EvaluateModel grades with them (TrainDAPO gets them as hyperparameters)."""
    flags = {"question_field": "--question-field", "answer_field": "--answer-field",
             "choices_field": "--choices-field", "grader": "--grader", "code_dir": "--code-dir"}
    settings = run.task.model_dump()
    return ["--task", params["Task"], *(a for key, flag in flags.items() if settings[key] is not None
                                        for a in (flag, str(settings[key])))]


def _drop_argument(params: dict[str, Any]) -> list[Any]:
    """ValidateData's limit on the rows a split may lose (the MaxDroppedShare parameter)."""
    return ["--max-dropped-share", params["MaxDroppedShare"].to_string()]


def _tracking_environment(cfg: PipelineConfig) -> dict[str, Any]:
    """What TrainDAPO needs to log to MLflow (steps/platform/tracking.py), only when a server is configured.

    MLflow's own variables name the server (the sagemaker-mlflow plugin in the image resolves the ARN)
    and the configured experiment; the execution's ARN lets the step read the experiment an execution
    was started with (``make start-pipeline EXPERIMENT=...``).
    """
    if not cfg.mlflow_tracking_arn:
        return {}
    return {tracking.ENV_TRACKING_URI: cfg.mlflow_tracking_arn, tracking.ENV_EXPERIMENT: cfg.experiment_name}


def _owner_environment() -> dict[str, Any]:
    """Whose job this is (TrainDAPO, EvaluateModel): their training sessions' names and the orphan sweep read it
    (steps/platform/ownership.py); the execution's ARN also tells MLflow tracking the execution's experiment."""
    return {ENV_PIPELINE: ExecutionVariables.PIPELINE_NAME,
            tracking.ENV_EXECUTION_ARN: ExecutionVariables.PIPELINE_EXECUTION_ARN}


def _train_step(
    cfg: PipelineConfig, run: RunConfig, params: dict[str, Any], validated: Any, session: PipelineSession
) -> TrainingStep:
    trainer = ModelTrainer(
        training_image=params["ImageUri"],  # the image's `train` entrypoint runs steps.train
        role=cfg.role_arn,
        base_job_name="dapo-train",
        compute=Compute(instance_type=params["TrainingInstanceType"], instance_count=1, volume_size_in_gb=30,
                        volume_kms_key_id=cfg.volume_kms_key_arn),
        networking=Networking(subnets=cfg.vpc.subnets, security_group_ids=cfg.vpc.security_group_ids,
                              enable_inter_container_traffic_encryption=True) if cfg.vpc else None,
        stopping_condition=StoppingCondition(max_runtime_in_seconds=cfg.max_runtime_seconds),
        output_data_config=OutputDataConfig(
            s3_output_path=_run_prefix(cfg, "TrainDAPO", "output"), compression_type="GZIP",
            kms_key_id=cfg.kms_key_arn,
        ),
        hyperparameters=_hyperparameters(run, params),
        environment={**_owner_environment(), **_session_network(cfg).environment(), **_tracking_environment(cfg)},
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
            # SM_CHANNEL_TOKENIZER: steps.train loads the tokenizer from it instead of the Hub's id.
            *([InputData(channel_name="tokenizer", data_source=cfg.tokenizer_s3_uri)] if cfg.tokenizer_s3_uri else []),
        ]
    )
    return TrainingStep(**_texts("TrainDAPO"), step_args=args, retry_policies=JOB_RETRY_POLICIES)


def _evaluate_step(
    cfg: PipelineConfig, params: dict[str, Any], validated: Any, model: Any, report: PropertyFile,
    session: PipelineSession
) -> ProcessingStep:
    tokenizer_inputs, tokenizer_args = _tokenizer_input(cfg)
    env = {**_owner_environment(), **_session_network(cfg).environment()}
    args = _processor(cfg, params, "evaluate", session, env=env).run(
        inputs=[
            _s3_input("model", model, f"{PROC}/input/model"),
            _s3_input("eval", Join(on="/", values=[validated, "eval.jsonl"]), f"{PROC}/input/eval"),
            # What EvalDataS3Uri names now, and ValidateData's record: a re-evaluation on new held-out data (a
            # selective execution from EvaluateModel, ValidateData and TrainDAPO kept) is checked by this step
            # against the questions the adapter trained on; re-running ValidateData would re-run TrainDAPO, which
            # lies on a path between them (pipeline/reevaluate.py).
            _s3_input("heldout", params["EvalDataS3Uri"], f"{PROC}/input/heldout"),
            _s3_input("validated", validated, f"{PROC}/input/validated"),
            *tokenizer_inputs,
        ],
        outputs=[_s3_output("evaluation", _run_prefix(cfg, "EvaluateModel", "evaluation"), EVALUATION_DIR)],
        arguments=[
            "--model", f"{PROC}/input/model",
            "--eval", f"{PROC}/input/eval",
            "--output", EVALUATION_DIR,
            "--eval-size", params["EvalSize"].to_string(),
            "--task", params["Task"],
            "--held-out", f"{PROC}/input/heldout",
            "--validated", f"{PROC}/input/validated",
            *tokenizer_args,
        ],
    )
    return ProcessingStep(
        **_texts("EvaluateModel"), step_args=args, property_files=[report], retry_policies=JOB_RETRY_POLICIES
    )


def _registry_step(
    name: str, cfg: PipelineConfig, params: dict[str, Any], model: Any, evaluation: Any, session: PipelineSession,
    *, verdict: PropertyFile | None = None, depends_on: list[Any] | None = None
) -> ProcessingStep:
    """steps.approve: the evaluation onto the model package, Approved, or with ``verdict`` Rejected, writing the
    gate's verdict in words as that property file (AccuracyTooLow's message reads it)."""
    args = _processor(cfg, params, "approve", session).run(
        inputs=[
            _s3_input("model", model, f"{PROC}/input/model"),
            _s3_input("evaluation", evaluation, f"{PROC}/input/evaluation"),
        ],
        outputs=[_s3_output(verdict.output_name, _run_prefix(cfg, name, "verdict"), VERDICT_DIR)] if verdict else None,
        arguments=["--model", f"{PROC}/input/model", "--evaluation", f"{PROC}/input/evaluation",
                   "--execution-arn", ExecutionVariables.PIPELINE_EXECUTION_ARN,
                   "--accuracy-threshold", params["AccuracyThreshold"].to_string(),
                   "--min-improvement", params["MinImprovement"].to_string(),
                   "--update-approval", params["UpdateApproval"].to_string(),
                   *(["--reject", "--output", VERDICT_DIR] if verdict else [])],
    )
    return ProcessingStep(**_texts(name), step_args=args, retry_policies=JOB_RETRY_POLICIES, depends_on=depends_on,
                          property_files=[verdict] if verdict else None)


def _gate_step(cfg: PipelineConfig, params: dict[str, Any], model: Any, evaluation: Any, evaluate_name: str,
               report: PropertyFile, session: PipelineSession) -> ConditionStep:
    """CheckAccuracy, with ApproveModel on one branch and RecordRejection then AccuracyTooLow on the other."""
    def report_value(path: str) -> JsonGet:
        return JsonGet(step_name=evaluate_name, property_file=report, json_path=path)

    # The gate (CheckAccuracy), every condition must hold:
    # - the strict greedy accuracy at or above AccuracyThreshold;
    # - at least one optimizer step: a run the generation-batch cap stopped before its first step evaluated the
    #   base weights, and however well they score, that package is never approved;
    # - the 95% lower bound of (trained - base) accuracy on the same questions at or above MinImprovement: an
    #   adapter is approved for what it adds to its base model, not for an accuracy the base already had;
    # - no health guard stopped training (a guard's stop is clean, and its package is never approved).
    # The condition says so where SageMaker shows the execution, and the other branch records which condition
    # failed on the package before AccuracyTooLow fails it, with RecordRejection's verdict in words as its message
    # (a Join of the raw figures could only print every condition, unrounded: steps/approve.py words it).
    accuracy = report_value("metrics.accuracy.value")
    steps_completed = report_value("training.steps_completed")
    gain_low = report_value("improvement.ci95_low")
    guard_stopped = report_value("training.guard_stopped")
    approve = _registry_step("ApproveModel", cfg, params, model, evaluation, session)
    verdict = PropertyFile(name="RejectionVerdict", output_name="verdict", path="verdict.json")
    rejection = _registry_step("RecordRejection", cfg, params, model, evaluation, session, verdict=verdict)
    too_low = FailStep(
        **_texts("AccuracyTooLow"),
        error_message=Join(on="", values=[JsonGet(step_name=rejection.name, property_file=verdict,
                                                  json_path="message")]),
        depends_on=[rejection],  # the rejection is on the package before the execution fails
    )
    check = ConditionStep(
        **_texts("CheckAccuracy"),
        conditions=[ConditionGreaterThanOrEqualTo(left=accuracy, right=params["AccuracyThreshold"]),
                    ConditionGreaterThanOrEqualTo(left=steps_completed, right=1),
                    ConditionGreaterThanOrEqualTo(left=gain_low, right=params["MinImprovement"]),
                    ConditionEquals(left=guard_stopped, right=0)],
        if_steps=[approve],
        else_steps=[rejection, too_low],
    )
    return check


def get_pipeline(cfg: PipelineConfig, run: RunConfig, *, session: PipelineSession | None = None) -> Pipeline:
    """Build the pipeline; no AWS call happens here or in ``definition()``."""
    session = session or make_session(run.session.region or "us-east-1", cfg.default_bucket)
    params = make_parameters(run)

    validate = _validate_step(cfg, run, params, session)
    validated = validate.properties.ProcessingOutputConfig.Outputs["validated"].S3Output.S3Uri

    train = _train_step(cfg, run, params, validated, session)
    model = train.properties.ModelArtifacts.S3ModelArtifacts

    report = PropertyFile(name="EvaluationReport", output_name="evaluation", path="evaluation.json")
    evaluate = _evaluate_step(cfg, params, validated, model, report, session)
    evaluation = evaluate.properties.ProcessingOutputConfig.Outputs["evaluation"].S3Output.S3Uri
    check = _gate_step(cfg, params, model, evaluation, evaluate.name, report, session)
    return Pipeline(
        name=cfg.name,
        parameters=list(params.values()),
        steps=[validate, train, evaluate, check],
        sagemaker_session=session,
        pipeline_experiment_config=None,  # Experiments would need extra permissions
        mlflow_config=MlflowConfig(mlflow_resource_arn=cfg.mlflow_tracking_arn,
                                   mlflow_experiment_name=cfg.experiment_name) if cfg.mlflow_tracking_arn else None,
    )
