"""Wire handling of the local service, as moto's ``responses.py``: every request is
parsed, validated, handed to the backend (``models``) in one call, and answered here.

A handler parses its request into what the backend takes (a runtime operation
becomes a ``work.Work``), makes one backend call, and shapes what comes back:
a runtime result from the operation's ``work.Outcome`` (with the ``tokenUsage``
botocore's runtime model declares), a control-plane description from the
backend object's ``describe()``/``detail()``. Refused requests are logged, one line each.

Validation happens once, in :func:`dispatch`, before any lookup, in two layers:

1. **botocore's service model** (:mod:`pipeline.shapes`): every member the
   operation's input shape declares, checked for required, type (``Integer``
   32-bit, ``Long`` 64-bit), min/max, length, pattern, enum and union, with URI
   members (``trainingSessionName``, ``operationId``) taken from the path;
2. **what the model cannot say**, by hand, in the handlers: per-token loss inputs
   as long as the datum, token ids inside the toy vocabulary, the loss inputs each
   loss function needs (``toy.losses.LOSS_FNS``), ``lossFnConfig``'s keys and clip
   bounds (an open Document in the model), the one base model served here. What
   depends on the backend's state (a session or model package that exists) the
   backend checks, in the same call.

A violation is a ``ValidationException`` in botocore's error shape for the
operation's protocol: control plane (``sagemaker``, JSON 1.1) HTTP 400
``{"__type", "message"}``; runtime (rest-json) the error's status with an
``x-amzn-ErrorType`` header and ``{"message"}``. The message names the member.
Something that does not exist is ``ResourceNotFound`` on the control plane and
``ResourceNotFoundException`` (404) on the runtime, as each model names it.
"""
from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

from local.training_session.exceptions import NotFound, ServiceError, invalid
from local.training_session.models import TrainingSessionBackend
from local.training_session.sessions import OperationState
from local.training_session.toy.adam import AdamConfig
from local.training_session.toy.losses import ACCEPTED_INPUTS, CLIP_RANGES, LOSS_FNS
from local.training_session.toy.policy import DatumArrays
from local.training_session.toy.tokenizer import BASE_MODEL_NAME, HF_FILES, ToyTokenizer
from local.training_session.work import (
    Done,
    LoadSamplerWork,
    LoadWork,
    Logprobs,
    LogprobsWork,
    LossOutcome,
    LossWork,
    Metrics,
    OptimWork,
    Outcome,
    Sampled,
    SampleWork,
    Saved,
    SaveWork,
    Work,
)
from pipeline.shapes import input_shape, violations

logger = logging.getLogger(__name__)

CONTROL_PLANE = "sagemaker"
RUNTIME = "sagemakertrainingsessionruntime"
#: Account of model package groups created by name alone (CreateModelPackageGroup).
DEFAULT_ACCOUNT = "123456789012"
VOCAB_SIZE = ToyTokenizer().vocab_size
#: The toy's context as its Hub document states it: a toy prompt (~40 tokens) plus the API's minimum max_tokens.
TOY_SEQUENCE_LENGTH = "1K"
_HUB_ARN = re.compile(r"^arn:[\w-]+:sagemaker:[\w-]+:aws:hub-content/SageMakerPublicHub/Model/"
                      r"(?P<name>[^/]+)/(?P<version>[^/]+)$")
_CREDENTIAL_REGION = re.compile(r"Credential=[^/]+/\d{8}/(?P<region>[\w-]+)/")


def base_model_arn(region: str = "us-west-2", version: str = "1.0.0") -> str:
    """The Hub ARN that selects the local base model."""
    return f"arn:aws:sagemaker:{region}:aws:hub-content/SageMakerPublicHub/Model/{BASE_MODEL_NAME}/{version}"


