"""The local service refuses exactly what botocore's models declare, and everything the loop sends passes.

1. The model walk: every constraint ``pipeline.shapes.constraints()`` lists on the input shape of every
   operation the service serves becomes one request, built from a valid request that holds every member,
   that breaks exactly that constraint. It goes over the wire with a botocore client that skips its own
   validation (raw HTTP where botocore cannot serialise the value, and for URI members), and must come
   back a ValidationException naming the member.
2. The rules the model cannot state, checked by hand in ``responses``: one request each.
3. A short real training run, and its resume: the service refused none of the loop's requests and saw
   every runtime operation kind the loop uses.
"""
from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from typing import Any, Iterator
from urllib.parse import quote

import boto3
import pytest
from botocore import xform_name
from botocore.config import Config
from botocore.exceptions import ClientError
from botocore.model import Shape
from botocore.serialize import create_serializer

from local.toy_data import write_split
from local.training_session.responses import CONTROL_PLANE, CONTROL_PLANE_OPERATIONS, RUNTIME, RUNTIME_OPERATIONS
from local.training_session.server import RunningService, start_service
from local.training_session.toy.tokenizer import ToyTokenizer
from pipeline.shapes import Constraint, compile_pattern, constraints, input_shape, service_model, violations
from tests.local_service import BASE_MODEL_ARN, REGION, ROLE_ARN, S3_OUTPUT_PATH, group_arn
from tests.test_train import start_training, step_records

SERVED = {CONTROL_PLANE: CONTROL_PLANE_OPERATIONS, RUNTIME: RUNTIME_OPERATIONS}
NO_CHECKS = Config(parameter_validation=False, retries={"max_attempts": 0}, region_name=REGION)


# -- a valid request holding every member ------------------------------------------------------
# Strings tried, in order, for a string shape with no enum: the first its length and pattern accept.
CANDIDATE_STRINGS = (
    "abc", "1.0.0", "s3://bucket/key", "https://example.com/key", "sha256:" + "0" * 64, "text/plain",
    "arn:aws:sagemaker:us-west-2:123456789012:model-package-group/group",
    "arn:aws:sagemaker:us-west-2:123456789012:model-package/group/1",
    "arn:aws:iam::123456789012:role/Role", "arn:aws:kms:us-west-2:123456789012:key/abc-123", BASE_MODEL_ARN,
)


def _valid_string(shape: Shape) -> str:
    if shape.enum:
        return shape.enum[0]
    found = next((s for s in CANDIDATE_STRINGS if not violations(shape, s)), None)
    assert found is not None, f"add a string {shape.name} accepts to CANDIDATE_STRINGS: {shape.metadata}"
    return found


def _valid_number(shape: Shape) -> float:
    lo, hi = shape.metadata.get("min"), shape.metadata.get("max")
    if lo is not None and hi is not None:
        return lo if shape.type_name in ("integer", "long") else (lo + hi) / 2
    return lo if lo is not None else (hi if hi is not None else 1)


def _on_focus(path: str, focus: str) -> bool:
    return focus == path or any(focus.startswith(path + c) for c in ".[{")


def valid(shape: Shape, path: str = "", focus: str = "", seen: tuple[str, ...] = ()) -> Any:
    """A value ``shape`` accepts, with every member set; a union sets the member ``focus`` leads to."""
    kind = shape.type_name
    if kind == "structure":
        if shape.metadata.get("document"):
            return {}
        members = {name: member for name, member in shape.members.items()
                   if member.name not in seen or name in shape.required_members}  # no endless recursion
        if shape.metadata.get("union"):
            name = next((n for n in members if _on_focus(f"{path}.{n}".lstrip("."), focus)), next(iter(members)))
            members = {name: members[name]}
        return {name: valid(member, f"{path}.{name}".lstrip("."), focus, seen + (shape.name,))
                for name, member in members.items()}
    if kind == "list":
        return [valid(shape.member, f"{path}[*]", focus, seen) for _ in range(max(1, shape.metadata.get("min", 1)))]
    if kind == "map":
        return {_valid_string(shape.key): valid(shape.value, f"{path}['*']", focus, seen)}
    if kind == "string":
        return _valid_string(shape)
    if kind in ("integer", "long", "float", "double"):
        number = _valid_number(shape)
        return int(number) if kind in ("integer", "long") else float(number)
    return {"boolean": True, "timestamp": 1_700_000_000, "blob": "YWJj"}[kind]


