"""The four sections of a config file as pydantic models: ``session``, ``dapo``, ``task``, ``pipeline``.

Bounds follow what the API accepts (botocore's models), so an out-of-range value
fails here, before anything is billed, not at the first training operation.
A field's ``rule`` (in ``json_schema_extra``) is the message shown when its
value is refused; without one, the message is derived from its bounds.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator

LossFn = Literal["ppo", "importance_sampling", "cispo"]
LossAggregation = Literal["token", "sequence"]
# Which reading of a grade earns the reward (steps/dapo/sampling.py).
RewardFormat = Literal["strict", "lenient"]
# The sampling API's botocore model rejects maxTokens below this.
MIN_MAX_TOKENS = 512
INT32_MAX = 2**31 - 1
# SageMaker's own limits, so a bad value fails here and not at CreatePipeline.
MAX_TRAINING_RUNTIME = 28 * 24 * 3600
MAX_PROCESSING_RUNTIME = 7 * 24 * 3600


def _rule(text: str) -> dict[str, str]:
    return {"rule": text}


class Section(BaseModel):
    """Frozen, and unknown keys refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Prices(Section):
    """``session.prices``: what the training-session service charges for the base model's tokens, in USD per
    million of each kind it bills (DescribeTrainingSession's BillableTokenUsage; steps/platform/billing.py).
    No price ships with the project: the figures are the user's, from the SageMaker AI pricing page."""

    prefill_usd_per_million: float = Field(ge=0)
    sample_usd_per_million: float = Field(ge=0)
    train_usd_per_million: float = Field(ge=0)


class SessionConfig(Section):
    """Which model to train and where the training session keeps its artifacts."""

    # A SageMaker Public Hub model ARN. No default: a real run must name its model
    # (config/local.yaml names the local service's toy model).
    base_model: str | None = None
    # Keyword arguments of the tokenizer's apply_chat_template, e.g. {enable_thinking: false} (Qwen3
    # family) or {reasoning_effort: low} (gpt-oss). The tokenizer itself is the base model's, as the
    # Hub publishes it (steps/platform/tokenizer.py).
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict, json_schema_extra=_rule("must be a mapping of chat-template argument to value"))
    # The model's context in tokens when the Hub's model metadata does not say (or to tighten it):
    # ValidateData drops questions whose prompt plus dapo.max_tokens exceeds it. Null: the Hub's.
    max_context_tokens: int | None = Field(None, ge=1)
    lora_rank: int = Field(32, ge=1)
    lora_alpha: int = Field(64, ge=1)
    region: str | None = None
    role_arn: str | None = None
    model_package_group_arn: str | None = None
    s3_output_path: str | None = None
    # USD per million billed tokens of each kind, to show the token totals as money; null: tokens only.
    prices: Prices | None = Field(None, json_schema_extra=_rule(
        "must be {prefill_usd_per_million: X, sample_usd_per_million: Y, train_usd_per_million: Z} "
        "(USD per million tokens, each >= 0), or null"))


