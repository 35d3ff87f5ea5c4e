"""Validate a value against a botocore service-model shape the way the AWS API does.

botocore's client-side validator checks required members, types and ``min``, but
skips what the service itself enforces: ``max``, ``pattern``, ``enum``, the
32/64-bit width of ``Integer``/``Long``, and ``union`` structures. This module
checks all of it, straight from the model, so offline checks refuse what AWS
would refuse.

A pattern must match the **whole** value, as the AWS API checks it (its errors
read "Member must satisfy regular expression pattern"): SageMaker refuses a job
named ``my_job`` although ``[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}`` is found in it.
botocore's JSON models carry the patterns without the ``^...$`` the API
documentation shows, and Smithy reads a pattern unanchored, so a search would let
through what the API refuses (a ``clientToken`` of ``"a b"`` would reach the session
lookup and answer 404 instead of 400).

Paths name members with dots, list items as ``[3]`` and map entries as
``['key']``. ``constraints()`` lists the declared rules reachable from a shape;
its paths write any list item as ``[*]``, any map value as ``['*']`` and the map
key itself as ``{key}``.
"""
from __future__ import annotations

import datetime
import functools
import math
import re
import sys
import unicodedata
from dataclasses import dataclass
from typing import Any, Callable

import botocore.session
from botocore.model import ListShape, MapShape, ServiceModel, Shape, StringShape, StructureShape

RULES = ("required", "type", "range", "length", "pattern", "enum", "union", "unknown")

# The wire widths of Smithy's Integer and Long: the model declares no min/max for them.
WIDTH = {"integer": (-(2**31), 2**31 - 1), "long": (-(2**63), 2**63 - 1)}
TYPE_NAMES = {"integer": "32-bit Integer", "long": "64-bit Long"}


@dataclass(frozen=True)
class Violation:
    path: str
    rule: str
    message: str


@dataclass(frozen=True)
class Constraint:
    """One declared rule reachable from a shape: where, which rule, on which shape, and its bound or pattern."""

    path: str
    rule: str
    shape: str
    detail: str


@functools.cache
def service_model(service: str) -> ServiceModel:
    return botocore.session.get_session().get_service_model(service)


def input_shape(service: str, operation: str) -> StructureShape:
    shape = service_model(service).operation_model(operation).input_shape
    if shape is None:
        raise ValueError(f"{service}:{operation} takes no input")
    return shape


# --- patterns -------------------------------------------------------------------------------------------------

# Model patterns are written for Java/ECMA regex engines. Python's ``re`` lacks \p{...}
# classes and reads a UTF-16 surrogate pair as two characters; these are the only
# constructs of the sagemaker and training-session models it cannot compile as-is.
_POSIX = {"Alnum": "a-zA-Z0-9", "Alpha": "a-zA-Z", "Digit": "0-9"}  # Java's \p{Alnum} is ASCII-only
_PROPERTY = re.compile(r"\\p\{(\w+)\}")
_SURROGATE_PAIR = re.compile(r"\\u(D[89AB][0-9A-F]{2})\\u(D[C-F][0-9A-F]{2})", re.IGNORECASE)
# `(...)${1,128}`: a quantified end anchor, which Java ignores and Python refuses.
_QUANTIFIED_END = re.compile(r"\$\{\d+(,\d*)?\}")


@functools.cache
def _category_ranges(major: str) -> str:
    """A character-class body for every code point whose Unicode category starts with ``major`` (e.g. "L")."""
    ranges, start = [], None
    for cp in range(sys.maxunicode + 2):
        inside = cp <= sys.maxunicode and unicodedata.category(chr(cp)).startswith(major)
        if inside and start is None:
            start = cp
        elif not inside and start is not None:
            ranges.append(f"\\U{start:08x}" if start == cp - 1 else f"\\U{start:08x}-\\U{cp - 1:08x}")
            start = None
    return "".join(ranges)


def _class_body(name: str) -> str:
    if name in _POSIX:
        return _POSIX[name]
    # A general category (L) or one of its subcategories (Cc: control characters, since botocore 1.44.18).
    if name[0] in "LMNPSZC" and len(name) <= 2 and (body := _category_ranges(name)):
        return body
    raise ValueError(f"unsupported regex property \\p{{{name}}}")


def _pair(match: re.Match[str]) -> str:
    high, low = int(match[1], 16), int(match[2], 16)
    return f"\\U{0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00):08x}"


