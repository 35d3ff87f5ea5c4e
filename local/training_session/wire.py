"""Request and result shapes of the training-session runtime, as botocore models them.

Pure functions: a request body's ``operationConfig`` in, the Policy's argument
types out (validated the way the real service validates them, so a bad request
is a ``ValidationException`` at submit time), and the Policy's results back into
the result shapes the SDK parses. No state, no HTTP.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from local.training_session.policy import AdamConfig, DatumArrays, SampledSeq


class ServiceError(Exception):
    """An error answered on the wire: an error code, an HTTP status and a message."""

    def __init__(self, code: str, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status


def invalid(message: str) -> ServiceError:
    return ServiceError("ValidationException", message, 400)


LOSS_FNS = ("cross_entropy", "importance_sampling", "ppo", "cispo")
_RL_INPUTS = ("target_tokens", "weights", "logprobs", "advantages")
REQUIRED_INPUTS: Mapping[str, tuple[str, ...]] = {
    "cross_entropy": ("target_tokens", "weights"),
    "importance_sampling": _RL_INPUTS,
    "ppo": _RL_INPUTS,
    "cispo": _RL_INPUTS,
}
#: The only lossFnInputs keys the service accepts (botocore's Datum docs).
SUPPORTED_INPUTS = ("target_tokens", "weights", "advantages", "logprobs", "ref_log_prob", "temperature")
#: Bounds on the probability ratio: (low, high, low is exclusive).
CLIP_BOUNDS = {"clip_low_threshold": (0.0, 1.0, True), "clip_high_threshold": (1.0, 10.0, False)}


@dataclass(frozen=True)
class LossCall:
    """Arguments of a forward or forwardBackward operation."""

    loss_fn: str
    datums: list[DatumArrays]
    loss_fn_config: dict[str, float] | None


@dataclass(frozen=True)
class SampleCall:
    """Arguments of a sample operation."""

    prompt: list[int]
    num_samples: int
    max_tokens: int
    temperature: float | None
    top_k: int | None
    top_p: float | None
    seed: int | None
    stop: list[str] | None
    include_prompt_logprobs: bool
    model_package_arn: str | None


def only_member(config: Any, allowed: Sequence[str], field: str) -> tuple[str, dict[str, Any]]:
    """The one member set in a union such as ``operationConfig``."""
    if not isinstance(config, dict):
        raise invalid(f"{field} must be an object with exactly one of {list(allowed)}")
    present = [k for k, v in config.items() if v is not None]
    if len(present) != 1 or present[0] not in allowed:
        raise invalid(f"{field} must set exactly one of {list(allowed)}, got {present}")
    body = config[present[0]]
    if not isinstance(body, dict):
        raise invalid(f"{field}.{present[0]} must be an object")
    return present[0], body


def model_input_tokens(model_input: Any, field: str, vocab_size: int) -> list[int]:
    """Concatenate a ModelInput's encoded_text chunks into one token list."""
    chunks = model_input.get("chunks") if isinstance(model_input, dict) else None
    if not isinstance(chunks, list) or not chunks:
        raise invalid(f"{field}.chunks must be a non-empty list of encoded_text chunks")
    tokens: list[int] = []
    for i, chunk in enumerate(chunks):
        where = f"{field}.chunks[{i}]"
        if not isinstance(chunk, dict) or chunk.get("type") != "encoded_text":
            raise invalid(f"{where} must be {{'type': 'encoded_text', 'tokens': [...]}}")
        ids = chunk.get("tokens")
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise invalid(f"{where}.tokens must be a list of integer token ids")
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise invalid(f"{where}.tokens has ids {bad[:5]} outside the vocabulary "
                          f"[0, {vocab_size}) of the local-toy-arith model")
        tokens.extend(ids)
    if not tokens:
        raise invalid(f"{field} holds no tokens")
    return tokens


def _tensor_values(value: Any, field: str) -> list[Any]:
    """Flatten a TensorData's ``data`` (a flat or nested list) to one list."""
    if not isinstance(value, dict) or "data" not in value:
        raise invalid(f"{field} must be a TensorData object {{'data': [...], 'dtype': ..., 'shape': [...]}}")
    data = value["data"]
    flat: list[Any] = []
    stack = [data]
    while stack:  # iterative flatten, preserving order
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(reversed(node))
        else:
            flat.append(node)
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in flat):
        raise invalid(f"{field}.data must hold only numbers")
    return flat


