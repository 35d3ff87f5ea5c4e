"""Knobs that drive the toy sick: the failures the training step's health guards catch (steps/dapo/health.py).

Each drives the sampler of ``local-toy-arith`` into one failure of RL fine-tuning that users of every RL stack
report, so a test can show that its guard stops the run:

- ``temperature``: every sampled (non-greedy) request is drawn at this temperature instead of the one asked
  for, and its logprobs are those of the distribution drawn from. Near 0 the toy answers the same way every
  time: **entropy collapse**.
- ``loop_rate``: this share of completions fall into a **repetition loop**: the completion's own last
  n-gram (n from 2 to 5) repeated until ``max_tokens``, as a degenerating LoRA run writes.
- ``run_on_rate``: this share of completions **never end**: filler words instead of their end-of-turn token,
  until ``max_tokens`` cuts them off.
- ``drop_form_per_step``: a share of completions lose their **answer form** (``####`` becomes ``so``: the
  number stays, the strict grade fails), growing by this much with each optimizer step the session has run
  (0 before the first), so format errors rise while the sampled accuracy falls.

Rewritten tokens carry the toy's own logprobs of them (its ``computeLogprobs``), so the trainer agrees with the
sampler on them. Which completions are rewritten is drawn from the request's seed, so a seeded run is sick the
same way every time. The knobs wrap the backend from outside, as the faults do: the hook replaces a
``sample`` operation's work (``sessions.Hooks.sampling_work``) with :class:`SickSampleWork`.

Settable three ways, all validated the same (``settings``): flags of ``python -m local.training_session``,
environment variables (:data:`ENV_VARS`), and ``POST /_admin/sickness``.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, fields, replace
from typing import ClassVar, Mapping, Sequence

import numpy as np

from local.training_session.sessions import Hooks, Session
from local.training_session.settings import Settings, require
from local.training_session.toy import model as M
from local.training_session.toy.policy import SampledSeq
from local.training_session.work import Outcome, Sampled, SampleWork, Work

logger = logging.getLogger(__name__)

SETTINGS = {
    "temperature": ("LOCAL_TS_SICK_TEMPERATURE", "--sick-temperature",
                    "sample every non-greedy request at this temperature (near 0: entropy collapse)"),
    "loop_rate": ("LOCAL_TS_SICK_LOOP_RATE", "--sick-loop-rate",
                  "fraction of completions that end in a repeated n-gram loop up to max_tokens"),
    "run_on_rate": ("LOCAL_TS_SICK_RUN_ON_RATE", "--sick-run-on-rate",
                    "fraction of completions that never end: filler until max_tokens cuts them off"),
    "drop_form_per_step": ("LOCAL_TS_SICK_DROP_FORM_PER_STEP", "--sick-drop-form-per-step",
                           "per optimizer step of the session, this much more of the completions lose '####'"),
}
ENV_VARS = {name: var for name, (var, _, _) in SETTINGS.items()}

SO = M.TOKENIZER.token_id("so")
FILLER = tuple(M.TOKENIZER.token_id(w) for w in ("so", "then", "now"))


@dataclass(frozen=True)
class Sickness(Settings):
    """How sick the toy's sampler is. The default is healthy."""

    temperature: float | None = None
    loop_rate: float = 0.0
    run_on_rate: float = 0.0
    drop_form_per_step: float = 0.0
    KIND: ClassVar[str] = "sickness"
    SETTINGS: ClassVar[Mapping[str, tuple[str, str, str]]] = SETTINGS

    def __post_init__(self) -> None:
        require("sickness", self.temperature is None
                or (isinstance(self.temperature, (int, float)) and 0 < self.temperature <= 2),
                "temperature", self.temperature, "a temperature in (0, 2], or null to sample as asked")
        for name in ("loop_rate", "run_on_rate", "drop_form_per_step"):
            value = getattr(self, name)
            require("sickness", isinstance(value, (int, float)) and 0.0 <= value <= 1.0,
                    name, value, "a fraction between 0 and 1")

    @property
    def healthy(self) -> bool:
        return self == Sickness()


@dataclass(frozen=True)
class SickSampleWork(SampleWork):
    """A ``sample`` operation of a sick toy: sampled as asked (or at the sick temperature), then rewritten."""

    sickness: Sickness = Sickness()

    def run(self, session: Session) -> Outcome:
        sick = self.sickness
        asked = self
        if sick.temperature is not None and self.temperature != 0:  # greedy stays greedy
            asked = replace(self, temperature=sick.temperature)
        outcome = SampleWork.run(asked, session)
        assert isinstance(outcome, Sampled)
        rng = np.random.default_rng(None if self.seed is None else [self.seed % 2**32, 0x51C])
        drop = min(1.0, sick.drop_form_per_step * _optimizer_steps(session))
        sequences = [self._rewrite(session, seq, rng, drop) for seq in outcome.sequences]
        return replace(outcome, sequences=sequences)

    def _rewrite(self, session: Session, seq: SampledSeq, rng: np.random.Generator, drop: float) -> SampledSeq:
        sick, tokens, stop = self.sickness, list(seq.tokens), seq.stop_reason
        body = tokens[:-1] if tokens and tokens[-1] == M.EOS else tokens
        if rng.random() < sick.loop_rate:
            tokens, stop = _loop(body[: self.max_tokens // 2], int(rng.integers(2, 6)), self.max_tokens), "length"
        elif rng.random() < sick.run_on_rate and stop == "stop":
            filler = rng.integers(0, len(FILLER), self.max_tokens - len(body))
            tokens, stop = body + [FILLER[i] for i in filler], "length"
        if rng.random() < drop:
            tokens = [SO if t == M.HASHES else t for t in tokens]
        if tokens == list(seq.tokens):
            return seq
        policy = session.registry.policy(self.model_package_arn) if self.model_package_arn else \
            session.current_policy()
        logprobs = policy.compute_logprobs(list(self.prompt) + tokens)[len(self.prompt):]
        return SampledSeq(tokens, [float(x) for x in logprobs], stop)


def _loop(start: Sequence[int], n: int, max_tokens: int) -> list[int]:
    """``start`` followed by its own last ``n`` tokens again and again, up to ``max_tokens``."""
    gram = list(start[-n:]) or [SO]
    tokens = list(start)
    while len(tokens) < max_tokens:
        tokens.extend(gram[: max_tokens - len(tokens)])
    return tokens


def _optimizer_steps(session: Session) -> int:
    return sum(op.kind == "optimizerStep" and op.status == "Completed" for op in session.operations())


class SicknessHook(Hooks):
    """Replaces each ``sample`` operation's work with a :class:`SickSampleWork` while the toy is set sick."""

    def __init__(self, sickness: Sickness | None = None) -> None:
        self.sickness = sickness or Sickness()

    def sampling_work(self, session: Session, work: Work) -> Work:
        sick = self.sickness
        if sick.healthy or type(work) is not SampleWork:
            return work
        return SickSampleWork(**{f.name: getattr(work, f.name) for f in fields(SampleWork)}, sickness=sick)