class DapoConfig(Section):
    """DAPO hyperparameters; config/default.yaml documents each one."""

    learning_rate: float = Field(1e-5, gt=0, le=0.01, json_schema_extra={"why": "the training-session API's range"})
    adam_beta1: float = Field(0.9, ge=0, le=0.999999)
    adam_beta2: float = Field(0.95, ge=0, le=0.999999)
    adam_eps: float = Field(1e-8, ge=1e-16, le=0.01)
    weight_decay: float = Field(0.0, ge=0, le=1)
    grad_clip_norm: float | None = Field(None, gt=0, le=100)
    batch_size: int = Field(32, ge=1)
    group_size: int = Field(8, ge=2, json_schema_extra={"why": "a group of one has no advantage"})
    max_steps: int | None = Field(100, ge=1)
    epochs: float | None = Field(None, gt=0)
    max_tokens: int = Field(1024, ge=MIN_MAX_TOKENS, json_schema_extra={"why": "the sampling API's minimum"})
    temperature: float = Field(1.0, ge=0, le=2)
    # strict: only the answer committed in the instructed form ('#### N' or '\\boxed{N}' for GSM8K) in the
    # answer region earns the reward; lenient: also one found otherwise ("the answer is N", its last number).
    reward_format: RewardFormat = "strict"
    loss_fn: LossFn = "ppo"
    clip_low_threshold: float = Field(0.8, gt=0, le=1, json_schema_extra={"why": "a ratio bound, not an epsilon"})
    clip_high_threshold: float = Field(1.28, ge=1, le=10, json_schema_extra={"why": "a ratio bound, not an epsilon"})
    max_num_gen_batches: int = Field(10, ge=1)
    # null: as many as the observed keep rate says the step needs, up to max_num_gen_batches.
    max_inflight_gen_batches: int | None = Field(None, ge=1, json_schema_extra={"why": "null = auto"})
    # 0: a step samples once the previous step's weights are saved; 1: it samples while the previous one trains;
    # 2: as 1, and groups sampled ahead and carried are trained two steps old rather than dropped;
    # null: auto, 1 if a probe step shows the overlap pays (steps/dapo/loop.py).
    max_steps_off_policy: int | None = Field(None, ge=0, le=2, json_schema_extra={"why": "null = auto"})
    overlong_filtering: bool = True
    overlong_buffer: int = Field(0, ge=0)
    overlong_penalty: float = Field(1.0, ge=0)
    advantage_std_scaling: bool = False
    loss_aggregation: LossAggregation = "token"
    sample_retries: int = Field(2, ge=0)
    save_every: int = Field(10, ge=1)
    eval_every: int = Field(0, ge=0, json_schema_extra={"why": "0 = only at the end"})
    # Held-out questions evaluated, from the start of the file; 0: all of them (GSM8K's test split: 1,319).
    eval_size: int = Field(0, ge=0, json_schema_extra={"why": "0 = the whole held-out file"})
    # Samples per held-out question at `temperature` in EvaluateModel, for pass@k and maj@k (k = this); 0: off.
    eval_k: int = Field(4, ge=0, json_schema_extra={"why": "0 = greedy only"})
    # Answers of each evaluation shown as rollouts (an MLflow table and rollouts.jsonl); 0: none.
    eval_rollouts: int = Field(16, ge=0)
    # Seeds the data order and, hashed, every sampling request (the API's seed is a 32-bit Integer).
    seed: int = Field(0, ge=0, le=INT32_MAX)
    # Health guards (steps/dapo/health.py): each stops training cleanly, as max_num_gen_batches does, when its
    # condition holds for guard_patience consecutive steps; a guard's stop is never approved.
    guards: bool = True
    guard_patience: int = Field(3, ge=1)
    guard_min_entropy: float = Field(0.02, ge=0, json_schema_extra={"why": "0 turns this guard off"})
    guard_max_repetition_frac: float = Field(0.5, ge=0, le=1)
    guard_max_truncated_frac: float = Field(0.5, ge=0, le=1)
    guard_format_error_rise: float = Field(0.2, gt=0, le=1)
    guard_accuracy_drop: float = Field(0.05, gt=0, le=1)
    # Selective rollouts (steps/dapo/selective.py, GRESO): prompts whose recent groups were all-equal are skipped
    # before sampling with a probability that adapts toward a target share of zero-variance groups sampled.
    selective_rollouts: bool = False
    selective_target_zero_variance: float = Field(0.25, ge=0, le=1)
    selective_explore_p: float = Field(0.5, gt=0, le=1, json_schema_extra={"why": "a probability"})
    selective_p_step: float = Field(0.01, ge=0, le=1)
    selective_p_min: float = Field(0.05, gt=0, le=1, json_schema_extra={"why": "a probability"})
    selective_p_max: float = Field(0.95, gt=0, le=1, json_schema_extra={"why": "a probability"})
    # The exploration floor: no prompt's chance of being sampled falls below it, so none is starved for ever.
    selective_keep_floor: float = Field(0.01, gt=0, le=1, json_schema_extra={"why": "0 could starve a prompt"})

    @model_validator(mode="after")
    def _consistent(self) -> "DapoConfig":
        if self.max_steps is None and self.epochs is None:
            raise ValueError("set 'dapo.max_steps' or 'dapo.epochs' (both are null)")
        if not self.selective_p_min <= self.selective_explore_p <= self.selective_p_max:
            raise ValueError(f"'dapo.selective_explore_p' ({self.selective_explore_p}) must lie between "
                             f"'dapo.selective_p_min' ({self.selective_p_min}) and "
                             f"'dapo.selective_p_max' ({self.selective_p_max})")
        if self.overlong_buffer >= self.max_tokens:
            raise ValueError(f"'dapo.overlong_buffer' ({self.overlong_buffer}) must be smaller than "
                             f"'dapo.max_tokens' ({self.max_tokens})")
        return self


#: The built-in tasks (steps/tasks/): an answer format each; ``custom`` is the user's own grader (``task.grader``).
TaskName = Literal["gsm8k", "hash", "boxed", "answer_is", "choice", "number", "custom"]
_FIELD_RULE = _rule("must be the name of a field of the JSONL rows (letters, digits, _ and -)")
_FIELD = r"^[A-Za-z0-9_\-]{1,64}$"