# -- requests and responses -------------------------------------------------------
@dataclass(frozen=True)
class Request:
    """An HTTP request as the transport received it, routed to an API operation."""

    service: str  # CONTROL_PLANE or RUNTIME: the botocore service model, and the error shape
    operation: str
    path: str
    raw: bytes
    uri_params: Mapping[str, str] = field(default_factory=dict)  # runtime URI members, unquoted
    authorization: str = ""

    @functools.cached_property
    def body(self) -> Any:
        try:
            return json.loads(self.raw or b"{}")
        except ValueError:
            raise invalid("(request): the body is not valid JSON") from None

    def params(self) -> dict[str, Any]:
        """The operation's input members: the JSON body, and the URI members from the path."""
        if not isinstance(self.body, dict):
            raise invalid(f"(request): the body must be a JSON object, got {type(self.body).__name__}")
        return {**self.body, **self.uri_params}

    @property
    def kind(self) -> str | None:
        """A runtime submit's operation kind: the member of ``operationConfig`` it sets."""
        try:
            config = self.body.get("operationConfig") if isinstance(self.body, dict) else None
        except ServiceError:
            return None
        members = [k for k, v in config.items() if v is not None] if isinstance(config, dict) else []
        return members[0] if len(members) == 1 else None

    @property
    def region(self) -> str:
        match = _CREDENTIAL_REGION.search(self.authorization)
        return match["region"] if match else "us-west-2"


@dataclass(frozen=True)
class Response:
    status: int
    payload: dict[str, Any]
    content_type: str = "application/json"
    error_code: str | None = None  # sent as x-amzn-ErrorType


def error_response(service: str, error: ServiceError) -> Response:
    """``error`` in botocore's error shape for the service's protocol."""
    if service == CONTROL_PLANE:
        return Response(400, {"__type": error.code, "message": error.message},
                        "application/x-amz-json-1.1", error.code)
    if isinstance(error, NotFound):  # the runtime model's name and status for it
        return Response(404, {"message": error.message}, error_code="ResourceNotFoundException")
    return Response(error.status, {"message": error.message}, error_code=error.code)


def _success(request: Request, payload: dict[str, Any]) -> Response:
    content_type = "application/x-amz-json-1.1" if request.service == CONTROL_PLANE else "application/json"
    return Response(200, payload, content_type)


def dispatch(backend: TrainingSessionBackend, request: Request) -> Response:
    """Validate the request against botocore's model, run its handler, shape the answer."""
    params: dict[str, Any] = {}
    try:
        params = request.params()
        _check_model(request.service, request.operation, params)
        return _success(request, HANDLERS[request.operation](backend, params, request.region))
    except ServiceError as e:
        if request.operation == "ExecuteTrainingOperation":
            _spend_sequence_number(backend, params, e)
        response = error_response(request.service, e)
        _log_refusal(request, params, response)
        return response


def _log_refusal(request: Request, params: dict[str, Any], response: Response) -> None:
    name = params.get("TrainingSessionName") or params.get("trainingSessionName")
    about = f" (session {name})" if isinstance(name, str) else ""
    logger.info("refused %s%s%s: %s %s: %s", request.operation, about, f" {request.kind}" if request.kind else "",
                response.status, response.error_code, response.payload.get("message"))


def _check_model(service: str, operation: str, params: dict[str, Any]) -> None:
    problems = violations(input_shape(service, operation), params)
    if problems:
        count = f"{len(problems)} validation error{'s' if len(problems) > 1 else ''} detected"
        raise invalid(f"{count}: " + "; ".join(p.message for p in problems))


def _spend_sequence_number(backend: TrainingSessionBackend, params: dict[str, Any], error: ServiceError) -> None:
    """The SDK spends a sequence number on a refused submit (it does not retry a 4xx
    other than throttling): tell the session, so the operations behind it fail rather
    than wait for it in vain."""
    name, seq = params.get("trainingSessionName"), params.get("sequenceNumber")
    if isinstance(name, str) and isinstance(seq, int) and not isinstance(seq, bool):
        backend.refused(name, seq, error)


Handler = Callable[[TrainingSessionBackend, dict[str, Any], str], dict[str, Any]]