# -- one request breaking one constraint ---------------------------------------------------------
_STEP = re.compile(r"\.?(\w+)|\[\*\]|\['\*'\]|\{key\}")


def _steps(path: str) -> list[str]:
    return [m.group(1) or m.group(0) for m in _STEP.finditer(path)]


def _shape_at(shape: Shape, steps: list[str]) -> Shape:
    for step in steps:
        if step == "[*]":
            shape = shape.member
        elif step == "['*']":
            shape = shape.value
        elif step == "{key}":
            shape = shape.key
        else:
            shape = shape.members[step]
    return shape


def concrete(path: str, value: Any) -> str:
    """The path as violations() names it in ``value``: the first list item, the first map entry."""
    out, node = "", value
    for step in _steps(path):
        if step == "[*]":
            out, node = f"{out}[0]", node[0]
        elif step in ("['*']", "{key}"):
            key = next(iter(node))
            out, node = f"{out}[{key!r}]", node[key]
        else:
            out, node = f"{out}.{step}".lstrip("."), node[step]
    return out


def _parent(value: Any, steps: list[str]) -> Any:
    """The node ``steps`` lead to (no map-key step: a key holds no node)."""
    for step in steps:
        if step == "[*]":
            value = value[0]
        elif step == "['*']":
            value = value[next(iter(value))]
        else:
            value = value[step]
    return value


def _bad_type(shape: Shape) -> Any:
    return {"string": 12345, "integer": "12", "long": "12", "float": "1.5", "double": "1.5", "boolean": "true",
            "structure": "x", "list": "x", "map": "x", "timestamp": [1], "blob": 12345}[shape.type_name]


def _bad_length(shape: Shape, good: Any, detail: str) -> Any:
    bound, limit = detail.split("=")
    size = int(limit) - 1 if bound == "min" else int(limit) + 1
    if shape.type_name in ("string", "blob"):
        return good[:size] if bound == "min" else good + good[-1] * (size - len(good))
    if shape.type_name == "list":
        return (good * size)[:size]
    return {f"{next(iter(good))}{i}": next(iter(good.values())) for i in range(size)}


def _bad_pattern(shape: Shape, pattern: str) -> str | None:
    """A string the pattern does not match (the API matches the whole value), as long as the length rule wants
    if one is; else the empty string if the pattern refuses it (``[\\S\\s]+``); None if it takes all these."""
    size = max(shape.metadata.get("min", 1), 1)
    return next((c for c in [c * size for c in "!# "] + [""] if not compile_pattern(pattern).fullmatch(c)), None)


def _bad_value(constraint: Constraint, shape: Shape, good: Any) -> Any:
    if constraint.rule == "type":
        return _bad_type(shape)
    if constraint.rule == "length":
        return _bad_length(shape, good, constraint.detail)
    if constraint.rule == "range":
        bound, limit = constraint.detail.split("=")
        number = (int if shape.type_name in ("integer", "long") else float)(limit)
        return number - 1 if bound == "min" else number + 1
    if constraint.rule == "pattern":
        return _bad_pattern(shape, constraint.detail)
    assert constraint.rule == "enum", constraint
    return "NOT-ONE-OF-THEM"


def breaking(service: str, operation: str, constraint: Constraint) -> dict[str, Any]:
    """A valid request with ``constraint`` broken, and nothing else."""
    root = input_shape(service, operation)
    request = valid(root, focus=constraint.path)
    steps = _steps(constraint.path)
    if constraint.rule == "required":
        del _parent(request, steps[:-1])[steps[-1]]
        return request
    shape = _shape_at(root, steps)
    if constraint.rule == "union":
        union = _parent(request, steps)
        other = next(name for name in shape.members if name not in union)
        union[other] = valid(shape.members[other])
        return request
    if not steps:
        return _bad_type(root)
    parent = _parent(request, steps[:-1])
    if steps[-1] == "{key}":
        key = next(iter(parent))
        parent[_bad_value(constraint, shape, key)] = parent.pop(key)
    elif steps[-1] == "[*]":
        parent[0] = _bad_value(constraint, shape, parent[0])
    elif steps[-1] == "['*']":
        key = next(iter(parent))
        parent[key] = _bad_value(constraint, shape, parent[key])
    else:
        parent[steps[-1]] = _bad_value(constraint, shape, parent[steps[-1]])
    return request


