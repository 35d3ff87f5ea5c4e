"""Settings of the local service that are set three ways, all validated the same.

The fault injection (``faults.Faults``) and the cost model (``costs.Costs``) are
frozen dataclasses of settings, each settable as flags of ``python -m
local.training_session``, as ``LOCAL_TS_*`` environment variables, and through
``POST /_admin/<faults|costs>``. :class:`Settings` is what they share: building
from a JSON-like mapping or the environment, with errors that name the setting,
the command-line flags from each class's ``SETTINGS`` table, and back to a dict.
"""
from __future__ import annotations

import dataclasses
import os
import types
import typing
from typing import Any, ClassVar, Mapping, TypeVar

S = TypeVar("S", bound="Settings")
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


class Settings:
    """Mixin of a frozen dataclass of settings. Subclasses name their ``KIND`` (for messages) and ``SETTINGS``."""

    KIND: ClassVar[str]
    SETTINGS: ClassVar[Mapping[str, tuple[str, str, str]]]  # field -> (environment variable, flag, help)

    @classmethod
    def add_flags(cls, group: Any) -> None:
        """One flag per ``SETTINGS`` entry on an argparse group; a bool is a switch. Unset flags stay None, so the
        environment's value (or the default) holds."""
        hints = typing.get_type_hints(cls)
        for name, (_, flag, help_text) in cls.SETTINGS.items():
            kind = _base(hints[name])
            if kind is bool:
                group.add_argument(flag, dest=name, action="store_const", const=True, help=help_text)
            else:
                group.add_argument(flag, dest=name, type=kind, help=help_text)

    @classmethod
    def from_mapping(cls: type[S], values: Mapping[str, Any]) -> S:
        """Build from a JSON-like mapping; unknown keys are an error naming them."""
        known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown {cls.KIND} setting(s) {unknown}; known: {sorted(known)}")
        return cls(**dict(values))

    @classmethod
    def from_env(cls: type[S], environ: Mapping[str, str] = os.environ) -> S:
        """Read each setting's environment variable; unset variables keep the defaults."""
        hints = typing.get_type_hints(cls)
        values: dict[str, Any] = {}
        for name, (var, _, _) in cls.SETTINGS.items():
            raw = environ.get(var, "").strip()
            if raw:
                values[name] = _parse(hints[name], name, var, raw)
        return cls(**values)

    @classmethod
    def overridden(cls: type[S], base: S, overrides: Mapping[str, Any]) -> S:
        """``base`` with the values of ``overrides`` that are not None (e.g. the CLI flags given)."""
        return cls(**{**dataclasses.asdict(base), **{k: v for k, v in overrides.items() if v is not None}})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]


def require(kind: str, ok: bool, name: str, value: Any, expected: str) -> None:
    if not ok:
        raise ValueError(f"{kind} setting {name}={value!r} is invalid: expected {expected}")


def _base(hint: Any) -> Any:
    """X of ``X | None``; the hint itself otherwise."""
    return next((t for t in typing.get_args(hint) if t is not type(None)), hint)


def _parse(hint: Any, name: str, var: str, raw: str) -> Any:
    kind = _base(hint)
    if isinstance(hint, types.UnionType) and raw.lower() in ("none", "null"):
        return None
    if kind is bool:
        if raw.lower() in _TRUE + _FALSE:
            return raw.lower() in _TRUE
        raise ValueError(f"{var}={raw!r} is not a bool (use one of {', '.join(_TRUE + _FALSE)}); "
                         f"unset it or give a valid value for {name}")
    try:
        return kind(raw)
    except ValueError:
        raise ValueError(f"{var}={raw!r} is not a {kind.__name__}; "
                         f"unset it or give a valid value for {name}") from None