# -- control plane ----------------------------------------------------------------------
def _served_base_model(arn: str, region: str) -> tuple[str, str]:
    match = _HUB_ARN.match(arn)
    if not match or match["name"] != BASE_MODEL_NAME:
        raise invalid(f"ModelConfig.BaseModelArn {arn!r} is not served here: the local training-session "
                      f"service serves only {BASE_MODEL_NAME!r}, e.g. {base_model_arn(region)} "
                      "(any version)")
    return match["name"], match["version"]


def create_training_session(backend: TrainingSessionBackend, params: dict[str, Any], region: str) -> dict[str, Any]:
    base_model = _served_base_model(params["ModelConfig"]["BaseModelArn"], region)
    group_arn = params.get("ModelPackageGroupArn")
    if not group_arn:
        raise invalid("ModelPackageGroupArn is required by the local service (it registers "
                      "saved weights there)")
    session = backend.create_session(
        name=params["TrainingSessionName"], region=region, group_arn=group_arn, base_model=base_model,
        output_path=params["OutputConfig"]["S3Location"]["Path"],
        request={k: v for k, v in params.items() if k != "TrainingSessionName"})
    return {"TrainingSessionArn": session.arn}


def describe_training_session(backend: TrainingSessionBackend, params: dict[str, Any], region: str) -> dict[str, Any]:
    return {"TrainingSessionDetail": backend.session(params["TrainingSessionName"]).detail()}


def stop_training_session(backend: TrainingSessionBackend, params: dict[str, Any], region: str) -> dict[str, Any]:
    backend.stop_session(params["TrainingSessionName"])
    return {}


def delete_training_session(backend: TrainingSessionBackend, params: dict[str, Any], region: str) -> dict[str, Any]:
    backend.delete_session(params["TrainingSessionName"])
    return {}


def _page(items: list[Any], params: dict[str, Any], key: str) -> dict[str, Any]:
    """One page of ``items`` under ``key``, with NextToken as an offset."""
    token = params.get("NextToken") or "0"
    if not token.isdigit():
        raise invalid(f"NextToken {token!r} was not issued by this service")
    start = int(token)
    size = params.get("MaxResults") or 100
    page: dict[str, Any] = {key: items[start:start + size]}
    if start + size < len(items):
        page["NextToken"] = str(start + size)
    return page


def list_training_sessions(backend: TrainingSessionBackend, params: dict[str, Any], region: str) -> dict[str, Any]:
    contains, status = params.get("NameContains"), params.get("StatusEquals")
    sessions = sorted(backend.sessions(), key=lambda s: s.created, reverse=True)
    summaries = [s.summary() for s in sessions
                 if (not contains or contains in s.name) and (not status or s.status == status)]
    return _page(summaries, params, "TrainingSessionSummaries")


def describe_model_package(backend: TrainingSessionBackend, params: dict[str, Any], region: str) -> dict[str, Any]:
    return backend.registry.get(params["ModelPackageName"]).describe()


def list_model_packages(backend: TrainingSessionBackend, params: dict[str, Any], region: str) -> dict[str, Any]:
    group = params.get("ModelPackageGroupName")
    if not group:
        raise invalid("ModelPackageGroupName is required by the local service")
    packages = backend.registry.list(group)
    if params.get("SortBy") == "Name":
        packages.sort(key=lambda p: p.version)
    if params.get("SortOrder", "Ascending") == "Descending":
        packages.reverse()
    approval = params.get("ModelApprovalStatus")
    summaries = [p.summary() for p in packages if not approval or p.approval_status == approval]
    return _page(summaries, params, "ModelPackageSummaryList")


def update_model_package(backend: TrainingSessionBackend, params: dict[str, Any], region: str) -> dict[str, Any]:
    package = backend.registry.update_approval(
        params["ModelPackageArn"], params.get("ModelApprovalStatus"), params.get("ApprovalDescription"),
        params.get("CustomerMetadataProperties"), params.get("CustomerMetadataPropertiesToRemove"))
    return {"ModelPackageArn": package.arn}


def delete_model_package(backend: TrainingSessionBackend, params: dict[str, Any], region: str) -> dict[str, Any]:
    backend.registry.delete(params["ModelPackageName"])
    return {}


