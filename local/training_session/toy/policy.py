"""The policy the local training-session service trains and samples from.

:class:`Policy` holds the parameters of the toy model (:mod:`.model`), the
gradient accumulated since the last optimizer step, and the Adam state; it
offers the operations the service exposes: forward, forward_backward,
optim_step, sample, compute_logprobs, and state save/load. Its arguments arrive
validated (the service checks every request first); it asserts only what its
own maths needs.

:meth:`Policy.base` is the deterministic "pretrained" model ``local-toy-arith``.
It writes like a reasoning model: a completion either answers at once
(``#### N <eos>``) or first "thinks" in filler words (``so then now ...``), a
run that continues with probability 0.996 per token and then either answers
(``####``) or stops without an answer (``<eos>``). Completion lengths so spread
from 3 tokens to past the API's minimum ``max_tokens`` of 512 (about 8% of
temperature-1 samples are cut off, about 16% end without an answer; the mean is
about 130 tokens), and RL can learn to shorten the filler. Greedy decoding
answers at once (``####`` is the most likely first token). Its arithmetic is
vague (a low precision), it under-counts the second operand (85% of it after a
plus verb, 60% after a minus verb) and it likes round numbers after ``####``:
low accuracy (about 15%, greedy too) with plenty of room for RL to improve.

It follows the other built-in answer formats only partly, as a model tuned
mostly on GSM8K would: when the prompt asks for ``\\boxed{}``, for "The answer
is:" or for an option's letter (:func:`model.read_prompt`), 45% of its answers
take the asked form (``\\boxed { N }``, ``the answer is : N``, ``the answer is :
B``) and the rest stay ``#### N``, which greedy decoding always writes: a strict
accuracy of 0 greedy and about 5-10% sampled, that RL raises by learning the form
and the arithmetic together. For a multiple-choice prompt the head scores each
option's letter by its number, so the letter picked is the option nearest the
model's (vague) sum. GSM8K prompts sample exactly as before these forms existed.
"""
from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from local import toy_data
from local.training_session.toy import model as M
from local.training_session.toy.adam import AdamConfig, AdamState, adam_step
from local.training_session.toy.losses import LOSS_FNS, clip_bounds, summarize
from local.training_session.toy.tokenizer import CONTROL, DIGIT_CONTINUATIONS


@dataclass(frozen=True)
class DatumArrays:
    """One training datum: the model input and its per-token loss inputs."""

    tokens: np.ndarray  # int64, prompt + completion without its last token
    inputs: dict[str, np.ndarray]  # loss_fn_inputs by name, each 1-D, len == len(tokens)


@dataclass(frozen=True)
class SampledSeq:
    tokens: list[int]
    logprobs: list[float]
    stop_reason: str  # "stop" | "length"


Outputs = list[dict[str, list[float]]]


