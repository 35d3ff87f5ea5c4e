"""The pipeline definition checked offline against what SageMaker checks when it runs it.

* ``check_parameters``: each parameter's default has its declared Type.
* ``check_arguments``: each job step's ``Arguments``, evaluated by the one
  interpreter (pipeline/expressions.py, as the local run evaluates them) with
  parameters at their defaults and step properties and execution variables
  replaced by placeholder values of the right type, against botocore's Create*Job
  input shape (including the ``max``/``pattern``/``enum`` rules botocore's validator skips).
* ``check_console_texts``: each step's DisplayName and Description (what Studio shows)
  within the published schema's and botocore's limits; ``check_pipeline_description``
  the same for CreatePipeline's PipelineDescription.
* ``check_references``: every ``Get`` names a declared parameter, a known
  execution variable, or a field of the named step's Describe*Job output that
  the step declares (an output, a channel, a property file).

Each function returns human-readable problems naming the step, the field and the rule.
"""
from __future__ import annotations

import re
from typing import Any, Iterator

from botocore.model import ListShape, MapShape, Shape, StructureShape

from pipeline.config import PLACEHOLDER
from pipeline.expressions import (
    Environment,
    ExpressionError,
    all_steps,
    evaluate,
    parameter_values,
    parse_path,
    property_files,
)
from pipeline.shapes import input_shape, service_model, violations

# Step type -> the SageMaker operations behind it: the request its Arguments are, the response its properties are.
JOB_OPERATIONS = {
    "Processing": ("CreateProcessingJob", "DescribeProcessingJob"),
    "Training": ("CreateTrainingJob", "DescribeTrainingJob"),
}
NO_JOB = ("Condition", "Fail")  # steps that run no SageMaker job: no Arguments shape, no properties
# SageMaker Pipelines names each job itself (from the execution and the step), so the
# definition leaves out the one member the Create*Job request requires that it fills in.
PIPELINE_FILLED = {"Processing": "ProcessingJobName", "Training": "TrainingJobName"}
PARAMETER_TYPES: dict[str, tuple[type, ...]] = {
    "String": (str,), "Integer": (int,), "Float": (int, float), "Boolean": (bool,),
}
# Placeholders of each type for parameters without a default.
TYPED_PLACEHOLDERS = {"String": "placeholder", "Integer": 1, "Float": 1.0, "Boolean": True}
EXECUTION_ID = "abcdef123456"  # the shape of a real PipelineExecutionId: 12 lowercase letters and digits
EXECUTION_VARIABLES = {
    "PipelineExecutionId": EXECUTION_ID,
    "PipelineExecutionArn": f"arn:aws:sagemaker:us-east-1:123456789012:pipeline/dapo/execution/{EXECUTION_ID}",
    "PipelineName": "dapo",
    "PipelineArn": "arn:aws:sagemaker:us-east-1:123456789012:pipeline/dapo",
    "StartDateTime": "2025-01-01T00:00:00Z",
    "CurrentDateTime": "2025-01-01T00:00:00Z",
    "TrainingJobName": f"pipelines-{EXECUTION_ID}-TrainDAPO-0123456789",
    "ProcessingJobName": f"pipelines-{EXECUTION_ID}-ValidateData-0123456789",
}
# The example config's <PLACEHOLDER>s stand for values of these shapes. Deploy's preflight refuses them, but
# `make pipeline-definition` builds from the example, so the checks fill them in and check everything around them.
PLACEHOLDER_VALUES = {"<ACCOUNT_ID>": "123456789012", "<BUCKET>": "example-bucket", "<IMAGE_TAG>": "latest",
                      "<MODEL_VERSION>": "1.0.0"}
# A named index into a Describe list whose names the step declares elsewhere in its Arguments.
DECLARED_ELSEWHERE = {"FinalMetricDataList": ("AlgorithmSpecification.MetricDefinitions", "Name")}
_SCALARS = ("string", "integer", "long", "float", "double", "boolean", "timestamp")


def problems(definition: dict[str, Any]) -> list[str]:
    """Everything the checks of a definition find."""
    return (check_parameters(definition) + check_references(definition) + check_arguments(definition)
            + check_console_texts(definition))


# --- what the console shows -------------------------------------------------------------------------------------

