"""Reading a config file into :class:`RunConfig`, and turning pydantic's errors into one line per problem."""
from __future__ import annotations

import difflib
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, get_args

import yaml
from annotated_types import Ge, Gt, Le, Lt
from pydantic import ValidationError
from pydantic.fields import FieldInfo

from steps.cli import Refused
from steps.config.models import (
    SECTIONS,
    DapoConfig,
    PipelineConfig,
    Section,
    SessionConfig,
    TaskConfig,
    TaskName,
    type_name,
)

#: The sections a training job's flat hyperparameters (``batch_size=64``) set; their field names are unique.
FLAT_SECTIONS = ("session", "dapo", "task")


class ConfigError(Refused, ValueError):
    """A config problem; the message names the file and the key."""


@dataclass(frozen=True)
class RunConfig:
    session: SessionConfig
    dapo: DapoConfig
    pipeline: PipelineConfig | None = None  # only files meant for deployment have one
    source: str = "<defaults>"
    task: TaskConfig = field(default_factory=TaskConfig)  # the prompt, grader and row rules (steps/tasks/)


def _number(value: float) -> str:
    """A bound as a user types it: 2147483647 and 1e-08 stay exact (``:g`` would print 2.14748e+09)."""
    return str(value) if isinstance(value, int) else f"{value:.15g}"


def _bounds(field: FieldInfo) -> str:
    """"must be >= 1", "must be in (0, 0.01]" ... from the field's constraints."""
    low = high = None
    for m in field.metadata:
        if isinstance(m, (Ge, Gt)):
            low = ("[" if isinstance(m, Ge) else "(", getattr(m, "ge", getattr(m, "gt", None)))
        elif isinstance(m, (Le, Lt)):
            high = ("]" if isinstance(m, Le) else ")", getattr(m, "le", getattr(m, "lt", None)))
    if low and high:
        return f"must be in {low[0]}{_number(low[1])}, {_number(high[1])}{high[0]}"
    if low:
        return f"must be {'>=' if low[0] == '[' else '>'} {_number(low[1])}"
    return f"must be {'<=' if high and high[0] == ']' else '<'} {_number(high[1])}" if high else "is not valid"


def _message(section: str, error: dict[str, Any], model: type[Section], source: str) -> str:
    loc = [str(p) for p in error["loc"]]
    name = loc[0] if loc else ""
    key = f"'{section}.{'.'.join(loc)}'"
    field = model.model_fields.get(name)
    extra = (field.json_schema_extra or {}) if field is not None else {}
    value = error.get("input")
    kind = error["type"]
    if kind == "extra_forbidden":
        return unknown(f"{source}: unknown key", f"{section}.{'.'.join(loc)}",
                       [f"{section}.{n}" for n in model.model_fields], f"the keys of '{section}'",
                       shown=list(model.model_fields))
    if kind == "missing":
        return f"{source}: {key} is required (see config/config.yaml.example)"
    if field is None:  # a cross-field rule (model_validator): its own message names the keys
        return f"{source}: {error['msg'].removeprefix('Value error, ')}"
    if kind.endswith(("_type", "_parsing")) and kind != "dict_type":
        rule = f"must be of type {type_name(field.annotation)}"
    elif "rule" in extra:
        rule = extra["rule"]
    elif kind == "literal_error":
        allowed = [str(a) for a in field.annotation.__args__]
        close = difflib.get_close_matches(str(value), allowed, n=1, cutoff=0.6)
        guess = f"; did you mean '{close[0]}'?" if close else ""
        return f"{source}: {key} must be one of {', '.join(allowed)}, got {value!r}{guess}"
    elif kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        rule = _bounds(field) + (f" ({extra['why']})" if "why" in extra else "")
    else:
        rule = f"must be of type {type_name(field.annotation)}"
    return f"{source}: {key} {rule}, got {value!r}"


