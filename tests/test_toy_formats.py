"""The toy base model and the built-in answer formats: it reads which format a prompt's instruction asks
for, writes it only partly, and learns each one under the project's own DAPO loop.

Prompts and grades are the built-in tasks' (steps/tasks: ``gsm8k``, ``boxed``, ``answer_is``, ``choice``), as a
run with ``task.name`` set builds them from the toy data's rows (``python -m local.toy_data --format``).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pytest

from local import toy_data
from local.training_session.toy import model as M
from local.training_session.toy.policy import FILLER_WORDS, DatumArrays, Policy
from local.training_session.toy.tokenizer import ToyTokenizer
from steps.config import TaskConfig, load_config
from steps.dapo import metrics as metrics_io
from steps.dapo.heldout import evaluate_greedy
from steps.dapo.loop import Trainer
from steps.dapo.state import LoopState
from steps.dapo.task import Grade
from steps.platform.session import lora_kwargs
from steps.platform.tokenizer import load_tokenizer
from steps.tasks import Example, build_task
from steps.tasks.formats import FORMATS
from tests.local_service import BASE_MODEL_ARN, client_kwargs

ROOT = Path(__file__).resolve().parents[1]
TOK = ToyTokenizer()
FORMAT_NAMES = ("gsm8k", "boxed", "answer_is", "choice")
TASKS = {fmt: build_task(TaskConfig(name=fmt)) for fmt in FORMAT_NAMES}
MODEL_FORMAT = {"gsm8k": M.HASH, "boxed": M.BOXED_FORMAT, "answer_is": M.ANSWER_IS, "choice": M.CHOICE}
# What the toy writes in each format, numbers and letters as N.
ASKED_FORM = {"boxed": "\\boxed { N }", "answer_is": "the answer is : N", "choice": "the answer is : L"}


def example(row: dict, fmt: str) -> Example:
    """A toy_data row of format ``fmt`` as the built-in task reads it (a choice row keeps its options apart)."""
    task = TASKS[fmt]
    return task.read(row, task.fields_for(row))


def examples(n: int, seed: int, fmt: str) -> list[Example]:
    return [example(row, fmt) for row in toy_data.generate_rows(n, seed, fmt)]


def prompt_tokens(ex: Example, fmt: str) -> list[int]:
    return TASKS[fmt].prompt(ex, TOK, {})


def shape(text: str) -> str:
    """A completion without its filler, numbers as N and letters as L: '#### N', '\\boxed { N }', ''..."""
    words = [w for w in text.split() if w not in FILLER_WORDS]
    return " ".join("N" if w.isdigit() else "L" if len(w) == 1 and w in "abcde" else w for w in words)


# ---- reading the prompt --------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_the_model_reads_the_format_each_instruction_asks_for(fmt):
    [ex] = examples(1, seed=0, fmt=fmt)
    prompt = prompt_tokens(ex, fmt)
    assert TOK.unk_token_id not in prompt
    info = M.read_prompt(prompt[:-1])
    assert info.format == MODEL_FORMAT[fmt]
    # The arithmetic reads the question, never the options' numbers.
    question_only = M.read_prompt(prompt_tokens(Example(ex.question, ex.gold), "gsm8k"))
    np.testing.assert_array_equal(info.cues, question_only.cues)


def test_the_options_give_their_letters_values():
    [row] = toy_data.generate_rows(1, seed=4, fmt="choice")
    info = M.read_prompt(prompt_tokens(example(row, "choice"), "choice"))
    letters = info.values[len(M.NUMBER_IDS):]
    np.testing.assert_array_equal(letters[:4], [int(v) for v in row["choices"]])
    assert np.isnan(letters[4])  # "e" names no option
    # A question whose text only mentions "a )" once is no multiple-choice question.
    assert M.read_prompt(TOK.encode("ann has 3 apples ( a ) 5 pens")).format == M.HASH


@pytest.mark.parametrize("fmt", FORMAT_NAMES)
def test_the_hugging_face_files_read_each_format_as_the_toy_does(fmt):
    """The steps load the toy's tokenizer from its Hugging Face files: same prompt ids, same decoded answers."""
    from local.training_session.toy.tokenizer import HF_FILES

    hf = load_tokenizer(None, None, HF_FILES)
    policy = Policy.base()
    for i, ex in enumerate(examples(20, seed=6, fmt=fmt)):
        prompt = prompt_tokens(ex, fmt)
        assert TASKS[fmt].prompt(ex, hf, {}) == prompt
        for seq in policy.sample(prompt, 4, 512, seed=i):
            assert hf.decode(seq.tokens, skip_special_tokens=False) == TOK.decode(seq.tokens, skip_special_tokens=False)


