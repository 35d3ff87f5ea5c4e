"""The maths of the toy policy: features of a prefix, logits, and exact gradients.

Next-token logits after a prefix are the sum of two parts.

1. A log-linear part: rows of a ``table`` (one weight per vocabulary token),
   one row per active feature: ``bias`` (always), the previous token, and where
   the next token falls (inside the prompt, or completion offset 0, 1, ...,
   capped). These carry the answer format ("####", a number, "<eos>") and a
   prior over tokens.
2. An arithmetic head, active right after ``####`` in a completion, which adds
   ``-precision * (y - mu)^2`` to the logit of every number token y, with

       mu = intercept + sum of cue_weights[c] * n / VALUE_SCALE
                        over each number n of the prompt and each neighbour c of n
                        (the word before and the word after count separately)
       precision = exp(PRECISION_GAIN * head[1])

   "has 3 ... buys 4" wants weight 1 (times VALUE_SCALE) on "has" and on
   "buys"; "gives away 4" wants -1 on "away".

The two scales decide how far one Adam step moves each part: Adam moves every
parameter by about the learning rate per step, whatever its gradient. Table
logits move by lr; a cue weight by lr / VALUE_SCALE, so mu drifts smoothly; the
precision by a factor exp(PRECISION_GAIN * lr), so confidence can grow within
tens of steps at a learning rate small enough to keep the table's noisy
per-token updates small.

The completion starts after the last ``<assistant>`` token of the prefix, so
features are a pure function of the prefix: sampling and scoring agree. All
parameters live in one flat float64 vector (what Adam updates); :func:`unpack`
gives named views of it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from local.training_session.toy.tokenizer import ToyTokenizer

TOKENIZER = ToyTokenizer()
VOCAB_SIZE = TOKENIZER.vocab_size
ASSISTANT = TOKENIZER.token_id("<assistant>")
HASHES = TOKENIZER.token_id("####")
EOS = TOKENIZER.eos_token_id
# NUMBER_VALUE[token id] is the number a whole-number token stands for, else -1.
NUMBER_VALUE = np.full(VOCAB_SIZE, -1)
for _n in range(100):
    NUMBER_VALUE[TOKENIZER.token_id(str(_n))] = _n
NUMBER_IDS = np.flatnonzero(NUMBER_VALUE >= 0)
NUMBERS = NUMBER_VALUE[NUMBER_IDS].astype(np.float64)

# Rows of the table.
N_OFFSETS = 6  # completion offsets 0..4 get their own row; 5 and later share one
BIAS_ROW = 0
PREV_ROW0 = 1
PROMPT_ROW = PREV_ROW0 + VOCAB_SIZE
OFFSET_ROW0 = PROMPT_ROW + 1
N_ROWS = OFFSET_ROW0 + N_OFFSETS
BEFORE, AFTER = 0, 1  # cue_weights rows: the word before / after a number
VALUE_SCALE = 4.0  # see the module docstring
PRECISION_GAIN = 8.0
# head = (intercept, log precision / PRECISION_GAIN)
SHAPES = {"table": (N_ROWS, VOCAB_SIZE), "cue_weights": (2, VOCAB_SIZE), "head": (2,)}
N_PARAMS = sum(int(np.prod(s)) for s in SHAPES.values())


@dataclass(frozen=True)
class Params:
    """Named views into one flat parameter (or gradient) vector."""

    table: np.ndarray
    cue_weights: np.ndarray
    head: np.ndarray


def unpack(flat: np.ndarray) -> Params:
    views, start = {}, 0
    for name, shape in SHAPES.items():
        size = int(np.prod(shape))
        views[name] = flat[start : start + size].reshape(shape)
        start += size
    return Params(**views)


@dataclass(frozen=True)
class Features:
    """What is active at every position of a batch of sequences (flattened)."""

    prev_rows: np.ndarray  # (N,) table row of the previous token
    offset_rows: np.ndarray  # (N,) table row of the position
    head_pos: np.ndarray  # (H,) positions where the arithmetic head is active
    term_head: np.ndarray  # (K,) which head position each mu term belongs to
    term_cue: np.ndarray  # (K,) flat index into cue_weights
    term_value: np.ndarray  # (K,) the number n / VALUE_SCALE


def cue_terms(context: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """(flat cue_weights index, n / VALUE_SCALE) for each number n and neighbour in ``context``."""
    cues, values = [], []
    for i, tok in enumerate(context):
        n = NUMBER_VALUE[tok]
        if n < 0:
            continue
        for role, j in ((BEFORE, i - 1), (AFTER, i + 1)):
            if 0 <= j < len(context):
                cues.append(role * VOCAB_SIZE + int(context[j]))
                values.append(n / VALUE_SCALE)
    return np.array(cues, dtype=np.int64), np.array(values)


def offset_row(t: int, last_assistant: int) -> int:
    """Table row for predicting the token after position ``t``."""
    if last_assistant < 0:
        return PROMPT_ROW
    return OFFSET_ROW0 + min(t - last_assistant, N_OFFSETS - 1)


def features(sequences: Sequence[np.ndarray]) -> Features:
    prev, offset, head_pos, term_head, term_cue, term_value = [], [], [], [], [], []
    start = 0
    for tokens in sequences:
        positions = np.arange(len(tokens))
        # Index of the last <assistant> at or before each position (-1: none yet).
        last = np.maximum.accumulate(np.where(tokens == ASSISTANT, positions, -1))
        prev.append(PREV_ROW0 + tokens)
        offset.append(np.where(last < 0, PROMPT_ROW, OFFSET_ROW0 + np.minimum(positions - last, N_OFFSETS - 1)))
        cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for t in np.flatnonzero((tokens == HASHES) & (last >= 0)):
            cues, values = cache.setdefault(int(last[t]), cue_terms(tokens[: last[t]]))
            term_head.append(np.full(len(cues), len(head_pos)))
            term_cue.append(cues)
            term_value.append(values)
            head_pos.append(start + t)
        start += len(tokens)
    ints = [np.zeros(0, dtype=np.int64)]
    return Features(np.concatenate(prev), np.concatenate(offset), np.array(head_pos, dtype=np.int64),
                    np.concatenate(term_head + ints), np.concatenate(term_cue + ints),
                    np.concatenate(term_value + [np.zeros(0)]))


def head_centres(p: Params, f: Features) -> np.ndarray:
    """mu at every head position."""
    contrib = p.cue_weights.reshape(-1)[f.term_cue] * f.term_value
    return p.head[0] + np.bincount(f.term_head, weights=contrib, minlength=len(f.head_pos))


def precision(p: Params) -> float:
    return float(np.exp(PRECISION_GAIN * p.head[1]))


def head_logits(mu: np.ndarray, p: Params) -> np.ndarray:
    """(H, number tokens) logits the head adds for each centre in ``mu``."""
    return -precision(p) * (NUMBERS[None, :] - mu[:, None]) ** 2


def logits(p: Params, f: Features) -> np.ndarray:
    z = p.table[f.prev_rows] + p.table[f.offset_rows] + p.table[BIAS_ROW]
    if len(f.head_pos):
        z[np.ix_(f.head_pos, NUMBER_IDS)] += head_logits(head_centres(p, f), p)
    return z


def log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def backward(grad: Params, p: Params, f: Features, dz: np.ndarray, active: np.ndarray) -> None:
    """Add d loss / d params to ``grad`` given ``dz`` = d loss / d logits at positions ``active``."""
    grad.table[BIAS_ROW] += dz.sum(axis=0)
    np.add.at(grad.table, f.prev_rows[active], dz)
    np.add.at(grad.table, f.offset_rows[active], dz)
    if not len(f.head_pos):
        return
    # Head positions that carry gradient, and their rows of dz.
    row_of = np.full(len(f.prev_rows), -1)
    row_of[active] = np.arange(len(active))
    rows = row_of[f.head_pos]
    live = rows >= 0
    if not live.any():
        return
    mu = head_centres(p, f)[live]
    prec = precision(p)
    diff = NUMBERS[None, :] - mu[:, None]
    dz_num = dz[rows[live]][:, NUMBER_IDS]
    # logit = -prec (y - mu)^2, prec = exp(GAIN h):  d/dmu = 2 prec (y - mu);  d/dh = -GAIN prec (y - mu)^2
    dmu = np.zeros(len(f.head_pos))
    dmu[live] = (dz_num * 2 * prec * diff).sum(axis=1)
    grad.head[0] += dmu.sum()
    grad.head[1] += (dz_num * -PRECISION_GAIN * prec * diff**2).sum()
    flat_cue_grad = np.bincount(f.term_cue, weights=dmu[f.term_head] * f.term_value, minlength=grad.cue_weights.size)
    grad.cue_weights[:] += flat_cue_grad.reshape(grad.cue_weights.shape)
