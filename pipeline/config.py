"""The ``pipeline:`` section of a config file: where and how the pipeline is deployed.

The ``session:`` and ``dapo:`` sections of the same file are loaded by
:mod:`steps.config` and become the defaults of the pipeline parameters and the
training job's hyperparameters; this module only owns ``pipeline:``.
"""
from __future__ import annotations

import re
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping

from steps.config import ConfigError, RunConfig, config_from_dict, load_yaml

# SageMaker's own limits, so a bad value fails here and not at CreatePipeline.
MAX_TRAINING_RUNTIME = 28 * 24 * 3600
MAX_PROCESSING_RUNTIME = 7 * 24 * 3600
_PIPELINE_NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,255}$")
_ROLE_ARN = re.compile(r"^arn:aws[a-z-]*:iam::[^:\s]+:role/\S+$")
# Values such as "<ACCOUNT_ID>" in config.yaml.example that the user must fill in.
PLACEHOLDER = re.compile(r"<[A-Z][A-Z0-9_]*>")

# Pipeline parameter -> the flat steps.config key it overrides in the training job.
PARAMETER_KEYS = {
    "BaseModel": "base_model",
    "BatchSize": "batch_size",
    "GroupSize": "group_size",
    "MaxSteps": "max_steps",
    "LearningRate": "learning_rate",
    "MaxNumGenBatches": "max_num_gen_batches",
    "ClipLowThreshold": "clip_low_threshold",
    "ClipHighThreshold": "clip_high_threshold",
    "EvalSize": "eval_size",
}


def _s3(v: Any) -> bool:
    return isinstance(v, str) and re.match(r"^s3://[^/\s]+(/\S*)?$", v) is not None


def _rule(check, rule: str) -> dict[str, Any]:
    return {"check": check, "rule": rule}


_S3_RULE = _rule(_s3, "must be an s3://bucket/prefix URI")
_INSTANCE_RULE = _rule(lambda v: v.startswith("ml."), "must be a SageMaker instance type such as ml.m5.large")


@dataclass(frozen=True)
class PipelineConfig:
    """Deployment settings; every field is documented in config/default.yaml."""

    role_arn: str = field(metadata=_rule(
        lambda v: bool(_ROLE_ARN.match(v)), "must be an IAM role ARN (arn:aws:iam::<account>:role/<name>)"))
    image_uri: str = field(metadata=_rule(lambda v: bool(v.strip()), "must name the step image (see 'make push-image')"))
    train_s3_uri: str = field(metadata=_S3_RULE)
    eval_s3_uri: str = field(metadata=_S3_RULE)
    output_s3_uri: str = field(metadata=_S3_RULE)
    name: str = field(default="dapo-gsm8k", metadata=_rule(
        lambda v: bool(_PIPELINE_NAME.match(v)), "must be letters, digits and single hyphens, at most 256 characters"))
    description: str = "DAPO RL fine-tuning on GSM8K with SageMaker training sessions"
    processing_instance_type: str = field(default="ml.m5.large", metadata=_INSTANCE_RULE)
    training_instance_type: str = field(default="ml.m5.xlarge", metadata=_INSTANCE_RULE)
    accuracy_threshold: float = field(default=0.5, metadata=_rule(lambda v: 0 <= v <= 1, "must be in [0, 1]"))
    max_runtime_seconds: int = field(default=86400, metadata=_rule(
        lambda v: 1 <= v <= MAX_TRAINING_RUNTIME, f"must be in [1, {MAX_TRAINING_RUNTIME}] (SageMaker's limit)"))
    processing_max_runtime_seconds: int = field(default=7200, metadata=_rule(
        lambda v: 1 <= v <= MAX_PROCESSING_RUNTIME, f"must be in [1, {MAX_PROCESSING_RUNTIME}] (SageMaker's limit)"))
    # A tuple of pairs keeps the dataclass frozen and hashable; YAML gives a mapping.
    tags: tuple[tuple[str, str], ...] = ()

    @property
    def default_bucket(self) -> str:
        """The bucket of ``output_s3_uri``; handed to the SDK so it never looks one up."""
        return self.output_s3_uri[len("s3://"):].split("/", 1)[0]

    @property
    def output_prefix(self) -> str:
        return self.output_s3_uri.rstrip("/")


def _type_ok(value: Any, annotation: str) -> bool:
    if annotation == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, str)


def _tags(value: Any, source: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{source}: 'pipeline.tags' must be a mapping of tag key to value, got {value!r}")
    for k, v in value.items():
        if not isinstance(k, str) or isinstance(v, (Mapping, list)) or v is None:
            raise ConfigError(f"{source}: 'pipeline.tags.{k}' must be a plain key: value pair, got {v!r}")
    return tuple((k, str(v)) for k, v in value.items())


def pipeline_config_from_dict(raw: Mapping[str, Any] | None, source: str = "<dict>") -> PipelineConfig:
    """Validate the ``pipeline:`` section; errors name the file and the key."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{source}: a 'pipeline:' section is required (see config/config.yaml.example)")
    known = {f.name: f for f in fields(PipelineConfig)}
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in known:
            raise ConfigError(f"{source}: unknown key 'pipeline.{key}' (known keys: {', '.join(known)})")
        if key == "tags":
            values[key] = _tags(value, source)
            continue
        f = known[key]
        if not _type_ok(value, str(f.type)):
            raise ConfigError(f"{source}: 'pipeline.{key}' must be of type {f.type}, got {value!r}")
        check = f.metadata.get("check")
        if check is not None and not check(value):
            raise ConfigError(f"{source}: 'pipeline.{key}' {f.metadata['rule']}, got {value!r}")
        values[key] = float(value) if str(f.type) == "float" else value
    missing = [n for n, f in known.items() if f.default is MISSING and n not in values]
    if missing:
        raise ConfigError(f"{source}: 'pipeline.{missing[0]}' is required (see config/config.yaml.example)")
    return PipelineConfig(**values)


def load(path: str | Path) -> tuple[PipelineConfig, RunConfig]:
    """Read one config file: its ``pipeline:`` section and its ``session:``/``dapo:`` sections."""
    if not Path(path).exists():
        raise ConfigError(f"{path}: no such config file; copy config/config.yaml.example there and fill it in")
    raw = load_yaml(path)
    run = config_from_dict(raw, source=str(path))
    cfg = pipeline_config_from_dict(raw.get("pipeline"), source=str(path))
    if run.dapo.max_steps is None:
        # MaxSteps is an integer pipeline parameter; it cannot default to null.
        raise ConfigError(f"{path}: the pipeline needs 'dapo.max_steps' (its MaxSteps parameter cannot be null)")
    return cfg, run


def find_placeholders(cfg: PipelineConfig, run: RunConfig) -> list[str]:
    """Settings still holding a ``<PLACEHOLDER>`` from the example file, as 'section.key'."""
    found = []
    for section, obj in (("pipeline", cfg), ("session", run.session)):
        for f in fields(obj):
            value = getattr(obj, f.name)
            if isinstance(value, str) and PLACEHOLDER.search(value):
                found.append(f"{section}.{f.name}")
    return found