def test_boxed_is_one_token_and_decodes_as_the_builtin_strict_readings_want():
    from local.training_session.toy.tokenizer import HF_FILES

    text = 'so \\boxed{12} \\boxed { 7 }; "The answer is: B" \\frac{1}{2}'
    assert load_tokenizer(None, None, HF_FILES).encode(text, add_special_tokens=False) == TOK.encode(text)
    assert TOK.convert_ids_to_tokens(TOK.encode("\\boxed{12}")) == ["\\boxed", "{", "12", "}"]
    decoded = TOK.decode(TOK.encode(text))
    assert decoded == 'so \\boxed { 12 } \\boxed { 7 } ; " the answer is : b " { 1 } { 2 }'  # "\\frac" is <unk>
    assert FORMATS["boxed"].read(decoded, ()).committed == "7"  # the last box
    assert FORMATS["boxed"].read(TOK.decode(TOK.encode("so \\boxed{12}")), ()).committed == "12"
    assert FORMATS["choice"].read(TOK.decode(TOK.encode("The answer is: B")), ("1", "2")).committed == "B"


# ---- the base model: partly following ---------------------------------------------------------


@pytest.mark.parametrize("fmt", ["boxed", "answer_is", "choice"])
def test_the_base_model_writes_the_asked_form_partly_and_greedy_keeps_its_hash_habit(fmt):
    policy = Policy.base()
    shapes, hits, greedy = [], [], []
    for i, ex in enumerate(examples(60, seed=123, fmt=fmt)):
        prompt = prompt_tokens(ex, fmt)
        for seq in policy.sample(prompt, 8, 512, seed=i):
            text = TOK.decode(seq.tokens)
            if seq.stop_reason == "stop":
                shapes.append(shape(text))
            hits.append(TASKS[fmt].grade(text, ex).correct)
        greedy.append(shape(TOK.decode(policy.sample(prompt, 1, 512, temperature=0)[0].tokens)))
    # Every finished completion is filler, then one answer in the asked form, in '#### N', or none.
    forms = {s: shapes.count(s) / len(shapes) for s in set(shapes)}
    assert set(forms) <= {"", "#### N", ASKED_FORM[fmt]} | ({"the answer is : N"} if fmt == "choice" else set())
    asked = sum(v for s, v in forms.items() if s.startswith(ASKED_FORM[fmt][:3]))
    assert 0.25 <= asked / (asked + forms["#### N"]) <= 0.6, forms
    assert set(greedy) == {"#### N"}  # so the base model's greedy strict accuracy is 0
    assert 0.02 <= np.mean(hits) <= 0.2


def test_a_model_that_computes_right_picks_the_letter_of_the_right_option():
    """The head scores option letters by their numbers: exact arithmetic picks the gold letter."""
    theta = Policy.base().parameters().copy()
    p = M.unpack(theta)
    for verbs, weight in ((toy_data.PLUS_VERBS, 1.0), (toy_data.MINUS_VERBS, -1.0)):
        cues = [TOK.token_id(v.split()[v.split().index("{b}") - 1]) for v in verbs]
        p.cue_weights[M.BEFORE, cues] = weight * M.VALUE_SCALE
    p.head[1] = np.log(4.0) / M.PRECISION_GAIN
    policy = Policy(theta)
    for ex in examples(30, seed=5, fmt="choice"):
        prefix = prompt_tokens(ex, "choice") + TOK.encode("the answer is :")
        scores = {letter: policy.compute_logprobs(prefix + [TOK.token_id(letter)])[-1] for letter in "abcde"}
        assert max(scores, key=scores.get) == ex.gold.lower()
        assert scores["e"] < -20  # no option E


# ---- sampling and scoring agree, gradients are exact ---------------------------------------------


def perturbed_base(seed: int = 0) -> Policy:
    theta = Policy.base().parameters() + 0.05 * np.random.default_rng(seed).standard_normal(M.N_PARAMS)
    return Policy(theta)


def datum(prompt: list[int], completion: list[int]) -> DatumArrays:
    full = prompt + completion
    pad = [0.0] * (len(prompt) - 1)
    return DatumArrays(np.array(full[:-1]), {"target_tokens": np.array(full[1:]),
                                             "weights": np.array(pad + [1.0] * len(completion))})


@pytest.mark.parametrize("fmt", ["boxed", "answer_is", "choice"])
def test_sampled_logprobs_are_the_ones_forward_scores(fmt):
    policy = perturbed_base()
    prompts = [prompt_tokens(ex, fmt) for ex in examples(6, seed=9, fmt=fmt)]
    for i, prompt in enumerate(prompts):
        for seq in policy.sample(prompt, 6, 512, seed=i):
            scored = policy.forward([datum(prompt, seq.tokens)])[1][0]["logprobs"][-len(seq.tokens):]
            np.testing.assert_allclose(scored, seq.logprobs, rtol=0, atol=1e-10)


