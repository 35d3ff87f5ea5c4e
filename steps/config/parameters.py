"""The pipeline parameters: one table for the definition's Parameters, their routing to config keys,
the checks of ``make start-pipeline`` and the README's table.

Each parameter's default is the value of one config key; for ``session``, ``dapo`` and ``task`` keys the
execution's value also overrides that key in the training job's hyperparameters.

This table is the one place where a concept's name changes: the pipeline parameter's name
(``BatchSize``, SageMaker's CamelCase) maps to its config key (``dapo.batch_size``), and from there
to the loop every file calls it by the key's field name (``batch_size``; ``--batch-size`` on a command line).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from steps.config.load import RunConfig


@dataclass(frozen=True)
class Parameter:
    name: str
    key: str  # "section.field" whose value is the default
    kind: Literal["String", "Integer", "Float", "Boolean"]  # a bool config key's is Boolean (an on/off switch)
    meaning: str

    @property
    def section(self) -> str:
        return self.key.split(".", 1)[0]

    @property
    def field(self) -> str:
        return self.key.split(".", 1)[1]

    def default(self, run: RunConfig) -> Any:
        return getattr(getattr(run, self.section), self.field)


PARAMETERS = (
    Parameter("TrainDataS3Uri", "pipeline.train_s3_uri", "String",
              "S3 prefix of the train split (JSONL, JSON, CSV or parquet files)"),
    Parameter("EvalDataS3Uri", "pipeline.eval_s3_uri", "String", "S3 prefix of the held-out split (the same formats)"),
    Parameter("BaseModel", "session.base_model", "String", "Hub model ARN to fine-tune"),
    Parameter("Task", "task.name", "String",
              "the task: gsm8k, hash, boxed, answer_is, choice, number (built-in answer formats) or custom "
              "(task.grader)"),
    Parameter("MaxDroppedShare", "task.max_dropped_share", "Float",
              "ValidateData refuses a split that loses more than this share of its rows (1: any)"),
    Parameter("BatchSize", "dapo.batch_size", "Integer", "informative groups per optimizer step"),
    Parameter("GroupSize", "dapo.group_size", "Integer", "completions per prompt"),
    Parameter("MaxSteps", "dapo.max_steps", "Integer", "optimizer steps"),
    Parameter("LearningRate", "dapo.learning_rate", "Float", "Adam rate, in (0, 0.01] (the API's range)"),
    Parameter("MaxNumGenBatches", "dapo.max_num_gen_batches", "Integer", "generation batches one step may draw"),
    Parameter("SelectiveRollouts", "dapo.selective_rollouts", "Boolean",
              "true: skip prompts whose recent groups were all-equal before sampling (GRESO); false: off"),
    Parameter("ClipLowThreshold", "dapo.clip_low_threshold", "Float", "PPO ratio lower bound (DAPO: 0.8)"),
    Parameter("ClipHighThreshold", "dapo.clip_high_threshold", "Float", "PPO ratio upper bound (DAPO: 1.28)"),
    Parameter("EvalSize", "dapo.eval_size", "Integer", "held-out questions evaluated (0: all)"),
    Parameter("AccuracyThreshold", "pipeline.accuracy_threshold", "Float",
              "approve only at or above this greedy accuracy"),
    Parameter("MinImprovement", "pipeline.min_improvement", "Float",
              "approve only when the 95% lower bound of trained minus base accuracy is at least this"),
    Parameter("UpdateApproval", "pipeline.update_approval", "Boolean",
              "true: the gate's verdict sets the model package's approval status; false: recorded on the package, "
              "the status left as it is (a re-evaluation's default)"),
    Parameter("ProcessingInstanceType", "pipeline.processing_instance_type", "String",
              "instance of the processing steps"),
    Parameter("TrainingInstanceType", "pipeline.training_instance_type", "String",
              "instance of TrainDAPO's job (a small CPU one: the GPUs belong to the training session)"),
    Parameter("ImageUri", "pipeline.image_uri", "String", "the step image"),
)
BY_NAME = {p.name: p for p in PARAMETERS}
#: Parameters that override a training-job hyperparameter: name -> flat config key.
HYPERPARAMETERS = {p.name: p.field for p in PARAMETERS if p.section in ("session", "dapo", "task")}


def overridden(raw: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """The raw config with each parameter's value put in place of its key's (values already typed)."""
    out = {k: dict(v or {}) if isinstance(v, dict) else v for k, v in raw.items()}
    for name, value in values.items():
        p = BY_NAME[name]
        out.setdefault(p.section, {})[p.field] = value
    return out


def markdown_table() -> str:
    """The README's parameter table."""
    rows = ["| parameter | type | default (config key) | meaning |", "|---|---|---|---|"]
    rows += [f"| `{p.name}` | {p.kind} | `{p.key}` | {p.meaning} |" for p in PARAMETERS]
    return "\n".join(rows)