# -- the cases, and the ones the wire cannot carry -------------------------------------------------
def _uri_members(service: str, operation: str) -> set[str]:
    shape = input_shape(service, operation)
    return {name for name, member in shape.members.items() if member.serialization.get("location") == "uri"}


def _has_body(service: str, operation: str) -> bool:
    return service_model(service).operation_model(operation).http["method"] == "POST"


def unsendable(service: str, operation: str, constraint: Constraint) -> str | None:
    """Why no request on the wire can break ``constraint``, or None."""
    if constraint.path in _uri_members(service, operation) and constraint.rule in ("required", "type"):
        return "a URI member is always a path segment: a string, present (an empty one breaks its length rule)"
    if not constraint.path and constraint.rule == "type" and not _has_body(service, operation):
        return "the request has no body: its input is its path alone"
    if constraint.rule == "type" and constraint.path.endswith("{key}"):
        return "JSON object keys are always strings"
    if constraint.rule == "pattern" and _bad_pattern(_shape_at(input_shape(service, operation),
                                                               _steps(constraint.path)), constraint.detail) is None:
        return "the pattern takes any string (such as .*): none breaks it"
    return None


@dataclass(frozen=True)
class Case:
    service: str
    operation: str
    constraint: Constraint

    @property
    def id(self) -> str:
        c = self.constraint
        return f"{self.operation}:{c.path or '(request)'}:{c.rule}:{c.detail[:40]}"


CASES = [Case(service, op, c) for service, ops in SERVED.items() for op in ops
         for c in constraints(input_shape(service, op))]
SENDABLE = [case for case in CASES if unsendable(case.service, case.operation, case.constraint) is None]


# -- the wire ------------------------------------------------------------------------------------
def _raw(url: str, service: str, operation: str, request: Any) -> tuple[int, dict[str, str], dict]:
    """Send ``request`` as the protocol would, without botocore: for values it cannot serialise."""
    if service == CONTROL_PLANE:
        method, path, body = "POST", "/", request
        headers = {"X-Amz-Target": f"SageMaker.{operation}", "Content-Type": "application/x-amz-json-1.1"}
    else:
        http = service_model(service).operation_model(operation).http
        uri = _uri_members(service, operation)
        # A body that is no object still goes to a valid path.
        members = request if isinstance(request, dict) else valid(input_shape(service, operation))
        method, headers = http["method"], {"Content-Type": "application/json"}
        path = re.sub(r"\{(\w+)\}", lambda m: quote(str(members.get(m[1], "")), safe=""), http["requestUri"])
        body = {k: v for k, v in request.items() if k not in uri} if isinstance(request, dict) else request
    data = json.dumps(body).encode() if method == "POST" else None
    try:
        with urllib.request.urlopen(urllib.request.Request(url + path, data, headers, method=method),
                                    timeout=30) as resp:
            return resp.status, dict(resp.headers), json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), json.loads(e.read())


def _botocore_sends_as_is(case: Case, request: Any) -> bool:
    """Whether botocore's serializer puts ``request`` on the wire unchanged: it refuses some bad
    values and coerces others (a string where a list goes becomes a list of one)."""
    if not isinstance(request, dict) or case.constraint.path in _uri_members(case.service, case.operation):
        return False
    model = service_model(case.service)
    serializer = create_serializer(model.metadata["protocol"], include_validation=False)
    try:
        sent = serializer.serialize_to_request(request, model.operation_model(case.operation))
    except (TypeError, ValueError, AttributeError):
        return False
    uri = _uri_members(case.service, case.operation)
    return json.loads(sent["body"] or b"{}") == {k: v for k, v in request.items() if k not in uri}


def send(url: str, clients: dict[str, Any], case: Case, request: Any) -> tuple[int, str, str]:
    """(HTTP status, error code, message) of ``request``: by botocore when it sends it as it is, else raw."""
    if _botocore_sends_as_is(case, request):
        try:
            getattr(clients[case.service], xform_name(case.operation))(**request)
            return 200, "", ""
        except ClientError as e:
            return (e.response["ResponseMetadata"]["HTTPStatusCode"], e.response["Error"]["Code"],
                    e.response["Error"]["Message"])
    status, headers, body = _raw(url, case.service, case.operation, request)
    code = body.get("__type") if case.service == CONTROL_PLANE else headers.get("x-amzn-ErrorType")
    return status, code or "", body.get("message", "")


