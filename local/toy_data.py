"""Toy datasets of one-step addition and subtraction word problems, in each built-in answer format.

The same questions ("Ann has 3 apples and buys 4 more. How many apples does she have?") in four
row layouts, so the whole pipeline runs on them unchanged while the numbers stay small (operands
1..20, answers 0..40: each one a single token of the local service's toy tokenizer):

- ``gsm8k`` (the default): ``{"question", "answer"}``, the gold number after the final ``####``;
- ``boxed`` (MATH style): ``{"problem", "solution"}``, the solution ending in ``\\boxed{N}``;
- ``answer_is`` (MetaMathQA style): ``{"question", "answer"}``, the answer ending ``The answer is: N``;
- ``choice``: ``{"question", "choices", "answer"}``, four numbers (the right one and three near misses)
  and the letter of the right one.

    python -m local.toy_data --out DIR [--format gsm8k|boxed|answer_is|choice] --train 2000 --eval 200 --seed 0

writes ``DIR/train.jsonl`` and ``DIR/test.jsonl``, the layout ``make data SOURCE=DIR`` reads.
"""
from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

NAMES = (("Ann", "she"), ("Ben", "he"), ("Cara", "she"), ("Dan", "he"), ("Eva", "she"),
         ("Finn", "he"), ("Gina", "she"), ("Hugo", "he"), ("Ivy", "she"), ("Jack", "he"))
OBJECTS = ("apples", "pens", "books", "coins", "cards", "marbles", "shells", "stickers")
# Each verb phrase reads "<name> has A <objects> and <phrase>." with B in {b}.
PLUS_VERBS = ("buys {b} more", "finds {b} more", "gets {b} more", "wins {b} more")
MINUS_VERBS = ("gives away {b}", "loses {b}", "sells {b}", "donates {b}")
MAX_OPERAND = 20
FORMATS = ("gsm8k", "boxed", "answer_is", "choice")
LETTERS = "ABCD"  # a choice row's options
# A wrong option is the right answer moved by one of these: the near misses of vague arithmetic.
DISTRACTOR_OFFSETS = (-3, -2, -1, 1, 2, 3)

# Distinct questions: names x objects x (plus verbs x all operand pairs
# + minus verbs x pairs with b <= a) = 10 * 8 * (4 * 400 + 4 * 210).
N_DISTINCT = len(NAMES) * len(OBJECTS) * (
    len(PLUS_VERBS) * MAX_OPERAND**2 + len(MINUS_VERBS) * MAX_OPERAND * (MAX_OPERAND + 1) // 2
)
MAX_ROWS = N_DISTINCT // 2  # rejection sampling slows down near the total; half of it is plenty


def _worked(name_index: int, obj: str, verb: str, a: int, b: int) -> tuple[str, str, int]:
    """(question, the worked line without its result, the result)."""
    name, pronoun = NAMES[name_index]
    phrase = verb.format(b=b)
    if verb in PLUS_VERBS:
        c, op, tail = a + b, "+", "have"
    elif verb in MINUS_VERBS:
        if b > a:
            raise ValueError(f"subtraction row needs b <= a so the answer is not negative, got a={a}, b={b}")
        c, op, tail = a - b, "-", "have left"
    else:
        raise ValueError(f"unknown verb {verb!r}; use one of PLUS_VERBS or MINUS_VERBS")
    question = f"{name} has {a} {obj} and {phrase}. How many {obj} does {pronoun} {tail}?"
    return question, f"{name} starts with {a} {obj} and {phrase}, so {a} {op} {b} =", c


def make_row(name_index: int, obj: str, verb: str, a: int, b: int) -> dict:
    """One GSM8K-format question/answer row; ``verb`` is one of PLUS_VERBS or MINUS_VERBS."""
    question, worked, c = _worked(name_index, obj, verb, a, b)
    return {"question": question, "answer": f"{worked} {c}.\n#### {c}"}


def format_row(name_index: int, obj: str, verb: str, a: int, b: int, fmt: str, rng: random.Random) -> dict:
    """The row of one problem in answer format ``fmt`` (``rng`` draws a choice row's options)."""
    if fmt == "gsm8k":
        return make_row(name_index, obj, verb, a, b)
    question, worked, c = _worked(name_index, obj, verb, a, b)
    if fmt == "boxed":
        return {"problem": question, "solution": f"{worked} \\boxed{{{c}}}."}
    if fmt == "answer_is":
        return {"question": question, "answer": f"{worked} {c}.\nThe answer is: {c}"}
    if fmt == "choice":
        wrong = rng.sample([c + d for d in DISTRACTOR_OFFSETS if c + d >= 0], len(LETTERS) - 1)
        options = [c, *wrong]
        rng.shuffle(options)
        return {"question": question, "choices": [str(v) for v in options], "answer": LETTERS[options.index(c)]}
    raise ValueError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")


def _random_problem(rng: random.Random) -> tuple[int, str, str, int, int]:
    verb = rng.choice(PLUS_VERBS + MINUS_VERBS)
    a = rng.randint(1, MAX_OPERAND)
    b = rng.randint(1, MAX_OPERAND if verb in PLUS_VERBS else a)
    return rng.randrange(len(NAMES)), rng.choice(OBJECTS), verb, a, b


def generate_rows(n: int, seed: int, fmt: str = "gsm8k") -> list[dict]:
    """``n`` distinct rows in format ``fmt``, the same for the same seed; every format asks the same questions."""
    if not 0 <= n <= MAX_ROWS:
        raise ValueError(f"n must be between 0 and {MAX_ROWS} distinct toy questions, got {n}")
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
    rng = random.Random(seed)
    options_rng = random.Random(f"choices-{seed}")  # its own stream: the questions do not depend on the format
    problems: dict[str, tuple] = {}
    while len(problems) < n:
        problem = _random_problem(rng)
        problems.setdefault(_worked(*problem)[0], problem)
    return [format_row(*problem, fmt, options_rng) for problem in problems.values()]


def write_split(out_dir: str | Path, n_train: int, n_eval: int, seed: int, fmt: str = "gsm8k",
                eval_name: str = "eval.jsonl") -> tuple[Path, Path]:
    """Write ``train.jsonl`` and ``eval_name`` with no question in both."""
    if n_train < 0 or n_eval < 0 or n_train + n_eval > MAX_ROWS:
        raise ValueError(f"train and eval row counts must be >= 0 and sum to at most {MAX_ROWS}, "
                         f"got train={n_train}, eval={n_eval}")
    rows = generate_rows(n_train + n_eval, seed, fmt)  # all distinct, so the split is disjoint
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = (out / "train.jsonl", out / eval_name)
    for path, part in zip(paths, (rows[:n_train], rows[n_train:])):
        with path.open("w", encoding="utf-8") as f:
            f.writelines(json.dumps(row) + "\n" for row in part)
    return paths


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m local.toy_data", description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="directory for train.jsonl and test.jsonl")
    parser.add_argument("--format", choices=FORMATS, default="gsm8k", help="the rows' answer format (default gsm8k)")
    parser.add_argument("--train", type=int, default=2000, help="train rows (default 2000)")
    parser.add_argument("--eval", "--test", type=int, default=200, help="test rows (default 200)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        train, test = write_split(args.out, args.train, args.eval, args.seed, args.format, eval_name="test.jsonl")
    except ValueError as exc:
        parser.error(str(exc))
    print(f"wrote {args.train} {args.format} rows to {train} and {args.eval} rows to {test}")


if __name__ == "__main__":
    main()
