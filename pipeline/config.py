"""Loading a deployable config: the ``pipeline:`` section is required, and placeholders are found.

The models of all three sections live in :mod:`steps.config` (one mechanism); the step image
reads the same file for its ``session:`` and ``dapo:`` sections.
"""
from __future__ import annotations

import re
from pathlib import Path

from steps.config import ConfigError, PipelineConfig, RunConfig, load_config

# Values such as "<ACCOUNT_ID>" in config.yaml.example that the user must fill in.
PLACEHOLDER = re.compile(r"<[A-Z][A-Z0-9_]*>")


def load(path: str | Path) -> tuple[PipelineConfig, RunConfig]:
    """Read one config file: its ``pipeline:`` section and the whole run config."""
    if not Path(path).exists():
        raise ConfigError(f"{path}: no such config file; copy config/config.yaml.example there and fill it in")
    run = load_config(path)
    if run.pipeline is None:
        raise ConfigError(f"{path}: a 'pipeline:' section is required (see config/config.yaml.example)")
    if run.dapo.max_steps is None:
        # MaxSteps is an integer pipeline parameter; it cannot default to null.
        raise ConfigError(f"{path}: the pipeline needs 'dapo.max_steps' (its MaxSteps parameter cannot be null)")
    return run.pipeline, run


def find_placeholders(run: RunConfig) -> list[str]:
    """Settings still holding a ``<PLACEHOLDER>`` from the example file, as 'section.key'."""
    found = []
    for section in ("pipeline", "session"):
        model = getattr(run, section)
        for name, value in (model.model_dump() if model is not None else {}).items():
            if isinstance(value, str) and PLACEHOLDER.search(value):
                found.append(f"{section}.{name}")
    return found