def create_model_package_group(backend: TrainingSessionBackend, params: dict[str, Any],
                               region: str) -> dict[str, Any]:
    group = backend.registry.create_group(params["ModelPackageGroupName"], region, DEFAULT_ACCOUNT,
                                          params.get("ModelPackageGroupDescription") or "")
    return {"ModelPackageGroupArn": group.arn}


def describe_model_package_group(backend: TrainingSessionBackend, params: dict[str, Any],
                                 region: str) -> dict[str, Any]:
    return backend.registry.group(params["ModelPackageGroupName"]).describe()


def describe_hub_content(backend: TrainingSessionBackend, params: dict[str, Any], region: str) -> dict[str, Any]:
    name = params["HubContentName"]
    if name != BASE_MODEL_NAME:
        raise NotFound(f"Hub content {name!r} does not exist; the local service's only model is "
                       f"{BASE_MODEL_NAME!r}")
    version = params.get("HubContentVersion") or "1.0.0"
    hub_arn = f"arn:aws:sagemaker:{region}:aws:hub/SageMakerPublicHub"
    return {
        "HubContentName": name, "HubContentArn": base_model_arn(region, version),
        "HubContentVersion": version, "HubContentType": "Model", "DocumentSchemaVersion": "2.0.0",
        "HubName": "SageMakerPublicHub", "HubArn": hub_arn, "HubContentStatus": "Available",
        "HubContentDisplayName": "Local toy arithmetic policy", "CreationTime": 0,
        # What the steps read, as from a real model's document: the tokenizer's Hugging Face id (here a
        # directory of the toy tokenizer's Hugging Face files, which AutoTokenizer loads like a hub id) and
        # the recipes' sequence-length ceiling, the longest prompt plus completion the model serves.
        "HubContentDocument": json.dumps({"ModelName": name, "HuggingfaceId": str(HF_FILES),
                                          "RecipeCollection": [{"CustomizationTechnique": "RLVR",
                                                                "SequenceLength": TOY_SEQUENCE_LENGTH}]}),
    }


# -- runtime: the hand-written rules -------------------------------------------------------
def _tokens(model_input: dict[str, Any], where: str) -> list[int]:
    """A ModelInput's encoded_text chunks as one token list, each id inside the toy vocabulary."""
    chunks = model_input["chunks"]
    if not chunks:
        raise invalid(f"{where}.chunks: holds no chunk; send at least one encoded_text chunk")
    tokens: list[int] = []
    for i, chunk in enumerate(chunks):
        bad = [t for t in chunk["tokens"] if not 0 <= t < VOCAB_SIZE]
        if bad:
            raise invalid(f"{where}.chunks[{i}].tokens: ids {bad[:5]} are outside the vocabulary "
                          f"[0, {VOCAB_SIZE}) of the {BASE_MODEL_NAME} model")
        tokens.extend(chunk["tokens"])
    if not tokens:
        raise invalid(f"{where}: holds no tokens")
    return tokens


def _tensor_values(tensor: dict[str, Any], where: str) -> list[float]:
    """A TensorData's ``data`` (a flat or nested list; an open Document in the model) as one list of numbers."""
    flat: list[Any] = []
    stack = [tensor["data"]]
    while stack:  # iterative flatten, preserving order
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(reversed(node))
        else:
            flat.append(node)
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in flat):
        raise invalid(f"{where}.data: must hold only numbers")
    if not all(math.isfinite(v) for v in flat):
        raise invalid(f"{where}.data: holds NaN or infinite values")
    return flat