def _datum(datum: Any, index: int, loss_fn: str, vocab_size: int) -> DatumArrays:
    field = f"datumList[{index}]"
    if not isinstance(datum, dict):
        raise invalid(f"{field} must be an object with modelInput and lossFnInputs")
    tokens = model_input_tokens(datum.get("modelInput"), f"{field}.modelInput", vocab_size)
    inputs_raw = datum.get("lossFnInputs") or {}
    if not isinstance(inputs_raw, dict):
        raise invalid(f"{field}.lossFnInputs must be a map of name to TensorData")
    unsupported = sorted(set(inputs_raw) - set(SUPPORTED_INPUTS))
    if unsupported:
        raise invalid(f"{field}.lossFnInputs has unsupported keys {unsupported}; "
                      f"supported: {list(SUPPORTED_INPUTS)}")
    missing = [k for k in REQUIRED_INPUTS[loss_fn] if k not in inputs_raw]
    if missing:
        raise invalid(f"{field}.lossFnInputs is missing {missing}, which loss function "
                      f"{loss_fn!r} requires (it requires {list(REQUIRED_INPUTS[loss_fn])})")
    inputs: dict[str, np.ndarray] = {}
    for key, value in inputs_raw.items():
        values = _tensor_values(value, f"{field}.lossFnInputs[{key!r}]")
        if len(values) != len(tokens):
            raise invalid(f"{field}.lossFnInputs[{key!r}] has {len(values)} values but modelInput "
                          f"has {len(tokens)} tokens; per-token inputs cover the prompt too")
        if not all(math.isfinite(v) for v in values):
            raise invalid(f"{field}.lossFnInputs[{key!r}] holds NaN or infinite values")
        if key == "target_tokens" and any(v != int(v) for v in values):
            raise invalid(f"{field}.lossFnInputs['target_tokens'] must hold whole token ids")
        inputs[key] = np.asarray(values, dtype=np.int64 if key == "target_tokens" else np.float32)
    bad_targets = [int(t) for t in inputs["target_tokens"] if not 0 <= t < vocab_size]
    if bad_targets:
        raise invalid(f"{field}.lossFnInputs['target_tokens'] has ids {bad_targets[:5]} "
                      f"outside the vocabulary [0, {vocab_size})")
    return DatumArrays(tokens=np.asarray(tokens, dtype=np.int64), inputs=inputs)


def loss_config(config: Any) -> dict[str, float] | None:
    """Validate ``lossFnConfig``: only the clip bounds, each in its range."""
    if config is None:
        return None
    if not isinstance(config, dict):
        raise invalid("lossFnConfig must be an object")
    unknown = sorted(set(config) - set(CLIP_BOUNDS))
    if unknown:
        raise invalid(f"lossFnConfig has unsupported keys {unknown}; supported: {list(CLIP_BOUNDS)}")
    out: dict[str, float] = {}
    for key, value in config.items():
        lo, hi, lo_open = CLIP_BOUNDS[key]
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value <= hi
        ok = ok and (value > lo if lo_open else value >= lo)
        if not ok:
            span = f"({lo}, {hi}]" if lo_open else f"[{lo}, {hi}]"
            raise invalid(f"lossFnConfig.{key}={value!r} is out of range: it bounds the "
                          f"probability ratio and must be in {span}")
        out[key] = float(value)
    return out


def loss_call(config: dict[str, Any], vocab_size: int) -> LossCall:
    """Parse a ``forward`` / ``forwardBackward`` config."""
    loss_fn = config.get("lossFnName")
    if loss_fn not in LOSS_FNS:
        raise invalid(f"lossFnName={loss_fn!r} is not supported; use one of {list(LOSS_FNS)}")
    datum_list = config.get("datumList")
    if not isinstance(datum_list, list) or not datum_list:
        raise invalid("datumList must hold at least one datum")
    datums = [_datum(d, i, loss_fn, vocab_size) for i, d in enumerate(datum_list)]
    return LossCall(loss_fn=loss_fn, datums=datums, loss_fn_config=loss_config(config.get("lossFnConfig")))


#: adamParamsConfig field -> (AdamConfig field, low, high): botocore's documented ranges.
_ADAM_FIELDS = {
    "learningRate": ("learning_rate", 0.0, 0.01),
    "beta1": ("beta1", 0.0, 0.999999),
    "beta2": ("beta2", 0.0, 0.999999),
    "eps": ("eps", 1e-16, 0.01),
    "weightDecay": ("weight_decay", 0.0, 1.0),
    "gradClipNorm": ("grad_clip_norm", 0.0, 100.0),
    "loraPlusLrRatio": ("lora_plus_lr_ratio", 1.0, 100.0),
}