class TaskConfig(Section):
    """What the model is trained on: the prompt, the grader and the row rules (steps/tasks/); config/default.yaml
    documents each key. Field names left null are found per file (``question``/``answer``, ``problem``/``solution``)."""

    name: TaskName = "gsm8k"
    question_field: str | None = Field(None, pattern=_FIELD, json_schema_extra=_FIELD_RULE)
    answer_field: str | None = Field(None, pattern=_FIELD, json_schema_extra=_FIELD_RULE)
    choices_field: str | None = Field(None, pattern=_FIELD, json_schema_extra=_FIELD_RULE)
    # The user's own task: an entry point `package.module:attr` naming an object with the Task protocol
    # (steps/dapo/task.py) or a factory returning one; code_dir is put on sys.path first (the image has it too:
    # `make build-image TASK_CODE=<dir>` copies it to /opt/program/task_code, on the image's PYTHONPATH).
    grader: str | None = Field(None, pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$", json_schema_extra=_rule(
        "must be an entry point package.module:attr (an object with prompt() and grade(), or a factory of one)"))
    code_dir: str | None = Field(None, min_length=1)
    # A split that loses more than this share of its rows (invalid, duplicate, asked in the held-out split, a field
    # or a gold answer missing) is refused by ValidateData and check-task: most of a dataset dropped is more often
    # the wrong task or fields than bad rows. 1: any share (the pipeline parameter MaxDroppedShare).
    max_dropped_share: float = Field(0.5, ge=0, le=1)

    @model_validator(mode="before")
    @classmethod
    def _grader_means_custom(cls, values: Any) -> Any:
        # Naming a grader is choosing it: `task.name` may be left out (or be `custom`).
        if isinstance(values, dict) and values.get("grader") and "name" not in values:
            return {**values, "name": "custom"}
        return values

    @model_validator(mode="after")
    def _grader_iff_custom(self) -> "TaskConfig":
        if self.name == "custom" and not self.grader:
            raise ValueError("'task.name' custom needs 'task.grader' (package.module:attr of your grader)")
        if self.name != "custom" and self.grader:
            raise ValueError(f"'task.grader' is used only with 'task.name: custom' (got '{self.name}', a built-in "
                             "task); drop one of them")
        return self


class VpcSettings(Section):
    """``pipeline.vpc``: the subnets and security groups of every job and training session (botocore's limits)."""

    subnets: list[Annotated[str, StringConstraints(pattern=r"^subnet-[0-9a-z]{1,25}$")]] = Field(
        min_length=1, max_length=16)
    security_group_ids: list[Annotated[str, StringConstraints(pattern=r"^sg-[0-9a-z]{1,28}$")]] = Field(
        min_length=1, max_length=5)


_KMS_KEY_ARN = r"^arn:aws[a-z-]*:kms:[a-z0-9-]+:[0-9]{12}:key/(mrk-)?[a-f0-9-]+$"
_KMS_RULE = _rule("must be a KMS key ARN (arn:aws:kms:<region>:<account>:key/<key id>): the training session "
                  "takes no alias")
_S3_URI = r"^s3://[^/\s]+(/\S*)?$"
_S3_RULE = _rule("must be an s3://bucket/prefix URI")
_INSTANCE_RULE = _rule("must be a SageMaker instance type such as ml.m5.large")


