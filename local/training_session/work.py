"""The operations' work: what each runtime operation does to a session and its toy model.

A :class:`Work` is what ``responses`` builds from a validated request; what it returns is an :class:`Outcome`
(which ``responses`` shapes into the operation's result), and what it bills a :class:`Billed` (the session's
``BillableTokenUsage``). A work reads and changes its session only through :class:`SessionState`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Mapping, Protocol

from local.training_session.exceptions import invalid
from local.training_session.registry import PackageGroup, PackageRegistry
from local.training_session.toy.adam import AdamConfig
from local.training_session.toy.policy import DatumArrays, Policy, SampledSeq


class SessionState(Protocol):
    """What an operation's work reads and changes of its session (``sessions.Session`` is one)."""

    name: str
    group: PackageGroup
    base_model: tuple[str, str]
    output_path: str
    registry: PackageRegistry
    policy: Policy | None

    def current_policy(self) -> Policy: ...


@dataclass(frozen=True)
class Billed:
    """Tokens billed, as ``BillableTokenUsage`` counts them: prompt tokens prefilled (a request's prompt once,
    however many samples share it; computeLogprobs too), tokens generated, and datum tokens trained (every
    model-input token of a forward or forward_backward datum, prompt positions included)."""

    prefill: int = 0
    sample: int = 0
    training: int = 0

    def __add__(self, other: Billed) -> Billed:
        return Billed(self.prefill + other.prefill, self.sample + other.sample, self.training + other.training)


class Outcome:
    """What an operation returns; ``responses`` shapes it into the operation's result."""

    @property
    def billed(self) -> Billed:
        return Billed()


@dataclass(frozen=True)
class LossOutcome(Outcome):
    """forward / forward_backward: metrics and per-datum loss outputs."""

    metrics: Mapping[str, float]
    outputs: list[dict[str, list[float]]]
    tokens: int  # the datums' model-input tokens

    @property
    def billed(self) -> Billed:
        return Billed(training=self.tokens)


@dataclass(frozen=True)
class Metrics(Outcome):
    """optim_step's metrics."""

    metrics: Mapping[str, float]


@dataclass(frozen=True)
class Saved(Outcome):
    model_package_arn: str


@dataclass(frozen=True)
class Done(Outcome):
    """loadState / loadWeightsForSampling: nothing to return."""


@dataclass(frozen=True)
class Sampled(Outcome):
    sequences: list[SampledSeq]
    prompt_logprobs: list[float | None] | None
    prompt_tokens: int

    @property
    def lengths(self) -> list[int]:
        return [len(s.tokens) for s in self.sequences]

    @property
    def billed(self) -> Billed:
        return Billed(prefill=self.prompt_tokens, sample=sum(self.lengths))


@dataclass(frozen=True)
class Logprobs(Outcome):
    logprobs: list[float | None]
    prompt_tokens: int

    @property
    def billed(self) -> Billed:
        return Billed(prefill=self.prompt_tokens)


class Work:
    """What one runtime operation does, built by ``responses`` from a request it has validated."""

    kind: ClassVar[str]  # the operationConfig member (an instance field where one class does two kinds)
    training: ClassVar[bool] = True

    @property
    def tokens(self) -> int:
        """What its cost is proportional to: datum tokens of a forward(_backward), prompt tokens of a sample or
        computeLogprobs; 0 for the rest."""
        return 0

    def check(self, registry: PackageRegistry) -> None:
        """What must hold of the backend's state at submit: a model package it names exists."""

    def run(self, session: SessionState) -> Outcome:
        raise NotImplementedError


@dataclass(frozen=True)
class LossWork(Work):
    kind: str  # type: ignore[misc]  # forward | forwardBackward
    datums: tuple[DatumArrays, ...]
    loss_fn: str
    loss_fn_config: dict[str, float] | None

    @property
    def tokens(self) -> int:
        return sum(len(d.tokens) for d in self.datums)

    def run(self, session: SessionState) -> Outcome:
        policy = session.current_policy()
        fn = policy.forward_backward if self.kind == "forwardBackward" else policy.forward
        metrics, outputs = fn(list(self.datums), loss_fn=self.loss_fn, loss_fn_config=self.loss_fn_config)
        return LossOutcome(metrics, outputs, self.tokens)


