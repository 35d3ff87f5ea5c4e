"""The maths of the toy policy: features of a prefix, logits, and exact gradients.

Next-token logits after a prefix are the sum of two parts.

1. A log-linear part: rows of a ``table`` (one weight per vocabulary token),
   one row per active feature: ``bias`` (always), the previous token, where
   the next token falls (inside the prompt, or completion offset 0, 1, ...,
   capped), in a completion the answer format the prompt asks for (unless it
   is GSM8K's ``####``, the default: see :func:`read_prompt`), and whether the
   completion has an unclosed ``{``. These carry the answer forms
   (``#### N``, ``\\boxed { N }``, ``the answer is : N``), the choice between
   them, and a prior over tokens.
2. An arithmetic head, active right after a value marker (``####``, ``{`` or
   ``:``) in a completion, which adds ``-precision * (y - mu)^2`` to the logit
   of every number token y, and of every option letter of a multiple-choice
   prompt (``a ) 12`` lines) with y the option's number, with

       mu = intercept + sum of cue_weights[c] * n / VALUE_SCALE
                        over each number n of the prompt and each neighbour c of n
                        (the word before and the word after count separately)
       precision = exp(PRECISION_GAIN * head[1])

   "has 3 ... buys 4" wants weight 1 (times VALUE_SCALE) on "has" and on
   "buys"; "gives away 4" wants -1 on "away". The options' own numbers are
   not terms of mu: they are what mu is matched against. A letter that names
   no option gets LETTER_ABSENT instead.

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
BOXED = TOKENIZER.token_id("\\boxed")
OPEN, CLOSE = TOKENIZER.token_id("{"), TOKENIZER.token_id("}")
COLON = TOKENIZER.token_id(":")
PAREN = TOKENIZER.token_id(")")
ANSWER, IS = TOKENIZER.token_id("answer"), TOKENIZER.token_id("is")
# The head is active right after these: '#### N', '\boxed { N }', 'the answer is : N'.
VALUE_MARKERS = np.array([HASHES, OPEN, COLON])
# NUMBER_VALUE[token id] is the number a whole-number token stands for, else -1.
NUMBER_VALUE = np.full(VOCAB_SIZE, -1)
for _n in range(100):
    NUMBER_VALUE[TOKENIZER.token_id(str(_n))] = _n
NUMBER_IDS = np.flatnonzero(NUMBER_VALUE >= 0)
NUMBERS = NUMBER_VALUE[NUMBER_IDS].astype(np.float64)
# Option letters of a multiple-choice prompt ("A) 12" lowercases to "a ) 12").
LETTER_IDS = np.array([TOKENIZER.token_id(c) for c in "abcde"])
# The tokens the head scores: numbers, then letters; a letter's value is its option's number.
VALUE_IDS = np.concatenate([NUMBER_IDS, LETTER_IDS])
NO_OPTIONS = np.concatenate([NUMBERS, np.full(len(LETTER_IDS), np.nan)])
LETTER_ABSENT = -30.0  # the head's logit for a letter that names no option of a multiple-choice prompt

# The answer formats a prompt can ask for (read_prompt). HASH is the default and has no table row.
HASH, BOXED_FORMAT, ANSWER_IS, CHOICE = range(4)
FORMATS = ("hash", "boxed", "answer_is", "choice")

# Rows of the table.
N_OFFSETS = 6  # completion offsets 0..4 get their own row; 5 and later share one
BIAS_ROW = 0
PREV_ROW0 = 1
PROMPT_ROW = PREV_ROW0 + VOCAB_SIZE
OFFSET_ROW0 = PROMPT_ROW + 1
FORMAT_ROW0 = OFFSET_ROW0 + N_OFFSETS  # FORMAT_ROW0 + format - 1 for the formats after HASH
OPEN_ROW = FORMAT_ROW0 + len(FORMATS) - 1  # inside an unclosed '{' of the completion
N_ROWS = OPEN_ROW + 1
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
    format_pos: np.ndarray  # (F,) completion positions of prompts that ask for a format other than HASH
    format_rows: np.ndarray  # (F,) their format's table row
    open_pos: np.ndarray  # (Q,) completion positions inside an unclosed '{'
    head_pos: np.ndarray  # (H,) positions where the arithmetic head is active
    head_values: np.ndarray  # (H, len(VALUE_IDS)) the value of each scored token (NaN: a letter with no option)
    head_choice: np.ndarray  # (H,) the prompt is multiple-choice (a letter with no option gets LETTER_ABSENT)
    term_head: np.ndarray  # (K,) which head position each mu term belongs to
    term_cue: np.ndarray  # (K,) flat index into cue_weights
    term_value: np.ndarray  # (K,) the number n / VALUE_SCALE


@dataclass(frozen=True)
class PromptInfo:
    """What a completion reads of its prompt: the format asked for, the options, the terms of mu."""

    format: int
    values: np.ndarray  # (len(VALUE_IDS),) NO_OPTIONS, with the option letters' numbers filled in
    cues: np.ndarray
    cue_values: np.ndarray


def options(prompt: Sequence[int]) -> dict[int, int]:
    """{index into LETTER_IDS: number} of the prompt's ``<letter> ) <number>`` options."""
    found = {}
    for i in range(len(prompt) - 2):
        if prompt[i + 1] == PAREN and NUMBER_VALUE[prompt[i + 2]] >= 0 and prompt[i] in LETTER_IDS:
            found[int(np.flatnonzero(LETTER_IDS == prompt[i])[0])] = int(NUMBER_VALUE[prompt[i + 2]])
    return found


