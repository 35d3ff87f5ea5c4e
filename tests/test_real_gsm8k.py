"""The validator, the gold parser and the grader on the real GSM8K release, read in place.

The files sit beside the checkout, in ../shared/data/gsm8k/ (train.jsonl 7,473 rows, test.jsonl 1,319
rows, example_model_solutions.jsonl: four real model solutions per test question with correctness labels;
MIT licence beside them). They are never copied into the project; without them these tests skip.
Times and memory are printed in pytest's summary, not asserted (timings belong in `make bench`).
"""
from __future__ import annotations

import re
import time
import tracemalloc
from pathlib import Path
from typing import Any, Callable

import pytest

from steps import validate
from steps.dapo.sampling import RewardShaping, reward
from steps.gsm8k.answer import canonical, gold_answer, grade
from steps.tasks.reader import PROMPT_TOO_LONG, RowError, iter_lines

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k"
TRAIN, TEST, SOLUTIONS = DATA / "train.jsonl", DATA / "test.jsonl", DATA / "example_model_solutions.jsonl"
pytestmark = pytest.mark.skipif(
    not all(p.is_file() for p in (TRAIN, TEST, SOLUTIONS)),
    reason=f"the real GSM8K files are not in {DATA} (they live beside the checkout, in ../shared/data/gsm8k/)")

FIGURES: list[str] = []


class _Figures:
    """Registered by this module: pytest prints what it measured in the terminal summary."""

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if FIGURES:
            terminalreporter.write_sep("-", "real GSM8K: figures")
            for line in FIGURES:
                terminalreporter.write_line(line)


@pytest.fixture(scope="module", autouse=True)
def figures(request):
    manager = request.config.pluginmanager
    if not manager.has_plugin("real-gsm8k-figures"):
        manager.register(_Figures(), "real-gsm8k-figures")


def rows(path: Path) -> list[dict[str, Any]]:
    return [line.row for line in iter_lines(path)]


def measured(run: Callable[[], dict]) -> tuple[dict, float, int]:
    """(result, seconds of a plain run, peak bytes Python allocated in a second, traced run)."""
    t0 = time.perf_counter()
    result = run()
    seconds = time.perf_counter() - t0
    tracemalloc.start()
    try:
        run()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return result, seconds, peak


def test_the_validator_keeps_every_real_row_and_finds_no_overlap(tmp_path):
    report, seconds, peak = measured(lambda: validate.validate(str(TRAIN), str(TEST), 32, tmp_path / "out"))
    assert report["status"] == "accepted"
    assert report["kept"] == {"eval": 1319, "train": 7473}
    assert {name: split["rejected"] for name, split in report["splits"].items()} == {"eval": 0, "train": 0}
    assert report["overlap"]["count"] == 0
    # Every row's own gold answer read and graded right by the GSM8K grader, before anything could bill.
    assert report["grader_agreement"] == {"checked": 8792, "agreed": 8792, "first_disagreements": []}
    assert rows(tmp_path / "out" / "train.jsonl") == rows(TRAIN)  # cleaned = the input, row for row
    FIGURES.append(f"validator, {TRAIN.name} + {TEST.name}: 8,792 rows, all kept, 0 overlap, "
                   f"{seconds:.2f} s, peak Python allocation {peak / 1e6:.1f} MB")


def test_the_hash_task_reads_every_real_gold_answer_and_the_boxed_task_refuses_them(tmp_path):
    from steps.config import TaskConfig
    from steps.tasks import build_task

    report = validate.validate(str(TRAIN), str(TEST), 32, tmp_path / "hash", task=build_task(TaskConfig(name="hash")))
    assert report["status"] == "accepted"
    assert report["grader_agreement"] == {"checked": 8792, "agreed": 8792, "first_disagreements": []}
    report = validate.validate(str(TRAIN), str(TEST), 32, tmp_path / "boxed", task=build_task(TaskConfig(name="boxed")))
    assert report["status"] == "refused" and report["grader_agreement"]["agreed"] == 0
    assert "the boxed task's grader cannot read the gold answers of eval: it agreed with 0 of 1319 rows" in \
        report["message"]
    assert "these answers read as the built-in task hash (TASK=hash" in report["message"]


