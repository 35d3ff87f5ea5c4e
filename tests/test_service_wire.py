"""The local training-session service, driven over the wire by the real SDK.

Everything goes through ``sagemaker.train.training_session`` (or, where the SDK
would refuse to send a request, a plain botocore client of the same service
model) against the in-process service from ``tests/local_service.py``.
"""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from sagemaker.train.training_session import ModelPackageKind, OperationError
from sagemaker.train.training_session.exceptions import is_retryable

from local.training_session.faults import Faults
from local.training_session.server import start_service
from local.training_session.toy.tokenizer import ToyTokenizer
from tests.local_service import (
    BASE_MODEL_ARN,
    ENDPOINT_ENV_VARS,
    REGION,
    ROLE_ARN,
    S3_OUTPUT_PATH,
    client_kwargs,
    group_arn,
)

REPO = Path(__file__).resolve().parents[1]
TOK = ToyTokenizer()
PROMPT = TOK.apply_chat_template([{"role": "user", "content": "ann has 3 apples and buys 4 more . "
                                                              "how many apples does she have ?"}])
CLIP = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.28}
SAMPLING = {"max_tokens": 512, "temperature": 1.0, "seed": 7}


@pytest.fixture
def service_client(module_service_client, local_service):
    """The module's ServiceClient; ``local_service`` resets faults around each test."""
    return module_service_client


def rl_datum(completion: list[int], behaviour_logprobs: list[float], advantage: float) -> tuple[list[int], dict]:
    """Model input and per-token loss inputs for one sampled completion of PROMPT."""
    tokens = PROMPT + completion
    n_prompt = len(PROMPT) - 1  # positions predicting prompt tokens carry no weight
    inputs = {
        "target_tokens": tokens[1:],
        "weights": [0.0] * n_prompt + [1.0] * len(completion),
        "logprobs": [0.0] * n_prompt + list(behaviour_logprobs),
        "advantages": [0.0] * n_prompt + [advantage] * len(completion),
    }
    return tokens[:-1], inputs