@pytest.fixture(scope="module")
def clients(training_service: RunningService) -> dict[str, Any]:
    """botocore clients of both services that leave every check to the local service."""
    return {service: boto3.client(service, endpoint_url=training_service.url, config=NO_CHECKS)
            for service in SERVED}


@pytest.mark.parametrize("case", SENDABLE, ids=[case.id for case in SENDABLE])
def test_each_model_constraint_is_enforced_on_the_wire(case: Case, training_service, clients):
    request = breaking(case.service, case.operation, case.constraint)
    # A missing member is named where the valid request had it.
    named_in = valid(input_shape(case.service, case.operation), focus=case.constraint.path) \
        if case.constraint.rule == "required" else request
    member = concrete(case.constraint.path, named_in)
    # The request breaks that constraint and only at that member.
    found = violations(input_shape(case.service, case.operation), request)
    assert {(v.rule, v.path) for v in found} >= {(case.constraint.rule, member)}, found
    assert {v.path for v in found} == {member}, found

    status, code, message = send(training_service.url, clients, case, request)
    assert (status, code) == (400, "ValidationException"), message
    assert f"{member or '(request)'}: " in message


def test_the_walk_covers_every_served_operation_and_says_why_it_skips():
    assert {case.operation for case in SENDABLE} == set(CONTROL_PLANE_OPERATIONS) | set(RUNTIME_OPERATIONS)
    skipped = {unsendable(c.service, c.operation, c.constraint) for c in CASES} - {None}
    assert len(SENDABLE) > 0.9 * len(CASES), skipped
    print(f"\n{len(SERVED[CONTROL_PLANE]) + len(SERVED[RUNTIME])} operations, {len(CASES)} model constraints, "
          f"{len(SENDABLE)} sent on the wire, {len(CASES) - len(SENDABLE)} unsendable: {sorted(skipped)}")


# -- the rules the model cannot state ---------------------------------------------------------------
TOK = ToyTokenizer()
PROMPT = TOK.apply_chat_template([{"role": "user", "content": "ann has 3 apples and buys 4 more ."}])
COMPLETION = TOK.encode("#### 7") + [TOK.eos_token_id]
TOKENS = PROMPT + COMPLETION[:-1]  # the model input: every token but the last
N = len(TOKENS)
PAD = [0.0] * (len(PROMPT) - 1)


def tensor(values: list, dtype: str = "float32") -> dict:
    return {"data": values, "dtype": dtype, "shape": [len(values)]}


def rl_inputs(**changes: Any) -> dict:
    """lossFnInputs of a valid ppo datum, with ``changes`` (None drops a key)."""
    inputs = {"target_tokens": tensor(PROMPT[1:] + COMPLETION, "int64"),
              "weights": tensor(PAD + [1.0] * len(COMPLETION)),
              "logprobs": tensor(PAD + [-0.5] * len(COMPLETION)),
              "advantages": tensor(PAD + [1.0] * len(COMPLETION))}
    inputs.update(changes)
    return {k: v for k, v in inputs.items() if v is not None}


def loss_config(inputs: dict | None = None, tokens: list[int] | None = None, **changes: Any) -> dict:
    datum = {"modelInput": {"chunks": [{"type": "encoded_text", "tokens": TOKENS if tokens is None else tokens}]},
             "lossFnInputs": rl_inputs() if inputs is None else inputs}
    config = {"lossFnName": "ppo", "datumList": [datum],
              "lossFnConfig": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.28}}
    config.update(changes)
    return {"forwardBackward": {k: v for k, v in config.items() if v is not None}}


def sample_config(sample: dict | None = None, **params: Any) -> dict:
    config = {"prompt": {"chunks": [{"type": "encoded_text", "tokens": PROMPT}]}, "numSamples": 2,
              "samplingParams": {"maxTokens": 512, "seed": 1, **params}, **(sample or {})}
    return {"sample": config}


DATUM = "operationConfig.forwardBackward.datumList[0]"
INPUTS = f"{DATUM}.lossFnInputs"
SAMPLE = "operationConfig.sample"


@pytest.fixture(scope="module")
def session(training_service: RunningService) -> Iterator[str]:
    """A session on the shared service; every submit below is refused, so sequence number 1 stays free."""
    name = f"rules-{uuid.uuid4().hex[:10]}"
    control = boto3.client(CONTROL_PLANE, endpoint_url=training_service.url, region_name=REGION)
    control.create_training_session(
        TrainingSessionName=name, ModelPackageGroupArn=group_arn("rules-tests"), LoraConfig={"Rank": 8, "Alpha": 16},
        RoleArn=ROLE_ARN, ModelConfig={"BaseModelArn": BASE_MODEL_ARN},
        OutputConfig={"S3Location": {"Path": S3_OUTPUT_PATH}})
    yield name
    control.stop_training_session(TrainingSessionName=name)


