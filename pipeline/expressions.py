"""The pipeline definition's expression language, evaluated: one interpreter for the offline checks
(pipeline/checks.py, over placeholder values) and the local run (local/pipeline_runner.py, over real ones).

What a value in a definition means, and where each rule comes from. "Doc" is SageMaker's documentation:
the developer guide's "Pipelines steps" and "Pass data between steps" (property files and JsonGet) pages,
the SageMaker Python SDK's pipeline guide (amazon_sagemaker_model_building_pipeline.rst) and its
``workflow/functions.py``/``conditions.py``, and the published definition schema. Where they are silent
the choice is ours and says why; the SDK's own local executor (``sagemaker.mlops.local.pipeline``) is the
nearest thing to a reference implementation and is cited where it settles or differs.

=============================================  ==============================================  ==========
expression                                     value                                           source
=============================================  ==============================================  ==========
literal (string, number, boolean, null)        itself                                          doc
``{"Get": "Parameters.N"}``                    the execution's value of N, else its default,   doc
                                               typed by the parameter's Type (the API passes
                                               execution values as strings)
undeclared N, or no value and no default       error naming N                                  doc (the
                                                                                               API refuses)
``{"Get": "Execution.V"}``                     the execution variable V (PipelineExecutionId,  doc
                                               PipelineExecutionArn, PipelineName, ...)
``{"Get": "Steps.S.<path>"}``                  field <path> of step S's Describe*Job response  doc
  ``.Field``                                   the member Field                                doc
  ``[3]``                                      item 3 of a list                                doc
  ``['name']`` on a map                        the key name (HyperParameters['lr'])            doc
  ``['name']`` on a list                       the item whose ...Name member is name           doc
                                               (Outputs['train'] by OutputName,
                                               FinalMetricDataList['val:acc'] by MetricName)
  a field, key or item that is not there       error naming how far the path got               SDK local
``Std:Join`` {On, Values}                      the values rendered as text, joined by On       doc
  On omitted                                   ""                                              doc (SDK)
  string                                       itself                                          doc
  integer                                      decimal digits: 32 -> "32"                      chosen (1)
  float                                        shortest text that reads back the same float:   chosen (1)
                                               1e-05 -> "1e-05", 0.5 -> "0.5", 1.0 -> "1.0"
  boolean                                      "true" / "false"                                chosen (2)
  null                                         error                                           chosen (3)
  object or array                              error                                           chosen (3)
  nested expression (Get, Join, JsonGet)       evaluated first, then rendered                  doc
``Std:JsonGet`` {PropertyFile, Path}           the value at Path in the step's property file:  doc
                                               <Outputs[OutputName].S3Output.S3Uri>/<FilePath>
``Std:JsonGet`` {S3Uri, Path}                  the value at Path in the JSON file at S3Uri     doc
  Path ``a.b.c``, ``a[0].b``, ``a['k-1']``     JsonPath's dot and bracket notation (a leading  doc
                                               ``$.`` is allowed)
  a key or index that is not there             error naming the file and how far Path got      SDK local
  while building (checks)                      RUN_TIME: unknown until the step has run        chosen (4)
ConditionStep ``Conditions``                   true when every condition holds (AND)           doc
``GreaterThan`` ``GreaterThanOrEqualTo``       the order of two numbers (integer or float)     doc (5)
``LessThan`` ``LessThanOrEqualTo``
  a string, boolean or null operand            error naming both operands                      chosen (5)
``Equals``                                     numbers by value (1 == 1.0), strings and        chosen (6)
                                               booleans by equality
  operands of different kinds                  error naming both operands                      SDK local
``In`` {QueryValue, Values}                    some value Equals QueryValue; values of         doc (6)
                                               another kind never match
``Not`` {Condition}                            the negation                                    doc
``Or`` {Conditions}                            true when any condition holds                   doc
=============================================  ==============================================  ==========

(1) The documentation shows Join over strings only; the SDK's ``to_string()`` of an Integer or Float
    parameter is a one-value Join, so numbers are joined, but their spelling is not stated. Integers have
    one spelling. For floats we take Python's shortest round-trip text, which is also what the SDK's local
    executor writes (``str(value)``); the service (JVM-based) may write 1.0E-5 for 1e-05. Both read back
    as the same float, and the steps parse hyperparameters with YAML's scalar rules or ``float()``.
(2) Not documented. JSON's spelling, the language the definition is written in (and the SDK's local
    executor's ``str(True)`` = "True" is Python's). The steps read hyperparameters with YAML's scalar rules,
    where both spellings are the same boolean, so the choice changes nothing a step sees.
(3) Not documented. Before this module the checks joined null as "" and the local run as "None"; an
    empty or "None" text in an S3 URI or an argument is a silent bug, so both refuse it, as the SDK's
    local executor fails the step ("... is undefined").
(4) A property file exists only once its step has run: the checks cannot know a JsonGet's value, only
    check its reference (check_references). It stands in as the text RUN_TIME in a Join.
(5) The documentation compares metrics and thresholds (numbers) and says nothing of ordering strings.
    The SDK's local executor would order strings by code point; we refuse, so a number that arrives as
    text (a JsonGet of "0.5") is an error that names it rather than a wrong branch taken silently.
(6) Not documented. JSON has one number type, and a JsonGet of ``1`` against a Float parameter ``1.0``
    should be equal, so numbers compare by value (the SDK's local executor instead fails int vs float).
    The SDK writes ``In`` as QueryValue/Values; the published schema names them Value/In: we read the
    SDK's spelling, which is what the definition holds.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, NamedTuple, Sequence

# The execution variables the SDK documents (sagemaker.workflow.execution_variables.ExecutionVariables).
EXECUTION_VARIABLE_NAMES = ("PipelineExecutionId", "PipelineExecutionArn", "PipelineName", "PipelineArn",
                       "StartDateTime", "CurrentDateTime", "TrainingJobName", "ProcessingJobName")
# A JsonGet's value while building: the property file does not exist yet (see note 4).
RUN_TIME = "placeholder"
PARAMETER_TYPES = ("String", "Integer", "Float", "Boolean")


class ExpressionError(ValueError):
    """An expression that has no value: the message names where it is and what to fix."""

    def __init__(self, message: str, *, located: bool = False) -> None:
        super().__init__(message)
        self.located = located  # the message already names the expression's place


# --- paths: Steps.S.<path> and JsonGet's Path ----------------------------------------------------------------


class Token(NamedTuple):
    kind: str  # "field" (.Name), "key" (['name']) or "index" ([3])
    value: str | int

    def __str__(self) -> str:
        return {"field": f".{self.value}", "key": f"[{self.value!r}]", "index": f"[{self.value}]"}[self.kind]


_TOKEN = re.compile(r"""\.?([^.\[\]'"\s]+)|\[(?:'([^']*)'|"([^"]*)"|(\d+))\]""")


def parse_path(path: str) -> list[Token]:
    """``ProcessingOutputConfig.Outputs['x'].S3Output.S3Uri`` -> tokens; a leading ``$``/``$.`` (JsonPath's
    root) is dropped. Refuses anything it cannot read whole, e.g. ``a..b`` or ``a[x]``."""
    text = re.sub(r"^\$\.?", "", path)
    matches = list(_TOKEN.finditer(text))
    if not text or "".join(m.group() for m in matches) != text or text.startswith("."):
        raise ExpressionError(f"cannot parse the property path {path!r}")
    tokens = []
    for m in matches:
        name, single, double, index = m.groups()
        if name is not None:
            tokens.append(Token("field", name))
        elif index is not None:
            tokens.append(Token("index", int(index)))
        else:
            tokens.append(Token("key", single if single is not None else double))
    return tokens


def _named(items: list[Any], name: str) -> Any:
    """The item of a Describe list whose ...Name member (OutputName, ChannelName, MetricName) is ``name``."""
    for item in items:
        if isinstance(item, dict) and any(k.endswith("Name") and v == name for k, v in item.items()):
            return item
    raise KeyError(name)


def walk(value: Any, path: str) -> Any:
    """The value at ``path`` under ``value``; an error names how far the path got and what was there."""
    done = ""
    for token in parse_path(path):
        try:
            if token.kind == "index" and isinstance(value, list):
                value = value[int(token.value)]
            elif token.kind == "key" and isinstance(value, list):
                value = _named(value, str(token.value))
            elif token.kind != "index" and isinstance(value, dict):
                value = value[token.value]
            else:
                raise KeyError(token.value)
        except (KeyError, IndexError):
            where = f"after {done.lstrip('.')!r}" if done else "at the top"
            missing = repr(token.value) if token.kind == "field" else str(token)
            raise ExpressionError(f"there is no {missing} {where} (there: {_shape_of(value)})") from None
        done += str(token)
    return value


def _shape_of(value: Any) -> str:
    if isinstance(value, dict):
        return "keys " + ", ".join(map(str, value)) if value else "an empty object"
    if isinstance(value, list):
        return f"a list of {len(value)}"
    return f"the {_kind(value)} {value!r}"


# --- values --------------------------------------------------------------------------------------------------


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    return "object" if isinstance(value, dict) else "array"


def render(value: Any) -> str:
    """How Std:Join writes one value (the table above: strings as they are, numbers, true/false)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float) and math.isfinite(value):
        return repr(value)
    raise ExpressionError(f"cannot write the {_kind(value)} {value!r} as text; give the value a default "
                          "or make the expression it comes from yield a string or number")


def typed(name: str, kind: str, value: Any) -> Any:
    """A parameter's value as its declared Type: StartPipelineExecution passes every value as a string."""
    if kind not in PARAMETER_TYPES:
        raise ExpressionError(f"parameter {name}: Type {kind!r} is not one of {', '.join(PARAMETER_TYPES)}")
    if not isinstance(value, str):
        return value
    try:
        if kind == "Integer":
            return int(value)
        if kind == "Float":
            return float(value)
    except ValueError:
        raise ExpressionError(f"parameter {name}={value!r}: must be {kind.lower()}") from None
    if kind == "Boolean":
        if value.lower() not in ("true", "false"):
            raise ExpressionError(f"parameter {name}={value!r}: must be true or false")
        return value.lower() == "true"
    return value


def parameter_values(definition: Mapping[str, Any], given: Mapping[str, Any]) -> dict[str, Any]:
    """Each declared parameter's value for one execution: the given value, else the default; typed.

    A name the definition does not declare is refused, naming the declared ones."""
    declared = {p["Name"]: p for p in definition.get("Parameters", [])}
    unknown = sorted(set(given) - set(declared))
    if unknown:
        raise ExpressionError(f"unknown pipeline parameter(s) {', '.join(unknown)} "
                              f"(the pipeline has: {', '.join(declared)})")
    values = {}
    for name, p in declared.items():
        value = given.get(name, p.get("DefaultValue"))
        if value is not None:
            values[name] = typed(name, p.get("Type", "String"), value)
    return values


# --- the interpreter -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Environment:
    """What expressions are evaluated against; the checks and the local run fill it differently.

    ``parameters``: name -> value for this execution (:func:`parameter_values`); a declared parameter without
    a value is absent. ``execution``: execution variable -> value. ``step_property(step, path)``: field
    ``path`` of step ``step``'s Describe response (real, or a placeholder of the field's type).
    ``read_json(s3_uri)``: the parsed JSON file at an S3 URI; None while building, where a JsonGet is RUN_TIME.
    ``property_files``: step name -> its PropertyFiles declarations (PropertyFileName, OutputName, FilePath).
    """

    parameters: Mapping[str, Any]
    execution: Mapping[str, Any]
    step_property: Callable[[str, str], Any]
    read_json: Callable[[str], Any] | None = None
    property_files: Mapping[str, Sequence[Mapping[str, str]]] = field(default_factory=dict)


def property_files(definition: Mapping[str, Any]) -> dict[str, list[dict[str, str]]]:
    """Step name -> PropertyFiles, for every step, the ones nested in Condition steps included."""
    found: dict[str, list[dict[str, str]]] = {}
    for step in all_steps(definition):
        if step.get("PropertyFiles"):
            found[step["Name"]] = step["PropertyFiles"]
    return found


def all_steps(definition: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every step, including the If/Else steps nested in Condition steps."""
    for step in definition.get("Steps", []):
        yield step
        if step.get("Type") == "Condition":
            yield from all_steps({"Steps": step["Arguments"].get("IfSteps", [])})
            yield from all_steps({"Steps": step["Arguments"].get("ElseSteps", [])})


_FUNCTIONS = ("Get", "Std:Join", "Std:JsonGet")


def evaluate(node: Any, env: Environment, where: str = "") -> Any:
    """``node`` with every expression in it replaced by its value; errors name ``where`` in the node."""
    if isinstance(node, list):
        return [evaluate(v, env, f"{where}[{i}]") for i, v in enumerate(node)]
    if not isinstance(node, dict):
        return node
    if len(node) == 1 and next(iter(node)) in _FUNCTIONS:
        function, argument = next(iter(node.items()))
        try:
            return {"Get": _get, "Std:Join": _join, "Std:JsonGet": _json_get}[function](argument, env, where)
        except ExpressionError as exc:
            if exc.located:  # a nested expression already said where it is
                raise
            raise ExpressionError(f"{where}: {_name(function, argument)}: {exc}" if where
                                  else f"{_name(function, argument)}: {exc}", located=True) from None
    return {k: evaluate(v, env, f"{where}.{k}" if where else k) for k, v in node.items()}


def _name(function: str, argument: Any) -> str:
    """An expression as an error names it: a Get with its reference, a JsonGet with its Path."""
    if function == "Get":
        return f"Get {argument!r}"
    if function == "Std:JsonGet" and isinstance(argument, dict):
        return f"Std:JsonGet Path {argument.get('Path')!r}"
    return function


def _get(reference: Any, env: Environment, where: str) -> Any:
    head, _, rest = str(reference).partition(".")
    if head == "Parameters":
        if rest not in env.parameters:
            raise ExpressionError(f"parameter {rest!r} has no value: it is not declared, or has no default "
                                  f"and the execution gave none (values: {', '.join(env.parameters)})")
        return env.parameters[rest]
    if head == "Execution":
        if rest not in env.execution:
            known = rest in EXECUTION_VARIABLE_NAMES
            raise ExpressionError(f"{rest!r} is {'not available here' if known else 'not an execution variable'} "
                                  f"(available: {', '.join(env.execution)})")
        return env.execution[rest]
    if head == "Steps" and "." in rest:
        step, _, path = rest.partition(".")
        return env.step_property(step, path)
    raise ExpressionError("a Get names Parameters.<name>, Execution.<variable> or Steps.<step>.<property>")


def _join(argument: Any, env: Environment, where: str) -> str:
    if not isinstance(argument, dict) or not isinstance(argument.get("Values"), list):
        raise ExpressionError("Std:Join takes {On, Values: [...]}")
    texts = []
    for i, value in enumerate(evaluate(argument["Values"], env, f"{where}.Std:Join.Values")):
        try:
            texts.append(render(value))
        except ExpressionError as exc:
            raise ExpressionError(f"value {i}: {exc}") from None
    return str(argument.get("On", "")).join(texts)


def _json_get(argument: Any, env: Environment, where: str) -> Any:
    if not isinstance(argument, dict) or not isinstance(argument.get("Path"), str):
        raise ExpressionError("Std:JsonGet takes {PropertyFile: {Get: ...}, Path} or {S3Uri, Path}")
    if "PropertyFile" in argument:
        uri = _property_file_uri(argument["PropertyFile"], env)
    elif "S3Uri" in argument:
        uri = evaluate(argument["S3Uri"], env, f"{where}.Std:JsonGet.S3Uri")
    else:
        raise ExpressionError("Std:JsonGet needs a PropertyFile or an S3Uri")
    if env.read_json is None:
        parse_path(argument["Path"])  # the path is checkable before the file exists
        return RUN_TIME
    try:
        return walk(env.read_json(uri), argument["Path"])
    except ExpressionError as exc:
        raise ExpressionError(f"in {uri}: {exc}") from None


def _property_file_uri(reference: Any, env: Environment) -> str:
    """Where a property file is: its output's S3 URI (a step property) joined with its FilePath."""
    source = reference.get("Get", "") if isinstance(reference, dict) else ""
    m = re.fullmatch(r"Steps\.([^.]+)\.PropertyFiles\.([^.]+)", source)
    if not m:
        raise ExpressionError(f"PropertyFile {reference!r} is not a Get of Steps.<step>.PropertyFiles.<name>")
    step, name = m.groups()
    declared = {f.get("PropertyFileName"): f for f in env.property_files.get(step, [])}
    if name not in declared:
        raise ExpressionError(f"step {step} declares no property file {name!r} (it declares {sorted(declared)})")
    pf = declared[name]
    output = env.step_property(step, f"ProcessingOutputConfig.Outputs['{pf['OutputName']}'].S3Output.S3Uri")
    return f"{str(output).rstrip('/')}/{pf['FilePath'].lstrip('/')}"


# --- conditions ------------------------------------------------------------------------------------------------

_ORDER: dict[str, Callable[[Any, Any], bool]] = {
    "GreaterThan": lambda a, b: a > b, "GreaterThanOrEqualTo": lambda a, b: a >= b,
    "LessThan": lambda a, b: a < b, "LessThanOrEqualTo": lambda a, b: a <= b,
}
CONDITION_TYPES = (*_ORDER, "Equals", "In", "Not", "Or")


def all_hold(conditions: Sequence[Mapping[str, Any]], env: Environment, where: str = "Conditions") -> bool:
    """A ConditionStep's outcome: every condition holds."""
    return all(holds(c, env, f"{where}[{i}]") for i, c in enumerate(conditions))


def holds(condition: Mapping[str, Any], env: Environment, where: str = "condition") -> bool:
    kind = condition.get("Type")
    if kind in _ORDER:
        left, right = _operands(condition, env, where)
        if _kind(left) != "number" or _kind(right) != "number":
            raise ExpressionError(f"{where}: {kind} compares numbers, not the {_kind(left)} {left!r} "
                                  f"and the {_kind(right)} {right!r}", located=True)
        return _ORDER[kind](left, right)
    if kind == "Equals":
        left, right = _operands(condition, env, where)
        if _kind(left) != _kind(right):
            raise ExpressionError(f"{where}: Equals compares values of one kind, not the {_kind(left)} {left!r} "
                                  f"and the {_kind(right)} {right!r}", located=True)
        return bool(left == right)
    if kind == "In":
        query = evaluate(condition.get("QueryValue"), env, f"{where}.QueryValue")
        values = evaluate(condition.get("Values", []), env, f"{where}.Values")
        return any(_kind(v) == _kind(query) and v == query for v in values)
    if kind == "Not":
        return not holds(condition.get("Condition", {}), env, f"{where}.Condition")
    if kind == "Or":
        return any(holds(c, env, f"{where}.Conditions[{i}]") for i, c in enumerate(condition.get("Conditions", [])))
    raise ExpressionError(f"{where}: condition type {kind!r} is not one of {', '.join(CONDITION_TYPES)}",
                          located=True)


def _operands(condition: Mapping[str, Any], env: Environment, where: str) -> tuple[Any, Any]:
    return (evaluate(condition.get("LeftValue"), env, f"{where}.LeftValue"),
            evaluate(condition.get("RightValue"), env, f"{where}.RightValue"))