class Policy:
    """Parameters, accumulated gradient and Adam state of the toy model.

    The parameter vector is never written in place (``optim_step`` swaps in a new
    one), so ``sample``/``forward`` may run on other threads while this one trains;
    ``forward_backward``/``optim_step`` are serialized by a lock.
    """

    def __init__(self, params: np.ndarray, adam: AdamState | None = None) -> None:
        if params.shape != (M.N_PARAMS,):
            raise ValueError(f"parameter vector has shape {params.shape}, this model needs ({M.N_PARAMS},)")
        self._theta = _read_only(np.array(params, dtype=np.float64))
        self._adam = adam or AdamState.zeros(self._theta.shape)
        self._grad = np.zeros(M.N_PARAMS)
        self._lock = threading.Lock()

    @classmethod
    def base(cls) -> "Policy":
        return cls(_base_params())

    # ---- training ----------------------------------------------------------------

    def forward(self, datums: list[DatumArrays], loss_fn: str = "cross_entropy",
                loss_fn_config: dict | None = None) -> tuple[dict[str, float], Outputs]:
        """Loss metrics and per-token logprobs; gradients untouched."""
        metrics, outputs, _ = self._loss(self._theta, datums, loss_fn, loss_fn_config)
        return metrics, outputs

    def forward_backward(self, datums: list[DatumArrays], loss_fn: str,
                         loss_fn_config: dict | None) -> tuple[dict[str, float], Outputs]:
        """Like forward, and adds the batch's gradient to the accumulated one."""
        with self._lock:
            metrics, outputs, backward = self._loss(self._theta, datums, loss_fn, loss_fn_config)
            backward(M.unpack(self._grad))
        return metrics, outputs

    def optim_step(self, adam: AdamConfig) -> dict[str, float]:
        """Apply the accumulated gradient with Adam, then clear it."""
        with self._lock:
            theta, self._adam, metrics = adam_step(self._theta, self._grad, self._adam, adam)
            self._theta = _read_only(theta)
            self._grad = np.zeros(M.N_PARAMS)
        return metrics

    def gradient(self) -> np.ndarray:
        """A copy of the flat gradient accumulated since the last optim_step."""
        return self._grad.copy()

    def parameters(self) -> np.ndarray:
        """The flat parameter vector (read-only)."""
        return self._theta

    def _loss(self, theta: np.ndarray, datums: Sequence[DatumArrays], loss_fn: str, loss_fn_config: dict | None):
        assert datums, "a loss needs at least one datum"
        fn = LOSS_FNS[loss_fn]
        clip = clip_bounds(loss_fn_config) if fn.uses_clip else None
        inputs = [{k: np.asarray(v) for k, v in d.inputs.items()} for d in datums]
        params = M.unpack(theta)
        f = M.features([np.asarray(d.tokens, dtype=np.int64) for d in datums])
        targets = np.concatenate([x["target_tokens"] for x in inputs]).astype(np.int64)
        # Optional per-token temperature: p is scored at the temperature the token was sampled at.
        temps = np.concatenate([x.get("temperature", np.ones(len(x["weights"]))) for x in inputs]).astype(np.float64)
        temps = np.where(temps > 0, temps, 1.0)  # the service allows <= 0 only where the weight is 0
        logp_all = M.log_softmax(M.logits(params, f) / temps[:, None])
        logp = logp_all[np.arange(len(targets)), targets]
        ends = np.cumsum([len(x["weights"]) for x in inputs])
        per_datum_p = np.split(logp, ends[:-1])
        losses = [fn.per_token(p, x, clip) for p, x in zip(per_datum_p, inputs)]
        metrics = summarize(loss_fn, losses, per_datum_p, inputs)
        outputs = [{"logprobs": p.tolist()} for p in per_datum_p]

        def backward(grad: M.Params) -> None:
            dloss_dp = np.concatenate([t.dloss_dp for t in losses])
            active = np.flatnonzero(dloss_dp)
            # p = log_softmax(z / T)[y]  =>  dp/dz = (onehot(y) - softmax(z / T)) / T
            dz = -np.exp(logp_all[active])
            dz[np.arange(len(active)), targets[active]] += 1.0
            dz *= (dloss_dp[active] / temps[active])[:, None]
            M.backward(grad, params, f, dz, active)

        return metrics, outputs, backward

    # ---- sampling ----------------------------------------------------------------

    def sample(self, prompt: Sequence[int], num_samples: int, max_tokens: int, temperature: float | None = None,
               top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
               stop: Sequence[str] | None = None) -> list[SampledSeq]:
        """``num_samples`` completions of ``prompt``.

        Logprobs are those of the distribution sampled from, before top-k/top-p
        truncation: log softmax(logits / temperature). At temperature 1 they equal
        ``forward``'s; at temperature 0 (greedy) they are the temperature-1 ones. A
        sequence ends at ``<eos>`` (included; reason "stop"), once a ``stop``
        string appears in its decoded text (reason "stop"; the token that
        completed it included), or after ``max_tokens`` tokens ("length").
        ``seed`` is any 32-bit signed integer (the API's ``Integer``), negative ones too.
        """
        prompt = _token_ids(prompt)
        assert num_samples >= 1 and max_tokens >= 1, (num_samples, max_tokens)
        temperature = 1.0 if temperature is None else float(temperature)
        # numpy seeds must be >= 0: fold the API's signed 32-bit seed onto [0, 2**32)
        # one to one, so -1 and 1 stay different streams. Per call: concurrent
        # samplers share no RNG state.
        rng = np.random.default_rng(None if seed is None else seed % 2**32)
        params = M.unpack(self._theta)  # one snapshot, even if a training step swaps the weights
        picker = _Picker(params, temperature, top_k, top_p)
        return [_sample_one(picker, prompt, max_tokens, rng, list(stop or ())) for _ in range(num_samples)]

    def compute_logprobs(self, prompt: Sequence[int]) -> list[float | None]:
        """Logprob of each prompt token given the tokens before it (None for the first)."""
        tokens = np.asarray(_token_ids(prompt), dtype=np.int64)
        if len(tokens) == 1:
            return [None]
        z = M.logits(M.unpack(self._theta), M.features([tokens[:-1]]))
        return [None] + M.log_softmax(z)[np.arange(len(tokens) - 1), tokens[1:]].tolist()

    # ---- weights -----------------------------------------------------------------

    def weights_copy(self) -> "Policy":
        """The current weights for a sampler, without optimizer state."""
        return Policy(self._theta)

    def state_dict(self, include_optimizer: bool) -> dict[str, np.ndarray]:
        state = {"params": self._theta.copy()}
        if include_optimizer:
            state.update(adam_m=self._adam.m.copy(), adam_v=self._adam.v.copy(), adam_step=np.array(self._adam.step))
        return state

    @classmethod
    def from_state_dict(cls, state: dict[str, np.ndarray]) -> "Policy":
        """Restore a :meth:`state_dict`; Adam moments too when it has them."""
        if "params" not in state:
            raise ValueError(f"state has no 'params' (keys: {', '.join(state) or 'none'})")
        for key in ("params", "adam_m", "adam_v"):
            if key in state and np.shape(state[key]) != (M.N_PARAMS,):
                raise ValueError(f"state[{key!r}] has shape {np.shape(state[key])}, this model needs ({M.N_PARAMS},)")
        adam = None
        if "adam_m" in state:
            missing = [k for k in ("adam_v", "adam_step") if k not in state]
            if missing:
                raise ValueError(f"state has adam_m but not {', '.join(missing)}")
            adam = AdamState(np.array(state["adam_m"], dtype=np.float64), np.array(state["adam_v"], dtype=np.float64),
                             int(state["adam_step"]))
        return cls(np.asarray(state["params"]), adam)