def read_prompt(prompt: Sequence[int]) -> PromptInfo:
    """The format a prompt asks for: CHOICE with two or more options, else BOXED_FORMAT if it says
    ``\\boxed``, else ANSWER_IS if it says "answer is", else HASH; its options, and the terms of mu."""
    prompt = [int(t) for t in prompt]
    found = options(prompt)
    values = NO_OPTIONS.copy()
    for letter, number in found.items():
        values[len(NUMBER_IDS) + letter] = number
    if len(found) >= 2:
        fmt = CHOICE
    elif BOXED in prompt:
        fmt = BOXED_FORMAT
    elif any(a == ANSWER and b == IS for a, b in zip(prompt, prompt[1:])):
        fmt = ANSWER_IS
    else:
        fmt = HASH
    cues, cue_values = cue_terms(prompt, options_too=fmt != CHOICE)
    return PromptInfo(fmt, values if fmt == CHOICE else NO_OPTIONS, cues, cue_values)


def cue_terms(context: Sequence[int], options_too: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(flat cue_weights index, n / VALUE_SCALE) for each number n and neighbour in ``context``
    (without ``options_too``, not the numbers of ``<letter> )`` options)."""
    cues, values = [], []
    for i, tok in enumerate(context):
        n = NUMBER_VALUE[tok]
        if n < 0 or (not options_too and i >= 2 and context[i - 1] == PAREN and context[i - 2] in LETTER_IDS):
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
    prev, offset, fmt_pos, fmt_rows, open_pos, head_pos, head_values, head_choice = [], [], [], [], [], [], [], []
    term_head, term_cue, term_value = [], [], []
    start = 0
    for tokens in sequences:
        positions = np.arange(len(tokens))
        # Index of the last <assistant> at or before each position (-1: none yet).
        last = np.maximum.accumulate(np.where(tokens == ASSISTANT, positions, -1))
        prev.append(PREV_ROW0 + tokens)
        offset.append(np.where(last < 0, PROMPT_ROW, OFFSET_ROW0 + np.minimum(positions - last, N_OFFSETS - 1)))
        # Braces opened minus closed since the completion's start (the <assistant> token adds none).
        depth = np.cumsum((tokens == OPEN).astype(np.int64) - (tokens == CLOSE))
        heads = np.isin(tokens, VALUE_MARKERS) & (last >= 0)
        for a in np.unique(last[last >= 0]):
            info = read_prompt(tokens[:a])
            mine = np.flatnonzero(last == a)
            if info.format != HASH:
                fmt_pos.append(start + mine)
                fmt_rows.append(np.full(len(mine), FORMAT_ROW0 + info.format - 1))
            open_pos.append(start + mine[depth[mine] > depth[a]])
            for t in mine[heads[mine]]:
                term_head.append(np.full(len(info.cues), len(head_pos)))
                term_cue.append(info.cues)
                term_value.append(info.cue_values)
                head_pos.append(start + t)
                head_values.append(info.values)
                head_choice.append(info.format == CHOICE)
        start += len(tokens)
    ints = [np.zeros(0, dtype=np.int64)]
    return Features(np.concatenate(prev), np.concatenate(offset), np.concatenate(fmt_pos + ints),
                    np.concatenate(fmt_rows + ints), np.concatenate(open_pos + ints),
                    np.array(head_pos, dtype=np.int64),
                    np.array(head_values).reshape(len(head_pos), len(VALUE_IDS)), np.array(head_choice, dtype=bool),
                    np.concatenate(term_head + ints), np.concatenate(term_cue + ints),
                    np.concatenate(term_value + [np.zeros(0)]))


def head_centres(p: Params, f: Features) -> np.ndarray:
    """mu at every head position."""
    contrib = p.cue_weights.reshape(-1)[f.term_cue] * f.term_value
    return p.head[0] + np.bincount(f.term_head, weights=contrib, minlength=len(f.head_pos))


def precision(p: Params) -> float:
    return float(np.exp(PRECISION_GAIN * p.head[1]))


def head_logits(mu: np.ndarray, p: Params, values: np.ndarray, choice: np.ndarray) -> np.ndarray:
    """(H, len(VALUE_IDS)) logits the head adds for each centre in ``mu``: -precision (y - mu)^2 for a
    token of value y; for a letter with no value, LETTER_ABSENT in a multiple-choice prompt, else 0."""
    out = -precision(p) * (values - mu[:, None]) ** 2
    missing = np.isnan(values)
    out[missing] = np.broadcast_to(np.where(choice, LETTER_ABSENT, 0.0)[:, None], out.shape)[missing]
    return out


def logits(p: Params, f: Features) -> np.ndarray:
    z = p.table[f.prev_rows] + p.table[f.offset_rows] + p.table[BIAS_ROW]
    if len(f.format_pos):
        z[f.format_pos] += p.table[f.format_rows]
    if len(f.open_pos):
        z[f.open_pos] += p.table[OPEN_ROW]
    if len(f.head_pos):
        z[np.ix_(f.head_pos, VALUE_IDS)] += head_logits(head_centres(p, f), p, f.head_values, f.head_choice)
    return z


def log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def backward(grad: Params, p: Params, f: Features, dz: np.ndarray, active: np.ndarray) -> None:
    """Add d loss / d params to ``grad`` given ``dz`` = d loss / d logits at positions ``active``."""
    grad.table[BIAS_ROW] += dz.sum(axis=0)
    np.add.at(grad.table, f.prev_rows[active], dz)
    np.add.at(grad.table, f.offset_rows[active], dz)
    # Rows of dz of each position (-1: no gradient there).
    row_of = np.full(len(f.prev_rows), -1)
    row_of[active] = np.arange(len(active))
    for pos, table_rows in ((f.format_pos, f.format_rows), (f.open_pos, np.full(len(f.open_pos), OPEN_ROW))):
        rows = row_of[pos]
        np.add.at(grad.table, table_rows[rows >= 0], dz[rows[rows >= 0]])
    if not len(f.head_pos):
        return
    rows = row_of[f.head_pos]
    live = rows >= 0
    if not live.any():
        return
    mu = head_centres(p, f)[live]
    prec = precision(p)
    diff = np.nan_to_num(f.head_values[live] - mu[:, None])  # a letter with no value: a constant logit
    dz_val = dz[rows[live]][:, VALUE_IDS]
    # logit = -prec (y - mu)^2, prec = exp(GAIN h):  d/dmu = 2 prec (y - mu);  d/dh = -GAIN prec (y - mu)^2
    dmu = np.zeros(len(f.head_pos))
    dmu[live] = (dz_val * 2 * prec * diff).sum(axis=1)
    grad.head[0] += dmu.sum()
    grad.head[1] += (dz_val * -PRECISION_GAIN * prec * diff**2).sum()
    flat_cue_grad = np.bincount(f.term_cue, weights=dmu[f.term_head] * f.term_value, minlength=grad.cue_weights.size)
    grad.cue_weights[:] += flat_cue_grad.reshape(grad.cue_weights.shape)