def adam_config(config: dict[str, Any]) -> AdamConfig:
    """Parse ``optimizerStep.adamParamsConfig``; fields left out keep AdamConfig's defaults."""
    params = config.get("adamParamsConfig")
    if not isinstance(params, dict):
        raise invalid("optimizerStep.adamParamsConfig is required")
    unknown = sorted(set(params) - set(_ADAM_FIELDS))
    if unknown:
        raise invalid(f"adamParamsConfig has unknown keys {unknown}; known: {list(_ADAM_FIELDS)}")
    learning_rate = params.get("learningRate")
    if not isinstance(learning_rate, (int, float)) or isinstance(learning_rate, bool) or learning_rate <= 0:
        raise invalid(f"adamParamsConfig.learningRate={learning_rate!r} is required and must be > 0")
    kwargs: dict[str, float] = {}
    for wire_name, (name, lo, hi) in _ADAM_FIELDS.items():
        value = params.get(wire_name)
        if value is None:
            continue
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not lo <= value <= hi:
            raise invalid(f"adamParamsConfig.{wire_name}={value!r} must be in [{lo}, {hi}]")
        kwargs[name] = float(value)
    return AdamConfig(**kwargs)


def _optional_number(params: dict[str, Any], key: str, lo: float, hi: float) -> float | None:
    value = params.get(key)
    if value is None:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not lo <= value <= hi:
        raise invalid(f"samplingParams.{key}={value!r} must be in [{lo}, {hi}]")
    return float(value)


def sample_call(config: dict[str, Any], vocab_size: int) -> SampleCall:
    """Parse a ``sample`` config."""
    prompt = model_input_tokens(config.get("prompt"), "sample.prompt", vocab_size)
    num_samples = config.get("numSamples")
    if not isinstance(num_samples, int) or not 1 <= num_samples <= 1000:
        raise invalid(f"sample.numSamples={num_samples!r} must be a whole number in [1, 1000]")
    if config.get("topkPromptLogprobs"):
        raise invalid("sample.topkPromptLogprobs is not supported by the local service; "
                      "use includePromptLogprobs")
    params = config.get("samplingParams")
    if not isinstance(params, dict):
        raise invalid("sample.samplingParams is required (with maxTokens)")
    max_tokens = params.get("maxTokens")
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise invalid(f"samplingParams.maxTokens={max_tokens!r} must be a whole number >= 1")
    top_k = params.get("topK")
    if top_k is not None and (not isinstance(top_k, int) or (top_k < 1 and top_k != -1)):
        raise invalid(f"samplingParams.topK={top_k!r} must be >= 1, or -1 to disable it")
    seed = params.get("seed")
    if seed is not None and not isinstance(seed, int):
        raise invalid(f"samplingParams.seed={seed!r} must be a whole number")
    stop = params.get("stop")
    if stop is not None and not (isinstance(stop, list) and all(isinstance(s, str) and s for s in stop)):
        raise invalid("samplingParams.stop must be a list of non-empty strings")
    return SampleCall(
        prompt=prompt, num_samples=num_samples, max_tokens=max_tokens,
        temperature=_optional_number(params, "temperature", 0.0, 2.0),
        top_k=None if top_k in (None, -1) else top_k,
        top_p=_optional_number(params, "topP", 0.0, 1.0),
        seed=seed, stop=stop or None,
        include_prompt_logprobs=bool(config.get("includePromptLogprobs")),
        model_package_arn=config.get("modelPackageArn") or None,
    )


def _float(value: float) -> float:
    # JSON has no NaN/Infinity; botocore would choke on the bare tokens.
    value = float(value)
    return value if math.isfinite(value) else 0.0


def loss_result(metrics: Mapping[str, float], outputs: Sequence[Mapping[str, Sequence[float]]]) -> dict[str, Any]:
    """ForwardResult / ForwardBackwardResult body: metrics and per-datum TensorData."""
    tensors = [
        {key: {"data": [_float(v) for v in values], "dtype": "float32", "shape": [len(values)]}
         for key, values in entry.items()}
        for entry in outputs
    ]
    return {"metrics": {k: _float(v) for k, v in metrics.items()},
            "lossFnOutputs": tensors, "lossFnOutputType": "TensorData"}


def sample_result(sequences: Sequence[SampledSeq], prompt_logprobs: Sequence[float | None] | None) -> dict[str, Any]:
    """SampleResponse body."""
    body: dict[str, Any] = {"sequences": [
        {"stopReason": s.stop_reason, "tokens": [int(t) for t in s.tokens],
         "logprobs": [_float(v) for v in s.logprobs]}
        for s in sequences
    ]}
    if prompt_logprobs is not None:
        # The SDK's SampleResponse rejects a null in this list, while the first
        # prompt token has no logprob; report it as 0.0 (log 1: nothing predicted).
        body["promptLogprobs"] = [0.0 if v is None else _float(v) for v in prompt_logprobs]
    return body


def logprobs_result(logprobs: Sequence[float | None]) -> dict[str, Any]:
    """ComputeLogprobsResult body; a null first entry is what the SDK expects here."""
    return {"logprobs": [None if v is None else _float(v) for v in logprobs]}