def _read_only(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


def _token_ids(prompt: Sequence[int]) -> list[int]:
    tokens = [int(t) for t in prompt]
    assert tokens and all(0 <= t < M.VOCAB_SIZE for t in tokens), "a prompt of this model's token ids"
    return tokens


def _sample_one(picker: "_Picker", prompt: list[int], max_tokens: int, rng: np.random.Generator,
                stop: list[str]) -> SampledSeq:
    seq = list(prompt)
    last = max((i for i, tok in enumerate(seq) if tok == M.ASSISTANT), default=-1)
    reader = _Reader(picker.params, seq, last)
    tokens: list[int] = []
    logprobs: list[float] = []
    draws = rng.random(max_tokens) if picker.temperature > 0 else np.zeros(max_tokens)
    for u in draws.tolist():
        t = len(seq) - 1
        if seq[t] == M.ASSISTANT and t != last:
            last, reader = t, _Reader(picker.params, seq, t)
        tok, logprob = picker.pick(seq[t], M.offset_row(t, last), reader, u)
        seq.append(tok)
        reader.saw(tok)
        tokens.append(tok)
        logprobs.append(logprob)
        if tok == M.EOS or (stop and any(s in M.TOKENIZER.decode(tokens) for s in stop)):
            return SampledSeq(tokens, logprobs, "stop")
    return SampledSeq(tokens, logprobs, "length")


class _Reader:
    """What the features (model.features) see of a completion that starts after position ``last``:
    its prompt's format row, the head's centre and values, and the braces it has opened."""

    def __init__(self, p: M.Params, seq: list[int], last: int) -> None:
        self.in_completion = last >= 0
        info = M.read_prompt(seq[:max(last, 0)])
        self.format_row = M.FORMAT_ROW0 + info.format - 1 if self.in_completion and info.format != M.HASH else -1
        self.mu = float(p.head[0] + p.cue_weights.reshape(-1)[info.cues] @ info.cue_values)
        self.values, self.choice = info.values, info.format == M.CHOICE
        self.depth = 0

    def saw(self, tok: int) -> None:
        self.depth += (tok == M.OPEN) - (tok == M.CLOSE)

    def open(self) -> bool:
        return self.in_completion and self.depth > 0


@dataclass(frozen=True)
class _Distribution:
    """One next-token distribution, ready to draw from: the cumulative kept mass and the logprobs."""

    cumulative: list[float]  # over the tokens top-k/top-p keep (others add nothing)
    logprobs: list[float]  # log softmax(z / temperature), before truncation
    greedy: int  # argmax, for temperature 0

    def draw(self, u: float) -> int:
        """The token whose cumulative mass first exceeds ``u`` of the total."""
        return min(bisect.bisect_right(self.cumulative, u * self.cumulative[-1]), len(self.cumulative) - 1)


class _Picker:
    """Draws next tokens for one ``sample`` call (see Policy.sample).

    Outside the arithmetic head a position's logits depend only on (previous
    token, table row of the position, format row, inside braces or not), so each such distribution is computed
    once per call and reused: a run of filler costs a dictionary lookup and a
    bisection per token, not a softmax over the vocabulary.
    """

    def __init__(self, params: M.Params, temperature: float, top_k: int | None, top_p: float | None) -> None:
        self.params, self.temperature, self.top_k, self.top_p = params, temperature, top_k, top_p
        self._cache: dict[tuple[int, int], _Distribution] = {}

    def pick(self, prev: int, row: int, reader: _Reader, u: float) -> tuple[int, float]:
        """One token after ``prev`` at table row ``row`` of the completion ``reader`` reads, and its logprob."""
        key = (prev, row, reader.format_row, reader.open())
        if reader.in_completion and prev in M.VALUE_MARKERS:  # the head is active
            z = self._logits(*key)
            z[M.VALUE_IDS] += M.head_logits(np.array([reader.mu]), self.params, reader.values[None, :],
                                            np.array([reader.choice]))[0]
            dist = self._distribution(z)
        else:
            dist = self._cache.get(key)
            if dist is None:
                dist = self._cache[key] = self._distribution(self._logits(*key))
        tok = dist.greedy if self.temperature == 0 else dist.draw(u)
        return tok, dist.logprobs[tok]

    def _logits(self, prev: int, row: int, format_row: int, open_: bool) -> np.ndarray:
        table = self.params.table
        z = table[M.BIAS_ROW] + table[M.PREV_ROW0 + prev] + table[row]
        if format_row >= 0:
            z = z + table[format_row]
        return z + table[M.OPEN_ROW] if open_ else z

    def _distribution(self, z: np.ndarray) -> _Distribution:
        if self.temperature == 0:
            logp = M.log_softmax(z)  # greedy reports the temperature-1 logprobs
            return _Distribution([1.0], logp.tolist(), int(np.argmax(z)))
        logp = M.log_softmax(z / self.temperature)
        keep = np.ones(len(z), dtype=bool)
        order = np.argsort(-logp, kind="stable")
        if self.top_k is not None and self.top_k > 0:
            keep[order[self.top_k:]] = False
        if self.top_p is not None and self.top_p < 1:
            # Keep the smallest prefix of the sorted tokens whose mass reaches top_p.
            cum = np.cumsum(np.exp(logp[order]))
            keep[order[np.searchsorted(cum, self.top_p) + 1 :]] = False
        cumulative = np.cumsum(np.where(keep, np.exp(logp), 0.0))
        return _Distribution(cumulative.tolist(), logp.tolist(), int(np.argmax(z)))


# ---- the "pretrained" base model ----------------------------------------------------

BASE_SEED = 20240607
BASE_PRECISION = 0.15  # a broad bump: the answer's std is about 1.8 around mu
PLUS_VERB_WEIGHT = 0.85  # the base model's weight on the operand after a plus verb (should be 1)
MINUS_VERB_WEIGHT = -0.6  # ... after a minus verb (should be -1)
ROUND_BIAS = 1.0  # extra logit for multiples of 5 after "####"
PRIOR_NOISE = 0.3  # seeded noise on the number logits after "####"
# Reasoning-length completions (see the module docstring). The first completion token is "####" with
# ANSWER_FIRST, else one of the filler words (each less likely than "####", so greedy answers at once);
# a filler word is followed by another with FILLER_CONTINUE, else by "####" (FILLER_TO_ANSWER of the
# time) or by <eos>: a run of filler has a mean of about 1 / (1 - FILLER_CONTINUE) tokens.
FILLER_WORDS = ("so", "then", "now")
ANSWER_FIRST = 0.4
FILLER_CONTINUE = 0.996
FILLER_TO_ANSWER = 0.7
NEVER = -30.0  # the logit of a token the base model does not write at that point
# The other answer forms, for a prompt whose instruction asks for one (model.read_prompt): where the
# base model would write "####" it writes the asked form's first token with FOLLOW_INSTRUCTION, else
# still "####" (a GSM8K habit: so greedy decoding, which takes "####" over a filler word over the asked
# form, answers '#### N' whatever the instruction). The forms: '\boxed { N }' and 'the answer is : N';
# for a multiple-choice prompt 'the answer is : L', a letter with LETTER_AFTER_COLON more logit than a
# number, the head choosing among the letters by their options' numbers.
FOLLOW_INSTRUCTION = 0.45
LETTER_AFTER_COLON = 3.0
FORM_STARTS = {M.BOXED_FORMAT: "\\boxed", M.ANSWER_IS: "the", M.CHOICE: "the"}
FORM_CHAINS = (("\\boxed", "{"), ("the", "answer"), ("answer", "is"), ("is", ":"))


def _operand_cues(phrases: Sequence[str]) -> list[int]:
    """Token ids of the word right before the operand in each toy verb phrase."""
    return [M.TOKENIZER.token_id(p.split()[p.split().index("{b}") - 1]) for p in phrases]


def _base_params() -> np.ndarray:
    rng = np.random.default_rng(BASE_SEED)
    theta = np.zeros(M.N_PARAMS)
    p = M.unpack(theta)
    never = [M.TOKENIZER.token_id(t) for t in CONTROL + DIGIT_CONTINUATIONS if t != "<eos>"]
    p.table[M.BIAS_ROW, never] = -10.0
    filler = [M.TOKENIZER.token_id(w) for w in FILLER_WORDS]
    # The first completion token: "####", or a filler word that starts the "thinking".
    first = p.table[M.OFFSET_ROW0 + 0]
    first[:] = NEVER
    first[M.HASHES] = np.log(ANSWER_FIRST)
    first[filler] = np.log((1 - ANSWER_FIRST) / len(filler))
    # After a filler word: more filler, or the answer, or the end without one.
    for word in filler:
        row = p.table[M.PREV_ROW0 + word]
        row[:] = NEVER
        row[filler] = np.log(FILLER_CONTINUE / len(filler))
        row[M.HASHES] = np.log((1 - FILLER_CONTINUE) * FILLER_TO_ANSWER)
        row[M.EOS] = np.log((1 - FILLER_CONTINUE) * (1 - FILLER_TO_ANSWER))
    # After "####" a number (the head adds the arithmetic), and after a number <eos>.
    after_hashes = p.table[M.PREV_ROW0 + M.HASHES]
    after_hashes[np.setdiff1d(np.arange(M.VOCAB_SIZE), M.NUMBER_IDS)] = NEVER
    after_hashes[M.NUMBER_IDS] = ROUND_BIAS * (M.NUMBERS % 5 == 0) + PRIOR_NOISE * rng.standard_normal(len(M.NUMBERS))
    p.table[M.PREV_ROW0 + M.NUMBER_IDS, M.EOS] = -NEVER
    _other_forms(p, filler, after_hashes[M.NUMBER_IDS])
    # Arithmetic: "has A" counts fully; verbs only partly (and minus verbs least).
    p.cue_weights[M.BEFORE, M.TOKENIZER.token_id("has")] = M.VALUE_SCALE
    p.cue_weights[M.BEFORE, _operand_cues(toy_data.PLUS_VERBS)] = PLUS_VERB_WEIGHT * M.VALUE_SCALE
    p.cue_weights[M.BEFORE, _operand_cues(toy_data.MINUS_VERBS)] = MINUS_VERB_WEIGHT * M.VALUE_SCALE
    p.head[1] = np.log(BASE_PRECISION) / M.PRECISION_GAIN
    return theta


def _other_forms(p: M.Params, filler: list[int], number_prior: np.ndarray) -> None:
    """The answer forms other than '#### N' (see FOLLOW_INSTRUCTION): where a completion may answer, each
    form's first token is as likely as "####" times exp(NEVER), which its format row lifts (elsewhere the
    bias keeps it at NEVER or below even so), and the tokens of a form follow each other; GSM8K prompts
    never see them."""
    tok = M.TOKENIZER.token_id
    starts = sorted({tok(t) for t in FORM_STARTS.values()})
    p.table[M.BIAS_ROW, starts] = NEVER
    for row in [M.OFFSET_ROW0 + 0] + [M.PREV_ROW0 + w for w in filler]:
        p.table[row, starts] = p.table[row, M.HASHES]
    for fmt, start in FORM_STARTS.items():
        row = p.table[M.FORMAT_ROW0 + fmt - 1]
        row[tok(start)] = -NEVER + np.log(FOLLOW_INSTRUCTION)
        row[M.HASHES] = np.log(1 - FOLLOW_INSTRUCTION)
    for before, after in FORM_CHAINS:
        row = p.table[M.PREV_ROW0 + tok(before)]
        row[:] = NEVER
        row[tok(after)] = 0.0
    # The value: after "{" a number, after ":" a number or a letter (a multiple-choice prompt's format
    # row lifts the letters); the head scores both. Then "}" inside braces (OPEN_ROW), else <eos>.
    for marker in (M.OPEN, M.COLON):
        row = p.table[M.PREV_ROW0 + marker]
        row[:] = NEVER
        row[M.NUMBER_IDS] = number_prior
    p.table[M.PREV_ROW0 + M.OPEN, M.CLOSE] = 2 * NEVER  # not even OPEN_ROW's lift closes an empty box
    p.table[M.PREV_ROW0 + M.COLON, M.LETTER_IDS] = NEVER / 3
    p.table[M.FORMAT_ROW0 + M.CHOICE - 1, M.LETTER_IDS] = -NEVER / 3 + LETTER_AFTER_COLON
    p.table[M.PREV_ROW0 + M.LETTER_IDS, M.EOS] = -NEVER
    p.table[M.PREV_ROW0 + M.CLOSE, M.EOS] = -NEVER
    p.table[M.OPEN_ROW, M.CLOSE] = -NEVER
    p.table[M.OPEN_ROW, M.EOS] = NEVER