@pytest.fixture(scope="module")
def runtime(training_service: RunningService) -> Any:
    return boto3.client(RUNTIME, endpoint_url=training_service.url, region_name=REGION)


@pytest.mark.parametrize("config, expected", [
    (loss_config(rl_inputs(advantages=None)), f"{INPUTS}: is missing ['advantages'], which loss function 'ppo'"),
    (loss_config(rl_inputs(weights=tensor([1.0, 1.0, 1.0]))),
     f"{INPUTS}['weights']: has 3 values but modelInput has {N} tokens"),
    (loss_config(rl_inputs(target_tokens=tensor([10_000] * N, "int64"))),
     f"{INPUTS}['target_tokens']: must hold whole token ids in the vocabulary"),
    (loss_config(rl_inputs(values=tensor([0.0] * N))), f"{INPUTS}: has unsupported keys ['values']"),
    (loss_config(rl_inputs(weights=tensor(["a"] * N))), f"{INPUTS}['weights'].data: must hold only numbers"),
    (loss_config(rl_inputs(logprobs=tensor([float("nan")] * N))), f"{INPUTS}['logprobs'].data: holds NaN"),
    (loss_config(rl_inputs(temperature=tensor([0.0] * N))), f"{INPUTS}['temperature']: must be > 0 where"),
    (loss_config(tokens=[TOK.vocab_size + 3] + TOKENS[1:]), f"{DATUM}.modelInput.chunks[0].tokens: ids "
                                                             f"[{TOK.vocab_size + 3}] are outside the vocabulary"),
    (loss_config(datumList=[]), "operationConfig.forwardBackward.datumList: holds no datum"),
    (loss_config(lossFnConfig={"clip_low_threshold": 0.0}),
     "lossFnConfig.clip_low_threshold: 0.0 is out of range: it bounds the probability ratio and must be in (0.0, 1.0]"),
    (loss_config(lossFnConfig={"clip_low_threshold": 0.2, "clip_high_threshold": 0.2}),
     "lossFnConfig.clip_high_threshold: 0.2 is out of range"),
    (loss_config(lossFnConfig={"clip_high_threshold": 11}), "must be in [1.0, 10.0]"),
    (loss_config(lossFnConfig={"epsilon": 0.2}), "lossFnConfig: has unsupported keys ['epsilon']"),
    ({"loadState": {"modelPackageArn": "arn:aws:sagemaker:us-west-2:123456789012:model-package/none/1",
                    "loadOptimizer": True}}, "Model package 'arn:aws:sagemaker:us-west-2:123456789012:"
                                             "model-package/none/1' does not exist"),
], ids=["missing-input", "short-input", "target-outside-vocab", "unknown-input", "non-numbers", "nan",
        "temperature-0", "token-outside-vocab", "no-datum", "clip-low-0", "clip-high-below-1", "clip-high-11",
        "unknown-config-key", "no-such-package"])
def test_training_rules_the_model_cannot_state(runtime, session, config, expected):
    with pytest.raises(ClientError) as excinfo:
        runtime.execute_training_operation(trainingSessionName=session, sequenceNumber=1, operationConfig=config)
    assert excinfo.value.response["Error"]["Code"] == "ValidationException"
    assert expected in excinfo.value.response["Error"]["Message"]


@pytest.mark.parametrize("config, expected", [
    (sample_config(topK=0), f"{SAMPLE}.samplingParams.topK: 0 must be >= 1, or -1 to disable it"),
    (sample_config(stop=[""]), f"{SAMPLE}.samplingParams.stop: must be a list of non-empty strings"),
    (sample_config({"topkPromptLogprobs": 3}), f"{SAMPLE}.topkPromptLogprobs: is not supported"),
    (sample_config({"prompt": {"chunks": []}}), f"{SAMPLE}.prompt.chunks: holds no chunk"),
    (sample_config({"modelPackageArn": "arn:aws:sagemaker:us-west-2:123456789012:model-package/none/1"}),
     "does not exist"),
], ids=["top-k-0", "empty-stop", "topk-prompt-logprobs", "no-chunk", "no-such-package"])
def test_sampling_rules_the_model_cannot_state(runtime, session, config, expected):
    with pytest.raises(ClientError) as excinfo:
        runtime.execute_sampling_operation(trainingSessionName=session, operationConfig=config)
    assert excinfo.value.response["Error"]["Code"] == "ValidationException"
    assert expected in excinfo.value.response["Error"]["Message"]


