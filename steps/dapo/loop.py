"""The DAPO training loop, in the manner of tinker-cookbook's ``rl_loop``: :meth:`Trainer.step` reads top to bottom.

Per step: sample -> grade -> filter (dynamic sampling fills ``batch_size`` informative groups, carrying any
surplus: steps/dapo/sampling.py) -> health (the guards judge the sampled completions: a sick run stops here, as
one the generation-batch cap stops does) -> advantages -> datums (steps/dapo/batch.py) -> update (one
``forward_backward`` and one ``optim_step``, with the next sampler's ``save_weights_for_sampler`` queued behind
them, so the three training operations cost one wait, not three) -> save (a checkpoint every ``save_every``
steps and at the end, its ``save_state`` awaited behind the next step's sampling).

Sampling ahead (``max_steps_off_policy: 1``, one step off-policy, as verl's one-step-off-policy recipe and
tinker-cookbook's async mode do) is a matter of when futures are awaited: the next step's expected generation
batches are submitted, on the weights this step trains from, before this step's update is awaited; once the
update is done, the rest of that fill samples the new weights. Each group carries the step of the weights that
sampled it; no group is trained more than ``OFF_POLICY_LIMIT`` steps off-policy.

With ``max_steps_off_policy: null`` (auto, the default) the run measures whether that overlap pays
(:class:`Overlap`): steps 1 and 2 sample and train one after the other, step 2 trains while step 3 samples (the
probe), and from then on the run samples ahead only if the probe step saved at least ``MIN_HIDDEN_SHARE`` of
what an overlap can save, ``min(S, T)``, against step 2's sampling and that training one after the other. On
GPUs that sampler and trainer share, training pauses decoding and the overlap cannot pay: the run goes back
on-policy, as it does wherever on-policy measured faster. Step 2's sampling is the reference, not step 1's:
step 1 starts one generation batch blind (no keep rate seen yet). A step's seconds leave evaluation out.

Between steps the loop hands on one frozen :class:`Carry`: the checkpointed :class:`~steps.dapo.state.LoopState`
and what is still running (the sampler, the next step's batch sampled ahead, spare generation batches, a
checkpoint whose save is running). ``make bench`` drives :meth:`Trainer.start`, :meth:`Trainer.step` and
:meth:`Trainer.finish` from outside, as :meth:`Trainer.run` does.
"""
from __future__ import annotations

import logging
import math
import time
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from sagemaker.train.training_session import AdamParams, SamplingParams

from steps.config import DapoConfig
from steps.dapo import forecast as forecasting
from steps.dapo import rollouts, selective
from steps.dapo import state as checkpoint
from steps.dapo.batch import build_datums, train_samples
from steps.dapo.health import Limits, drawn_by, health_figures, observe, sampler_kl, step_rollouts
from steps.dapo.heldout import EvalResult, evaluate_greedy
from steps.dapo.metrics import MetricsLog, sampling_figures, train_figures
from steps.dapo.sampling import (
    OFF_POLICY_LIMIT,
    Cursor,
    Draws,
    Filling,
    GenerationBatch,
    Group,
    GroupSampler,
    RewardShaping,
    SamplerAt,
    StepBatch,
)
from steps.dapo.state import LoopState, PendingCheckpoint
from steps.dapo.task import Task
from steps.platform.billing import TokenMeter

log = logging.getLogger(__name__)

#: The least share of the most an overlap can save, ``min(S, T)``, that the probe step must save for sampling
#: ahead to be kept (auto). On separate GPUs the overlap hides the shorter of sampling and training under the
#: longer, nearly all of it; on GPUs that sampler and trainer share it hides none, and the steps' sampling times
#: differ by a few seconds either way. Measured against ``min(S, T)`` rather than the whole step, so that noise
#: does not decide a short side's case (``make bench``: training x0.25 at 20% keep hides 3 s under 30 s of
#: sampling; a trainer-bound session hides its sampling under a longer training).
MIN_HIDDEN_SHARE = 0.5


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


def carried(groups: Sequence[Group], update: int, limit: int = OFF_POLICY_LIMIT) -> tuple[tuple[Group, ...], int]:
    """Surplus groups for optimizer step ``update``, and how many were dropped as more than ``limit`` steps stale
    for it: a carried group is one step older than the groups sampled for its step; sampling ahead, two."""
    fresh = tuple(g for g in groups if update - 1 - g.sampler_step <= limit)
    return fresh, len(groups) - len(fresh)


