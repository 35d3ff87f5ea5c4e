"""The DAPO training loop: one readable loop, in the manner of tinker-cookbook's rl_loop.

Per step: dynamic sampling fills `batch_size` informative groups (carrying any
surplus), group advantages become datums, and one `forward_backward` plus one
`optim_step` are submitted back to back with the next sampler's
`save_weights_for_sampler` queued behind them, so the three training ops cost
one wait, not three.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from sagemaker.train.training_session import AdamParams, SamplingParams

from steps import checkpoint as ckpt_io
from steps.advantages import group_advantages
from steps.checkpoint import Checkpoint
from steps.config import DapoConfig
from steps.data import Example
from steps.data_order import DataPosition, take
from steps.datums import TrainSample, build_datums
from steps.dynamic_sampling import KeepRate, StepBatch, collect_step
from steps.evaluation import EvalResult, evaluate_greedy
from steps.metrics import MetricsLog
from steps.rollouts import Group, GroupSampler, RewardShaping, default_grader, request_seed

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Outcome:
    steps_completed: int
    sampler_model_package_arn: str
    state_model_package_arn: str
    stopped_early: bool
    stop_reason: str
    final_eval: EvalResult | None


def total_steps(cfg: DapoConfig, n_train: int) -> int:
    by_epochs = math.ceil(cfg.epochs * n_train / cfg.batch_size) if cfg.epochs else None
    candidates = [s for s in (cfg.max_steps, by_epochs) if s]
    return min(candidates)


def train_samples(groups: Sequence[Group], cfg: DapoConfig) -> list[TrainSample]:
    out = []
    for g in groups:
        for r, adv in zip(g.rollouts, group_advantages(g.rewards, cfg.advantage_std_scaling)):
            # Overlong filtering: a truncated answer was cut off, not wrong, so it
            # should teach nothing either way.
            weight = 0.0 if (cfg.overlong_filtering and r.stop_reason == "length") else 1.0
            out.append(TrainSample(g.prompt, r.tokens, r.logprobs, adv, weight))
    return out


def adam_params(cfg: DapoConfig) -> AdamParams:
    return AdamParams(
        learning_rate=cfg.learning_rate, beta1=cfg.adam_beta1, beta2=cfg.adam_beta2,
        eps=cfg.adam_eps, weight_decay=cfg.weight_decay, grad_clip_norm=cfg.grad_clip_norm,
    )


@dataclass
class Cursor:
    """Where the data order and the sampling seeds stand; advanced by every generation batch."""

    position: DataPosition
    gen_batches_drawn: int


@dataclass
class Trainer:
    tc: Any  # TrainingClient
    cfg: DapoConfig
    tokenizer: Any
    train: Sequence[Example]
    eval: Sequence[Example]
    metrics: MetricsLog
    checkpoint_dir: Path
    grader: Callable = default_grader
    print_fn: Callable[[str], None] = print

    def __post_init__(self) -> None:
        d = self.cfg
        self.sampler = GroupSampler(
            tokenizer=self.tokenizer, examples=self.train, group_size=d.group_size,
            params=SamplingParams(max_tokens=d.max_tokens, temperature=d.temperature),
            shaping=RewardShaping(d.max_tokens, d.overlong_buffer, d.overlong_penalty),
            retries=d.sample_retries, grader=self.grader,
        )

    # -- one generation batch -------------------------------------------------
    def _launcher(self, client: Any, cursor: Cursor) -> Callable[[], Callable[[], list[Group | None]]]:
        def launch() -> Callable[[], list[Group | None]]:
            indices, cursor.position = take(len(self.train), self.cfg.batch_size, self.cfg.seed, cursor.position)
            seed = request_seed(self.cfg.seed, cursor.gen_batches_drawn)
            cursor.gen_batches_drawn += 1
            futures = self.sampler.submit(client, indices, seed)
            return lambda: self.sampler.collect(client, indices, futures, seed)

        return launch

    # -- the loop ----------------------------------------------------------------
    def run(self, start: Checkpoint) -> Outcome:
        d = self.cfg
        n_steps = total_steps(d, len(self.train))
        cursor = Cursor(start.position, start.gen_batches_drawn)
        keep_rate = KeepRate(start.keep_kept, start.keep_sampled)
        carry: list[Group] = list(start.carry)
        if start.stopped_early:  # a restart after the cap: nothing left to do
            return Outcome(start.step, start.sampler_model_package_arn, start.state_model_package_arn,
                           True, start.stop_reason, None)
        state, step = start, start.step
        client = self._sampler(self.tc.save_weights_for_sampler(description=f"dapo step {step}").result())
        last_eval: tuple[int, EvalResult] | None = None

        while step < n_steps:
            t0 = time.monotonic()
            batch = collect_step(self._launcher(client, cursor), carry, d.batch_size,
                                 d.max_num_gen_batches, d.max_inflight_gen_batches, keep_rate)
            self._log_sampling(step + 1, batch)
            if batch.hit_cap:
                reason = (
                    f"step {step + 1}: only {len(batch.kept)} of {d.batch_size} groups had mixed rewards after "
                    f"max_num_gen_batches={d.max_num_gen_batches} generation batches "
                    f"(filtered fraction {batch.filtered_frac:.2f}). Training stops here with the model of step {step}. "
                    "The prompts are too easy or too hard for the current model: raise max_num_gen_batches, "
                    "raise group_size, or use a dataset of more suitable difficulty."
                )
                self.print_fn(f"stopped: {reason}")
                state = self._checkpoint(step, client, cursor, batch.kept, keep_rate, stopped=reason)
                return Outcome(step, client.model_package_arn, state.state_model_package_arn, True, reason,
                               last_eval[1] if last_eval else None)

            carry = batch.carry
            samples = train_samples(batch.kept, d)
            fb = self.tc.forward_backward(
                build_datums(samples, d.loss_aggregation), loss_fn=d.loss_fn,
                loss_fn_config={"clip_low_threshold": d.clip_low_threshold, "clip_high_threshold": d.clip_high_threshold},
            )
            opt = self.tc.optim_step(adam_params(d))
            # Queued behind the optimizer step on the same sequence: one wait for all three.
            # Waited on in submission order, so a failed step raises before the save is awaited.
            save = self.tc.save_weights_for_sampler(description=f"dapo step {step + 1}")
            fb_out, _, saved = fb.result(), opt.result(), save.result()
            client = self._sampler(saved)
            step += 1
            self._log_train(step, batch, samples, fb_out, time.monotonic() - t0)

            if step % d.save_every == 0 or step == n_steps:
                state = self._checkpoint(step, client, cursor, carry, keep_rate)
            if d.eval_every and step % d.eval_every == 0:
                last_eval = (step, self.evaluate(step, client))

        if last_eval and last_eval[0] == step:
            final: EvalResult | None = last_eval[1]
        else:
            final = self.evaluate(step, client) if self.eval else None
        return Outcome(step, client.model_package_arn, state.state_model_package_arn, False, "", final)

    # -- pieces --------------------------------------------------------------------
    def _sampler(self, saved: Any) -> Any:
        """A SamplingClient on this session for the weights just saved."""
        if not saved.model_package_arn:
            raise RuntimeError("save_weights_for_sampler returned no model package ARN; cannot sample the new weights")
        return self.tc.create_sampling_client(model_package_arn=saved.model_package_arn)

    def evaluate(self, step: int, client: Any) -> EvalResult:
        result = evaluate_greedy(client, self.tokenizer, self.eval[: self.cfg.eval_size], self.cfg.max_tokens, self.cfg.sample_retries)
        self.print_fn(f"eval: step={step} accuracy={result.accuracy:.4f}")
        self.metrics.write({"kind": "eval", "step": step, "accuracy": result.accuracy,
                            "format_error_rate": result.format_error_rate, "n": result.n, "failed": result.failed})
        return result

    def _checkpoint(self, step: int, client: Any, cursor: Cursor, carry: Sequence[Group], keep_rate: KeepRate,
                    stopped: str = "") -> Checkpoint:
        saved = self.tc.save_state(description=f"dapo step {step}").result()
        ckpt = Checkpoint(
            step=step, state_model_package_arn=saved.model_package_arn,
            sampler_model_package_arn=client.model_package_arn, position=cursor.position,
            gen_batches_drawn=cursor.gen_batches_drawn, seed=self.cfg.seed, carry=tuple(carry),
            keep_kept=keep_rate.kept, keep_sampled=keep_rate.sampled,
            stopped_early=bool(stopped), stop_reason=stopped,
        )
        ckpt_io.write(self.checkpoint_dir, ckpt)
        log.info("checkpoint: step=%d state=%s", step, saved.model_package_arn)
        return ckpt

    def _log_sampling(self, step: int, b: StepBatch) -> None:
        self.print_fn(
            f"sampling: step={step} gen_batches={b.gen_batches} groups_sampled={b.groups_sampled} "
            f"filtered_frac={b.filtered_frac:.4f} kept_groups={len(b.kept)} empty_rollouts={b.empty_rollouts}"
        )
        if b.speculative:
            # Its own prefix: exactly one `sampling:` line per step keeps the metric regexes simple.
            self.print_fn(f"speculation: step={step} early_gen_batches={b.speculative} (the keep rate so far said "
                          "one more generation batch would not fill the step, so more were started at once)")
        if b.hit_cap:
            self.metrics.write({"kind": "stopped", "step": step, **_sampling_figures(b)})

    def _log_train(self, step: int, b: StepBatch, samples: Sequence[TrainSample], fb_out: Any, seconds: float) -> None:
        rollouts = [r for g in b.sampled for r in g.rollouts]
        reward_mean = sum(r.reward for r in rollouts) / len(rollouts) if rollouts else 0.0
        accuracy = sum(r.correct for r in rollouts) / len(rollouts) if rollouts else 0.0
        tokens = sum(len(s.completion) for s in samples if s.weight > 0)
        loss = float((fb_out.metrics or {}).get("loss:sum", float("nan")))
        self.print_fn(
            f"train: step={step} reward_mean={reward_mean:.4f} accuracy={accuracy:.4f} "
            f"loss={loss:.6g} tokens={tokens} seconds={seconds:.2f}"
        )
        self.metrics.write({"kind": "step", "step": step, **_sampling_figures(b), "reward_mean": reward_mean,
                            "accuracy": accuracy, "loss": loss, "tokens": tokens, "seconds": seconds})


def _sampling_figures(b: StepBatch) -> dict[str, Any]:
    all_wrong_frac = b.filtered_all_wrong / b.groups_sampled if b.groups_sampled else 0.0
    return {"gen_batches": b.gen_batches, "groups_sampled": b.groups_sampled, "filtered_frac": b.filtered_frac,
            "filtered_all_wrong_frac": all_wrong_frac,
            "kept_groups": len(b.kept), "carried_groups": len(b.carry), "empty_rollouts": b.empty_rollouts,
            "failed_groups": b.failed_groups, "speculative_batches": b.speculative}