def test_what_the_model_allows_is_served(service_client):
    """A negative seed, topP 0, learning rate 0 and gradClipNorm 0 are valid API values: they run."""
    with service_client.create_lora_training_client(base_model=BASE_MODEL_ARN) as training:
        sampler = training.create_sampling_client()
        for params in ({"seed": -(2**31), "max_tokens": 512}, {"seed": -1, "top_p": 0.0, "max_tokens": 512}):
            assert sampler.sample(PROMPT, 2, params).result().sequences
        assert training.optim_step({"learning_rate": 0.0, "grad_clip_norm": 0.0}).result().metrics


def test_control_plane_rules_the_model_cannot_state(training_service):
    control = boto3.client(CONTROL_PLANE, endpoint_url=training_service.url, region_name=REGION)
    refusals = {
        "group": lambda: control.create_training_session(
            TrainingSessionName=f"rules-{uuid.uuid4().hex[:10]}", LoraConfig={"Rank": 8, "Alpha": 16},
            RoleArn=ROLE_ARN, ModelConfig={"BaseModelArn": BASE_MODEL_ARN},
            OutputConfig={"S3Location": {"Path": S3_OUTPUT_PATH}}),
        "list": lambda: control.list_model_packages(),
        "token": lambda: control.list_training_sessions(NextToken="not-ours"),
    }
    messages = {}
    for name, call in refusals.items():
        with pytest.raises(ClientError) as excinfo:
            call()
        assert excinfo.value.response["Error"]["Code"] == "ValidationException"
        messages[name] = excinfo.value.response["Error"]["Message"]
    assert "ModelPackageGroupArn is required by the local service" in messages["group"]
    assert "ModelPackageGroupName is required by the local service" in messages["list"]
    assert "NextToken 'not-ours' was not issued by this service" in messages["token"]


# -- everything the loop sends passes ---------------------------------------------------------------
def _admin(url: str, route: str) -> dict:
    with urllib.request.urlopen(f"{url}/_admin/{route}", timeout=10) as resp:
        return json.loads(resp.read())


def test_the_request_log_counts_requests_and_refusals_by_operation_and_kind():
    with start_service() as service:
        control = boto3.client(CONTROL_PLANE, endpoint_url=service.url, config=NO_CHECKS)
        runtime = boto3.client(RUNTIME, endpoint_url=service.url, config=NO_CHECKS)
        control.list_training_sessions()
        with pytest.raises(ClientError):
            control.list_training_sessions(MaxResults=0)
        with pytest.raises(ClientError):
            runtime.execute_sampling_operation(trainingSessionName="no-such-session", operationConfig=sample_config())
        assert _admin(service.url, "requests")["requests"] == {
            "ListTrainingSessions": {"requests": 2, "errors": {"ValidationException": 1}},
            "ExecuteSamplingOperation": {"requests": 1, "errors": {"ResourceNotFoundException": 1}},
            "sample": {"requests": 1, "errors": {"ResourceNotFoundException": 1}},
        }


@pytest.mark.slow
def test_every_request_of_a_training_run_and_its_resume_passes(tmp_path):
    """``python -m steps.train`` for two steps, then again to three: the rerun resumes (loadState)."""
    split = write_split(tmp_path / "data", 200, 40, seed=5)
    with start_service() as service:
        for max_steps in (2, 3):
            proc = start_training(tmp_path, split, service, "batch_size=4", "save_every=1", "eval_every=0",
                                  "eval_size=8", f"max_steps={max_steps}")
            out, _ = proc.communicate(timeout=300)
            assert proc.returncode == 0, out
        requests = _admin(service.url, "requests")["requests"]
    assert [r["step"] for r in step_records(tmp_path)] == [1, 2, 3]
    refused = {key: r["errors"] for key, r in requests.items() if r["errors"]}
    assert refused == {}, refused
    loop_kinds = {"sample", "forwardBackward", "optimizerStep", "saveWeights", "saveState", "loadState"}
    assert loop_kinds <= set(requests), requests
    assert all(requests[kind]["requests"] > 0 for kind in loop_kinds)
