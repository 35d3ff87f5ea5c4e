"""Run configuration: one YAML file, three sections, pydantic models, errors that name the file and key.

    session:   # where the training session runs (SessionConfig)
    dapo:      # the algorithm (DapoConfig)
    task:      # the prompt, grader and row rules: a built-in answer format or your grader (TaskConfig)
    pipeline:  # deployment settings, read by pipeline/ only (PipelineConfig)

SageMaker hands hyperparameters to the training job as a flat string map, so
:func:`apply_overrides` routes flat ``key=value`` pairs to the one section that
owns the field (field names are unique across sections).
"""
from steps.config.load import (
    ConfigError,
    RunConfig,
    apply_overrides,
    config_from_dict,
    load_config,
    load_yaml,
    to_dict,
)
from steps.config.models import DapoConfig, PipelineConfig, SessionConfig, TaskConfig

__all__ = [
    "ConfigError", "DapoConfig", "PipelineConfig", "RunConfig", "SessionConfig", "TaskConfig",
    "apply_overrides", "config_from_dict", "load_config", "load_yaml", "to_dict",
]
