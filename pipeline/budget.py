"""What a run may cost, said before it starts: the most samples it may draw, and the training-session time a step
may take.

Dynamic sampling draws generation batches of ``batch_size`` prompts x ``group_size`` samples until
``batch_size`` informative groups are kept, at most ``max_num_gen_batches`` per step: a run of
``max_steps`` steps may draw ``max_steps x max_num_gen_batches`` generation batches. The bound is
reached when the data is too easy or too hard for the model, which is when a run is most wasteful.

A step's session time at the product's throughput figures (:class:`pipeline.throughput.Throughput`:
public serving and training figures for a ~30B model with LoRA on one GPU node): each of its
generation batches decodes ``batch_size x group_size`` sequences of ``max_tokens`` tokens, one
batch after another; then ``forward_backward`` over those tokens, ``optim_step``,
``save_weights_for_sampler`` and a ``save_state`` (a checkpoint step). Prompt prefill is left out
(GSM8K prompts are short). The session bills for its time whatever it is doing.
"""
from __future__ import annotations

from dataclasses import dataclass

from pipeline.throughput import Throughput
from steps.config import DapoConfig


@dataclass(frozen=True)
class Budget:
    max_steps: int | None  # None: the run ends after dapo.epochs, not after a number of steps
    gen_batches_per_step: int
    samples_per_gen_batch: int
    step_seconds: float  # the most session time one step may take

    @property
    def gen_batches(self) -> int | None:
        return None if self.max_steps is None else self.max_steps * self.gen_batches_per_step

    @property
    def samples(self) -> int | None:
        return None if self.gen_batches is None else self.gen_batches * self.samples_per_gen_batch


def worst_case(dapo: DapoConfig, throughput: Throughput = Throughput()) -> Budget:
    """The most a run of ``dapo`` may draw, and the most session time a step may take at ``throughput``."""
    sequences = dapo.batch_size * dapo.group_size
    decode = dapo.max_tokens / throughput.decode_rate(sequences)  # every sequence runs to max_tokens
    train = (throughput.training_seconds("forwardBackward", sequences * dapo.max_tokens)
             + sum(throughput.training_seconds(kind, 0) for kind in ("optimizerStep", "saveWeights", "saveState")))
    return Budget(dapo.max_steps, dapo.max_num_gen_batches, sequences, dapo.max_num_gen_batches * decode + train)


def _span(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds < 3600 else f"{seconds / 3600:.1f} h"


def describe(dapo: DapoConfig, throughput: Throughput = Throughput()) -> str:
    """Two lines for the console, before anything starts."""
    b = worst_case(dapo, throughput)
    per_batch = f"generation batches of {dapo.batch_size} x {dapo.group_size} = {b.samples_per_gen_batch:,} samples"
    if b.max_steps is None:
        draws = f"cost: each step may draw up to {b.gen_batches_per_step} {per_batch} (dapo.epochs bounds the steps)"
        total = ""
    else:
        draws = (f"cost: a run may draw up to max_steps {b.max_steps} x max_num_gen_batches {b.gen_batches_per_step} "
                 f"= {b.gen_batches:,} {per_batch} ({b.samples:,} samples)")
        total = f"; {b.max_steps} steps: up to {_span(b.max_steps * b.step_seconds)}"
    time = (f"cost: a step may take up to {_span(b.step_seconds)} of training-session time{total} "
            f"(max_tokens {dapo.max_tokens}; the throughput of a ~30B model on one GPU node, "
            "pipeline/throughput.py)")
    return f"{draws}\n{time}"
