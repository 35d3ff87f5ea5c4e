"""What a run may cost, said before it starts: the most samples it may draw, the training-session time a step
may take, and the most tokens of each kind its sessions may bill (in USD with ``session.prices``).

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

The most billable tokens (steps/platform/billing.py says how the service counts them), with every generation
batch drawn and every completion ``max_tokens`` long: a step's requests prefill their prompts
(``max_num_gen_batches x batch_size`` of them) and generate ``group_size x max_tokens`` tokens each; its
``forward_backward`` trains ``batch_size x group_size`` datums of prompt + completion - 1 tokens. The
evaluations add theirs: greedy answers every ``eval_every`` steps and at the end in TrainDAPO, and in
EvaluateModel both models' greedy answers and ``eval_k`` samples per question. A prompt counts
:data:`PROMPT_TOKENS` (the budget speaks before any data is read).
"""
from __future__ import annotations

from dataclasses import dataclass

from pipeline.throughput import Throughput
from steps.config import DapoConfig
from steps.config.models import Prices
from steps.platform.billing import TokenCount, cost_usd

#: Tokens of one prompt in the worst case: GSM8K's longest question (985 characters, some 250 tokens) with the
#: instruction and a chat template around it.
PROMPT_TOKENS = 320
#: Held-out questions of an evaluation of ``eval_size`` 0 (the whole file): GSM8K's test split.
HELD_OUT_QUESTIONS = 1319


@dataclass(frozen=True)
class Budget:
    max_steps: int | None  # None: the run ends after dapo.epochs, not after a number of steps
    gen_batches_per_step: int
    samples_per_gen_batch: int
    step_seconds: float  # the most session time one step may take
    step_tokens: TokenCount = TokenCount()  # the most one step may bill (its sampling and its update)
    eval_tokens: TokenCount = TokenCount()  # the most a run's evaluations may bill (TrainDAPO's and EvaluateModel's)

    @property
    def tokens(self) -> TokenCount | None:
        """The most the whole run may bill; None when dapo.epochs bounds the steps."""
        if self.max_steps is None:
            return None
        per_step = self.step_tokens
        return TokenCount(*(self.max_steps * n for n in (per_step.prefill, per_step.sample, per_step.train))) \
            + self.eval_tokens

    @property
    def gen_batches(self) -> int | None:
        return None if self.max_steps is None else self.max_steps * self.gen_batches_per_step

    @property
    def samples(self) -> int | None:
        return None if self.gen_batches is None else self.gen_batches * self.samples_per_gen_batch


def step_tokens(dapo: DapoConfig, prompt_tokens: int = PROMPT_TOKENS) -> TokenCount:
    """The most one optimizer step may bill: every generation batch drawn, every completion max_tokens long."""
    requests = dapo.max_num_gen_batches * dapo.batch_size
    return TokenCount(prefill=requests * prompt_tokens, sample=requests * dapo.group_size * dapo.max_tokens,
                      train=dapo.batch_size * dapo.group_size * (prompt_tokens + dapo.max_tokens - 1))


