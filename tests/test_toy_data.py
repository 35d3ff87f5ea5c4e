"""The toy datasets: the GSM8K-format one `make local-run` trains on, and the same questions in the other
built-in answer formats."""
from __future__ import annotations

import json
import re

import pytest

from local import toy_data
from local.training_session.toy.tokenizer import ToyTokenizer

QUESTION_RE = re.compile(
    r"(?P<name>[A-Z][a-z]+) has (?P<a>\d+) (?P<obj>[a-z]+) and (?P<phrase>[a-z ]+?) ?(?P<b>\d+)(?: more)?\. "
    r"How many (?P=obj) does (?:she|he) have(?: left)?\?"
)


def _solve(question: str) -> int:
    """Work the answer out from the question text alone."""
    m = QUESTION_RE.fullmatch(question)
    assert m, f"unexpected question shape: {question!r}"
    a, b, phrase = int(m["a"]), int(m["b"]), m["phrase"]
    plus = {v.split(" {b}")[0] for v in toy_data.PLUS_VERBS}
    minus = {v.split(" {b}")[0] for v in toy_data.MINUS_VERBS}
    assert phrase in plus | minus, phrase
    return a + b if phrase in plus else a - b


def test_rows_are_gsm8k_shaped_and_their_gold_answers_are_right():
    rows = toy_data.generate_rows(500, seed=0)
    for row in rows:
        assert set(row) == {"question", "answer"}
        assert isinstance(row["question"], str) and isinstance(row["answer"], str)
        gold = row["answer"].rsplit("####", 1)[1].strip()
        assert gold == str(_solve(row["question"]))
        assert 0 <= int(gold) <= 2 * toy_data.MAX_OPERAND
        # The worked line agrees with the gold number.
        a, op, b, c = re.search(r"(\d+) ([+-]) (\d+) = (\d+)\.\n####", row["answer"]).groups()
        assert int(c) == (int(a) + int(b) if op == "+" else int(a) - int(b)) == int(gold)


def test_rows_cover_both_operations_and_all_verbs():
    phrases = {QUESTION_RE.fullmatch(r["question"])["phrase"] for r in toy_data.generate_rows(500, seed=1)}
    assert phrases == {v.split(" {b}")[0] for v in toy_data.PLUS_VERBS + toy_data.MINUS_VERBS}


def test_generation_is_deterministic_by_seed_and_has_no_duplicates():
    first = toy_data.generate_rows(2200, seed=5)
    assert first == toy_data.generate_rows(2200, seed=5)
    assert first != toy_data.generate_rows(2200, seed=6)
    assert len({r["question"].lower() for r in first}) == 2200


def test_write_split_files_are_disjoint_and_reproducible(tmp_path):
    train, eval_ = toy_data.write_split(tmp_path / "a", 2000, 200, seed=3)
    assert (train.name, eval_.name) == ("train.jsonl", "eval.jsonl")
    train_rows = [json.loads(line) for line in train.read_text().splitlines()]
    eval_rows = [json.loads(line) for line in eval_.read_text().splitlines()]
    assert (len(train_rows), len(eval_rows)) == (2000, 200)
    assert not {r["question"] for r in train_rows} & {r["question"] for r in eval_rows}
    again = toy_data.write_split(tmp_path / "b", 2000, 200, seed=3)
    assert [p.read_bytes() for p in again] == [train.read_bytes(), eval_.read_bytes()]


def test_cli_writes_the_split_as_make_data_reads_it(tmp_path, capsys):
    from pipeline.data import source_files

    toy_data.main(["--out", str(tmp_path), "--train", "30", "--eval", "5", "--seed", "1"])
    assert len((tmp_path / "train.jsonl").read_text().splitlines()) == 30
    assert len((tmp_path / "test.jsonl").read_text().splitlines()) == 5
    assert "wrote 30 gsm8k rows" in capsys.readouterr().out
    assert source_files(tmp_path) == {"train": [tmp_path / "train.jsonl"], "test": [tmp_path / "test.jsonl"]}


@pytest.mark.parametrize("fmt, fields", [("gsm8k", {"question", "answer"}), ("boxed", {"problem", "solution"}),
                                         ("answer_is", {"question", "answer"}),
                                         ("choice", {"question", "choices", "answer"})])
def test_each_format_asks_the_same_questions_with_the_right_gold_answer(fmt, fields, tmp_path):
    toy_data.main(["--out", str(tmp_path), "--format", fmt, "--train", "40", "--eval", "10", "--seed", "2"])
    rows = [json.loads(line) for name in ("train", "test")
            for line in (tmp_path / f"{name}.jsonl").read_text().splitlines()]
    assert [r.get("question", r.get("problem")) for r in rows] == [r["question"] for r in toy_data.generate_rows(50, 2)]
    for row in rows:
        assert set(row) == fields
        c = _solve(row.get("question", row.get("problem")))
        if fmt == "boxed":
            assert row["solution"].endswith(f"= \\boxed{{{c}}}.")
        elif fmt == "answer_is":
            assert row["answer"].endswith(f"= {c}.\nThe answer is: {c}")
        elif fmt == "choice":
            values = [int(v) for v in row["choices"]]
            assert len(set(values)) == 4 and all(v >= 0 and abs(v - c) <= 3 for v in values)
            assert values["ABCD".index(row["answer"])] == c


def test_choice_rows_put_the_right_answer_under_every_letter():
    letters = [r["answer"] for r in toy_data.generate_rows(400, seed=3, fmt="choice")]
    assert all(0.15 <= letters.count(x) / len(letters) <= 0.35 for x in "ABCD")


def test_an_unknown_format_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        toy_data.main(["--out", str(tmp_path), "--format", "latex"])
    assert exc.value.code == 2 and "invalid choice: 'latex'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="unknown format 'latex'; use one of gsm8k, boxed, answer_is, choice"):
        toy_data.generate_rows(3, seed=0, fmt="latex")


@pytest.mark.parametrize("argv", [["--train", "-1"], ["--train", str(toy_data.MAX_ROWS)]])
def test_cli_refuses_impossible_counts(tmp_path, argv, capsys):
    with pytest.raises(SystemExit) as exc:
        toy_data.main(["--out", str(tmp_path), *argv])
    assert exc.value.code == 2
    assert f"at most {toy_data.MAX_ROWS}" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("fmt", toy_data.FORMATS)
def test_the_toy_tokenizer_covers_every_word_and_number(fmt):
    tok = ToyTokenizer()
    for row in toy_data.generate_rows(300, seed=2, fmt=fmt):
        for text in [v for v in row.values() if isinstance(v, str)] + row.get("choices", []):
            ids = tok.encode(text)
            assert tok.unk_token_id not in ids, text
            numbers = re.findall(r"\d+", text)
            assert [t for t in tok.convert_ids_to_tokens(ids) if t.isdigit()] == numbers  # one token each
