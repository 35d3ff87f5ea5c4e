"""The DAPO training loop: one readable loop, in the manner of tinker-cookbook's ``rl_loop``.

Per step: dynamic sampling fills ``batch_size`` informative groups (carrying any
surplus), group advantages become datums, and one ``forward_backward`` plus one
``optim_step`` are submitted back to back with the next sampler's
``save_weights_for_sampler`` queued behind them, so the three training
operations cost one wait, not three. The loop carries one frozen
:class:`~steps.dapo.state.LoopState`; a checkpoint is that state, written.

Nothing waits that need not: a checkpoint step's ``save_state`` is queued behind the
update and awaited only after the next step's sampling, and ``checkpoint.json`` is
written then, naming a state that exists. With ``max_steps_off_policy: 1`` the next
step's sampling runs while a step trains, on the weights the step trained from (as
verl's one-step-off-policy recipe and tinker-cookbook's async mode do); each group
carries the step of the weights that sampled it, and the train line logs how many
steps off-policy a step trained (``OFF_POLICY_LIMIT``).
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from sagemaker.train.training_session import AdamParams, SamplingParams

from steps.config import DapoConfig
from steps.dapo import state as checkpoint
from steps.dapo.batch import TrainSample, build_datums, train_samples
from steps.dapo.heldout import EvalResult, evaluate_greedy
from steps.dapo.metrics import MetricsLog, sampling_figures, train_figures
from steps.dapo.sampling import (
    GenerationBatch,
    Grader,
    Group,
    GroupSampler,
    StepBatch,
    collect_step,
    derived_seed,
    grade_example,
)
from steps.dapo.state import LoopState, take
from steps.gsm8k.data import Example
from steps.gsm8k.reward import RewardShaping

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Outcome:
    state: LoopState
    final_eval: EvalResult | None


def total_steps(cfg: DapoConfig, n_train: int) -> int:
    by_epochs = math.ceil(cfg.epochs * n_train / cfg.batch_size) if cfg.epochs else None
    return min(s for s in (cfg.max_steps, by_epochs) if s)


def adam_params(cfg: DapoConfig) -> AdamParams:
    return AdamParams(learning_rate=cfg.learning_rate, beta1=cfg.adam_beta1, beta2=cfg.adam_beta2,
                      eps=cfg.adam_eps, weight_decay=cfg.weight_decay, grad_clip_norm=cfg.grad_clip_norm)


def cap_reason(step: int, batch: StepBatch, cfg: DapoConfig) -> str:
    filtered = batch.filtered / len(batch.sampled) if batch.sampled else 0.0
    return (
        f"step {step + 1}: only {len(batch.kept)} of {cfg.batch_size} groups had mixed rewards after "
        f"max_num_gen_batches={cfg.max_num_gen_batches} generation batches "
        f"(filtered fraction {filtered:.2f}). Training stops here with the model of step {step}. "
        "The prompts are too easy or too hard for the current model: raise max_num_gen_batches, "
        "raise group_size, or use a dataset of more suitable difficulty."
    )


#: The most optimizer steps a group is ever trained after the weights that sampled it. Surplus groups
#: carried into the next step are one step old; sampling ahead (max_steps_off_policy 1) makes a step's
#: groups one step old, and the ones it would carry two: those are dropped. The PPO ratio against the
#: sampler's logprobs (and its clip) is what makes a step-old group safe to train on.
OFF_POLICY_LIMIT = 1


@dataclass(frozen=True)
class SamplerAt:
    """A SamplingClient and the optimizer step of the weights it samples."""

    step: int
    client: Any


@dataclass(frozen=True)
class SampledBy:
    """A generation batch in flight, its groups stamped with the step of the weights that sample them."""

    batch: GenerationBatch
    step: int

    def result(self) -> list[Group | None]:
        return [None if g is None else replace(g, sampler_step=self.step) for g in self.batch.result()]


@dataclass(frozen=True)
class Filled:
    """What dynamic sampling drew for a step, and the loop state once it was drawn."""

    batch: StepBatch
    state: LoopState


@dataclass(frozen=True)
class Update:
    """One optimizer step's training operations, submitted back to back so they cost one wait."""

    forward_backward: Any
    optim: Any
    save_weights: Any
    save_state: Any | None  # a checkpoint step's, awaited only after the next step's sampling

    def landed(self) -> "Update":
        """Wait until the service has every operation (the SDK submits them in the background)."""
        for future in (self.forward_backward, self.optim, self.save_weights, self.save_state):
            if future is not None:
                future.operation_id  # noqa: B018 - blocks until the submit round trip is done
        return self

    def result(self) -> tuple[Any, Any]:
        """(forward_backward output, the saved sampler weights), awaited in submission order so a
        failed step raises before the save is waited on."""
        fb = self.forward_backward.result()
        self.optim.result()
        return fb, self.save_weights.result()