def overlap_pays(sampling_s: float, training_s: float, overlapped_s: float) -> bool:
    """Whether a step that trained while the next one sampled (``overlapped_s``: from its update's submit
    to both done) saved at least ``MIN_HIDDEN_SHARE`` of the most an overlap can save, the shorter of the
    two (``min(S, T)``), against an on-policy step's sampling (``sampling_s``) and the same training
    (``training_s``) one after the other. Never when on-policy was as fast (a saving of zero or less)."""
    saved = sampling_s + training_s - overlapped_s
    hideable = min(sampling_s, training_s)
    return hideable > 0 and saved > 0 and saved >= MIN_HIDDEN_SHARE * hideable


@dataclass(frozen=True)
class Overlap:
    """The auto decision's evidence (``max_steps_off_policy: null``): the last on-policy sampling and the
    last training waited on alone, in the run's clock's seconds; ``verdict`` once a probe step has run."""

    sampling_s: float | None = None
    training_s: float | None = None
    verdict: bool | None = None

    def sample_ahead(self) -> bool:
        """Sample the next step ahead: the verdict, or the probe once both figures are measured."""
        if self.verdict is not None:
            return self.verdict
        return self.sampling_s is not None and self.training_s is not None

    def sampled(self, seconds: float, groups: int) -> "Overlap":
        """An on-policy fill; one that sampled nothing (carried groups filled it) says nothing."""
        return replace(self, sampling_s=seconds) if groups else self

    def trained(self, seconds: float, ahead: bool, update_s: float, groups: int = 0) -> "Overlap":
        """After a step's update (``seconds`` until it and any sampling ahead, of ``groups``, were done,
        ``update_s`` until the update was): alone, its training time; the probe (the first step sampled
        ahead that sampled something), the verdict. The probe's own training time prices the on-policy
        step it is compared with: a step's training varies with its tokens."""
        if not ahead:
            return replace(self, training_s=seconds)
        if self.verdict is None and self.sample_ahead() and groups:  # (a fixed max_steps_off_policy: unmeasured)
            assert self.sampling_s is not None
            verdict = overlap_pays(self.sampling_s, update_s, seconds)
            log.info("overlap: sampling %.2fs alone, training %.2fs, %.2fs both overlapped: %s", self.sampling_s,
                     update_s, seconds, "sampling ahead" if verdict else "on-policy from now on")
            return replace(self, verdict=verdict)
        return self


def sample_ahead(update: int, n_steps: int, overlap: Overlap, max_steps_off_policy: int | None) -> bool:
    """Whether the step after optimizer step ``update`` samples while ``update`` trains (``max_steps_off_policy``
    None: auto, as ``overlap`` says)."""
    if update >= n_steps:
        return False
    if max_steps_off_policy is None:
        return overlap.sample_ahead()
    return bool(max_steps_off_policy)


def off_policy_limit(overlap: Overlap, max_steps_off_policy: int | None) -> int:
    """The most steps a group may be trained after the weights that sampled it: 2 only when set so
    (``max_steps_off_policy: 2``: sampled ahead and carried, trained two steps old rather than dropped);
    otherwise 1. Auto (None) stays at 1: bench/parity.py's table for 2 decides (docs/benchmarks.md)."""
    return 2 if max_steps_off_policy == 2 else OFF_POLICY_LIMIT