def ce_datum() -> tuple[list[int], dict]:
    tokens = PROMPT + TOK.encode("#### 7") + [TOK.eos_token_id]
    return tokens[:-1], {"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)}


def completion_logprob(sampler: Any, completion: list[int]) -> float:
    logprobs = sampler.compute_logprobs(PROMPT + completion).result()
    return sum(logprobs[len(PROMPT):])


def train_step(tc: Any, lr: float = 0.01) -> None:
    tokens, inputs = ce_datum()
    tc.forward_backward([tokens], "cross_entropy", loss_fn_inputs=inputs).result()
    tc.optim_step({"learning_rate": lr}).result()


def error_code(excinfo: pytest.ExceptionInfo) -> str:
    return excinfo.value.response["Error"]["Code"]


def control_client(url: str) -> Any:
    return boto3.client("sagemaker", endpoint_url=url, region_name=REGION)


def runtime_client(url: str) -> Any:
    return boto3.client("sagemakertrainingsessionruntime", endpoint_url=url, region_name=REGION)


def raw_session(url: str) -> str:
    """A session created with a plain botocore client, for requests the SDK would not send."""
    name = f"raw-{uuid.uuid4().hex[:10]}"
    control_client(url).create_training_session(
        TrainingSessionName=name, ModelPackageGroupArn=group_arn("raw-tests"),
        LoraConfig={"Rank": 8, "Alpha": 16}, RoleArn=ROLE_ARN, ModelConfig={"BaseModelArn": BASE_MODEL_ARN},
        OutputConfig={"S3Location": {"Path": S3_OUTPUT_PATH}})
    return name


def wire_datum(tokens: list[int], inputs: dict[str, list]) -> dict:
    return {"modelInput": {"chunks": [{"type": "encoded_text", "tokens": tokens}]},
            "lossFnInputs": {k: {"data": v, "dtype": "int64" if k == "target_tokens" else "float32",
                                 "shape": [len(v)]} for k, v in inputs.items()}}


def ce_config(kind: str = "forwardBackward", inputs: dict | None = None) -> dict:
    tokens, default_inputs = ce_datum()
    return {kind: {"lossFnName": "cross_entropy", "datumList": [wire_datum(tokens, inputs or default_inputs)]}}


def session_snapshot(service: Any, name: str) -> dict:
    return next(s for s in service.sessions() if s["name"] == name)


# -- the SDK flow ----------------------------------------------------------------
def test_sample_returns_logprobs_that_match_compute_logprobs(service_client):
    with service_client.create_lora_training_client(base_model=BASE_MODEL_ARN) as tc:
        sampler = tc.create_sampling_client()
        resp = sampler.sample(PROMPT, 3, SAMPLING, include_prompt_logprobs=True).result()
        scored = sampler.compute_logprobs(PROMPT).result()

        assert len(resp.sequences) == 3
        for seq in resp.sequences:
            assert seq.tokens and len(seq.logprobs) == len(seq.tokens)
            assert seq.stop_reason.value in ("stop", "length")
            # Temperature-1 sampling logprobs are the model's own logprobs of those tokens.
            full = sampler.compute_logprobs(PROMPT + seq.tokens).result()
            assert full[len(PROMPT):] == pytest.approx(seq.logprobs, abs=1e-9)
        assert scored[0] is None and len(scored) == len(PROMPT)
        # The first prompt token has no logprob; the SDK's SampleResponse takes no null, so it reads 0.0.
        assert resp.prompt_logprobs == pytest.approx([0.0] + scored[1:], abs=1e-9)


@pytest.mark.parametrize("advantage", [1.0, -1.0])
def test_ppo_update_moves_logprobs_in_the_advantage_direction(service_client, advantage):
    with service_client.create_lora_training_client(base_model=BASE_MODEL_ARN) as tc:
        sampler = tc.create_sampling_client()
        seq = sampler.sample(PROMPT, 1, SAMPLING).result().sequences[0]
        before = completion_logprob(sampler, seq.tokens)

        tokens, inputs = rl_datum(seq.tokens, seq.logprobs, advantage)
        fwd = tc.forward([tokens], "ppo", loss_fn_inputs=inputs, loss_fn_config=CLIP).result()
        assert completion_logprob(sampler, seq.tokens) == before  # forward changes nothing
        out = tc.forward_backward([tokens], "ppo", loss_fn_inputs=inputs, loss_fn_config=CLIP).result()
        assert out.metrics == pytest.approx(fwd.metrics)
        assert len(out.loss_fn_outputs) == 1
        tc.optim_step({"learning_rate": 0.01}).result()

        change = completion_logprob(sampler, seq.tokens) - before
        assert change * advantage > 0.01


def test_saved_weights_and_state_round_trip(service_client):
    completion = TOK.encode("#### 7") + [TOK.eos_token_id]
    with service_client.create_lora_training_client(base_model=BASE_MODEL_ARN) as tc:
        train_step(tc)
        state_arn = tc.save_state(description="after one step").result().model_package_arn
        weights_arn = tc.save_weights_for_sampler().result().model_package_arn
        saved = completion_logprob(tc.create_sampling_client(), completion)
        assert completion_logprob(tc.save_weights_and_get_sampling_client(), completion) == saved
        with service_client.create_sampling_client(model_package_arn=weights_arn) as from_weights:
            assert completion_logprob(from_weights, completion) == saved

        with service_client.create_training_client_from_state_with_optimizer(state_arn) as resumed, \
                service_client.create_training_client_from_state(state_arn) as fresh_adam:
            assert completion_logprob(resumed.create_sampling_client(), completion) == saved
            assert completion_logprob(fresh_adam.create_sampling_client(), completion) == saved
            for client in (tc, resumed, fresh_adam):
                train_step(client)
            after = completion_logprob(tc.create_sampling_client(), completion)
            # Restored Adam moments give the very same second step; fresh ones do not.
            assert completion_logprob(resumed.create_sampling_client(), completion) == after
            assert completion_logprob(fresh_adam.create_sampling_client(), completion) != after


def test_the_session_bills_the_tokens_a_run_sent_and_received(service_client, local_service):
    """DescribeTrainingSession's BillableTokenUsage, as botocore's model shapes it, counts as the service bills:
    each request's prompt prefilled once (a sample of 3, and a compute_logprobs), the tokens generated, and the
    datum tokens of every forward and forward_backward; an optim_step bills none."""
    tokens, inputs = ce_datum()
    with service_client.create_lora_training_client(base_model=BASE_MODEL_ARN) as tc:
        sampler = tc.create_sampling_client()
        sampled = sampler.sample(PROMPT, 3, SAMPLING).result()
        sampler.compute_logprobs(PROMPT).result()
        out = tc.forward_backward([tokens], "cross_entropy", loss_fn_inputs=inputs).result()
        tc.forward([tokens], "cross_entropy", loss_fn_inputs=inputs).result()
        tc.optim_step({"learning_rate": 0.01}).result()
        name = tc.training_session_name
    detail = control_client(local_service.url).describe_training_session(TrainingSessionName=name)
    assert detail["TrainingSessionDetail"]["BillableTokenUsage"] == {
        "PrefillTokenCount": 2 * len(PROMPT), "SampleTokenCount": sum(len(s.tokens) for s in sampled.sequences),
        "TrainingTokenCount": 2 * len(tokens)}
    # The SDK keeps a pass's raw result, ForwardBackwardResult's tokenUsage included (it has no accessor for it).
    assert out._sub_result("forwardBackward")["tokenUsage"] == {"trainingTokens": len(tokens)}


def test_each_result_carries_its_token_usage_where_the_runtime_model_puts_it(local_service):
    """botocore parses only the members its model declares: GetTrainingOperationResult's and
    ForwardBackwardResult's TrainingTokenUsage, each SampledSequence's SampleTokenUsage."""
    name, rt = raw_session(local_service.url), runtime_client(local_service.url)
    tokens, _ = ce_datum()
    op = rt.execute_training_operation(trainingSessionName=name, sequenceNumber=1, operationConfig=ce_config())
    trained = rt.get_training_operation_result(trainingSessionName=name, operationId=op["operationId"])
    assert trained["tokenUsage"] == trained["operationResult"]["forwardBackward"]["tokenUsage"] == \
        {"trainingTokens": len(tokens)}
    op = rt.execute_sampling_operation(trainingSessionName=name, operationConfig={"sample": {
        "prompt": {"chunks": [{"type": "encoded_text", "tokens": PROMPT}]}, "numSamples": 2,
        "samplingParams": {"maxTokens": 512, "seed": 3}}})
    sequences = rt.get_sampling_operation_result(trainingSessionName=name, operationId=op["operationId"])[
        "operationResult"]["sample"]["sequences"]
    assert [s["tokenUsage"] for s in sequences] == [{"prefill": len(PROMPT), "decode": len(s["tokens"])}
                                                    for s in sequences]
    control_client(local_service.url).stop_training_session(TrainingSessionName=name)


def test_model_packages_are_listed_newest_first_and_can_be_approved(service_client, local_service):
    group = group_arn(f"listing-{uuid.uuid4().hex[:8]}")  # this test's own, so the listing is exact
    with service_client.create_lora_training_client(base_model=BASE_MODEL_ARN, model_package_group_arn=group) as tc:
        first = tc.save_state().result().model_package_arn
        weights = tc.save_weights_for_sampler(description="sampler").result().model_package_arn
        last = tc.save_state().result().model_package_arn

    listed = service_client.list_model_packages(model_package_group_arn=group)
    assert [p.model_package_arn for p in listed] == [last, weights, first]
    assert [p.version for p in listed] == [3, 2, 1]
    assert weights == group.replace(":model-package-group/", ":model-package/") + "/2"
    latest = {kind: service_client.get_latest_model_package(kind, model_package_group_arn=group).model_package_arn
              for kind in ModelPackageKind}
    assert latest == {ModelPackageKind.CHECKPOINT: last, ModelPackageKind.MODEL: weights}
    assert [p.model_package_arn for p in service_client.list_model_packages(
        kind=ModelPackageKind.MODEL, model_package_group_arn=group)] == [weights]

    sm = control_client(local_service.url)
    sm.update_model_package(ModelPackageArn=weights, ModelApprovalStatus="Approved",
                            ApprovalDescription="accuracy 0.9 >= 0.5")
    desc = sm.describe_model_package(ModelPackageName=weights)
    assert desc["ModelApprovalStatus"] == "Approved"
    assert desc["ApprovalDescription"] == "accuracy 0.9 >= 0.5"
    assert desc["ModelPackageDescription"] == "sampler"
    container = desc["InferenceSpecification"]["Containers"][0]
    assert container["BaseModel"] == {"HubContentName": "local-toy-arith", "HubContentVersion": "1.0.0"}
    assert container["IsCheckpoint"] is False

    deletion = service_client.delete_model_package(first)
    assert deletion.model_package_deleted
    assert [p.version for p in service_client.list_model_packages(model_package_group_arn=group)] == [3, 2]


def test_sessions_without_a_group_get_the_sdk_default_group(local_service):
    from sagemaker.train.training_session import ServiceClient

    kwargs = {k: v for k, v in client_kwargs().items() if k != "model_package_group_arn"}
    svc = ServiceClient(**kwargs)
    # The first creates the group, the second finds it already there and describes it.
    with svc.create_lora_training_client(base_model=BASE_MODEL_ARN) as first, \
            svc.create_lora_training_client(base_model=BASE_MODEL_ARN) as second:
        arns = [tc.save_weights_for_sampler().result().model_package_arn for tc in (first, second)]
    assert all(":model-package/sagemaker-default/" in arn for arn in arns)


def test_saved_packages_survive_a_restart_with_a_state_dir(tmp_path, monkeypatch):
    from sagemaker.train.training_session import ServiceClient

    completion = TOK.encode("#### 7") + [TOK.eos_token_id]
    kwargs = client_kwargs()
    with start_service(state_dir=tmp_path) as first:
        for var in ENDPOINT_ENV_VARS:
            monkeypatch.setenv(var, first.url)
        with ServiceClient(**kwargs).create_lora_training_client(base_model=BASE_MODEL_ARN) as tc:
            train_step(tc)
            arn = tc.save_weights_for_sampler().result().model_package_arn
            saved = completion_logprob(tc.create_sampling_client(), completion)

    with start_service(state_dir=tmp_path) as second:
        for var in ENDPOINT_ENV_VARS:
            monkeypatch.setenv(var, second.url)
        svc = ServiceClient(**kwargs)
        assert [p.model_package_arn for p in svc.list_model_packages()] == [arn]
        with svc.create_sampling_client(model_package_arn=arn) as sampler:
            assert completion_logprob(sampler, completion) == saved


def test_stopped_session_rejects_operations_and_can_be_deleted(service_client):
    tc = service_client.create_lora_training_client(base_model=BASE_MODEL_ARN)
    name = tc.training_session_name
    service_client.stop_session(name)
    tokens, inputs = ce_datum()
    with pytest.raises(ClientError) as excinfo:
        tc.forward_backward([tokens], "cross_entropy", loss_fn_inputs=inputs).result()
    assert error_code(excinfo) == "ConflictException"
    assert "is Stopped" in str(excinfo.value)

    tc.stop()  # already stopped: the SDK absorbs the service's state-transition error
    assert [s.status.value for s in service_client.list_sessions(name_contains=name)] == ["Stopped"]
    tc.delete()
    assert service_client.list_sessions(name_contains=name) == []


# -- validation ----------------------------------------------------------------
def test_clip_bound_out_of_range_is_a_validation_error(service_client):
    with service_client.create_lora_training_client(base_model=BASE_MODEL_ARN) as tc:
        seq = tc.create_sampling_client().sample(PROMPT, 1, SAMPLING).result().sequences[0]
        tokens, inputs = rl_datum(seq.tokens, seq.logprobs, advantage=1.0)
        with pytest.raises(ClientError) as excinfo:
            tc.forward_backward([tokens], "ppo", loss_fn_inputs=inputs,
                                loss_fn_config={"clip_low_threshold": 1.5, "clip_high_threshold": 2.0}).result()
    assert error_code(excinfo) == "ValidationException"
    assert "operationConfig.forwardBackward.lossFnConfig.clip_low_threshold: 1.5 is out of range" in str(excinfo.value)
    assert not is_retryable(excinfo.value)


def test_unknown_base_model_is_a_validation_error_naming_the_supported_one(service_client):
    other = "arn:aws:sagemaker:us-west-2:aws:hub-content/SageMakerPublicHub/Model/meta-llama-3-8b/1.0.0"
    with pytest.raises(ClientError) as excinfo:
        service_client.create_lora_training_client(base_model=other)
    assert error_code(excinfo) == "ValidationException"
    assert "local-toy-arith" in str(excinfo.value)


N_TOKENS = len(ce_datum()[0])


DATUM = "operationConfig.forwardBackward.datumList[0].lossFnInputs"


@pytest.mark.parametrize("break_inputs, expected", [
    (lambda i: {"target_tokens": i["target_tokens"]}, f"{DATUM}: is missing ['weights']"),
    (lambda i: {**i, "weights": i["weights"][:-1]},
     f"{DATUM}['weights']: has {N_TOKENS - 1} values but modelInput has {N_TOKENS} tokens"),
    (lambda i: {**i, "labels": i["weights"]}, f"{DATUM}: has unsupported keys ['labels']"),
])
def test_bad_loss_inputs_are_rejected_at_submit(local_service, break_inputs, expected):
    name, rt = raw_session(local_service.url), runtime_client(local_service.url)
    _, inputs = ce_datum()
    with pytest.raises(ClientError) as excinfo:
        rt.execute_training_operation(trainingSessionName=name, sequenceNumber=1,
                                      operationConfig=ce_config(inputs=break_inputs(inputs)))
    assert error_code(excinfo) == "ValidationException"
    assert expected in str(excinfo.value)
    assert excinfo.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    control_client(local_service.url).stop_training_session(TrainingSessionName=name)


# -- sequencing and idempotency ----------------------------------------------------
def test_duplicate_client_token_is_the_same_operation(local_service):
    name, rt = raw_session(local_service.url), runtime_client(local_service.url)
    first = rt.execute_training_operation(trainingSessionName=name, sequenceNumber=1, clientToken="tok-1",
                                          operationConfig=ce_config())
    again = rt.execute_training_operation(trainingSessionName=name, sequenceNumber=1, clientToken="tok-1",
                                          operationConfig=ce_config())
    assert again["operationId"] == first["operationId"]
    with pytest.raises(ClientError) as reused_token:
        rt.execute_training_operation(trainingSessionName=name, sequenceNumber=1, clientToken="tok-1",
                                      operationConfig=ce_config("forward"))
    assert error_code(reused_token) == "ConflictException"
    with pytest.raises(ClientError) as reused_seq:
        rt.execute_training_operation(trainingSessionName=name, sequenceNumber=1, clientToken="tok-2",
                                      operationConfig=ce_config())
    assert error_code(reused_seq) == "ValidationException"

    result = rt.get_training_operation_result(trainingSessionName=name, operationId=first["operationId"])
    assert result["status"] == "Completed"
    assert set(result["operationResult"]) == {"forwardBackward"}
    assert session_snapshot(local_service, name)["operations"] == 1
    control_client(local_service.url).stop_training_session(TrainingSessionName=name)


@pytest.mark.parametrize("token", ["a b", "tok_1", "!!!"])
def test_a_client_token_breaking_its_pattern_is_refused_before_any_lookup(local_service, token):
    """ClientToken is [a-zA-Z0-9-]+, matched against the whole token as the API does: the request is invalid
    whether or not its session exists (a token that merely contained a match used to reach the lookup: 404)."""
    with pytest.raises(ClientError) as excinfo:
        runtime_client(local_service.url).execute_training_operation(
            trainingSessionName="no-such-session", sequenceNumber=1, clientToken=token, operationConfig=ce_config())
    assert (error_code(excinfo), excinfo.value.response["ResponseMetadata"]["HTTPStatusCode"]) == \
        ("ValidationException", 400)
    assert "clientToken" in str(excinfo.value)


def test_operations_run_in_sequence_order_whatever_order_they_arrive_in(local_service):
    name, rt = raw_session(local_service.url), runtime_client(local_service.url)
    step = {"optimizerStep": {"adamParamsConfig": {"learningRate": 0.01}}}
    submitted = {}
    for seq, config in ((4, ce_config("forward")), (3, step), (2, ce_config())):
        submitted[seq] = rt.execute_training_operation(
            trainingSessionName=name, sequenceNumber=seq, operationConfig=config)["operationId"]
    waiting = session_snapshot(local_service, name)
    assert waiting["by_status"] == {"Pending": 3} and waiting["next_sequence_number"] == 1
    submitted[1] = rt.execute_training_operation(
        trainingSessionName=name, sequenceNumber=1, operationConfig=ce_config("forward"))["operationId"]

    results = {seq: rt.get_training_operation_result(trainingSessionName=name, operationId=op_id)
               for seq, op_id in submitted.items()}
    assert {seq: r["status"] for seq, r in results.items()} == dict.fromkeys(submitted, "Completed")
    loss = {seq: r["operationResult"][kind]["metrics"]["loss:sum"]
            for seq, r, kind in ((1, results[1], "forward"), (2, results[2], "forwardBackward"),
                                 (4, results[4], "forward"))}
    assert loss[2] == pytest.approx(loss[1])  # forwardBackward saw the base weights
    assert loss[4] < loss[1]  # the last forward saw the optimizer step
    control_client(local_service.url).stop_training_session(TrainingSessionName=name)


def test_operations_behind_a_rejected_one_fail_with_its_reason(service_client):
    with service_client.create_lora_training_client(base_model=BASE_MODEL_ARN) as tc:
        tokens, inputs = ce_datum()
        tc.forward_backward([tokens], "cross_entropy", loss_fn_inputs=inputs).result()
        step = tc.optim_step({"learning_rate": 0.05})  # above the API's maximum of 0.01
        save = tc.save_state()  # sequence number 3 waits for 2, which the SDK spent on the rejected submit
        with pytest.raises(ClientError) as rejected:
            step.result()
        assert error_code(rejected) == "ValidationException"
        with pytest.raises(OperationError, match=r"sequence number 2 was rejected at submit \(ValidationException: "
                                                 r"1 validation error detected: operationConfig.optimizerStep."
                                                 r"adamParamsConfig.learningRate: 0.05 is outside"):
            save.result()


def test_a_sequence_number_that_never_arrives_fails_the_session_naming_it():
    with start_service(gap_timeout_s=0.2) as service:
        name, rt = raw_session(service.url), runtime_client(service.url)
        op = rt.execute_training_operation(trainingSessionName=name, sequenceNumber=2, operationConfig=ce_config())
        result = rt.get_training_operation_result(trainingSessionName=name, operationId=op["operationId"])
        assert result["status"] == "Skipped"
        assert "sequence number 1 never arrived within 0.2 s" in result["errorDetails"]
        detail = control_client(service.url).describe_training_session(TrainingSessionName=name)
        assert detail["TrainingSessionDetail"]["TrainingSessionStatus"] == "Failed"


def test_first_poll_sees_the_result_even_with_injected_latency(local_service):
    name, rt = raw_session(local_service.url), runtime_client(local_service.url)
    local_service.set_faults(Faults(latency_ms=150))
    op = rt.execute_training_operation(trainingSessionName=name, sequenceNumber=1, operationConfig=ce_config())
    # The poll is held until the operation is done, so the SDK never sleeps its 2 s poll interval.
    result = rt.get_training_operation_result(trainingSessionName=name, operationId=op["operationId"])
    assert result["status"] == "Completed"
    control_client(local_service.url).stop_training_session(TrainingSessionName=name)


# -- injected faults -------------------------------------------------------------
def test_throttled_submits_are_retried_by_the_sdk(service_client, local_service):
    with service_client.create_lora_training_client(base_model=BASE_MODEL_ARN) as tc:
        local_service.set_faults(Faults(throttle_rate=1.0, throttle_limit=1))
        tokens, inputs = ce_datum()
        out = tc.forward_backward([tokens], "cross_entropy", loss_fn_inputs=inputs).result()
        resp = tc.create_sampling_client().sample(PROMPT, 1, SAMPLING).result()
    assert out.metrics["loss:sum"] > 0 and resp.sequences
    assert local_service.state.injector.injected["throttled"] == 2  # each submit once, then let through


def test_failed_operations_surface_as_operation_errors(service_client, local_service):
    with service_client.create_lora_training_client(base_model=BASE_MODEL_ARN) as tc:
        local_service.set_faults(Faults(fail_rate=1.0))
        tokens, inputs = ce_datum()
        with pytest.raises(OperationError, match="injected operation failure"):
            tc.forward_backward([tokens], "cross_entropy", loss_fn_inputs=inputs).result()
        with pytest.raises(OperationError, match="injected operation failure"):
            tc.create_sampling_client().sample(PROMPT, 1, SAMPLING).result()


def test_a_session_that_dies_rejects_later_operations(service_client, local_service):
    local_service.set_faults(Faults(fail_session_after=2))
    with service_client.create_lora_training_client(base_model=BASE_MODEL_ARN) as tc:
        train_step(tc)  # operations 1 and 2 complete; then the session fails
        with pytest.raises(ClientError) as excinfo:
            tc.save_state().result()
        assert error_code(excinfo) == "ConflictException"
        assert "is Failed (injected fault: session failed after 2 operations)" in str(excinfo.value)
        detail = control_client(local_service.url).describe_training_session(
            TrainingSessionName=tc.training_session_name)["TrainingSessionDetail"]
        assert detail["TrainingSessionStatus"] == "Failed"
        assert "injected fault" in detail["ErrorDetails"]
    # Leaving the block stopped the failed session without an error (the SDK absorbs it).


# -- HTTP surface ----------------------------------------------------------------
def _http(url: str, data: bytes | None = None, headers: dict | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=data, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_each_answer_leaves_in_one_write(local_service, monkeypatch):
    """Headers and body in one socket write: botocore reads a body cut short as empty (it does not enforce
    Content-Length), so a service killed between two writes answered a submit with no operationId and the SDK
    raised KeyError('operationId') rather than finding the service gone (test_local_run's dead-service test)."""
    import socket

    writes: list[bytes] = []
    for name in ("send", "sendall"):
        real = getattr(socket.socket, name)

        def spy(sock, data, *args, _real=real):
            if sock.getsockname()[1] == local_service.port:  # the service's side of the connection
                writes.append(bytes(data))
            return _real(sock, data, *args)
        monkeypatch.setattr(socket.socket, name, spy)
    with pytest.raises(ClientError, match="ResourceNotFound"):  # an AWS answer, through botocore
        control_client(local_service.url).describe_training_session(TrainingSessionName="no-such-session")
    status, body = _http(f"{local_service.url}/_admin/faults")
    assert status == 200 and body["faults"]["latency_ms"] == 0
    answers = [w for w in writes if w.startswith(b"HTTP/1.1 ")]
    assert len(answers) == len(writes) >= 2, [w[:40] for w in writes]  # the error and the settings
    assert all(w.endswith(b"}") for w in answers), [w[-40:] for w in answers]


def test_admin_routes_report_sessions_and_validate_faults(local_service):
    name = raw_session(local_service.url)
    status, body = _http(f"{local_service.url}/_admin/sessions")
    assert status == 200
    assert {"name": name, "status": "Running"}.items() <= next(
        s for s in body["sessions"] if s["name"] == name).items()

    status, body = _http(f"{local_service.url}/_admin/faults", json.dumps({"throttle_rate": 2}).encode())
    assert status == 400 and "throttle_rate=2" in body["message"]
    status, body = _http(f"{local_service.url}/_admin/faults", json.dumps({"latency_ms": 5}).encode())
    assert status == 200 and body["faults"]["latency_ms"] == 5
    control_client(local_service.url).stop_training_session(TrainingSessionName=name)


def test_unknown_control_plane_operation_is_named_in_the_error(local_service):
    status, body = _http(local_service.url + "/", b"{}", {"X-Amz-Target": "SageMaker.CreateTrainingJob",
                                                          "Content-Type": "application/x-amz-json-1.1"})
    assert status == 400
    assert body["__type"] == "UnknownOperationException"
    assert "SageMaker.CreateTrainingJob" in body["message"]


def test_hub_content_describes_the_local_base_model(local_service):
    sm = control_client(local_service.url)
    desc = sm.describe_hub_content(HubName="SageMakerPublicHub", HubContentType="Model",
                                   HubContentName="local-toy-arith")
    assert desc["HubContentArn"] == BASE_MODEL_ARN
    with pytest.raises(ClientError) as excinfo:
        sm.describe_hub_content(HubName="SageMakerPublicHub", HubContentType="Model", HubContentName="gpt-9")
    assert error_code(excinfo) == "ResourceNotFound"


def test_fault_settings_name_the_bad_field():
    with pytest.raises(ValueError, match="throttle_rate=2"):
        Faults(throttle_rate=2)
    with pytest.raises(ValueError, match="unknown fault setting.*'latency'"):
        Faults.from_mapping({"latency": 5})
    with pytest.raises(ValueError, match="LOCAL_TS_LATENCY_MS='soon' is not a int"):
        Faults.from_env({"LOCAL_TS_LATENCY_MS": "soon"})
    assert Faults.from_env({"LOCAL_TS_LATENCY_MS": "25", "LOCAL_TS_FAIL_RATE": "0.5"}) == \
        Faults(latency_ms=25, fail_rate=0.5)


def _read_line(proc: subprocess.Popen, timeout: float) -> str:
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, "the service printed nothing in time"
    return proc.stdout.readline().strip()


def test_cli_serves_until_sigterm_and_the_example_runs_against_it(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGEMAKER_TRAINING_SESSION")}
    log = tmp_path / "training-session-service.log"  # where local/stack.py keeps the service's stderr
    with log.open("w") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "local.training_session", "--port", "0"],
                                cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True)
    try:
        line = _read_line(proc, timeout=30)
        assert line.startswith("listening on http://127.0.0.1:")
        url = line.removeprefix("listening on ")
        with pytest.raises(ClientError) as excinfo:
            control_client(url).describe_training_session(TrainingSessionName="no-such-session")
        assert error_code(excinfo) == "ResourceNotFound"

        example = subprocess.run(
            [sys.executable, "-m", "local.examples.sdk_smoke"], cwd=REPO, capture_output=True, text=True,
            timeout=120, env={**env, "SAGEMAKER_TRAINING_SESSION_ENDPOINT": url,
                              "SAGEMAKER_TRAINING_SESSION_RUNTIME_ENDPOINT": url})
        assert example.returncode == 0, example.stderr
        assert "logprob of the sampled completion" in example.stdout
        status, body = _http(f"{url}/_admin/sessions")
        assert [s["status"] for s in body["sessions"]] == ["Stopped"]  # the example cleaned up

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # What an operator needs, one line each, and no line per request (the example made dozens).
    lines = log.read_text().splitlines()
    name = body["sessions"][0]["name"]
    for expected in (f"listening on {url}", f"session {name} created", f"session {name} stopped",
                     "refused DescribeTrainingSession (session no-such-session): 400 ResourceNotFound"):
        assert any(expected in line for line in lines), (expected, lines)
    assert len(lines) < 10, lines