@dataclass(frozen=True)
class PendingCheckpoint:
    """A checkpoint whose save_state may still be running: written once that state exists."""

    save_state: Any
    state: LoopState


@dataclass
class Trainer:
    training_client: Any  # the SDK's TrainingClient of this run's session
    cfg: DapoConfig
    tokenizer: Any
    train_examples: Sequence[Example]
    eval_examples: Sequence[Example]
    metrics: MetricsLog
    checkpoint_dir: Path
    grader: Grader = grade_example
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)  # session.chat_template_kwargs

    def __post_init__(self) -> None:
        cfg = self.cfg
        self.sampler = GroupSampler(
            tokenizer=self.tokenizer, examples=self.train_examples, group_size=cfg.group_size,
            params=SamplingParams(max_tokens=cfg.max_tokens, temperature=cfg.temperature),
            shaping=RewardShaping(cfg.max_tokens, cfg.overlong_buffer, cfg.overlong_penalty, cfg.reward_format),
            retries=cfg.sample_retries, grader=self.grader, chat_template_kwargs=self.chat_template_kwargs,
        )

    def run(self, state: LoopState) -> Outcome:
        cfg = self.cfg
        if state.stopped_early:  # a restart after the cap: nothing left to do
            return Outcome(state, None)
        n_steps = total_steps(cfg, len(self.train_examples))
        sampler = self._sampler(state.step, self._save_weights(state.step).result())
        pending: PendingCheckpoint | None = None  # its save_state runs while the next step samples
        ahead: Filled | None = None  # max_steps_off_policy 1: the next step's batch, sampled while this one trained
        last_eval: tuple[int, EvalResult] | None = None
        step_clock = time.monotonic()
        try:
            while state.step < n_steps:
                filled = ahead or self._fill(state, sampler)
                ahead = None
                if pending:  # by now its state exists (or the step fails here, before training on)
                    filled = replace(filled, state=filled.state.with_saved_state(self._write(pending)))
                    pending = None
                batch, update = filled.batch, state.step + 1
                record = sampling_figures(update, batch)
                self.metrics.sampling(record)
                if batch.hit_cap:
                    reason = cap_reason(state.step, batch, cfg)
                    self.metrics.print_fn(f"stopped: {reason}")
                    self.metrics.stopped(record)
                    stop = replace(filled.state, carry=batch.kept, stopped_early=True, stop_reason=reason,
                                   sampler_model_package_arn=sampler.client.model_package_arn)
                    return Outcome(self._checkpoint(stop), last_eval[1] if last_eval else None)

                samples = train_samples(batch.kept, cfg.advantage_std_scaling, cfg.overlong_filtering)
                checkpoint_step = update % cfg.save_every == 0 or update == n_steps
                submitted = self._submit_update(samples, update, checkpoint_step)
                carry, dropped = self._carry(batch.carry, update + 1)
                after = replace(filled.state, step=update, carry=carry)
                if cfg.max_steps_off_policy and update < n_steps:
                    ahead, sampler, fb_out = self._fill_while_training(after, sampler, submitted)
                else:
                    fb_out, saved = submitted.result()
                    sampler = self._sampler(update, saved)
                state = replace(after, sampler_model_package_arn=sampler.client.model_package_arn)
                self.metrics.step({**record, **train_figures(batch, samples, fb_out.metrics,
                                                             time.monotonic() - step_clock, update, dropped)})
                step_clock = time.monotonic()
                if checkpoint_step:
                    pending = self._checkpoint_later(submitted, state)
                if cfg.eval_every and state.step % cfg.eval_every == 0:
                    last_eval = (state.step, self.evaluate(state.step, sampler.client))
                    step_clock = time.monotonic()  # a step's seconds leave the evaluation out

            final = last_eval[1] if last_eval and last_eval[0] == state.step else (
                self.evaluate(state.step, sampler.client) if self.eval_examples else None)
            if pending:
                state = state.with_saved_state(self._write(pending))
            return Outcome(state, final)
        except Exception:
            if pending:  # a save_state that finished still makes a checkpoint to resume from
                self._salvage(pending)
            raise

    def _fill(self, state: LoopState, sampler: SamplerAt) -> Filled:
        """Dynamic sampling for the step after ``state``; the state advances past every generation batch drawn."""
        position, drawn = state.position, state.gen_batches_drawn

        def launch() -> SampledBy:
            nonlocal position, drawn
            indices, position = take(len(self.train_examples), self.cfg.batch_size, self.cfg.seed, position)
            batch = self.sampler.launch(sampler.client, indices, seed=derived_seed(self.cfg.seed, drawn))
            for future in batch.futures:  # the whole batch on the service before any of it is awaited
                future.operation_id  # noqa: B018 - blocks until the submit round trip is done
            drawn += 1
            return SampledBy(batch, sampler.step)

        batch = collect_step(launch, state.carry, self.cfg.batch_size, self.cfg.max_num_gen_batches,
                             self.cfg.max_inflight_gen_batches, (state.kept_groups, state.sampled_groups))
        return Filled(batch, replace(state, position=position, gen_batches_drawn=drawn,
                                     kept_groups=state.kept_groups + batch.informative,
                                     sampled_groups=state.sampled_groups + len(batch.sampled)))

    def _fill_while_training(self, state: LoopState, sampler: SamplerAt,
                             update: Update) -> tuple[Filled, SamplerAt, Any]:
        """Sample the step after ``state`` while ``update`` trains, on the weights sampling now: one
        step older than the ones it will be trained from. Then wait for the update.

        Returns the batch, the sampler of the new weights, and the update's forward_backward output.
        The loop waits on one thread only, so a service can tell its waits from its work.
        """
        filled = self._fill(state, sampler)
        fb_out, saved = update.result()
        return filled, self._sampler(state.step, saved), fb_out

    def _carry(self, groups: Sequence[Group], update: int) -> tuple[tuple[Group, ...], int]:
        """Surplus groups for update ``update``, and how many were dropped as too stale for it.

        A carried group is one step older than the groups sampled for its step; with
        max_steps_off_policy 1 a group sampled ahead would become two: those are dropped,
        so no group is trained more than ``OFF_POLICY_LIMIT`` steps off-policy.
        """
        fresh = tuple(g for g in groups if update - 1 - g.sampler_step <= OFF_POLICY_LIMIT)
        return fresh, len(groups) - len(fresh)

    def _submit_update(self, samples: Sequence[TrainSample], update: int, checkpoint_step: bool) -> Update:
        """forward_backward, optim_step and the next sampler's save, back to back; a checkpoint step's
        save_state queued behind them on the same sequence."""
        cfg = self.cfg
        fb = self.training_client.forward_backward(
            build_datums(samples, cfg.loss_aggregation), loss_fn=cfg.loss_fn,
            loss_fn_config={"clip_low_threshold": cfg.clip_low_threshold,
                            "clip_high_threshold": cfg.clip_high_threshold},
        )
        optim = self.training_client.optim_step(adam_params(cfg))
        save = self._save_weights(update)
        save_state = self.training_client.save_state(description=f"dapo step {update}") if checkpoint_step else None
        # Landed before the loop goes on to sample or wait: the update is queued ahead of any sampling
        # launched next, and a service timing the loop (the local cost model's virtual time) sees a loop
        # that waits on nothing it has not been sent.
        return Update(fb, optim, save, save_state).landed()

    def _save_weights(self, step: int) -> Any:
        return self.training_client.save_weights_for_sampler(description=f"dapo step {step}")

    def _sampler(self, step: int, saved: Any) -> SamplerAt:
        """A SamplingClient on this session for the weights of ``step``, just saved."""
        if not saved.model_package_arn:
            raise RuntimeError("save_weights_for_sampler returned no model package ARN; cannot sample the new weights")
        return SamplerAt(step, self.training_client.create_sampling_client(model_package_arn=saved.model_package_arn))

    def evaluate(self, step: int, sampling_client: Any) -> EvalResult:
        cfg = self.cfg
        result = evaluate_greedy(sampling_client, self.tokenizer, self.eval_examples[: cfg.eval_size], cfg.max_tokens,
                                 cfg.sample_retries, self.chat_template_kwargs)
        self.metrics.eval({"step": step, "accuracy": result.accuracy, "accuracy_lenient": result.accuracy_lenient,
                           "format_error_rate": result.format_error_rate,
                           "n": result.n, "failed": result.failed})
        return result

    def _checkpoint(self, state: LoopState) -> LoopState:
        """Save the state and write the checkpoint now (the cap's stop)."""
        pending = PendingCheckpoint(self.training_client.save_state(description=f"dapo step {state.step}"), state)
        return state.with_saved_state(self._write(pending))

    def _checkpoint_later(self, update: Update, state: LoopState) -> PendingCheckpoint:
        """The checkpoint of a step whose save_state was queued with its update: written after the next
        step's sampling (or at the end), so the save runs while the sampler works."""
        assert update.save_state is not None, "a checkpoint step queues its save_state"
        return PendingCheckpoint(update.save_state, state)

    def _write(self, pending: PendingCheckpoint) -> str:
        """Wait for the save_state, then write checkpoint.json: it only ever names a state that exists."""
        arn = pending.save_state.result().model_package_arn
        checkpoint.write(self.checkpoint_dir, pending.state.with_saved_state(arn))
        log.info("checkpoint: step=%d state=%s", pending.state.step, arn)
        return arn

    def _salvage(self, pending: PendingCheckpoint) -> None:
        """On the way out of a failed step: write the previous step's checkpoint if its save_state finished."""
        try:
            self._write(pending)
        except Exception as exc:  # the error being raised is the one to report
            log.warning("checkpoint of step %d not written: %s", pending.state.step, exc)