def _datum(datum: dict[str, Any], where: str, loss_fn: str) -> DatumArrays:
    tokens = _tokens(datum["modelInput"], f"{where}.modelInput")
    raw_inputs = datum.get("lossFnInputs") or {}
    unsupported = sorted(set(raw_inputs) - set(ACCEPTED_INPUTS))
    if unsupported:
        raise invalid(f"{where}.lossFnInputs: has unsupported keys {unsupported}; supported: {list(ACCEPTED_INPUTS)}")
    required = LOSS_FNS[loss_fn].required_inputs
    missing = [k for k in required if k not in raw_inputs]
    if missing:
        raise invalid(f"{where}.lossFnInputs: is missing {missing}, which loss function {loss_fn!r} "
                      f"requires (it requires {list(required)})")
    inputs: dict[str, np.ndarray] = {}
    for key, tensor in raw_inputs.items():
        at = f"{where}.lossFnInputs[{key!r}]"
        values = _tensor_values(tensor, at)
        if len(values) != len(tokens):
            raise invalid(f"{at}: has {len(values)} values but modelInput has {len(tokens)} tokens; "
                          "per-token inputs cover the prompt too")
        if key == "target_tokens" and any(v != int(v) or not 0 <= v < VOCAB_SIZE for v in values):
            raise invalid(f"{at}: must hold whole token ids in the vocabulary [0, {VOCAB_SIZE})")
        inputs[key] = np.asarray(values, dtype=np.int64 if key == "target_tokens" else np.float32)
    if "temperature" in inputs:
        bad = (inputs["temperature"] <= 0) & (inputs["weights"] != 0)
        if bad.any():
            raise invalid(f"{where}.lossFnInputs['temperature']: must be > 0 where the weight is not 0 "
                          f"(position {int(np.argmax(bad))})")
    return DatumArrays(tokens=np.asarray(tokens, dtype=np.int64), inputs=inputs)


def _loss_config(config: Any, where: str) -> dict[str, float] | None:
    """``lossFnConfig`` (an open Document in the model): only the clip bounds, each in its range."""
    if config is None:
        return None
    if not isinstance(config, dict):
        raise invalid(f"{where}: must be an object with {' and/or '.join(CLIP_RANGES)}")
    unknown = sorted(set(config) - set(CLIP_RANGES))
    if unknown:
        raise invalid(f"{where}: has unsupported keys {unknown}; supported: {list(CLIP_RANGES)}")
    for key, value in config.items():
        lo, hi, lo_open = CLIP_RANGES[key]
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value <= hi
        if not (ok and (value > lo if lo_open else value >= lo)):
            span = f"({lo}, {hi}]" if lo_open else f"[{lo}, {hi}]"
            raise invalid(f"{where}.{key}: {value!r} is out of range: it bounds the probability ratio "
                          f"and must be in {span} (PPO's epsilon 0.2 is {{0.8, 1.2}})")
    return {key: float(value) for key, value in config.items()}


# -- runtime: requests into work ---------------------------------------------------------------
def _loss_work(kind: str, config: dict[str, Any]) -> Work:
    where = f"operationConfig.{kind}"
    loss_fn = config["lossFnName"]
    if not config["datumList"]:
        raise invalid(f"{where}.datumList: holds no datum; send at least one")
    datums = tuple(_datum(d, f"{where}.datumList[{i}]", loss_fn) for i, d in enumerate(config["datumList"]))
    return LossWork(kind, datums, loss_fn, _loss_config(config.get("lossFnConfig"), f"{where}.lossFnConfig"))


#: adamParamsConfig member -> AdamConfig field (the model checks each one's range).
_ADAM_FIELDS = {"learningRate": "learning_rate", "beta1": "beta1", "beta2": "beta2", "eps": "eps",
                "weightDecay": "weight_decay", "gradClipNorm": "grad_clip_norm",
                "loraPlusLrRatio": "lora_plus_lr_ratio"}


def _optim_work(kind: str, config: dict[str, Any]) -> Work:
    params = config["adamParamsConfig"]
    return OptimWork(AdamConfig(**{_ADAM_FIELDS[k]: float(v) for k, v in params.items() if v is not None
                                   # The model allows gradClipNorm 0; as in Tinker's AdamParams, 0 means no clipping.
                                   and not (k == "gradClipNorm" and v == 0)}))


def _save_work(kind: str, config: dict[str, Any]) -> Work:
    return SaveWork(kind, config.get("description") or "")


def _load_work(kind: str, config: dict[str, Any]) -> Work:
    return LoadWork(config["modelPackageArn"], config["loadOptimizer"])