def test_gradient_of_the_format_rows_braces_and_letters_matches_finite_differences():
    policy = perturbed_base(1)
    [boxed] = examples(1, seed=2, fmt="boxed")
    [choice] = examples(1, seed=2, fmt="choice")
    batch = [datum(prompt_tokens(boxed, "boxed"), TOK.encode("so \\boxed { 7 }") + [TOK.eos_token_id]),
             datum(prompt_tokens(choice, "choice"), TOK.encode("the answer is : b") + [TOK.eos_token_id])]
    policy.forward_backward(batch, "cross_entropy", None)
    grad = policy.gradient()
    index = M.unpack(np.arange(M.N_PARAMS))
    focus = np.concatenate([index.table[M.FORMAT_ROW0:].ravel(), index.head,
                            index.cue_weights[M.BEFORE, [TOK.token_id("has"), TOK.token_id("buys")]]])
    assert np.abs(grad[focus]).sum() > 0
    theta, rng = policy.parameters(), np.random.default_rng(0)
    for _ in range(3):
        v = np.zeros(M.N_PARAMS)
        v[focus] = rng.standard_normal(len(focus))
        eps = 1e-6
        loss = [Policy(theta + s * eps * v).forward(batch)[0]["loss:sum"] for s in (1, -1)]
        assert (loss[0] - loss[1]) / (2 * eps) == pytest.approx(grad @ v, rel=1e-5, abs=1e-8)


# ---- learning each format under the DAPO loop -------------------------------------------------------


@dataclass(frozen=True)
class FormatExample(Example):
    fmt: str = ""


def tagged(ex: Example, fmt: str) -> FormatExample:
    return FormatExample(ex.question, ex.gold, ex.choices, ex.row, ex.answer, fmt=fmt)


class MixedTask:
    """Each example prompted and graded by its own format's built-in task (one short run teaches all three)."""

    def prompt(self, ex: FormatExample, tokenizer: Any, chat_template_kwargs: Mapping[str, Any]) -> list[int]:
        return TASKS[ex.fmt].prompt(ex, tokenizer, chat_template_kwargs)

    def grade(self, text: str, ex: FormatExample) -> Grade:
        return TASKS[ex.fmt].grade(text, ex)


LEARNED = ("boxed", "answer_is", "choice")
# 10 steps of 12 groups: the three formats learned at once in about 15 s on a quiet machine.
STEPS, STEPS_BATCH, HELD_OUT = 10, 12, 40


def test_the_dapo_loop_teaches_the_toy_each_answer_format(tmp_path, local_service):
    """The project's loop (dynamic sampling, strict rewards, PPO with DAPO's clip) through the real SDK, on
    questions of the three formats mixed: greedy strict accuracy on each format's held-out questions rises
    from the base model's 0 (it answers '#### N', the wrong form for all three)."""
    from sagemaker.train.training_session import ServiceClient

    cfg = load_config(ROOT / "config" / "local.yaml", {
        "batch_size": STEPS_BATCH, "group_size": 8, "max_steps": STEPS, "save_every": STEPS, "eval_every": 0,
        "eval_size": 0, "guards": False, "learning_rate": 0.01})
    rows = {fmt: [tagged(e, fmt) for e in examples(200, seed=21, fmt=fmt)] for fmt in LEARNED}
    held_out = {fmt: r[:HELD_OUT] for fmt, r in rows.items()}
    train = [e for i in range(HELD_OUT, 200) for e in (rows[fmt][i] for fmt in LEARNED)]
    task, tokenizer = MixedTask(), load_tokenizer(BASE_MODEL_ARN, None)

    def evaluate(sampler: Any) -> dict[str, Any]:
        return {fmt: evaluate_greedy(sampler, task, tokenizer, exs, cfg.dapo.max_tokens, 2)
                for fmt, exs in held_out.items()}

    training_client = ServiceClient(**client_kwargs()).create_lora_training_client(**lora_kwargs(cfg.session))
    try:
        base = evaluate(training_client.save_weights_and_get_sampling_client())
        trainer = Trainer(training_client=training_client, cfg=cfg.dapo, task=task, tokenizer=tokenizer,
                          train_examples=train, eval_examples=[],
                          metrics=metrics_io.MetricsLog(tmp_path / "metrics.jsonl"), checkpoint_dir=tmp_path / "ckpt")
        outcome = trainer.run(LoopState(seed=cfg.dapo.seed))
        trained = evaluate(training_client.save_weights_and_get_sampling_client())
    finally:
        training_client.stop()
    assert outcome.state.step == STEPS and not outcome.state.stopped_early
    figures = {fmt: (r.accuracy, r.format_error_rate) for fmt, r in trained.items()}
    for fmt in LEARNED:
        assert (base[fmt].accuracy, base[fmt].format_error_rate) == (0.0, 1.0)  # '#### N' is the wrong form
        assert trained[fmt].format_error_rate <= 0.25 and trained[fmt].accuracy >= 0.2, (fmt, figures)