# The published schema's rule for a step's DisplayName (its StepName definition: the characters of a step name);
# tests/test_definition_checks.py holds this to the schema file. Its Description limit (4096) is looser than
# botocore's StepDescription (3072), which is checked below.
SCHEMA_DISPLAY_NAME = r"[A-Za-z0-9\-_]{1,64}"
# botocore's shapes of the texts (what ListPipelineExecutionSteps returns them as): length and pattern.
STEP_TEXT_SHAPES = {"DisplayName": "StepDisplayName", "Description": "StepDescription"}


def check_console_texts(definition: dict[str, Any]) -> list[str]:
    """Every step has a DisplayName and a Description, within the schema's and botocore's limits."""
    found = []
    for step in all_steps(definition):
        name = step.get("Name")
        for member, shape in STEP_TEXT_SHAPES.items():
            if member not in step:
                found.append(f"step {name}: no {member}; give the step one in pipeline/pipeline.py (STEP_TEXTS) "
                             "so the console explains it [console]")
                continue
            found += [f"step {name}: {v.message} [{v.rule}]"
                      for v in violations(service_model("sagemaker").shape_for(shape), step[member], member)]
        display = step.get("DisplayName")
        if isinstance(display, str) and not re.fullmatch(SCHEMA_DISPLAY_NAME, display):
            found.append(f"step {name}: DisplayName {display!r} must be 1-64 letters, digits, '-' or '_' "
                         "(the published schema's StepName) [pattern]")
    return found


def check_pipeline_description(description: str) -> list[str]:
    """CreatePipeline's PipelineDescription against botocore's model (at most 3072 characters)."""
    member = input_shape("sagemaker", "CreatePipeline").members["PipelineDescription"]
    return [f"{v.message}; shorten pipeline.description in the config [{v.rule}]"
            for v in violations(member, description, "PipelineDescription")]


# --- parameters -----------------------------------------------------------------------------------------------


def check_parameters(definition: dict[str, Any]) -> list[str]:
    found = []
    for param in definition.get("Parameters", []):
        name, kind = param.get("Name"), param.get("Type")
        if kind not in PARAMETER_TYPES:
            found.append(f"parameter {name}: Type {kind!r} is not one of {', '.join(PARAMETER_TYPES)}")
            continue
        default = param.get("DefaultValue")
        typed = isinstance(default, PARAMETER_TYPES[kind]) and (kind == "Boolean" or not isinstance(default, bool))
        if default is not None and not typed:  # bool is an int in Python, but not an Integer parameter
            found.append(f"parameter {name}: DefaultValue {default!r} is a {type(default).__name__}, "
                         f"but its Type is {kind} [type]")
    return found


def _defaults(definition: dict[str, Any]) -> dict[str, Any]:
    return {p["Name"]: p.get("DefaultValue", TYPED_PLACEHOLDERS.get(p.get("Type")))
            for p in definition.get("Parameters", [])}


# --- references -----------------------------------------------------------------------------------------------


def _describe_shape(step_type: str) -> StructureShape:
    return service_model("sagemaker").operation_model(JOB_OPERATIONS[step_type][1]).output_shape


def _name_member(item: Shape) -> str | None:
    """The member that names a list item (OutputName, ChannelName, MetricName ...)."""
    members = item.members if isinstance(item, StructureShape) else {}
    return next((m for m in members if m.endswith("Name")), None)


def _at(node: Any, dotted: str) -> Any:
    for key in dotted.split("."):
        node = node.get(key) if isinstance(node, dict) else None
    return node


def _step_property(step: dict[str, Any], path: str) -> tuple[Shape | None, str | None]:
    """The Describe output shape that ``path`` (e.g. ``ProcessingOutputConfig.Outputs['x'].S3Output.S3Uri``)
    names on ``step``, or a problem: a field the response lacks, or a named output/channel the step does not declare.
    """
    shape: Shape = _describe_shape(step["Type"])
    declared: Any = step.get("Arguments")  # the same path in the step's own request, where it declares names
    try:
        tokens = parse_path(path)
    except ExpressionError as exc:
        return None, str(exc)
    done = ""
    for kind, value in tokens:
        if kind == "field":
            member = str(value)
            if not isinstance(shape, StructureShape) or member not in shape.members:
                return None, f"{shape.name} has no field {member!r} (after {done or 'the response'})"
            shape, declared = shape.members[member], declared.get(member) if isinstance(declared, dict) else None
            done = f"{done}.{member}" if done else member
            continue
        key, index = (str(value), None) if kind == "key" else (None, str(value))
        problem, shape, declared = _index(step, shape, declared, done, key, index)
        if problem:
            return None, problem
        done += f"[{key!r}]" if key is not None else f"[{index}]"
    if shape.type_name not in _SCALARS:
        return None, f"{done} is a {shape.type_name} ({shape.name}), not a single value"
    return shape, None