def _sample_work(kind: str, config: dict[str, Any]) -> Work:
    where = "operationConfig.sample"
    prompt = _tokens(config["prompt"], f"{where}.prompt")
    if config.get("topkPromptLogprobs"):
        raise invalid(f"{where}.topkPromptLogprobs: is not supported by the local service; "
                      "use includePromptLogprobs")
    params = config["samplingParams"]
    top_k, stop = params.get("topK"), params.get("stop")
    if top_k is not None and top_k < 1 and top_k != -1:
        raise invalid(f"{where}.samplingParams.topK: {top_k} must be >= 1, or -1 to disable it")
    if stop is not None and not all(stop):
        raise invalid(f"{where}.samplingParams.stop: must be a list of non-empty strings")
    return SampleWork(tuple(prompt), config["numSamples"], params["maxTokens"], temperature=params.get("temperature"),
                      top_k=None if top_k == -1 else top_k, top_p=params.get("topP"), seed=params.get("seed"),
                      stop=tuple(stop or ()), model_package_arn=config.get("modelPackageArn"),
                      with_prompt_logprobs=bool(config.get("includePromptLogprobs")))


def _logprobs_work(kind: str, config: dict[str, Any]) -> Work:
    prompt = _tokens(config["prompt"], "operationConfig.computeLogprobs.prompt")
    return LogprobsWork(tuple(prompt), config.get("modelPackageArn"))


def _load_sampler_work(kind: str, config: dict[str, Any]) -> Work:
    return LoadSamplerWork(config["modelPackageArn"])


#: Each operationConfig member, parsed and checked into the work the backend runs.
WORK: dict[str, Callable[[str, dict[str, Any]], Work]] = {
    "forward": _loss_work, "forwardBackward": _loss_work, "optimizerStep": _optim_work,
    "saveState": _save_work, "saveWeights": _save_work, "loadState": _load_work,
    "sample": _sample_work, "computeLogprobs": _logprobs_work, "loadWeightsForSampling": _load_sampler_work,
}


# -- runtime: the operations -----------------------------------------------------------------
def _work(params: dict[str, Any]) -> Work:
    """The work of the one member set in the operationConfig union (the model has checked there is one)."""
    kind, config = next((k, v) for k, v in params["operationConfig"].items() if v is not None)
    return WORK[kind](kind, config)


def execute_training_operation(backend: TrainingSessionBackend, params: dict[str, Any],
                               region: str) -> dict[str, Any]:
    seq = params["sequenceNumber"]
    fingerprint = hashlib.sha256(json.dumps([seq, params["operationConfig"]], sort_keys=True).encode()).hexdigest()
    operation = backend.submit_training(params["trainingSessionName"], seq, params.get("clientToken"), fingerprint,
                                        _work(params))
    return {"operationId": operation.id}


def execute_sampling_operation(backend: TrainingSessionBackend, params: dict[str, Any],
                               region: str) -> dict[str, Any]:
    return {"operationId": backend.submit_sampling(params["trainingSessionName"], _work(params)).id}


def get_training_operation_result(backend: TrainingSessionBackend, params: dict[str, Any],
                                  region: str) -> dict[str, Any]:
    return _result_body(backend.operation_state(params["trainingSessionName"], params["operationId"], True))


def get_sampling_operation_result(backend: TrainingSessionBackend, params: dict[str, Any],
                                  region: str) -> dict[str, Any]:
    return _result_body(backend.operation_state(params["trainingSessionName"], params["operationId"], False))


# -- runtime: result shapes --------------------------------------------------------------------
def _result_body(state: OperationState) -> dict[str, Any]:
    """Get*OperationResult body. ``operationResult`` only once Completed (botocore rejects an empty union),
    ``errorDetails`` only on a failure; a training result's ``tokenUsage`` as its model places it: a forward
    or forward_backward's, at the top and in the result."""
    body: dict[str, Any] = {"status": state.status}
    if state.outcome is not None:
        body["operationResult"] = {state.kind: _shape(state.outcome)}
        if state.training and isinstance(state.outcome, LossOutcome):
            body["tokenUsage"] = _training_usage(state.outcome)
    elif state.error:
        body["errorDetails"] = state.error
    return body


