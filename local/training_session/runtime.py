"""Runtime plane of the local service: requests become Runners.

A submit is parsed and validated here (so a bad request is a ValidationException
at submit, as on the real service) and turned into a :data:`~state.Runner`, a
closure that :mod:`state` runs in sequence order against the session's Policy.
"""
from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Callable

from local.training_session import wire
from local.training_session.policy import Policy
from local.training_session.state import Runner, ServiceState, Session
from local.training_session.tokenizer import ToyTokenizer
from local.training_session.wire import ServiceError, invalid

VOCAB_SIZE = ToyTokenizer().vocab_size
TRAINING_OPS = ("forward", "forwardBackward", "optimizerStep", "saveWeights", "saveState", "loadState")
SAMPLING_OPS = ("sample", "computeLogprobs", "loadWeightsForSampling")
_CLIENT_TOKEN = re.compile(r"^[a-zA-Z0-9-]{1,128}$")


def _package_arn(state: ServiceState, value: Any, field: str) -> str:
    """A model package ARN that exists (checked at submit, not when the op runs)."""
    if not isinstance(value, str) or not value:
        raise invalid(f"{field} is required")
    state.registry.get(value)
    return value


def _loss_runner(kind: str, cfg: dict[str, Any]) -> Runner:
    call = wire.loss_call(cfg, VOCAB_SIZE)

    def run(session: Session) -> dict[str, Any]:
        policy = session.current_policy()
        fn = policy.forward_backward if kind == "forwardBackward" else policy.forward
        metrics, outputs = fn(call.datums, loss_fn=call.loss_fn, loss_fn_config=call.loss_fn_config)
        return {kind: wire.loss_result(metrics, outputs)}
    return run


def _optim_runner(cfg: dict[str, Any]) -> Runner:
    adam = wire.adam_config(cfg)

    def run(session: Session) -> dict[str, Any]:
        metrics = session.current_policy().optim_step(adam)
        return {"optimizerStep": {"metrics": {k: float(v) for k, v in metrics.items()}}}
    return run


def _save_runner(state: ServiceState, kind: str, cfg: dict[str, Any]) -> Runner:
    description = cfg.get("description") or ""
    if not isinstance(description, str) or len(description) > 1024:
        raise invalid(f"{kind}.description must be a string of at most 1024 characters")
    checkpoint = kind == "saveState"  # state = weights + Adam moments; weights = sampler weights

    def run(session: Session) -> dict[str, Any]:
        package = state.registry.add(
            session.group, session.current_policy().state_dict(include_optimizer=checkpoint),
            is_checkpoint=checkpoint, description=description, base_model=session.base_model,
            session_name=session.name, s3_prefix=session.output_path)
        return {kind: {"modelPackageArn": package.arn}}
    return run


def _load_runner(state: ServiceState, cfg: dict[str, Any]) -> Runner:
    arn = _package_arn(state, cfg.get("modelPackageArn"), "loadState.modelPackageArn")
    with_optimizer = cfg.get("loadOptimizer")
    if not isinstance(with_optimizer, bool):
        raise invalid("loadState.loadOptimizer is required (true or false)")
    if with_optimizer and not state.registry.get(arn).is_checkpoint:
        raise invalid(f"model package {arn} holds sampler weights (saveWeights) and no optimizer "
                      "state; load it with loadOptimizer false, or load a saveState checkpoint")

    def run(session: Session) -> dict[str, Any]:
        policy = Policy.from_state_dict(state.registry.weights(arn))
        session.policy = policy if with_optimizer else policy.weights_copy()  # weights_copy: fresh Adam
        return {"loadState": {}}
    return run


def training_runner(state: ServiceState, kind: str, cfg: dict[str, Any]) -> Runner:
    if kind in ("forward", "forwardBackward"):
        return _loss_runner(kind, cfg)
    if kind == "optimizerStep":
        return _optim_runner(cfg)
    if kind in ("saveState", "saveWeights"):
        return _save_runner(state, kind, cfg)
    return _load_runner(state, cfg)


def _sampling_policy(state: ServiceState, arn: str | None) -> Callable[[Session], Policy]:
    """Which weights a sampling op reads: a saved package's, else the session's current ones."""
    if arn:
        _package_arn(state, arn, "modelPackageArn")
        return lambda session: state.registry.policy(arn)
    return lambda session: session.current_policy()


def sampling_runner(state: ServiceState, kind: str, cfg: dict[str, Any]) -> Runner:
    if kind == "sample":
        call = wire.sample_call(cfg, VOCAB_SIZE)
        weights = _sampling_policy(state, call.model_package_arn)

        def run_sample(session: Session) -> dict[str, Any]:
            policy = weights(session)
            seqs = policy.sample(call.prompt, call.num_samples, call.max_tokens, temperature=call.temperature,
                                 top_k=call.top_k, top_p=call.top_p, seed=call.seed, stop=call.stop)
            prompt_lp = policy.compute_logprobs(call.prompt) if call.include_prompt_logprobs else None
            return {"sample": wire.sample_result(seqs, prompt_lp)}
        return run_sample
    if kind == "computeLogprobs":
        prompt = wire.model_input_tokens(cfg.get("prompt"), "computeLogprobs.prompt", VOCAB_SIZE)
        weights = _sampling_policy(state, cfg.get("modelPackageArn"))
        return lambda session: {"computeLogprobs": wire.logprobs_result(weights(session).compute_logprobs(prompt))}
    arn = _package_arn(state, cfg.get("modelPackageArn"), "loadWeightsForSampling.modelPackageArn")

    def run_load(session: Session) -> dict[str, Any]:
        state.registry.policy(arn)  # build it now, so the first sample does not pay for it
        return {"loadWeightsForSampling": {}}
    return run_load


def find_session(state: ServiceState, name: str) -> Session:
    session = state.find(name)
    if session is None:
        raise ServiceError("ResourceNotFoundException", f"Training session {name!r} does not exist", 404)
    return session


def submit_training(state: ServiceState, session: Session, body: dict[str, Any]) -> dict[str, Any]:
    seq, token = body.get("sequenceNumber"), body.get("clientToken")
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
        raise invalid(f"sequenceNumber={seq!r} must be a whole number >= 1")
    if token is not None and not (isinstance(token, str) and _CLIENT_TOKEN.match(token)):
        raise invalid("clientToken must be 1-128 letters, digits and hyphens")
    try:
        kind, cfg = wire.only_member(body.get("operationConfig"), TRAINING_OPS, "operationConfig")
        runner = training_runner(state, kind, cfg)
    except ServiceError as e:
        session.note_rejected(seq, e)
        raise
    fingerprint = hashlib.sha256(json.dumps([seq, body["operationConfig"]], sort_keys=True).encode()).hexdigest()
    return {"operationId": session.submit_training(seq, token, fingerprint, kind, runner).id}


def submit_sampling(state: ServiceState, session: Session, body: dict[str, Any]) -> dict[str, Any]:
    kind, cfg = wire.only_member(body.get("operationConfig"), SAMPLING_OPS, "operationConfig")
    return {"operationId": session.submit_sampling(kind, sampling_runner(state, kind, cfg)).id}