@dataclass(frozen=True)
class Update:
    """One optimizer step's training operations, submitted back to back so they cost one wait."""

    forward_backward: Any
    optim: Any
    save_weights: Any
    save_state: Any | None  # a checkpoint step's

    def landed(self) -> "Update":
        """Wait until the service has every operation (the SDK submits them in the background): the update is
        queued ahead of any sampling launched next, and a service timing the loop (the local cost model's
        virtual time) sees a loop that waits on nothing it has not been sent."""
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
class Filled:
    """What dynamic sampling drew for a step, the loop state once it was drawn, and its selective-rollout
    figures (none when they are off)."""

    batch: StepBatch
    state: LoopState
    ahead: bool = False  # sampled while the previous step trained
    selected: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Carry:
    """What one step hands the next: the loop state, and what is still running."""

    state: LoopState
    sampler: SamplerAt  # the weights of ``state.step``
    overlap: Overlap = Overlap()  # the auto decision's evidence
    ahead: Filled | None = None  # the next step's batch, sampled while this one trained
    in_flight: tuple[GenerationBatch, ...] = ()  # spare generation batches still running: the next fill's first
    pending: PendingCheckpoint | None = None  # a checkpoint whose save_state runs behind the next sampling
    lap_from: float = 0.0  # the run's clock when the next step's seconds started
    started: Draws | None = None  # step 1's fill, begun by the forecast: the probe's groups are step 1's first


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
    meter: TokenMeter = field(default_factory=TokenMeter)  # the billable tokens sent and received so far
    clock: Callable[[], float] = time.monotonic  # the service's time (make bench: the session's simulated clock)

    def __post_init__(self) -> None:
        cfg = self.cfg
        self.n_steps = total_steps(cfg, len(self.train_examples))
        self.limits = Limits.from_config(cfg)
        self.selective = selective.Settings.from_config(cfg)
        self.sampler = GroupSampler(
            task=self.task, tokenizer=self.tokenizer, examples=self.train_examples, group_size=cfg.group_size,
            params=SamplingParams(max_tokens=cfg.max_tokens, temperature=cfg.temperature),
            shaping=RewardShaping(cfg.max_tokens, cfg.overlong_buffer, cfg.overlong_penalty, cfg.reward_format),
            sample_retries=cfg.sample_retries, chat_template_kwargs=self.chat_template_kwargs, meter=self.meter,
        )
        self.filling = Filling(self.sampler, cfg.batch_size, cfg.max_num_gen_batches, cfg.seed,
                               cfg.max_inflight_gen_batches)

    def run(self, state: LoopState) -> Outcome:
        """Train from ``state`` to the last step, or to a clean stop (the cap's, a guard's); evaluate every
        ``eval_every`` steps and at the end."""
        if state.stopped_early:  # a restart after a clean stop: nothing left to do
            return Outcome(state, None)
        carry, evaluated = self.start(state), None
        if carry.state.stopped_early:  # the forecast: nothing to learn from
            return Outcome(carry.state, None)
        try:
            while carry.state.step < self.n_steps:
                carry, _ = self.step(carry)
                if carry.state.stopped_early:
                    return Outcome(carry.state, evaluated[1] if evaluated else None)
                if self.cfg.eval_every and carry.state.step % self.cfg.eval_every == 0:
                    evaluated = (carry.state.step, self.evaluate(carry.state.step, carry.sampler.client))
                    carry = replace(carry, lap_from=self.clock())  # evaluation belongs to no step's seconds
            final = evaluated[1] if evaluated and evaluated[0] == carry.state.step else (
                self.evaluate(carry.state.step, carry.sampler.client) if self.eval_examples else None)
            return Outcome(self.finish(carry), final)
        except Exception:
            self.salvage(carry)
            raise

    def start(self, state: LoopState) -> Carry:
        """The carry a run starts from: a sampler of ``state``'s weights; a fresh run's forecast made."""
        saved = self.training_client.save_weights_for_sampler(description=f"dapo step {state.step}").result()
        carry = Carry(state, self.sampler_for(state.step, saved), lap_from=self.clock())
        return self.forecast(carry) if state.step == 0 and state.gen_batches_drawn == 0 else carry

    def forecast(self, c: Carry) -> Carry:
        """Before step 1, step 1's first generation batch, sampled by the base model and read: will the data teach
        it (steps/dapo/forecast.py)? If no group is mixed, the run stops here, its state written (no training
        operation: nothing to save); otherwise step 1 goes on from these groups."""
        draws = self.draws(c.state, ())
        self.filling.launch(draws, c.sampler, fresh=self.spares(c.state))
        while draws.in_flight:
            draws.receive(draws.in_flight.popleft().result())
        if not draws.sampled:  # every request failed: nothing to read (step 1 says so, as it would have)
            return replace(c, started=draws)
        seen = forecasting.forecast(draws.sampled, self.cfg.batch_size, self.n_steps, self.meter.prices)
        self.metrics.forecast(seen.record())
        reason, guard = seen.stop_reason(self.cfg.reward_format), ""
        if not reason:
            return replace(c, started=draws)
        # A sick base model (say, a collapsed one writing one answer every time) is named by its guard, as a
        # step the cap stops is: its advice says more than the forecast's.
        health = health_figures(step_rollouts(draws.step_batch(self.cfg.batch_size)))
        _, trip = observe(c.state.guard_state, health, self.limits, 1, reason, "the forecast's probe before step 1")
        if trip:
            reason, guard = trip.reason, trip.guard
        self.metrics.print_fn(f"stopped: {reason}")
        self.metrics.stopped({"step": 1, **health, **seen.record(), "gen_batches": draws.launched,
                              "forecast": True, **({"guard": guard} if guard else {})})
        stop = replace(c.state, stopped_early=True, stop_reason=reason, guard=guard,
                       sampler_model_package_arn=c.sampler.client.model_package_arn)
        checkpoint.write(self.checkpoint_dir, stop)
        return replace(c, state=stop)

    def step(self, c: Carry) -> tuple[Carry, StepBatch]:
        """One optimizer step: what it hands the next (``state.stopped_early`` if the cap or a guard stopped it),
        and the batch it drew."""
        cfg, update = self.cfg, c.state.step + 1
        limit = off_policy_limit(c.overlap, cfg.max_steps_off_policy)  # how stale a trained group may be
        # sample -> grade -> filter: dynamic sampling, unless it ran while the previous step trained
        filled, overlap = c.ahead, c.overlap
        if filled is None:
            start = self.clock()
            filled = self.fill(c.state, c.in_flight, c.sampler, c.started, limit)
            overlap = overlap.sampled(self.clock() - start, len(filled.batch.sampled))
        batch, state = filled.batch, filled.state
        if c.pending:  # the previous checkpoint, its save done while this step sampled
            state = state.with_saved_state(c.pending.write(self.checkpoint_dir))
        record = sampling_figures(update, batch)
        self.metrics.sampling(record)
        # health: the guards judge the sampled completions before they are trained on
        health = health_figures(step_rollouts(batch))
        state, stop, guard = self.judge(state, batch, health, update)
        if stop:
            return replace(c, state=self.stop(state, batch, {**record, **health}, c.sampler, stop, guard)), batch
        # advantages -> datums
        samples = train_samples(batch.kept, cfg.advantage_std_scaling, cfg.overlong_filtering)
        datums = build_datums(samples, cfg.loss_aggregation)
        # update: forward_backward + optim_step + the next sampler's weights (+ a checkpoint's save_state)
        save = update % cfg.save_every == 0 or update == self.n_steps
        submitted, start = self.submit(datums, update, save), self.clock()
        surplus, dropped = carried(batch.carry, update + 1, limit)
        state = replace(state, step=update, carry=surplus)
        # sampling ahead: the next step's expected batches go out on these weights before the update is awaited
        draws = self.draws(state, batch.in_flight, limit) \
            if sample_ahead(update, self.n_steps, overlap, cfg.max_steps_off_policy) else None
        if draws:  # spares only if the surplus, two steps old when carried, may be trained
            self.filling.launch(draws, c.sampler, fresh=limit >= 2 and self.spares(state))
        fb_out, weights = submitted.result()
        update_s, sampler = self.clock() - start, self.sampler_for(update, weights)
        ahead = self.filled(state, draws, self.filling.collect(draws, sampler, self.spares(state)), True) \
            if draws else None  # the rest of the next step's fill samples the new weights
        overlap = overlap.trained(self.clock() - start, draws is not None, update_s,
                                  len(ahead.batch.sampled) if ahead else 0)
        self.meter.trained(datums)  # forward_backward completed: its datums' tokens are billed
        state = replace(state, sampler_model_package_arn=sampler.client.model_package_arn)
        # the sampler-trainer mismatch, on the samples the weights this update starts from drew
        health.update(sampler_kl(samples, drawn_by(batch.kept, c.state.step), fb_out.loss_fn_outputs))
        self.metrics.step({**record, **train_figures(batch, samples, fb_out.metrics, self.clock() - c.lap_from,
                                                     update, dropped),
                           **health, **self.meter.figures(), "sampled_ahead": int(filled.ahead), **filled.selected,
                           "sampled_completion_tokens": sum(len(r.tokens) for g in batch.sampled
                                                            for r in g.rollouts)})
        # save: checkpoint.json is written once its save_state is done, behind the next step's sampling
        pending = PendingCheckpoint(submitted.save_state, state) if save else None
        in_flight = ahead.batch.in_flight if ahead else batch.in_flight
        return Carry(state, sampler, overlap, ahead, in_flight, pending, self.clock()), batch

    def finish(self, c: Carry) -> LoopState:
        """The run's end: its last checkpoint written, once the save is done."""
        return c.state.with_saved_state(c.pending.write(self.checkpoint_dir)) if c.pending else c.state

    def salvage(self, c: Carry) -> None:
        """On the way out of a failed step: write the previous step's checkpoint if its save_state finished."""
        if c.pending:
            try:
                c.pending.write(self.checkpoint_dir)
            except Exception as exc:  # the error being raised is the one to report
                log.warning("checkpoint of step %d not written: %s", c.pending.state.step, exc)

    # -- the pieces of a step ------------------------------------------------------------------------------------
    def spares(self, state: LoopState) -> bool:
        """Whether the fill for the step after ``state`` can carry a surplus: not in the run's last step."""
        return state.step + 1 < self.n_steps

    def draws(self, state: LoopState, in_flight: Sequence[GenerationBatch], limit: int = OFF_POLICY_LIMIT) -> Draws:
        """Dynamic sampling for the step after ``state``, about to start: the previous fill's spares still
        running are its first, if not more than ``limit`` steps stale for it (else left to finish)."""
        return Draws(Cursor(state.position, state.gen_batches_drawn), state.carry,
                     (state.kept_groups, state.sampled_groups),
                     selective.selector(self.selective, state.selective),
                     in_flight=deque(b for b in in_flight if state.step - b.sampler_step <= limit))

    def fill(self, state: LoopState, in_flight: Sequence[GenerationBatch], sampler: SamplerAt,
             started: Draws | None = None, limit: int = OFF_POLICY_LIMIT) -> Filled:
        """Dynamic sampling for the step after ``state``, on-policy: every batch on ``sampler``'s weights
        (``started``: begun already, by the forecast; ``limit``: the stalest spare still running it takes)."""
        draws = started or self.draws(state, in_flight, limit)
        return self.filled(state, draws, self.filling.collect(draws, sampler, self.spares(state)))

    def filled(self, state: LoopState, draws: Draws, batch: StepBatch, ahead: bool = False) -> Filled:
        """The state once ``batch`` was drawn: past every generation batch drawn, its evidence counted, and the
        graded groups in the prompts' history when selective rollouts are on."""
        state = replace(state, position=draws.cursor.position, gen_batches_drawn=draws.cursor.drawn,
                        kept_groups=state.kept_groups + batch.informative,
                        sampled_groups=state.sampled_groups + len(batch.sampled))
        if draws.selector is None:
            return Filled(batch, state, ahead)
        skip_state, figures = draws.selector.observed(batch.sampled, state.step + 1)
        return Filled(batch, replace(state, selective=skip_state), ahead, figures)

    def judge(self, state: LoopState, batch: StepBatch, health: dict[str, Any],
              update: int) -> tuple[LoopState, str, str]:
        """The guards' verdict on a step's sampled completions, their counts carried in the state, then the cap's:
        (state, why the run stops or "", the guard that stopped it or ""). A step the cap stops is a guard's stop
        when a guard's condition holds on it. A step filled entirely by carried groups sampled nothing new: no
        evidence either way, the counts stay."""
        if batch.sampled:
            capped = cap_facts(batch, self.cfg) if batch.hit_cap else None
            memory, trip = observe(state.guard_state, health, self.limits, update, capped)
            state = replace(state, guard_state=memory)
            if trip:
                return state, trip.reason, trip.guard
        return state, cap_reason(state.step, batch, self.cfg) if batch.hit_cap else "", ""

    def stop(self, state: LoopState, batch: StepBatch, record: dict[str, Any], sampler: SamplerAt, reason: str,
             guard: str) -> LoopState:
        """A clean stop (the cap's; a health guard's, named by ``guard``): why, logged; the state saved and
        its checkpoint written now."""
        self.metrics.print_fn(f"stopped: {reason}")
        self.metrics.stopped({**record, "guard": guard} if guard else record)
        stop = replace(state, carry=batch.kept, stopped_early=True, stop_reason=reason, guard=guard,
                       sampler_model_package_arn=sampler.client.model_package_arn)
        saved = self.training_client.save_state(description=f"dapo step {stop.step}")
        return stop.with_saved_state(PendingCheckpoint(saved, stop).write(self.checkpoint_dir))

    def submit(self, datums: list[dict[str, Any]], update: int, save: bool) -> Update:
        """forward_backward, optim_step and the next sampler's save, back to back; a checkpoint step's
        save_state queued behind them on the same sequence."""
        cfg, client = self.cfg, self.training_client
        fb = client.forward_backward(datums, loss_fn=cfg.loss_fn,
                                     loss_fn_config={"clip_low_threshold": cfg.clip_low_threshold,
                                                     "clip_high_threshold": cfg.clip_high_threshold})
        optim = client.optim_step(adam_params(cfg))
        weights = client.save_weights_for_sampler(description=f"dapo step {update}")
        save_state = client.save_state(description=f"dapo step {update}") if save else None
        return Update(fb, optim, weights, save_state).landed()

    def sampler_for(self, step: int, saved: Any) -> SamplerAt:
        """A SamplingClient on this session for the weights of ``step``, just saved."""
        if not saved.model_package_arn:
            raise RuntimeError("save_weights_for_sampler returned no model package ARN; cannot sample the new weights")
        return SamplerAt(step, self.training_client.create_sampling_client(model_package_arn=saved.model_package_arn))

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