class PipelineConfig(Section):
    """Deployment settings, read by pipeline/ only; config/default.yaml documents each one."""

    role_arn: str = Field(pattern=r"^arn:aws[a-z-]*:iam::[^:\s]+:role/\S+$",
                          json_schema_extra=_rule("must be an IAM role ARN (arn:aws:iam::<account>:role/<name>)"))
    image_uri: str = Field(pattern=r"\S", json_schema_extra=_rule("must name the step image (see 'make push-image')"))
    train_s3_uri: str = Field(pattern=_S3_URI, json_schema_extra=_S3_RULE)
    eval_s3_uri: str = Field(pattern=_S3_URI, json_schema_extra=_S3_RULE)
    output_s3_uri: str = Field(pattern=_S3_URI, json_schema_extra=_S3_RULE)
    # The base model's tokenizer files (tokenizer.json, tokenizer_config.json, ...) for jobs that
    # cannot download them (no internet egress): a `tokenizer` channel of TrainDAPO and an input of
    # ValidateData and EvaluateModel. Null: each step downloads the tokenizer the Hub names.
    tokenizer_s3_uri: str | None = Field(None, pattern=_S3_URI, json_schema_extra=_S3_RULE)
    name: str = Field("dapo-gsm8k", pattern=r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,255}$",
                      json_schema_extra=_rule("must be letters, digits and single hyphens, at most 256 characters"))
    description: str = "DAPO RL fine-tuning on GSM8K with SageMaker training sessions"
    processing_instance_type: str = Field("ml.m5.large", pattern=r"^ml\.", json_schema_extra=_INSTANCE_RULE)
    training_instance_type: str = Field("ml.m5.xlarge", pattern=r"^ml\.", json_schema_extra=_INSTANCE_RULE)
    accuracy_threshold: float = Field(0.5, ge=0, le=1)
    # The gate's paired test: approve only when the 95% lower bound of (trained - base) accuracy is at least
    # this. 0: the adapter is shown better than its base model (one-sided, 2.5%); 0.02: at least 2 points better.
    min_improvement: float = Field(0.0, ge=-1, le=1)
    # ApproveModel and RecordRejection set the package's approval status to the gate's verdict; false: they record
    # the verdict on the package and leave its status (a re-evaluation's default: make reevaluate UPDATE_APPROVAL=1).
    update_approval: bool = True
    max_runtime_seconds: int = Field(86400, ge=1, le=MAX_TRAINING_RUNTIME,
                                     json_schema_extra={"why": "SageMaker's limit"})
    processing_max_runtime_seconds: int = Field(7200, ge=1, le=MAX_PROCESSING_RUNTIME,
                                                json_schema_extra={"why": "SageMaker's limit"})
    tags: dict[str, str] = Field(default_factory=dict,
                                 json_schema_extra=_rule("must be a mapping of tag key to value"))
    # MLflow tracking (off when unset): the tracking server the steps log to, and the experiment.
    mlflow_tracking_arn: str | None = Field(
        None, pattern=r"^arn:aws[a-z-]*:sagemaker:[a-z0-9-]+:[0-9]{12}:mlflow-tracking-server/\S+$",
        json_schema_extra=_rule("must be a SageMaker MLflow tracking server ARN "
                                "(arn:aws:sagemaker:<region>:<account>:mlflow-tracking-server/<name>)"))
    mlflow_experiment: str | None = Field(
        None, pattern=r"^[a-zA-Z0-9\-_./]{1,256}$",
        json_schema_extra=_rule("must be 1-256 letters, digits and -_./ (MLflow's experiment names on SageMaker)"))
    # Network and encryption (off when unset): every job and training session in these subnets and
    # security groups; the key of what they write to S3; the key of the jobs' storage volumes.
    vpc: VpcSettings | None = Field(None, json_schema_extra=_rule(
        "must be {subnets: [subnet-...], security_group_ids: [sg-...]}: 1-16 subnets and 1-5 security groups"))
    kms_key_arn: str | None = Field(None, pattern=_KMS_KEY_ARN, json_schema_extra=_KMS_RULE)
    volume_kms_key_arn: str | None = Field(None, pattern=_KMS_KEY_ARN, json_schema_extra=_KMS_RULE)

    @field_validator("tags", mode="before")
    @classmethod
    def _tag_values_are_text(cls, tags: Any) -> Any:
        # YAML reads `cost: 7` as a number; a tag value is text. Nested values are refused.
        if isinstance(tags, dict) and all(isinstance(v, (str, int, float)) for v in tags.values()):
            return {k: str(v) for k, v in tags.items()}
        return tags

    @field_validator("train_s3_uri", "eval_s3_uri", "tokenizer_s3_uri")
    @classmethod
    def _prefix_ends_with_slash(cls, uri: str | None) -> str | None:
        # An S3Prefix input of s3://b/data/train would also pull in s3://b/data/train-old/...
        return uri if uri is None or uri.endswith("/") or uri.endswith(".jsonl") else uri + "/"

    @property
    def default_bucket(self) -> str:
        """The bucket of ``output_s3_uri``; handed to the SDK so it never looks one up."""
        return self.output_s3_uri[len("s3://"):].split("/", 1)[0]

    @property
    def output_prefix(self) -> str:
        return self.output_s3_uri.rstrip("/")

    @property
    def experiment_name(self) -> str:
        """The MLflow experiment of an execution not started with another: the configured one or the pipeline's name."""
        return self.mlflow_experiment or self.name


SECTIONS: dict[str, type[Section]] = {"session": SessionConfig, "dapo": DapoConfig, "task": TaskConfig,
                                      "pipeline": PipelineConfig}


def type_name(annotation: Any) -> str:
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")