def _index(step: dict[str, Any], shape: Shape, declared: Any, done: str, key: str | None,
           index: str | None) -> tuple[str | None, Shape, Any]:
    """One ``['name']`` or ``[3]`` into a map or list of the Describe output: (problem, item shape, declared item).

    A name must be one the step declares: an output, a channel, a metric definition, a map key it sets.
    """
    if isinstance(shape, MapShape) and key is not None:
        if isinstance(declared, dict) and key not in declared:
            return f"{done}[{key!r}] is not set by step {step['Name']} (it sets {sorted(declared)})", shape, None
        return None, shape.value, declared.get(key) if isinstance(declared, dict) else None
    if not isinstance(shape, ListShape):
        return f"{done} ({shape.name}) is a {shape.type_name} and cannot be indexed", shape, None
    if key is None:
        items = declared if isinstance(declared, list) else []
        return None, shape.member, items[int(index)] if int(index) < len(items) else None
    where, name_member = DECLARED_ELSEWHERE.get(done, (None, _name_member(shape.member)))
    if name_member is None:
        return f"{done} ({shape.name}) cannot be indexed by name", shape, None
    items = _at(step.get("Arguments"), where) if where else declared
    if not isinstance(items, list):
        return None, shape.member, None  # the step declares no such names: SageMaker sets them at run time
    names = [item.get(name_member) if isinstance(item, dict) else None for item in items]
    if key not in names:
        return f"{done}[{key!r}] is not declared by step {step['Name']} (it declares {names})", shape, None
    return None, shape.member, items[names.index(key)]


def _reference_problem(expr: str, steps: dict[str, dict[str, Any]], params: dict[str, Any]) -> str | None:
    head, _, rest = expr.partition(".")
    if head == "Parameters":
        return None if rest in params else f"parameter {rest!r} is not declared (declared: {sorted(params)})"
    if head == "Execution":
        return None if rest in EXECUTION_VARIABLES else f"{rest!r} is not an execution variable"
    if head != "Steps":
        return f"{expr!r} names neither Parameters, Execution nor Steps"
    name, _, path = rest.partition(".")
    step = steps.get(name)
    if step is None:
        return f"step {name!r} does not exist (steps: {sorted(steps)})"
    if path.startswith("PropertyFiles."):
        files = [f.get("PropertyFileName") for f in step.get("PropertyFiles", [])]
        wanted = path.removeprefix("PropertyFiles.")
        return None if wanted in files else f"step {name} declares no property file {wanted!r} (it declares {files})"
    if step.get("Type") not in JOB_OPERATIONS:
        return f"step {name} is a {step.get('Type')} step, which has no properties"
    return _step_property(step, path)[1]


