"""The task seam: the RL core trains and evaluates a task it has never heard of.

A second task, defined here, answers with a word (``ANSWER: <word>``) instead of GSM8K's
``#### N``. It runs through the loop against the local service: the toy cannot learn it (it
writes numbers), so DAPO's soft overlong punishment alone makes its groups mixed, but every
completion is graded by this task's grader and the step writes its usual log and metrics.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import pytest

from local import toy_data
from steps.config import load_config
from steps.dapo import metrics as metrics_io
from steps.dapo import state as ckpt_io
from steps.dapo.chat import answer_region, render_messages
from steps.dapo.loop import Trainer
from steps.dapo.state import LoopState
from steps.dapo.task import Grade
from steps.platform.session import lora_kwargs
from steps.platform.tokenizer import load_tokenizer
from tests.local_service import BASE_MODEL_ARN, client_kwargs

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Riddle:
    question: str
    gold: str  # a word


def riddles(n: int, seed: int) -> list[Riddle]:
    """'ann has 5 apples and 3 pens. what does she have more of?' in the toy's vocabulary."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        (name, pronoun), (a, b) = rng.choice(toy_data.NAMES), rng.sample(toy_data.OBJECTS, 2)
        x, y = rng.sample(range(1, 21), 2)
        rows.append(Riddle(f"{name} has {x} {a} and {y} {b}. What does {pronoun} have more of?", a if x > y else b))
    return rows


class WordTask:
    """Answers committed as 'ANSWER: <word>' (strict); the last word of the answer region (lenient)."""

    INSTRUCTION = "Write the final answer as ANSWER: followed by the word."
    _COMMITTED = re.compile(r"answer\s*:\s*([a-z]+)", re.IGNORECASE)

    def __init__(self) -> None:
        self.graded: list[str] = []

    def prompt(self, example: Riddle, tokenizer: Any, chat_template_kwargs: Mapping[str, Any]) -> list[int]:
        messages = [{"role": "user", "content": f"{example.question}\n{self.INSTRUCTION}"}]
        return render_messages(tokenizer, messages, chat_template_kwargs)

    def grade(self, text: str, example: Riddle) -> Grade:
        self.graded.append(text)
        region = re.sub(r"<[^>]*>", " ", answer_region(text) or "")  # special tokens such as <eos> are no words
        committed = [w.lower() for w in self._COMMITTED.findall(region)]
        words = re.findall(r"[a-z]+", region.lower())
        extracted = committed[-1] if committed else (words[-1] if words else None)
        right = extracted == example.gold
        return Grade(correct=right and bool(committed), formatted=bool(committed), extracted=extracted,
                     correct_unformatted=right and not committed)


@pytest.mark.parametrize("text,extracted,strict,lenient", [
    ("so the apples win. ANSWER: pens", "pens", False, False),
    ("answer : apples", "apples", True, True),
    ("<think> answer: pens </think> ANSWER: apples", "apples", True, True),  # the reasoning is never graded
    ("<think> so ANSWER: apples", None, False, False),  # cut off while thinking: no answer
    ("she has more apples", "apples", False, True),  # right, but not in the instructed form
    ("#### 5 <eos>", None, False, False),
])
def test_the_word_task_grades_its_own_format(text, extracted, strict, lenient):
    grade = WordTask().grade(text, Riddle("q", "apples"))
    assert (grade.extracted, grade.correct, grade.correct_lenient) == (extracted, strict, lenient)


def test_a_second_task_runs_through_the_loop(tmp_path, local_service):
    from sagemaker.train.training_session import ServiceClient

    # overlong_buffer 400 of max_tokens 512: any completion past 112 tokens loses reward, so a group of the
    # toy's answers (3 to 512 tokens long) has mixed rewards although none of them is right.
    cfg = load_config(ROOT / "config" / "local.yaml", {
        "batch_size": 2, "group_size": 8, "max_steps": 2, "save_every": 1, "eval_every": 0, "eval_size": 4,
        "overlong_buffer": 400, "max_num_gen_batches": 20})
    task, examples = WordTask(), riddles(20, seed=1)
    training_client = ServiceClient(**client_kwargs()).create_lora_training_client(**lora_kwargs(cfg.session))
    lines: list[str] = []
    try:
        outcome = Trainer(training_client=training_client, cfg=cfg.dapo, task=task,
                          tokenizer=load_tokenizer(BASE_MODEL_ARN, None), train_examples=examples,
                          eval_examples=examples[:4],
                          metrics=metrics_io.MetricsLog(tmp_path / "metrics.jsonl", print_fn=lines.append),
                          checkpoint_dir=tmp_path / "ckpt").run(LoopState(seed=cfg.dapo.seed))
    finally:
        training_client.stop()

    assert outcome.state.step == 2 and not outcome.state.stopped_early
    assert [line.split()[:2] for line in lines if line.startswith(("sampling:", "train:"))] == [
        ["sampling:", "step=1"], ["train:", "step=1"], ["sampling:", "step=2"], ["train:", "step=2"]]
    records = metrics_io.read(tmp_path / "metrics.jsonl")
    steps = [r for r in records if r["kind"] == "step"]
    assert [r["step"] for r in steps] == [1, 2] and [r["kind"] for r in records][-1] == "eval"
    assert ckpt_io.read(tmp_path / "ckpt").step == 2
    # Every completion sampled in training and every evaluation answer went through this task's grader,
    # and the predictions report its reading of them.
    assert len(task.graded) == sum(r["groups_sampled"] for r in steps) * 8 + 4
    predictions = outcome.final_eval.predictions
    assert [p.gold for p in predictions] == [e.gold for e in examples[:4]]
    assert [p.extracted for p in predictions] == [WordTask().grade(p.completion, e).extracted
                                                  for p, e in zip(predictions, examples[:4])]
