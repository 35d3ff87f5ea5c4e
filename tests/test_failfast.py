"""A training-session service that stops answering fails the step's calls in seconds (steps/platform/failfast.py),
where the SDK alone retries a refused connection ~150 times per call; throttles are retried as before."""
from __future__ import annotations

import json
import logging
import subprocess
import sys
import urllib.request

import pytest
from botocore.exceptions import EndpointConnectionError
from sagemaker.train.training_session import ServiceClient
from sagemaker.train.training_session.exceptions import is_retryable

from local.stack import ROOT
from local.training_session.faults import Faults
from local.training_session.toy.tokenizer import ToyTokenizer
from steps.config import config_from_dict
from steps.platform.failfast import FailFast, ServiceUnreachable, fail_fast
from steps.platform.session import service_client
from tests.local_service import BASE_MODEL_ARN, ENDPOINT_ENV_VARS, client_kwargs

TOK = ToyTokenizer()
PROMPT = TOK.apply_chat_template([{"role": "user", "content": "ann has 3 apples and buys 4 more . "}],
                                 add_generation_prompt=True)
SAMPLING = {"max_tokens": 512, "temperature": 1.0, "seed": 7}


class Endpoint:
    host = "http://127.0.0.1:9"


def test_only_connection_failures_for_the_whole_window_end_the_retries():
    now = [0.0]
    handler = FailFast(seconds=10, clock=lambda: now[0])
    refused = EndpointConnectionError(endpoint_url=Endpoint.host)
    assert handler(caught_exception=refused, endpoint=Endpoint) is None  # a blip: the SDK retries it
    now[0] = 9.9
    assert handler(caught_exception=refused, endpoint=Endpoint) is None
    now[0] = 10.0
    with pytest.raises(ServiceUnreachable, match=r"service at http://127.0.0.1:9 has not answered for 10s") as exc:
        handler(caught_exception=refused, endpoint=Endpoint)
    assert not is_retryable(exc.value) and exc.value.__cause__ is refused
    # Any answer (a throttle included: botocore hands it over as a response) starts the count again.
    assert handler(response=({"status_code": 429}, {}), endpoint=Endpoint) is None
    now[0] = 15.0
    assert handler(caught_exception=refused, endpoint=Endpoint) is None


def test_the_step_service_client_watches_every_botocore_client_of_the_pinned_sdk(local_service, caplog):
    """The SDK keeps its clients private: when an SDK upgrade moves them, this fails, not the fail-fast silently."""
    cfg = config_from_dict({"session": {**client_kwargs(), "base_model": BASE_MODEL_ARN}})
    with caplog.at_level(logging.WARNING, logger="steps.failfast"):
        service = service_client(cfg.session)
    assert [r for r in caplog.records if r.name == "steps.failfast"] == []
    for client in (service._sagemaker_session.sagemaker_client, service._sagemaker_client, service._runtime,
                   service._get_model_registry_client()):  # the last one built later, from the session
        assert "dapo-fail-fast" in client.meta.events._emitter._unique_id_handlers, client.meta.service_model


@pytest.fixture
def service_process(monkeypatch):
    """The local service as the local run starts it, in a process of its own, so that it can die: killed, it
    closes every connection at once (an in-process service's stop would still answer the open ones)."""
    proc = subprocess.Popen([sys.executable, "-m", "local.training_session", "--host", "127.0.0.1", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=str(ROOT))
    url = proc.stdout.readline().split("listening on ", 1)[1].strip()
    for var in ENDPOINT_ENV_VARS:
        monkeypatch.setenv(var, url)
    yield proc
    proc.kill()
    proc.wait()


def test_a_dead_service_fails_the_call_instead_of_retrying_for_minutes(service_process):
    client = fail_fast(ServiceClient(**client_kwargs()), seconds=1)
    training = client.create_lora_training_client(base_model=BASE_MODEL_ARN)
    sampler = training.create_sampling_client()
    assert sampler.sample(PROMPT, 1, SAMPLING).result().sequences
    service_process.kill()
    service_process.wait()
    # The service is gone (its port refuses): the next sample fails once the window has passed, where the SDK
    # alone would retry it ~150 times.
    with pytest.raises(ServiceUnreachable, match="has not answered for"):
        sampler.sample(PROMPT, 1, SAMPLING).result()
    with pytest.raises(ServiceUnreachable):  # and the stop at once: the endpoint is known to be gone
        training.stop()


def test_throttles_are_retried_as_before(local_service):
    """Even with no window at all, a throttled request is retried and succeeds: only a connection that does not
    open counts."""
    local_service.set_faults(Faults(throttle_rate=1.0, throttle_limit=2))
    client = fail_fast(ServiceClient(**client_kwargs()), seconds=0)
    with client.create_lora_training_client(base_model=BASE_MODEL_ARN) as training:
        assert training.create_sampling_client().sample(PROMPT, 1, SAMPLING).result().sequences
    with urllib.request.urlopen(f"{local_service.url}/_admin/faults", timeout=10) as resp:
        assert json.loads(resp.read())["injected"]["throttled"] >= 2