def _translate(pattern: str) -> str:
    pattern = _SURROGATE_PAIR.sub(_pair, pattern)
    pattern = _QUANTIFIED_END.sub("$", pattern)
    out, pos, depth = [], 0, 0
    for m in re.finditer(r"\\.|\[|\]", pattern):  # track whether a \p{..} sits inside a [...] class
        token = m.group()
        if token == "[":
            depth += 1
        elif token == "]" and depth:
            depth -= 1
        elif token == "\\p" and (prop := _PROPERTY.match(pattern, m.start())):
            body = _class_body(prop[1])
            out.append(pattern[pos : m.start()] + (body if depth else f"[{body}]"))
            pos = prop.end()
    return "".join(out) + pattern[pos:]


@functools.cache
def compile_pattern(pattern: str) -> re.Pattern[str]:
    """A model pattern as a Python regex; use ``fullmatch``: the API matches a pattern against the whole value."""
    return re.compile(_translate(pattern))


# --- violations -----------------------------------------------------------------------------------------------


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _where(path: str) -> str:
    return path or "(request)"


def _v(path: str, rule: str, text: str) -> list[Violation]:
    return [Violation(path, rule, f"{_where(path)}: {text}")]


def _join(path: str, member: str) -> str:
    return f"{path}.{member}" if path else member


def _length(shape: Shape, path: str, value: Any, size: int, unit: str) -> list[Violation]:
    lo, hi = shape.metadata.get("min"), shape.metadata.get("max")
    if (lo is not None and size < lo) or (hi is not None and size > hi):
        bounds = f"[{lo if lo is not None else 0}, {hi if hi is not None else 'unbounded'}]"
        return _v(path, "length", f"{_short(value)} has {size} {unit}, outside the allowed {bounds} ({shape.name})")
    return []


def _range(shape: Shape, path: str, value: float) -> list[Violation]:
    if shape.type_name in WIDTH:
        lo, hi = WIDTH[shape.type_name]
        if not lo <= value <= hi:
            return _v(path, "range", f"{value} is outside the {TYPE_NAMES[shape.type_name]} range [{lo}, {hi}]")
    lo, hi = shape.metadata.get("min"), shape.metadata.get("max")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        return _v(path, "range", f"{value} is outside the allowed range [{lo}, {hi}] ({shape.name})")
    return []


def _type_error(shape: Shape, path: str, value: Any, expected: str) -> list[Violation]:
    return _v(path, "type", f"{_short(value)} is a {type(value).__name__}, expected {expected} ({shape.name})")


def _structure(shape: StructureShape, value: Any, path: str) -> list[Violation]:
    if shape.metadata.get("document"):
        return []  # a Smithy document: any JSON value
    if not isinstance(value, dict):
        return _type_error(shape, path, value, "a structure (dict)")
    found: list[Violation] = []
    for name in value:
        if name not in shape.members:
            found += _v(_join(path, name), "unknown", f"is not a member of {shape.name}")
    for name in shape.required_members:
        if value.get(name) is None:
            found += _v(_join(path, name), "required", f"is required by {shape.name} but missing")
    set_members = [name for name, member in value.items() if member is not None and name in shape.members]
    if shape.metadata.get("union") and len(set_members) != 1:
        found += _v(path, "union", f"{shape.name} is a union: set exactly one of {sorted(shape.members)}, "
                                   f"got {sorted(set_members) or 'none'}")
    for name in set_members:
        found += violations(shape.members[name], value[name], _join(path, name))
    return found


def _list(shape: ListShape, value: Any, path: str) -> list[Violation]:
    if not isinstance(value, (list, tuple)):
        return _type_error(shape, path, value, "a list")
    found = _length(shape, path, value, len(value), "items")
    for i, item in enumerate(value):
        found += violations(shape.member, item, f"{path}[{i}]")
    return found


def _map(shape: MapShape, value: Any, path: str) -> list[Violation]:
    if not isinstance(value, dict):
        return _type_error(shape, path, value, "a map (dict)")
    found = _length(shape, path, value, len(value), "entries")
    for key, item in value.items():
        entry = f"{path}[{key!r}]"
        found += [Violation(v.path, v.rule, f"{v.message} (map key)") for v in violations(shape.key, key, entry)]
        found += violations(shape.value, item, entry)
    return found


def _string(shape: StringShape, value: Any, path: str) -> list[Violation]:
    if not isinstance(value, str):
        return _type_error(shape, path, value, "a string")
    found = _length(shape, path, value, len(value), "characters")
    if shape.enum and value not in shape.enum:
        found += _v(path, "enum", f"{_short(value)} is not one of {shape.name}'s {len(shape.enum)} values "
                                  f"({', '.join(shape.enum[:8])}{', ...' if len(shape.enum) > 8 else ''})")
    pattern = shape.metadata.get("pattern")
    if pattern and not compile_pattern(pattern).fullmatch(value):
        found += _v(path, "pattern", f"{_short(value)} does not match {shape.name}'s pattern /{pattern}/")
    return found