def _float(value: float) -> float:
    # JSON has no NaN/Infinity; botocore would choke on the bare tokens.
    value = float(value)
    return value if math.isfinite(value) else 0.0


def _training_usage(outcome: LossOutcome) -> dict[str, int]:
    """TrainingTokenUsage: the datums' tokens (an Integer; no single request carries 2^31 tokens)."""
    return {"trainingTokens": outcome.tokens}


def _loss_result(outcome: LossOutcome) -> dict[str, Any]:
    """ForwardResult / ForwardBackwardResult body: metrics, per-datum TensorData and the token usage."""
    tensors = [
        {key: {"data": [_float(v) for v in values], "dtype": "float32", "shape": [len(values)]}
         for key, values in entry.items()}
        for entry in outcome.outputs
    ]
    return {"metrics": {k: _float(v) for k, v in outcome.metrics.items()},
            "lossFnOutputs": tensors, "lossFnOutputType": "TensorData", "tokenUsage": _training_usage(outcome)}


def _sample_result(outcome: Sampled) -> dict[str, Any]:
    """SampleResponse body; each SampledSequence's tokenUsage: the prompt it continued and the tokens it added."""
    body: dict[str, Any] = {"sequences": [
        {"stopReason": s.stop_reason, "tokens": [int(t) for t in s.tokens],
         "logprobs": [_float(v) for v in s.logprobs],
         "tokenUsage": {"prefill": outcome.prompt_tokens, "decode": len(s.tokens)}}
        for s in outcome.sequences
    ]}
    if outcome.prompt_logprobs is not None:
        # The SDK's SampleResponse rejects a null in this list, while the first
        # prompt token has no logprob; report it as 0.0 (log 1: nothing predicted).
        body["promptLogprobs"] = [0.0 if v is None else _float(v) for v in outcome.prompt_logprobs]
    return body


def _logprobs_result(outcome: Logprobs) -> dict[str, Any]:
    """ComputeLogprobsResult body; a null first entry is what the SDK expects here."""
    return {"logprobs": [None if v is None else _float(v) for v in outcome.logprobs]}


#: Each outcome's result shape (the member of OperationResult / SampleOperationResult named by its kind).
RESULT_SHAPES: dict[type[Outcome], Callable[[Any], dict[str, Any]]] = {
    LossOutcome: _loss_result,
    Metrics: lambda outcome: {"metrics": {k: float(v) for k, v in outcome.metrics.items()}},
    Saved: lambda outcome: {"modelPackageArn": outcome.model_package_arn},
    Done: lambda outcome: {},
    Sampled: _sample_result,
    Logprobs: _logprobs_result,
}


def _shape(outcome: Outcome) -> dict[str, Any]:
    return RESULT_SHAPES[type(outcome)](outcome)


#: Every operation served, by name: control plane first, then runtime.
HANDLERS: dict[str, Handler] = {
    "CreateTrainingSession": create_training_session,
    "DescribeTrainingSession": describe_training_session,
    "StopTrainingSession": stop_training_session,
    "DeleteTrainingSession": delete_training_session,
    "ListTrainingSessions": list_training_sessions,
    "DescribeModelPackage": describe_model_package,
    "ListModelPackages": list_model_packages,
    "UpdateModelPackage": update_model_package,
    "DeleteModelPackage": delete_model_package,
    "CreateModelPackageGroup": create_model_package_group,
    "DescribeModelPackageGroup": describe_model_package_group,
    "DescribeHubContent": describe_hub_content,
    "ExecuteTrainingOperation": execute_training_operation,
    "GetTrainingOperationResult": get_training_operation_result,
    "ExecuteSamplingOperation": execute_sampling_operation,
    "GetSamplingOperationResult": get_sampling_operation_result,
}
RUNTIME_OPERATIONS = ("ExecuteTrainingOperation", "GetTrainingOperationResult",
                      "ExecuteSamplingOperation", "GetSamplingOperationResult")
CONTROL_PLANE_OPERATIONS = tuple(op for op in HANDLERS if op not in RUNTIME_OPERATIONS)
