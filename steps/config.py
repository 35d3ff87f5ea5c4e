"""Run configuration: YAML in, frozen dataclasses out, every error naming its key.

A config file has up to three sections::

    session:   # where the training session runs (SessionConfig)
    dapo:      # the algorithm (DapoConfig)
    pipeline:  # deployment settings, read by pipeline/ only

SageMaker hands hyperparameters to the training job as a flat string map, so
:func:`apply_overrides` takes flat ``key=value`` pairs and routes each to the one
section that owns the field (field names are unique across sections).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Mapping

import yaml

LOSS_FNS = ("ppo", "importance_sampling", "cispo")
LOSS_AGGREGATIONS = ("token", "sequence")
# The sampling API's botocore model rejects maxTokens below this.
MIN_MAX_TOKENS = 512


class ConfigError(ValueError):
    """A config problem; the message names the file and the key."""


def _check(pred: Callable[[Any], bool], rule: str) -> dict[str, Any]:
    return {"check": pred, "rule": rule}


def _positive(v: Any) -> bool:
    return v > 0


@dataclass(frozen=True)
class SessionConfig:
    """Which model to train and where the training session keeps its artifacts."""

    base_model: str = "arn:aws:sagemaker:us-west-2:aws:hub-content/SageMakerPublicHub/Model/local-toy-arith/1.0.0"
    # "toy" uses the local service's tokenizer; anything else is a Hugging Face
    # id or a local directory loaded with transformers.AutoTokenizer.
    tokenizer: str = "toy"
    lora_rank: int = field(default=32, metadata=_check(_positive, "must be >= 1"))
    lora_alpha: int = field(default=64, metadata=_check(_positive, "must be >= 1"))
    region: str | None = None
    role_arn: str | None = None
    model_package_group_arn: str | None = None
    s3_output_path: str | None = None


@dataclass(frozen=True)
class DapoConfig:
    """DAPO hyperparameters (SPEC section 4)."""

    learning_rate: float = field(default=1e-5, metadata=_check(lambda v: 0 < v <= 0.01, "must be in (0, 0.01] (the training-session API's range)"))
    adam_beta1: float = field(default=0.9, metadata=_check(lambda v: 0 <= v <= 0.999999, "must be in [0, 0.999999]"))
    adam_beta2: float = field(default=0.95, metadata=_check(lambda v: 0 <= v <= 0.999999, "must be in [0, 0.999999]"))
    adam_eps: float = field(default=1e-8, metadata=_check(lambda v: 1e-16 <= v <= 0.01, "must be in [1e-16, 0.01]"))
    weight_decay: float = field(default=0.0, metadata=_check(lambda v: 0 <= v <= 1, "must be in [0, 1]"))
    grad_clip_norm: float | None = field(default=None, metadata=_check(lambda v: 0 < v <= 100, "must be in (0, 100] or null"))
    batch_size: int = field(default=32, metadata=_check(_positive, "must be >= 1"))
    group_size: int = field(default=8, metadata=_check(lambda v: v >= 2, "must be >= 2 (a group of one has no advantage)"))
    max_steps: int | None = field(default=100, metadata=_check(_positive, "must be >= 1 or null"))
    epochs: float | None = field(default=None, metadata=_check(_positive, "must be > 0 or null"))
    max_tokens: int = field(
        default=1024,
        metadata=_check(lambda v: v >= MIN_MAX_TOKENS, f"must be >= {MIN_MAX_TOKENS} (the sampling API's minimum)"),
    )
    temperature: float = field(default=1.0, metadata=_check(lambda v: 0 <= v <= 2, "must be in [0, 2]"))
    loss_fn: str = field(default="ppo", metadata=_check(lambda v: v in LOSS_FNS, f"must be one of {', '.join(LOSS_FNS)}"))
    clip_low_threshold: float = field(default=0.8, metadata=_check(lambda v: 0 < v <= 1, "must be in (0, 1] (a ratio bound, not an epsilon)"))
    clip_high_threshold: float = field(default=1.28, metadata=_check(lambda v: 1 <= v <= 10, "must be in [1, 10] (a ratio bound, not an epsilon)"))
    max_num_gen_batches: int = field(default=10, metadata=_check(_positive, "must be >= 1"))
    # How many generation batches may be in flight at once when the observed
    # keep rate says one more will not fill the batch (1 = no speculation).
    max_inflight_gen_batches: int = field(default=2, metadata=_check(_positive, "must be >= 1"))
    overlong_filtering: bool = True
    overlong_buffer: int = field(default=0, metadata=_check(lambda v: v >= 0, "must be >= 0"))
    overlong_penalty: float = field(default=1.0, metadata=_check(lambda v: v >= 0, "must be >= 0"))
    advantage_std_scaling: bool = False
    loss_aggregation: str = field(
        default="token", metadata=_check(lambda v: v in LOSS_AGGREGATIONS, f"must be one of {', '.join(LOSS_AGGREGATIONS)}")
    )
    sample_retries: int = field(default=2, metadata=_check(lambda v: v >= 0, "must be >= 0"))
    save_every: int = field(default=10, metadata=_check(_positive, "must be >= 1"))
    eval_every: int = field(default=0, metadata=_check(lambda v: v >= 0, "must be >= 0 (0 = only at the end)"))
    eval_size: int = field(default=200, metadata=_check(_positive, "must be >= 1"))
    # Seeds the data order and, hashed, every sampling request (the API's seed is a 32-bit Integer).
    seed: int = field(default=0, metadata=_check(lambda v: 0 <= v <= 2**31 - 1, "must be in [0, 2147483647]"))


@dataclass(frozen=True)
class RunConfig:
    session: SessionConfig
    dapo: DapoConfig
    source: str = "<defaults>"


SECTIONS: dict[str, type] = {"session": SessionConfig, "dapo": DapoConfig}
_OTHER_SECTIONS = ("pipeline",)


def _type_ok(value: Any, annotation: str) -> bool:
    if value is None:
        return "None" in annotation
    if "bool" in annotation:
        return isinstance(value, bool)
    if "int" in annotation:
        return isinstance(value, int) and not isinstance(value, bool)
    if "float" in annotation:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if "str" in annotation:
        return isinstance(value, str)
    return True


def _float_or_same(text: str) -> float | str:
    # YAML 1.1 reads "1e-5" as a string (it wants "1.0e-5"); users write both.
    try:
        return float(text)
    except ValueError:
        return text


def _build(cls: type, section: str, values: Mapping[str, Any], source: str) -> Any:
    known = {f.name: f for f in fields(cls)}
    for key in values:
        if key not in known:
            raise ConfigError(f"{source}: unknown key '{section}.{key}' (known keys: {', '.join(known)})")
    values = dict(values)
    for key, value in list(values.items()):
        f = known[key]
        if isinstance(value, str) and "float" in str(f.type):
            value = values[key] = _float_or_same(value)
        if not _type_ok(value, str(f.type)):
            raise ConfigError(f"{source}: '{section}.{key}' must be of type {f.type}, got {value!r}")
        if isinstance(value, int) and not isinstance(value, bool) and "float" in str(f.type):
            values = {**values, key: float(value)}
        check = f.metadata.get("check")
        if check is not None and value is not None and not check(value):
            raise ConfigError(f"{source}: '{section}.{key}' {f.metadata['rule']}, got {value!r}")
    return cls(**values)


def _cross_checks(cfg: RunConfig) -> None:
    d, src = cfg.dapo, cfg.source
    if d.max_steps is None and d.epochs is None:
        raise ConfigError(f"{src}: set 'dapo.max_steps' or 'dapo.epochs' (both are null)")
    if d.overlong_buffer >= d.max_tokens:
        raise ConfigError(f"{src}: 'dapo.overlong_buffer' ({d.overlong_buffer}) must be smaller than 'dapo.max_tokens' ({d.max_tokens})")


def config_from_dict(raw: Mapping[str, Any] | None, source: str = "<dict>") -> RunConfig:
    raw = raw or {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{source}: the top level must be a mapping with sections {', '.join(SECTIONS)}")
    for section in raw:
        if section not in SECTIONS and section not in _OTHER_SECTIONS:
            raise ConfigError(f"{source}: unknown section '{section}' (known: {', '.join([*SECTIONS, *_OTHER_SECTIONS])})")
    parts = {}
    for name, cls in SECTIONS.items():
        values = raw.get(name) or {}
        if not isinstance(values, Mapping):
            raise ConfigError(f"{source}: section '{name}' must be a mapping")
        parts[name] = _build(cls, name, dict(values), source)
    cfg = RunConfig(session=parts["session"], dapo=parts["dapo"], source=source)
    _cross_checks(cfg)
    return cfg


def load_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read config ({exc.strerror})") from None
    try:
        return yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML ({exc})") from None


def load_config(path: str | Path, overrides: Mapping[str, Any] | None = None) -> RunConfig:
    """Load and validate a config file, then apply flat overrides (hyperparameters)."""
    raw = load_yaml(path)
    if overrides:
        raw = apply_overrides(raw, overrides, source=f"{path} + overrides")
    return config_from_dict(raw, source=str(path))


def _parse_scalar(text: str) -> Any:
    # Hyperparameters arrive as strings; YAML's scalar rules give ints, floats,
    # bools and null the way a user would write them in the file.
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def apply_overrides(raw: Mapping[str, Any], overrides: Mapping[str, Any], source: str) -> dict[str, Any]:
    """Route flat ``key -> value`` overrides into their sections."""
    owner = {f.name: name for name, cls in SECTIONS.items() for f in fields(cls)}
    types = {f.name: str(f.type) for cls in SECTIONS.values() for f in fields(cls)}
    out = {k: dict(v or {}) if isinstance(v, Mapping) else v for k, v in (raw or {}).items()}
    for key, value in overrides.items():
        section, _, name = key.rpartition(".")
        name = name if section else key
        if name not in owner or (section and owner[name] != section):
            raise ConfigError(f"{source}: unknown setting '{key}' (known: {', '.join(sorted(owner))})")
        parsed = _parse_scalar(value) if isinstance(value, str) else value
        if types[name].startswith("str") and isinstance(value, str) and not isinstance(parsed, str) and parsed is not None:
            parsed = value  # a string setting stays the string it was given ("123" is not 123)
        out.setdefault(owner[name], {})[name] = parsed
    return out


def to_dict(cfg: RunConfig) -> dict[str, Any]:
    return {"session": dataclasses.asdict(cfg.session), "dapo": dataclasses.asdict(cfg.dapo)}