def _integer(shape: Shape, value: Any, path: str) -> list[Violation]:
    if isinstance(value, bool) or not isinstance(value, int):
        return _type_error(shape, path, value, f"an integer ({TYPE_NAMES[shape.type_name]})")
    return _range(shape, path, value)


def _float(shape: Shape, value: Any, path: str) -> list[Violation]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return _type_error(shape, path, value, "a number")
    if not math.isfinite(value):
        return _v(path, "range", f"{value} is not a finite number ({shape.name})")
    return _range(shape, path, value)


def _boolean(shape: Shape, value: Any, path: str) -> list[Violation]:
    return [] if isinstance(value, bool) else _type_error(shape, path, value, "a boolean")


def _timestamp(shape: Shape, value: Any, path: str) -> list[Violation]:
    if isinstance(value, (datetime.datetime, int, float)) and not isinstance(value, bool):
        return []
    if isinstance(value, str):
        try:
            datetime.datetime.fromisoformat(value)
            return []
        except ValueError:
            pass
    return _type_error(shape, path, value, "a timestamp (epoch seconds or ISO-8601 string)")


def _blob(shape: Shape, value: Any, path: str) -> list[Violation]:
    if not isinstance(value, (str, bytes, bytearray)):
        return _type_error(shape, path, value, "a blob (bytes or base64 string)")
    return _length(shape, path, value, len(value), "bytes")


_CHECKS: dict[str, Callable[[Any, Any, str], list[Violation]]] = {
    "structure": _structure, "list": _list, "map": _map, "string": _string,
    "integer": _integer, "long": _integer, "float": _float, "double": _float,
    "boolean": _boolean, "timestamp": _timestamp, "blob": _blob,
}


def violations(shape: Shape, value: Any, path: str = "") -> list[Violation]:
    """Every rule of ``shape`` (and the shapes it contains) that ``value`` breaks; empty when AWS would accept it."""
    return _CHECKS[shape.type_name](shape, value, path)


# --- constraints ----------------------------------------------------------------------------------------------


def constraints(shape: Shape, path: str = "") -> list[Constraint]:
    """Every required member, type, range, length, pattern, enum and union rule reachable from ``shape``."""
    return _constraints(shape, path, ())


def _constraints(shape: Shape, path: str, seen: tuple[str, ...]) -> list[Constraint]:
    meta = shape.metadata
    if meta.get("document"):
        return []  # any JSON value: nothing to break
    found = [Constraint(path, "type", shape.name, shape.type_name)]
    if shape.type_name in ("string", "list", "map", "blob"):
        # A declared `min: 0` restricts nothing; only bounds a value can break count.
        found += [Constraint(path, "length", shape.name, f"{k}={meta[k]}") for k in ("min", "max") if meta.get(k)]
    if shape.type_name in WIDTH:  # the wire width bounds every Integer/Long; a declared bound narrows it
        lo, hi = WIDTH[shape.type_name]
        found += [Constraint(path, "range", shape.name, f"min={meta.get('min', lo)}"),
                  Constraint(path, "range", shape.name, f"max={meta.get('max', hi)}")]
    elif shape.type_name in ("float", "double"):
        found += [Constraint(path, "range", shape.name, f"{k}={meta[k]}") for k in ("min", "max") if k in meta]
    if "pattern" in meta:
        found.append(Constraint(path, "pattern", shape.name, meta["pattern"]))
    if getattr(shape, "enum", None):
        found.append(Constraint(path, "enum", shape.name, ",".join(shape.enum)))
    if shape.name in seen:
        return found  # recursive shape: its rules were listed where it first appeared on this path
    seen += (shape.name,)
    if isinstance(shape, StructureShape):
        if meta.get("union"):
            found.append(Constraint(path, "union", shape.name, ",".join(shape.members)))
        for name in shape.required_members:
            found.append(Constraint(_join(path, name), "required", shape.name, name))
        for name, member in shape.members.items():
            found += _constraints(member, _join(path, name), seen)
    elif isinstance(shape, ListShape):
        found += _constraints(shape.member, f"{path}[*]", seen)
    elif isinstance(shape, MapShape):
        found += _constraints(shape.key, f"{path}{{key}}", seen)
        found += _constraints(shape.value, f"{path}['*']", seen)
    return found