def test_the_prompt_length_check_on_the_real_questions(tmp_path):
    """With a Hugging Face tokenizer (the toy's files: an unknown word is one token, so counts are real
    counts of GSM8K's words) every question is rendered as training renders it: this is what it costs."""
    from transformers import AutoTokenizer

    from local.training_session.toy.tokenizer import HF_FILES
    from steps.tasks.rules import PromptBudget

    budget = PromptBudget(AutoTokenizer.from_pretrained(str(HF_FILES)), {}, 1024, 1024 + 400, "a test context")
    t0 = time.perf_counter()
    report = validate.validate(str(TRAIN), str(TEST), 32, tmp_path / "out", budget=budget)
    seconds = time.perf_counter() - t0
    assert report["kept"] == {"eval": 1319, "train": 7473}  # no GSM8K question is near 400 tokens
    tight = PromptBudget(budget.tokenizer, {}, 1024, 1024 + 60, "a test context")
    too_long = 0
    for row in rows(TEST):
        try:
            tight.check(row["question"])
        except RowError as exc:
            assert exc.reason == PROMPT_TOO_LONG and "> 1084, the context of a test context" in exc.detail
            too_long += 1
    assert 0 < too_long < 1319
    FIGURES.append(f"validator with the prompt-length check (HF tokenizer, all 8,792 questions rendered): "
                   f"{seconds:.2f} s; with 60 tokens left for the prompt, {too_long} of 1,319 test questions refused")


def test_the_gold_parser_reads_every_real_answer():
    for path in (TRAIN, TEST):
        for row in rows(path):
            gold = gold_answer(row["answer"])
            tail = row["answer"].rsplit("####", 1)[1].strip()
            assert gold is not None and int(gold) == int(tail.replace(",", "")), (path.name, tail)
    # An independent source: the labelled file's own reference answer ends "A: N".
    test_gold = {row["question"]: gold_answer(row["answer"]) for row in rows(TEST)}
    for row in rows(SOLUTIONS):
        reference = re.search(r"A:\s*(\S+)\s*$", row["ground_truth"])[1]
        assert canonical(reference) == test_gold[row["question"]], row["question"]


def labelled_solutions() -> list[tuple[str, str, bool]]:
    """(solution, gold, is_correct) for every model solution in the labelled file."""
    test_gold = {row["question"]: gold_answer(row["answer"]) for row in rows(TEST)}
    return [(v["solution"], test_gold[row["question"]], v["is_correct"])
            for row in rows(SOLUTIONS) for v in row.values() if isinstance(v, dict)]


def test_the_grader_agrees_with_every_correctness_label():
    """The solutions end "A: N" (the release's own format): the lenient reading grades them exactly as
    labelled; the strict one pays nothing for an answer not given as the instructed '#### N', and grades
    exactly as labelled once the same answer is given that way."""
    solutions = labelled_solutions()
    assert len(solutions) == 5276
    grades = [(grade(text, gold), label) for text, gold, label in solutions]
    lenient = sum(g.correct_lenient == label for g, label in grades)
    assert lenient == len(solutions)
    instructed = [grade(re.sub(r"\nA: ", "\n#### ", text), gold).correct == label for text, gold, label in solutions]
    assert all(instructed)
    strict = [reward(g, 0, RewardShaping(1024)) for g, _ in grades]
    loose = [reward(g, 0, RewardShaping(1024, reward_format="lenient")) for g, _ in grades]
    differ = sum(a != b for a, b in zip(strict, loose))
    assert differ == sum(label for _, label in grades)  # every right "A: N" answer, and nothing else
    FIGURES.append(f"grader on {len(solutions)} labelled solutions: lenient agreement {lenient}/{len(solutions)} "
                   f"(100%); strict agreement {sum(all_ for all_ in instructed)}/{len(solutions)} with 'A: N' "
                   f"written as '#### N'; strict and lenient rewards differ on {differ} ({differ / len(solutions):.1%})"
                   " as given ('A: N' is not an instructed form)")