def eval_tokens(dapo: DapoConfig, prompt_tokens: int = PROMPT_TOKENS) -> TokenCount:
    """The most a run's evaluations may bill: TrainDAPO's greedy ones (every eval_every steps and at the end; with
    dapo.epochs, only the last one is counted), and EvaluateModel's, where both models answer each question
    greedily and, with eval_k, once more with eval_k samples."""
    questions = dapo.eval_size or HELD_OUT_QUESTIONS
    steps, every = dapo.max_steps or 0, dapo.eval_every
    in_training = (steps // every + (steps % every != 0)) if every and steps else 1
    requests = questions * (in_training + 2 * (1 + (dapo.eval_k > 0)))
    sampled = questions * (in_training + 2 * (1 + dapo.eval_k))
    return TokenCount(prefill=requests * prompt_tokens, sample=sampled * dapo.max_tokens)


def worst_case(dapo: DapoConfig, throughput: Throughput = Throughput()) -> Budget:
    """The most a run of ``dapo`` may draw and bill, and the most session time a step may take at ``throughput``."""
    sequences = dapo.batch_size * dapo.group_size
    decode = dapo.max_tokens / throughput.decode_rate(sequences)  # every sequence runs to max_tokens
    train = (throughput.training_seconds("forwardBackward", sequences * dapo.max_tokens)
             + sum(throughput.training_seconds(kind, 0) for kind in ("optimizerStep", "saveWeights", "saveState")))
    return Budget(dapo.max_steps, dapo.max_num_gen_batches, sequences, dapo.max_num_gen_batches * decode + train,
                  step_tokens(dapo), eval_tokens(dapo))


def _span(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds < 3600 else f"{seconds / 3600:.1f} h"


def _counts(count: TokenCount) -> str:
    return f"{count.prefill:,} prefill, {count.sample:,} sample and {count.train:,} train tokens"


def _usd(count: TokenCount, prices: Prices | None) -> str:
    usd = cost_usd(count, prices)
    return "" if usd is None else f" = USD {usd:,.2f}"


def tokens_line(dapo: DapoConfig, b: Budget, prices: Prices | None = None) -> str:
    """The most billable tokens, and their money at ``prices``."""
    ev = b.eval_tokens
    if b.tokens is None:
        text = (f"cost: each step may bill up to {_counts(b.step_tokens)}{_usd(b.step_tokens, prices)}, "
                f"the evaluations {ev.prefill:,} prefill and {ev.sample:,} sample tokens{_usd(ev, prices)}")
    else:
        text = (f"cost: the run's sessions may bill up to {_counts(b.tokens)}{_usd(b.tokens, prices)}, the "
                f"evaluations' {ev.prefill:,} prefill and {ev.sample:,} sample tokens included")
    text += f" (prompts of {PROMPT_TOKENS} tokens, completions of max_tokens {dapo.max_tokens}"
    return text + ("; USD at session.prices)" if prices is not None else "; set session.prices to see it in USD)")


def model_name(base_model: str | None) -> str:
    """The model a Hub ARN (``.../hub-content/SageMakerPublicHub/Model/<name>/<version>``) or name selects."""
    if not base_model:
        return "the configured base model"
    parts = base_model.split("/")
    return parts[-2] if base_model.startswith("arn:") and len(parts) >= 3 else base_model


def _draws(dapo: DapoConfig, b: Budget, prefix: str) -> str:
    per_batch = f"generation batches of {dapo.batch_size} x {dapo.group_size} = {b.samples_per_gen_batch:,} samples"
    if b.max_steps is None:
        return f"{prefix}each step may draw up to {b.gen_batches_per_step} {per_batch} (dapo.epochs bounds the steps)"
    return (f"{prefix}a run may draw up to max_steps {b.max_steps} x max_num_gen_batches {b.gen_batches_per_step} "
            f"= {b.gen_batches:,} {per_batch} ({b.samples:,} samples)")


def describe(dapo: DapoConfig, throughput: Throughput = Throughput(), prices: Prices | None = None,
             base_model: str | None = None) -> str:
    """Three lines for the console before an execution starts on AWS; ``prices`` (session.prices) prices the
    tokens. The session time is an estimate at :class:`Throughput`'s figures, labelled with ``base_model``."""
    b = worst_case(dapo, throughput)
    total = "" if b.max_steps is None else f"; {b.max_steps} steps: up to {_span(b.max_steps * b.step_seconds)}"
    time = (f"estimate on AWS for {model_name(base_model)}: a step may take up to {_span(b.step_seconds)} of "
            f"training-session time{total} (max_tokens {dapo.max_tokens}; at the throughput of a ~30B model on one "
            "GPU node, pipeline/throughput.py)")
    return f"{_draws(dapo, b, 'cost: ')}\n{time}\n{tokens_line(dapo, b, prices)}"


def describe_toy(dapo: DapoConfig) -> str:
    """What a local run may draw and bill, as the toy's own figures (the local service counts its tokens as the
    real one would, and bills no money). No AWS session time: the toy model is not served on AWS, and a ~30B
    model's hours printed beside a run of seconds read as the toy's."""
    b = worst_case(dapo)
    if b.tokens is None:
        bill = f"each step may bill up to {_counts(b.step_tokens)}"
    else:
        bill = f"its sessions may bill up to {_counts(b.tokens)}, evaluations included"
    return (f"{_draws(dapo, b, 'toy run: ')}\n"
            f"toy run: {bill} (the local service's count: no money; every completion max_tokens "
            f"{dapo.max_tokens} long, prompts of {PROMPT_TOKENS})")
