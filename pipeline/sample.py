"""``python -m pipeline.sample --config X --model ARN --prompt TEXT [--n N]``: try a trained adapter.

``make sample MODEL=<model package ARN> PROMPT="..."`` prints the adapter's completions through the
training-session sampling API, with the SDK's own classes, as EvaluateModel samples it: one LoRA training
session on the base model the package was trained on (``DescribeModelPackage`` names it; the SDK's own
reading), one sampling client on the package, one ``sample`` request of ``--n`` completions. The prompt is one
user message rendered with the base model's chat template and the config's ``session.chat_template_kwargs``
(steps/dapo/chat.py), as the steps render theirs; each completion is printed as a grader reads it (special
tokens kept, so a reasoning block shows).

The session bills from creation to stop, so it is stopped however this ends (done, an error, Ctrl-C, SIGTERM:
steps/platform/session.py's ``stop_session``), and the tokens it billed are read once it is stopped and
printed as the steps print theirs (``billing:``, steps/platform/billing.py). ``local.sample`` runs the same
code against a finished local run's adapter.
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from steps import terminal
from steps.cli import Refused, run_step
from steps.config import RunConfig, load_config
from steps.dapo.chat import completion_text, opens_reasoning, render_messages
from steps.platform import billing
from steps.platform.session import lora_kwargs, service_client, stop_session
from steps.platform.tokenizer import load_tokenizer
from steps.platform.versions import require_training_session_sdk


@dataclass(frozen=True)
class Request:
    """What to ask the adapter: the prompt and the sampling parameters (None: the config's)."""

    model_package_arn: str
    prompt: str
    n: int = 1
    temperature: float | None = None  # None: dapo.temperature; 0: greedy
    max_tokens: int | None = None  # None: dapo.max_tokens (the API's minimum is 512)
    seed: int | None = None
    tokenizer_dir: str | None = None  # the base model's tokenizer files, for a machine without Hub access


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options the AWS and the local form share."""
    p.add_argument("--prompt", required=True, help="the user message, rendered with the base model's chat template")
    p.add_argument("--n", type=int, default=1, help="completions to sample (default 1)")
    p.add_argument("--temperature", type=float, default=None,
                   help="sampling temperature, 0 for greedy (default: dapo.temperature of the config)")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="the most tokens per completion, at least 512 (default: dapo.max_tokens of the config)")
    p.add_argument("--seed", type=int, default=None, help="sampling seed (default: none, a new draw each time)")
    p.add_argument("--tokenizer", default=None,
                   help="directory of the base model's tokenizer files (default: the one the Hub names)")


def request_from(args: argparse.Namespace, model_package_arn: str) -> Request:
    if args.n < 1:
        raise Refused(f"--n {args.n}: sample at least one completion")
    if not args.prompt.strip():
        raise Refused("--prompt is empty: give the question to ask the adapter (PROMPT=\"...\")")
    return Request(model_package_arn, args.prompt, args.n, args.temperature, args.max_tokens, args.seed,
                   args.tokenizer)


def registry_client(region: str | None) -> Any:
    """The registry the training-session SDK registered the package with (its endpoint override, else the
    Region's): the same client the steps read billing and approve with."""
    return billing.control_client(region)


def base_model_of(model_package_arn: str, region: str | None) -> str:
    """The versioned Hub ARN of the base model the package was trained on, read as the SDK reads it."""
    from botocore.exceptions import ClientError
    from sagemaker.train.training_session._utils import base_model_arn_from_model_package

    try:
        described = registry_client(region).describe_model_package(ModelPackageName=model_package_arn)
    except ClientError as exc:
        raise Refused(f"model package {model_package_arn}: {exc.response.get('Error', {}).get('Message', exc)} "
                      "(MODEL is a model package ARN of the group the pipeline registers to, or a local run id)"
                      ) from None
    try:
        return base_model_arn_from_model_package(described, region or "")
    except ValueError as exc:
        raise Refused(f"{exc} It is not a package a training session wrote; sample a package of the pipeline's "
                      "model package group") from None


def sample(service: Any, cfg: RunConfig, request: Request, base_model: str, prompt: list[int],
           say: Callable[[str], None] = print) -> tuple[Any, dict[str, Any]]:
    """The adapter's completions of ``prompt`` from a session of our own, stopped however this ends, and what the
    session billed (read once it is stopped)."""
    from sagemaker.train.training_session import SamplingParams

    session = cfg.session.model_copy(update={"base_model": base_model})
    params = SamplingParams(max_tokens=request.max_tokens or cfg.dapo.max_tokens,
                            temperature=cfg.dapo.temperature if request.temperature is None else request.temperature,
                            seed=request.seed)
    meter = billing.TokenMeter(prices=cfg.session.prices)
    training_client = service.create_lora_training_client(**lora_kwargs(session))
    name = training_client.training_session_name
    say(f"sample: training session {name} created on {base_model}; it is stopped when this ends")
    response = None
    try:
        sampler = training_client.create_sampling_client(model_package_arn=request.model_package_arn)
        response = sampler.sample(prompt, num_samples=request.n, sampling_params=params).result()
        meter.sampled(len(prompt), [s.tokens for s in response.sequences])
    finally:  # first: the session is what is billed (also on Ctrl-C and SIGTERM, which unwind through here)
        if stop_session(training_client, failing=response is None):
            say(f"sample: training session {name} stopped")
    return response, billing.block(meter.total, billing.service_count(name, cfg.session.region), name,
                                   cfg.session.prices)


def try_adapter(cfg: RunConfig, request: Request, say: Callable[[str], None] = terminal.say) -> int:
    """Render the prompt, sample it from the adapter and print the completions and the bill."""
    base_model = base_model_of(request.model_package_arn, cfg.session.region)
    tokenizer = load_tokenizer(base_model, cfg.session.region, request.tokenizer_dir)
    prompt = render_messages(tokenizer, [{"role": "user", "content": request.prompt}],
                             cfg.session.chat_template_kwargs)
    reasoning_open = opens_reasoning(tokenizer, prompt)
    service = service_client(cfg.session.model_copy(update={"base_model": base_model}))
    response, bill = sample(service, cfg, request, base_model, prompt, say)
    say(f"sample: {len(response.sequences)} completion(s) of {request.model_package_arn} "
        f"({len(prompt)} prompt tokens)")
    for i, sequence in enumerate(response.sequences, 1):
        say(f"--- completion {i} of {len(response.sequences)}: {len(sequence.tokens)} tokens, "
            f"stop_reason={getattr(sequence.stop_reason, 'value', sequence.stop_reason)} ---")
        say(completion_text(tokenizer, sequence.tokens, reasoning_open))
    say(billing.line(bill))
    return 0


def quiet_logging(*loggers: str) -> None:
    """The completions on the console, not the SDK's INFO lines (run_step turns them on for the steps' logs); and
    nothing below ERROR from ``loggers``."""
    terminal.quiet_libraries()
    root = logging.getLogger()
    for handler in [root, *root.handlers]:
        handler.setLevel(logging.WARNING)
    for name in loggers:
        logging.getLogger(name).setLevel(logging.ERROR)


def main(argv: Sequence[str] | None = None) -> int:
    from pipeline.aws import aws_session, resolve_region

    p = argparse.ArgumentParser(prog="python -m pipeline.sample", description=__doc__.split("\n")[0])
    p.add_argument("--config", required=True, help="YAML config (its session: section: region, role, group)")
    p.add_argument("--model", required=True, help="the trained adapter's model package ARN")
    add_arguments(p)

    def body() -> int:
        quiet_logging()
        args = p.parse_args(argv)
        cfg = load_config(args.config)
        region = resolve_region(cfg.session.region, args.config)
        aws_session(region)  # credentials, before anything is created
        cfg = dataclasses.replace(cfg, session=cfg.session.model_copy(update={"region": region}))
        return try_adapter(cfg, request_from(args, args.model))

    require_training_session_sdk()  # exits 2 naming the fix, before the step does anything
    return run_step(body, hint=lambda: "nothing is left running: the session, if one was created, was stopped",
                    terminal=True)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted: the training session, if one was created, was stopped", file=sys.stderr)
        sys.exit(130)