def unknown(what: str, name: str, known: Iterable[str], listed: str, shown: Iterable[str] | None = None) -> str:
    """``"<what> 'dapo.batch_sise'; did you mean 'dapo.batch_size'?"`` (difflib's closest of ``known``), in a
    line well under 200 characters, then every one of ``shown`` (default ``known``) wrapped on the lines after."""
    known = list(known)
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6) or \
        difflib.get_close_matches(name.lower(), [k.lower() for k in known], n=1, cutoff=0.6)
    match = next((k for k in known if close and k.lower() == close[0].lower()), None)
    first = f"{what} '{name}'" + (f"; did you mean '{match}'?" if match else "")
    everything = textwrap.wrap(f"{listed}: {', '.join(shown if shown is not None else known)}", width=96,
                               initial_indent="  ", subsequent_indent="    ", break_long_words=False,
                               break_on_hyphens=False)
    return "\n".join([first, *everything])


def task_name_problem(name: str, typed: str) -> str | None:
    """What is wrong with the task ``name`` the user gave as ``typed`` (``TASK=gms8k``, ``--task gms8k``, the
    ``Task`` parameter), with the closest of the tasks; None for a task there is."""
    names = [str(n) for n in get_args(TaskName)]
    if name in names:
        return None
    close = difflib.get_close_matches(name.lower(), names, n=1, cutoff=0.6)
    built_in = ", ".join(n for n in names if n != "custom")
    return (f"{typed}: there is no task '{name}'" + (f"; did you mean '{close[0]}'?" if close else "")
            + f"\n  the built-in tasks: {built_in}; custom: your own grader (task.grader in the config)")


def _build(model: type[Section], section: str, values: Any, source: str) -> Section:
    if not isinstance(values, Mapping):
        raise ConfigError(f"{source}: section '{section}' must be a mapping")
    for name, value in values.items():
        field = model.model_fields.get(name)
        # pydantic would read True as 1; a bool is never meant as a number.
        if field is not None and isinstance(value, bool) and field.annotation is not bool:
            raise ConfigError(f"{source}: '{section}.{name}' must be of type {type_name(field.annotation)}, "
                              f"got {value!r}")
    try:
        return model(**values)
    except ValidationError as exc:
        raise ConfigError(_message(section, exc.errors()[0], model, source)) from None


def config_from_dict(raw: Mapping[str, Any] | None, source: str = "<dict>") -> RunConfig:
    raw = raw or {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{source}: the top level must be a mapping with sections {', '.join(SECTIONS)}")
    for section in raw:
        if section not in SECTIONS:
            raise ConfigError(unknown(f"{source}: unknown section", str(section), SECTIONS, "the sections"))
    parts = {name: _build(model, name, raw.get(name) or {}, source)
             for name, model in SECTIONS.items() if name != "pipeline"}
    pipeline = raw.get("pipeline")
    if pipeline is not None:
        parts["pipeline"] = _build(PipelineConfig, "pipeline", pipeline, source)
    return RunConfig(**parts, source=source)


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
    """Route flat ``key -> value`` overrides (``batch_size`` or ``dapo.batch_size``) into their sections."""
    owner = {name: section for section in FLAT_SECTIONS for name in SECTIONS[section].model_fields}
    out = {k: dict(v or {}) if isinstance(v, Mapping) else v for k, v in (raw or {}).items()}
    for key, value in overrides.items():
        section, _, name = key.rpartition(".")
        name = name if section else key
        if name not in owner or (section and owner[name] != section):
            raise ConfigError(unknown(f"{source}: unknown setting", key,
                                      [*sorted(owner), *(f"{owner[n]}.{n}" for n in sorted(owner))],
                                      "the settings", shown=sorted(owner)))
        parsed = _parse_scalar(value) if isinstance(value, str) else value
        annotation = SECTIONS[owner[name]].model_fields[name].annotation
        if isinstance(value, str) and annotation in (str, str | None) and parsed is not None:
            parsed = value if not isinstance(parsed, str) else parsed  # "123" stays the string it was given
        out.setdefault(owner[name], {})[name] = parsed
    return out


def to_dict(cfg: RunConfig) -> dict[str, Any]:
    """The session, dapo and task sections, as written into model.json and the training job's hyperparameters."""
    return {"session": cfg.session.model_dump(), "dapo": cfg.dapo.model_dump(), "task": cfg.task.model_dump()}