@dataclass(frozen=True)
class OptimWork(Work):
    adam: AdamConfig
    kind: ClassVar[str] = "optimizerStep"

    def run(self, session: SessionState) -> Outcome:
        return Metrics({k: float(v) for k, v in session.current_policy().optim_step(self.adam).items()})


@dataclass(frozen=True)
class SaveWork(Work):
    kind: str  # type: ignore[misc]  # saveState: weights and Adam moments (a checkpoint); saveWeights: weights
    description: str

    def run(self, session: SessionState) -> Outcome:
        checkpoint = self.kind == "saveState"
        package = session.registry.add(
            session.group, session.current_policy().state_dict(include_optimizer=checkpoint),
            is_checkpoint=checkpoint, description=self.description, base_model=session.base_model,
            session_name=session.name, s3_prefix=session.output_path)
        return Saved(package.arn)


@dataclass(frozen=True)
class LoadWork(Work):
    model_package_arn: str
    with_optimizer: bool
    kind: ClassVar[str] = "loadState"

    def check(self, registry: PackageRegistry) -> None:
        package = registry.get(self.model_package_arn)
        if self.with_optimizer and not package.is_checkpoint:
            raise invalid(f"operationConfig.loadState.modelPackageArn: {package.arn} holds sampler weights "
                          "(saveWeights) and no optimizer state; load it with loadOptimizer false, or load a "
                          "saveState checkpoint")

    def run(self, session: SessionState) -> Outcome:
        policy = Policy.from_state_dict(session.registry.weights(self.model_package_arn))
        session.policy = policy if self.with_optimizer else policy.weights_copy()  # weights_copy: fresh Adam
        return Done()


def _sampler(session: SessionState, model_package_arn: str | None) -> Policy:
    """Which weights a sampling operation reads: a saved package's, else the session's current ones."""
    return session.registry.policy(model_package_arn) if model_package_arn else session.current_policy()


def _require_package(registry: PackageRegistry, arn: str | None) -> None:
    if arn:
        registry.get(arn)  # checked at submit, not when the operation runs


@dataclass(frozen=True)
class SampleWork(Work):
    prompt: tuple[int, ...]
    num_samples: int
    max_tokens: int
    temperature: float | None = None
    top_k: int | None = None  # None: no top-k (the API's -1)
    top_p: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    model_package_arn: str | None = None
    with_prompt_logprobs: bool = False
    kind: ClassVar[str] = "sample"
    training: ClassVar[bool] = False

    @property
    def tokens(self) -> int:
        return len(self.prompt)

    def check(self, registry: PackageRegistry) -> None:
        _require_package(registry, self.model_package_arn)

    def run(self, session: SessionState) -> Outcome:
        policy = _sampler(session, self.model_package_arn)
        prompt = list(self.prompt)
        seqs = policy.sample(prompt, self.num_samples, self.max_tokens, temperature=self.temperature,
                             top_k=self.top_k, top_p=self.top_p, seed=self.seed, stop=list(self.stop) or None)
        prompt_logprobs = policy.compute_logprobs(prompt) if self.with_prompt_logprobs else None
        return Sampled(seqs, prompt_logprobs, len(prompt))


@dataclass(frozen=True)
class LogprobsWork(Work):
    prompt: tuple[int, ...]
    model_package_arn: str | None = None
    kind: ClassVar[str] = "computeLogprobs"
    training: ClassVar[bool] = False

    @property
    def tokens(self) -> int:
        return len(self.prompt)

    def check(self, registry: PackageRegistry) -> None:
        _require_package(registry, self.model_package_arn)

    def run(self, session: SessionState) -> Outcome:
        return Logprobs(_sampler(session, self.model_package_arn).compute_logprobs(list(self.prompt)),
                        len(self.prompt))


@dataclass(frozen=True)
class LoadSamplerWork(Work):
    model_package_arn: str
    kind: ClassVar[str] = "loadWeightsForSampling"
    training: ClassVar[bool] = False

    def check(self, registry: PackageRegistry) -> None:
        _require_package(registry, self.model_package_arn)

    def run(self, session: SessionState) -> Outcome:
        session.registry.policy(self.model_package_arn)  # build it now, so the first sample does not pay for it
        return Done()