def _expressions(node: Any, where: str) -> Iterator[tuple[str, str, Any]]:
    """(location, function, argument) for every Get and Std:JsonGet under ``node``."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("Get", "Std:JsonGet"):
                yield where, key, value
            if key not in ("IfSteps", "ElseSteps"):  # nested steps are checked as steps of their own
                yield from _expressions(value, f"{where}.{key}")
    elif isinstance(node, list):
        for i, item in enumerate(node):
            yield from _expressions(item, f"{where}[{i}]")


def check_references(definition: dict[str, Any]) -> list[str]:
    steps = {s["Name"]: s for s in all_steps(definition)}
    params = _defaults(definition)
    found = []
    for step in steps.values():
        for where, function, arg in _expressions(step.get("Arguments"), "Arguments"):
            if function == "Get":
                if problem := _reference_problem(str(arg), steps, params):
                    found.append(f"step {step['Name']}: {where}: Get {arg!r}: {problem} [reference]")
            elif function == "Std:JsonGet" and "PropertyFile" in arg:
                source = arg["PropertyFile"].get("Get", "") if isinstance(arg["PropertyFile"], dict) else ""
                if not re.fullmatch(r"Steps\.[^.]+\.PropertyFiles\.[^.]+", source):
                    found.append(f"step {step['Name']}: {where}.PropertyFile: {arg['PropertyFile']!r} is not "
                                 f"a Get of Steps.<step>.PropertyFiles.<name> [reference]")
        outputs = [o.get("OutputName") for o in _at(step.get("Arguments"), "ProcessingOutputConfig.Outputs") or []]
        for pf in step.get("PropertyFiles", []):
            if pf.get("OutputName") not in outputs:
                found.append(f"step {step['Name']}: PropertyFiles {pf.get('PropertyFileName')!r}: OutputName "
                             f"{pf.get('OutputName')!r} is not one of the step's outputs {outputs} [reference]")
    return found


# --- arguments ------------------------------------------------------------------------------------------------


def _placeholder(shape: Shape, step: str) -> Any:
    """A value of ``shape``'s type standing in for a step property until the step has run."""
    if shape.type_name == "string":
        if shape.enum:
            return shape.enum[0]
        if "s3" in shape.metadata.get("pattern", "") or "S3" in shape.name:
            return f"s3://placeholder-bucket/pipelines/{EXECUTION_ID}/{step}"  # so Joins onto it meet S3Uri's pattern
        return f"{step}-placeholder"
    return {"integer": 1, "long": 1, "float": 1.0, "double": 1.0, "boolean": True,
            "timestamp": "2025-01-01T00:00:00Z"}[shape.type_name]


def _filled(node: Any) -> Any:
    """``node`` with the example config's <PLACEHOLDER>s replaced by values of their shape."""
    if isinstance(node, list):
        return [_filled(v) for v in node]
    if isinstance(node, dict):
        return {k: _filled(v) for k, v in node.items()}
    if not isinstance(node, str):
        return node
    return PLACEHOLDER.sub(lambda m: PLACEHOLDER_VALUES.get(m[0], "placeholder"), node)


def environment(definition: dict[str, Any]) -> Environment:
    """What the checks evaluate expressions against (pipeline/expressions.py): parameters at their defaults
    (a typed placeholder where there is none), a made-up execution's variables, each step property a
    placeholder of its Describe field's type, and JsonGet unknown until run time."""
    steps = {s["Name"]: s for s in all_steps(definition)}
    try:
        params = parameter_values(definition, {
            p["Name"]: TYPED_PLACEHOLDERS.get(p.get("Type"), "placeholder")
            for p in definition.get("Parameters", []) if p.get("DefaultValue") is None})
    except ExpressionError:  # a parameter of no known Type: check_parameters names it
        params = _defaults(definition)

    def step_property(name: str, path: str) -> Any:
        step = steps.get(name, {})
        if step.get("Type") not in JOB_OPERATIONS:
            return "placeholder"  # a broken reference: check_references names it
        shape, _ = _step_property(step, path)
        return _placeholder(shape, name) if shape is not None else "placeholder"

    return Environment(parameters=_filled(params), execution=EXECUTION_VARIABLES, step_property=step_property,
                       read_json=None, property_files=property_files(definition))


def resolve(node: Any, definition: dict[str, Any]) -> Any:
    """``node`` with every expression replaced by the value it would have in :func:`environment`."""
    return evaluate(_filled(node), environment(definition))


def check_arguments(definition: dict[str, Any]) -> list[str]:
    found = []
    env = environment(definition)
    for step in all_steps(definition):
        kind, name = step.get("Type"), step.get("Name")
        if kind in NO_JOB:
            continue
        if kind not in JOB_OPERATIONS:
            found.append(f"step {name}: type {kind!r} is not checked; add its Create/Describe operations to "
                         "JOB_OPERATIONS in pipeline/checks.py")
            continue
        try:
            arguments = evaluate(_filled(step.get("Arguments")), env, "Arguments")
        except ExpressionError as exc:
            # Mostly a broken reference, which check_references names with what is declared: say it once.
            if not any(p.startswith(f"step {name}: ") for p in check_references(definition)):
                found.append(f"step {name}: {exc} [expression]")
            continue
        shape = input_shape("sagemaker", JOB_OPERATIONS[kind][0])
        for v in violations(shape, arguments):
            if v.rule == "required" and v.path == PIPELINE_FILLED[kind]:
                continue
            found.append(f"step {name}: Arguments.{v.message} [{v.rule}]")
    return found
