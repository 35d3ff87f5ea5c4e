"""The DAPO training loop, in the manner of tinker-cookbook's ``rl_loop``: :meth:`Trainer.step` reads top to bottom.

Per step: sample -> grade -> filter (dynamic sampling fills ``batch_size`` informative groups,
carrying any surplus) -> health (the guards judge the sampled completions: a sick run stops here, as
one the generation-batch cap stops does) -> advantages -> datums -> update (one ``forward_backward`` and one
``optim_step``, with the next sampler's ``save_weights_for_sampler`` queued behind them, so the
three training operations cost one wait, not three) -> save (a checkpoint every ``save_every``
steps and at the end). The loop carries one frozen :class:`~steps.dapo.state.LoopState`; a
checkpoint is that state, written.

The prompts and the grader come from the run's task (steps/dapo/task.py); when each part is
waited on, the overlap of one step with the next, from its :class:`~steps.dapo.schedule.Schedule`.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from sagemaker.train.training_session import AdamParams, SamplingParams

from steps.config import DapoConfig
from steps.dapo import guards, rollouts
from steps.dapo.batch import build_datums, train_samples
from steps.dapo.health import drawn_by, health_figures, sampler_kl, step_rollouts
from steps.dapo.heldout import EvalResult, evaluate_greedy
from steps.dapo.metrics import MetricsLog, sampling_figures, train_figures
from steps.dapo.reward import RewardShaping
from steps.dapo.sampling import GenerationBatch, GroupSampler, StepBatch, collect_step
from steps.dapo.schedule import OFF_POLICY_LIMIT, Filled, PendingCheckpoint, Policy, Schedule, Update
from steps.dapo.selective import Selector, Settings, after_step
from steps.dapo.state import Cursor, LoopState
from steps.dapo.task import Task
from steps.platform.billing import TokenMeter


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


def cap_facts(batch: StepBatch, cfg: DapoConfig) -> str:
    """What the generation-batch cap saw, for its stop reason (and a guard's, when one explains it)."""
    filtered = batch.filtered / len(batch.sampled) if batch.sampled else 0.0
    return (f"only {len(batch.kept)} of {cfg.batch_size} groups had mixed rewards after "
            f"max_num_gen_batches={cfg.max_num_gen_batches} generation batches (filtered fraction {filtered:.2f})")


def cap_reason(step: int, batch: StepBatch, cfg: DapoConfig) -> str:
    return (
        f"step {step + 1}: {cap_facts(batch, cfg)}. Training stops here with the model of step {step}. "
        "The prompts are too easy or too hard for the current model: raise max_num_gen_batches, "
        "raise group_size, or use a dataset of more suitable difficulty."
    )


@dataclass(frozen=True)
class SamplerAt:
    """A SamplingClient and the optimizer step of the weights it samples."""

    step: int
    client: Any


@dataclass
class Trainer:
    training_client: Any  # the SDK's TrainingClient of this run's session
    cfg: DapoConfig
    task: Task[Any]  # the prompts and the grader (steps/gsm8k/task.py for GSM8K)
    tokenizer: Any
    train_examples: Sequence[Any]
    eval_examples: Sequence[Any]
    metrics: MetricsLog
    checkpoint_dir: Path
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)  # session.chat_template_kwargs
    policy: Policy | None = None  # how much overlaps; None: the config's (steps/dapo/schedule.py)
    on_batch: Callable[[int, StepBatch], None] | None = None  # sees each step's batch once sampled (make bench)
    meter: TokenMeter = field(default_factory=TokenMeter)  # the billable tokens sent and received so far
    clock: Callable[[], float] = time.monotonic  # the service's time (make bench: the simulated clock)

    def __post_init__(self) -> None:
        cfg = self.cfg
        self.policy = self.policy or Policy.from_config(cfg)
        self.limits = guards.Limits.from_config(cfg)
        self._latest: SamplerAt | None = None  # the last sampler made (a fill sampling ahead may make it first)
        self._in_flight: tuple[GenerationBatch, ...] = ()  # spares still running when the last step was full
        self.selective = Settings.from_config(cfg)
        self._selected: dict[int, dict[str, Any]] = {}  # each step's selective-rollout figures, until its record
        self.sampler = GroupSampler(
            task=self.task, tokenizer=self.tokenizer, examples=self.train_examples, group_size=cfg.group_size,
            params=SamplingParams(max_tokens=cfg.max_tokens, temperature=cfg.temperature),
            shaping=RewardShaping(cfg.max_tokens, cfg.overlong_buffer, cfg.overlong_penalty, cfg.reward_format),
            sample_retries=cfg.sample_retries, chat_template_kwargs=self.chat_template_kwargs, meter=self.meter,
        )

    def run(self, state: LoopState) -> Outcome:
        """Train from ``state`` to the last step, or to a clean stop (the cap's, a guard's); evaluate every
        ``eval_every`` steps and at the end."""
        if state.stopped_early:  # a restart after a clean stop: nothing left to do
            return Outcome(state, None)
        sampler = self._sampler(state.step, self._save_weights(state.step).result())
        schedule = Schedule(self.policy, total_steps(self.cfg, len(self.train_examples)), self.checkpoint_dir,
                            now=self.clock)
        evaluated: tuple[int, EvalResult] | None = None
        with schedule.salvaging():
            while state.step < schedule.n_steps:
                state, sampler = self.step(state, sampler, schedule)
                if state.stopped_early:
                    return Outcome(state, evaluated[1] if evaluated else None)
                if self.cfg.eval_every and state.step % self.cfg.eval_every == 0:
                    with schedule.untimed():
                        evaluated = (state.step, self.evaluate(state.step, sampler.client))
            final = evaluated[1] if evaluated and evaluated[0] == state.step else (
                self.evaluate(state.step, sampler.client) if self.eval_examples else None)
            return Outcome(schedule.finish(state), final)

    def step(self, state: LoopState, sampler: SamplerAt, schedule: Schedule) -> tuple[LoopState, SamplerAt]:
        """One optimizer step: the state after it (``stopped_early`` if the cap or a guard stopped it), and the
        sampler of its weights."""
        cfg, update = self.cfg, state.step + 1
        # sample -> grade -> filter: dynamic sampling, drawn while the previous step trained if sampling ahead
        filled = schedule.sampled(lambda: self._fill(state, sampler))
        batch, record = filled.batch, sampling_figures(update, filled.batch)
        self.metrics.sampling(record)
        if self.on_batch:
            self.on_batch(update, batch)
        # health: the guards judge the sampled completions before they are trained on
        health = health_figures(step_rollouts(batch))
        # A step the cap stops is a guard's stop when a guard's condition holds on it (steps/dapo/guards.py).
        filled, trip = self._watch(filled, health, update, cap_facts(batch, cfg) if batch.hit_cap else None)
        if trip:
            return self._stop(filled, {**record, **health}, sampler, trip.reason, trip.guard), sampler
        if batch.hit_cap:
            return self._stop(filled, {**record, **health}, sampler, cap_reason(state.step, batch, cfg)), sampler
        # advantages -> datums
        samples = train_samples(batch.kept, cfg.advantage_std_scaling, cfg.overlong_filtering)
        datums = build_datums(samples, cfg.loss_aggregation)
        # update: its operations in one wait, the next step's sampling meanwhile if sampling ahead
        save = update % cfg.save_every == 0 or update == schedule.n_steps
        submitted = self._submit_update(datums, update, save)
        carry, dropped = schedule.carried(batch.carry, update + 1)
        after = replace(filled.state, step=update, carry=carry)
        fb_out, weights = schedule.trained(submitted, update, lambda done: self._fill(after, sampler, (update, done)))
        self.meter.trained(datums)  # forward_backward completed: its datums' tokens are billed
        new_sampler = self._sampler(update, weights)
        trained = replace(after, sampler_model_package_arn=new_sampler.client.model_package_arn)
        # The sampler-trainer mismatch, on the samples the weights this update starts from drew.
        health.update(sampler_kl(samples, drawn_by(batch.kept, state.step), fb_out.loss_fn_outputs))
        with schedule.untimed():
            self.metrics.step({**record, **train_figures(batch, samples, fb_out.metrics, schedule.lap(), update,
                                                         dropped), **health, **self.meter.figures(),
                              "sampled_ahead": int(filled.ahead), **self._selected.pop(update, {}),
                              "sampled_completion_tokens": sum(len(r.tokens) for g in batch.sampled
                                                               for r in g.rollouts)})
        # save: written once its save_state is done, behind the next step's sampling
        if save:
            schedule.checkpoint(submitted, trained)
        return trained, new_sampler

    def _fill(self, state: LoopState, sampler: SamplerAt,
              overlapping: tuple[int, Callable[[], tuple[Any, Any]]] | None = None) -> Filled:
        """Dynamic sampling for the step after ``state`` on ``sampler``'s weights; the state advances past
        every generation batch drawn. ``overlapping`` (sampling ahead): the optimizer step training meanwhile
        and the wait for its update; batches started once it is done sample its weights."""
        cfg = self.cfg
        cursor = Cursor(state.position, state.gen_batches_drawn)
        selector = Selector(self.selective, state.selective) if self.selective.enabled else None
        current = [sampler]
        # The previous step's spares still running: theirs if not too stale for this step (else left to finish).
        running = tuple(b for b in self._in_flight if state.step - b.sampler_step <= OFF_POLICY_LIMIT)

        def newer_weights() -> None:
            assert overlapping is not None
            current[0] = self._sampler(overlapping[0], overlapping[1]()[1])

        batch = collect_step(lambda: self._launch(current[0], cursor, selector), state.carry, cfg.batch_size,
                             cfg.max_num_gen_batches, self.policy.batches_to_launch,
                             (state.kept_groups, state.sampled_groups), newer_weights if overlapping else None,
                             running, spares=state.step + 1 < total_steps(cfg, len(self.train_examples)))
        self._in_flight = batch.in_flight
        filled = replace(state, position=cursor.position, gen_batches_drawn=cursor.drawn,
                         kept_groups=state.kept_groups + batch.informative,
                         sampled_groups=state.sampled_groups + len(batch.sampled))
        if selector is not None:  # the graded groups go into the prompts' history, the probabilities adapt
            sampled = len(batch.sampled)
            self._selected[state.step + 1] = {
                **selector.figures(), "observed_keep_rate": batch.informative / sampled if sampled else math.nan}
            filled = replace(filled, selective=after_step(state.selective, batch.sampled, state.step + 1,
                                                          self.selective, selector.explored + selector.skipped > 0))
        return Filled(batch, filled)

    def _launch(self, sampler: SamplerAt, cursor: Cursor, selector: Selector | None = None) -> GenerationBatch:
        """The next generation batch, every request of it on the service before any is awaited; with a
        ``selector`` (selective rollouts), prompts predicted all-equal are skipped as they are drawn."""
        indices, seed = cursor.next(len(self.train_examples), self.cfg.batch_size, self.cfg.seed, selector)
        batch = self.sampler.launch(sampler.client, indices, seed, sampler.step)
        for future in batch.futures:
            future.operation_id  # noqa: B018 - blocks until the submit round trip is done
        return batch

    def _submit_update(self, datums: list[dict[str, Any]], update: int, save: bool) -> Update:
        """forward_backward, optim_step and the next sampler's save, back to back; a checkpoint step's
        save_state queued behind them on the same sequence."""
        cfg = self.cfg
        fb = self.training_client.forward_backward(
            datums, loss_fn=cfg.loss_fn,
            loss_fn_config={"clip_low_threshold": cfg.clip_low_threshold,
                            "clip_high_threshold": cfg.clip_high_threshold},
        )
        optim = self.training_client.optim_step(adam_params(cfg))
        weights = self._save_weights(update)
        save_state = self.training_client.save_state(description=f"dapo step {update}") if save else None
        # Landed before the loop goes on to sample or wait: the update is queued ahead of any sampling
        # launched next, and a service timing the loop (the local cost model's virtual time) sees a loop
        # that waits on nothing it has not been sent.
        return Update(fb, optim, weights, save_state).landed()

    def _save_weights(self, step: int) -> Any:
        return self.training_client.save_weights_for_sampler(description=f"dapo step {step}")

    def _sampler(self, step: int, saved: Any) -> SamplerAt:
        """A SamplingClient on this session for the weights of ``step``, just saved (the one a fill sampling
        ahead already made for them, if it did)."""
        if not saved.model_package_arn:
            raise RuntimeError("save_weights_for_sampler returned no model package ARN; cannot sample the new weights")
        latest = self._latest
        if latest is None or latest.step != step or latest.client.model_package_arn != saved.model_package_arn:
            latest = SamplerAt(step, self.training_client.create_sampling_client(
                model_package_arn=saved.model_package_arn))
            self._latest = latest
        return latest

    def _watch(self, filled: Filled, health: dict[str, Any], update: int,
               capped: str | None = None) -> tuple[Filled, guards.Trip | None]:
        """The guards' verdict on a step's sampled completions, their counts carried in the state (``capped``: what
        the generation-batch cap saw, if it stopped the step). A step filled entirely by carried groups sampled
        nothing new: no evidence either way, the counts stay."""
        if not filled.batch.sampled:
            return filled, None
        memory, trip = guards.observe(filled.state.guard_state, health, self.limits, update, capped)
        return replace(filled, state=replace(filled.state, guard_state=memory)), trip

    def _stop(self, filled: Filled, record: dict[str, Any], sampler: SamplerAt, reason: str,
              guard: str = "") -> LoopState:
        """A clean stop (the cap's; a health guard's, named by ``guard``): why, logged; the state saved and
        its checkpoint written now."""
        self.metrics.print_fn(f"stopped: {reason}")
        self.metrics.stopped({**record, "guard": guard} if guard else record)
        stop = replace(filled.state, carry=filled.batch.kept, stopped_early=True, stop_reason=reason, guard=guard,
                       sampler_model_package_arn=sampler.client.model_package_arn)
        saved = self.training_client.save_state(description=f"dapo step {stop.step}")
        return stop.with_saved_state(PendingCheckpoint(saved, stop).write(self.checkpoint_dir))

    def evaluate(self, step: int, sampling_client: Any) -> EvalResult:
        cfg = self.cfg
        result = evaluate_greedy(sampling_client, self.task, self.tokenizer,
                                 self.eval_examples[: cfg.eval_size or None],  # eval_size 0: all of them
                                 cfg.max_tokens, cfg.sample_retries, self.chat_template_kwargs,
                                 shaping=self.sampler.shaping,  # rollouts show the reward training pays
                                 meter=self.meter)
        self.metrics.eval({"step": step, "accuracy": result.accuracy, "accuracy_lenient": result.accuracy_lenient,
                           "format_error_rate": result.format_error_rate,
                           "n": result.n, "failed": result.failed})
        self.metrics.rollouts(rollouts.rows(result.predictions, step, "trained", cfg.eval_rollouts), step)
        return result
