"""The DAPO training loop: one readable loop, in the manner of tinker-cookbook's ``rl_loop``.

Per step: dynamic sampling fills ``batch_size`` informative groups (carrying any
surplus), group advantages become datums, and one ``forward_backward`` plus one
``optim_step`` are submitted back to back with the next sampler's
``save_weights_for_sampler`` queued behind them, so the three training
operations cost one wait, not three. The loop carries one frozen
:class:`~steps.dapo.state.LoopState`; a checkpoint is that state, written.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

from sagemaker.train.training_session import AdamParams, SamplingParams

from steps.config import DapoConfig
from steps.dapo import state as checkpoint
from steps.dapo.batch import build_datums, train_samples
from steps.dapo.heldout import EvalResult, evaluate_greedy
from steps.dapo.metrics import MetricsLog, sampling_figures, train_figures
from steps.dapo.sampling import (
    GenerationBatch,
    Grader,
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

    def __post_init__(self) -> None:
        cfg = self.cfg
        self.sampler = GroupSampler(
            tokenizer=self.tokenizer, examples=self.train_examples, group_size=cfg.group_size,
            params=SamplingParams(max_tokens=cfg.max_tokens, temperature=cfg.temperature),
            shaping=RewardShaping(cfg.max_tokens, cfg.overlong_buffer, cfg.overlong_penalty),
            retries=cfg.sample_retries, grader=self.grader,
        )

    def run(self, state: LoopState) -> Outcome:
        cfg = self.cfg
        if state.stopped_early:  # a restart after the cap: nothing left to do
            return Outcome(state, None)
        n_steps = total_steps(cfg, len(self.train_examples))
        sampling_client = self._sampler(self._save_weights(state.step).result())
        last_eval: tuple[int, EvalResult] | None = None

        while state.step < n_steps:
            t0 = time.monotonic()
            batch, state = self._fill(state, sampling_client)
            record = sampling_figures(state.step + 1, batch)
            self.metrics.sampling(record)
            if batch.hit_cap:
                reason = cap_reason(state.step, batch, cfg)
                self.metrics.print_fn(f"stopped: {reason}")
                self.metrics.stopped(record)
                state = replace(state, carry=batch.kept, stopped_early=True, stop_reason=reason,
                                sampler_model_package_arn=sampling_client.model_package_arn)
                return Outcome(self._checkpoint(state), last_eval[1] if last_eval else None)

            samples = train_samples(batch.kept, cfg.advantage_std_scaling, cfg.overlong_filtering)
            fb = self.training_client.forward_backward(
                build_datums(samples, cfg.loss_aggregation), loss_fn=cfg.loss_fn,
                loss_fn_config={"clip_low_threshold": cfg.clip_low_threshold,
                                "clip_high_threshold": cfg.clip_high_threshold},
            )
            optim = self.training_client.optim_step(adam_params(cfg))
            # Queued behind the optimizer step on the same sequence: one wait for all three, awaited in
            # submission order so a failed step raises before the save is waited on.
            save = self._save_weights(state.step + 1)
            fb_out, _, saved = fb.result(), optim.result(), save.result()
            sampling_client = self._sampler(saved)
            state = replace(state, step=state.step + 1, carry=batch.carry,
                            sampler_model_package_arn=sampling_client.model_package_arn)
            self.metrics.step({**record, **train_figures(batch, samples, fb_out.metrics, time.monotonic() - t0)})

            if state.step % cfg.save_every == 0 or state.step == n_steps:
                state = self._checkpoint(state)
            if cfg.eval_every and state.step % cfg.eval_every == 0:
                last_eval = (state.step, self.evaluate(state.step, sampling_client))

        if last_eval and last_eval[0] == state.step:
            return Outcome(state, last_eval[1])
        return Outcome(state, self.evaluate(state.step, sampling_client) if self.eval_examples else None)

    def _fill(self, state: LoopState, sampling_client: Any) -> tuple[StepBatch, LoopState]:
        """Dynamic sampling for the next step; the state advances past every generation batch drawn."""
        position, drawn = state.position, state.gen_batches_drawn

        def launch() -> GenerationBatch:
            nonlocal position, drawn
            indices, position = take(len(self.train_examples), self.cfg.batch_size, self.cfg.seed, position)
            batch = self.sampler.launch(sampling_client, indices, seed=derived_seed(self.cfg.seed, drawn))
            drawn += 1
            return batch

        batch = collect_step(launch, state.carry, self.cfg.batch_size, self.cfg.max_num_gen_batches,
                             self.cfg.max_inflight_gen_batches, (state.kept_groups, state.sampled_groups))
        return batch, replace(state, position=position, gen_batches_drawn=drawn,
                              kept_groups=state.kept_groups + batch.informative,
                              sampled_groups=state.sampled_groups + len(batch.sampled))

    def _save_weights(self, step: int) -> Any:
        return self.training_client.save_weights_for_sampler(description=f"dapo step {step}")

    def _sampler(self, saved: Any) -> Any:
        """A SamplingClient on this session for the weights just saved."""
        if not saved.model_package_arn:
            raise RuntimeError("save_weights_for_sampler returned no model package ARN; cannot sample the new weights")
        return self.training_client.create_sampling_client(model_package_arn=saved.model_package_arn)

    def evaluate(self, step: int, sampling_client: Any) -> EvalResult:
        cfg = self.cfg
        result = evaluate_greedy(sampling_client, self.tokenizer, self.eval_examples[: cfg.eval_size], cfg.max_tokens,
                                 cfg.sample_retries)
        self.metrics.eval({"step": step, "accuracy": result.accuracy, "format_error_rate": result.format_error_rate,
                           "n": result.n, "failed": result.failed})
        return result

    def _checkpoint(self, state: LoopState) -> LoopState:
        saved = self.training_client.save_state(description=f"dapo step {state.step}").result()
        state = state.with_saved_state(saved.model_package_arn)
        checkpoint.write(self.checkpoint_dir, state)
        log.info("checkpoint: step=%d state=%s", state.step, saved.model_package_arn)
        return state
