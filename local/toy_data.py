"""A GSM8K-format toy dataset: one-step addition and subtraction word problems.

Rows look like GSM8K (``{"question": str, "answer": str}``, the gold number
after the final ``####``) so the whole pipeline runs on them unchanged, while
the numbers stay small (operands 1..20, answers 0..40) so each one is a single
token of the local service's toy tokenizer.

    python -m local.toy_data --out DIR --train 2000 --eval 200 --seed 0
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

# Distinct questions: names x objects x (plus verbs x all operand pairs
# + minus verbs x pairs with b <= a) = 10 * 8 * (4 * 400 + 4 * 210).
N_DISTINCT = len(NAMES) * len(OBJECTS) * (
    len(PLUS_VERBS) * MAX_OPERAND**2 + len(MINUS_VERBS) * MAX_OPERAND * (MAX_OPERAND + 1) // 2
)
MAX_ROWS = N_DISTINCT // 2  # rejection sampling slows down near the total; half of it is plenty


def make_row(name_index: int, obj: str, verb: str, a: int, b: int) -> dict:
    """One question/answer row; ``verb`` is one of PLUS_VERBS or MINUS_VERBS."""
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
    answer = f"{name} starts with {a} {obj} and {phrase}, so {a} {op} {b} = {c}.\n#### {c}"
    return {"question": question, "answer": answer}


def _random_row(rng: random.Random) -> dict:
    verb = rng.choice(PLUS_VERBS + MINUS_VERBS)
    a = rng.randint(1, MAX_OPERAND)
    b = rng.randint(1, MAX_OPERAND if verb in PLUS_VERBS else a)
    return make_row(rng.randrange(len(NAMES)), rng.choice(OBJECTS), verb, a, b)


def generate_rows(n: int, seed: int) -> list[dict]:
    """``n`` distinct rows, the same for the same seed."""
    if not 0 <= n <= MAX_ROWS:
        raise ValueError(f"n must be between 0 and {MAX_ROWS} distinct toy questions, got {n}")
    rng = random.Random(seed)
    rows: dict[str, dict] = {}
    while len(rows) < n:
        row = _random_row(rng)
        rows.setdefault(row["question"], row)
    return list(rows.values())


def write_split(out_dir: str | Path, n_train: int, n_eval: int, seed: int) -> tuple[Path, Path]:
    """Write ``train.jsonl`` and ``eval.jsonl`` with no question in both."""
    if n_train < 0 or n_eval < 0 or n_train + n_eval > MAX_ROWS:
        raise ValueError(f"train and eval row counts must be >= 0 and sum to at most {MAX_ROWS}, "
                         f"got train={n_train}, eval={n_eval}")
    rows = generate_rows(n_train + n_eval, seed)  # all distinct, so the split is disjoint
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = (out / "train.jsonl", out / "eval.jsonl")
    for path, part in zip(paths, (rows[:n_train], rows[n_train:])):
        with path.open("w", encoding="utf-8") as f:
            f.writelines(json.dumps(row) + "\n" for row in part)
    return paths


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m local.toy_data", description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="directory for train.jsonl and eval.jsonl")
    parser.add_argument("--train", type=int, default=2000, help="train rows (default 2000)")
    parser.add_argument("--eval", type=int, default=200, help="eval rows (default 200)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        train, eval_ = write_split(args.out, args.train, args.eval, args.seed)
    except ValueError as exc:
        parser.error(str(exc))
    print(f"wrote {args.train} rows to {train} and {args.eval} rows to {eval_}")


if __name__ == "__main__":
    main()
