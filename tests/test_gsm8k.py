"""GSM8K prompt, answer extraction and grading."""
from __future__ import annotations

import pytest

from local.training_session.toy.tokenizer import ToyTokenizer
from steps.gsm8k.answer import extract_answer, gold_answer
from steps.gsm8k.prompt import INSTRUCTION, build_messages, render_prompt
from steps.gsm8k.reward import Grade, RewardShaping, grade, overlong_penalty, reward
from steps.gsm8k.rules import normalize_question

# (completion, gold, expected extracted, expected formatted, expected correct)
COMPLETIONS = [
    ("#### 7", "7", "7", True, True),
    ("3 + 4 = 7\n#### 7", "7", "7", True, True),
    ("#### 7", "17", "7", True, False),  # a prefix of the gold is not the gold
    ("#### 17", "7", "17", True, False),
    ("the answer is 5 not 7 #### 5", "7", "5", True, False),  # #### beats the earlier mention of 7
    ("#### 7\nCheck: 3 + 4 = 7, plus 10 more is 17", "7", "7", True, True),  # numbers after the answer
    ("#### 7\nso 12", "12", "7", True, False),
    ("#### 3 wait, no\n#### 4", "4", "4", True, True),  # the LAST #### is the answer
    ("#### 4\n#### 3", "4", "3", True, False),
    ("####", "7", None, False, False),
    ("3 + 4 = 7 ####", "7", "7", False, True),  # empty ####: falls back to the last number, unformatted
    ("#### 1,000", "1000", "1000", True, True),
    ("#### 1000", "1,000", "1000", True, True),
    ("#### -3", "3", "-3", True, False),
    ("#### -3", "-3", "-3", True, True),
    ("#### 3", "-3", "3", True, False),
    ("#### 3.0", "3", "3", True, True),
    ("#### 2.50", "2.5", "2.5", True, True),
    ("#### +7", "7", "7", True, True),
    ("#### 7.00", "7", "7", True, True),
    ("#### 42 dollars.", "42", "42", True, True),
    ("#### $18", "18", "18", True, True),
    ("#### $1,234.50.", "1234.5", "1234.5", True, True),
    ("#### **42**", "42", "42", True, True),
    ("#### 7 .", "7", "7", True, True),  # toy tokenizer spacing
    ("#### - 5", "-5", "-5", True, True),  # toy tokenizer splits the sign off
    ("The total is \\boxed{1,234}.", "1234", "1234", False, True),
    ("so \\boxed{12} ... no, \\boxed{-12}", "-12", "-12", False, True),
    ("the answer is 7", "7", "7", False, True),
    ("The answer is: $18.", "18", "18", False, True),
    ("The answer is 7, not 8", "8", "7", False, False),
    ("She pays 10-5 = 5 dollars", "5", "5", False, True),  # subtraction, not a negative 5
    ("She has 3 apples, then 4 more, so 7.", "7", "7", False, True),
    ("I think it is 007", "7", "7", False, True),
    ("no number here", "7", None, False, False),
    ("", "0", None, False, False),
    ("#### 0.5", ".5", "0.5", True, True),
    ("#### -0", "0", "0", True, True),
    ("#### 123456789012345678901234567890", "123456789012345678901234567890", "123456789012345678901234567890", True, True),
    ("#### 123456789012345678901234567891", "123456789012345678901234567890", "123456789012345678901234567891", True, False),
]


@pytest.mark.parametrize("completion, gold, extracted, formatted, correct", COMPLETIONS)
def test_grade_table(completion, gold, extracted, formatted, correct):
    assert extract_answer(completion) == (extracted, formatted)
    assert grade(completion, gold) == Grade(correct=correct, formatted=formatted, extracted=extracted)
    assert reward(grade(completion, gold), 10, RewardShaping(512)) == (1.0 if correct else 0.0)


def test_toy_tokenizer_completions_round_trip_and_grade():
    tok = ToyTokenizer()
    for text, gold, correct in [("#### 7 .", "7", True), ("the answer is 7", "7", True), ("#### 123", "123", True), ("#### 12", "123", False)]:
        decoded = tok.decode(tok.encode(text))
        assert grade(decoded, gold).correct is correct, decoded


GSM8K_ANSWER = (
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
    "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n"
    "#### 72"
)


@pytest.mark.parametrize(
    "answer, gold",
    [
        (GSM8K_ANSWER, "72"),
        ("He earns 1,000 + 500 = <<1000+500=1500>>1,500 dollars\n#### 1,500", "1500"),
        ("The loss is <<5-8=-3>>-3\n#### -3", "-3"),
        ("Half is <<5/2=2.5>>2.5\n#### 2.50", "2.5"),
        ("#### 3\ncorrection\n#### 4", "4"),  # the FINAL ####
        ("####72", "72"),
        ("#### 72 \n", "72"),
        ("#### $18", "18"),
        ("48/2 = <<48/2=24>>24", None),  # no ####
        ("#### ", None),
        ("#### seventy-two", None),
        ("#### 72 clips", None),  # the gold must be just the number
        ("#### 1/2", None),
        ("", None),
    ],
)
def test_gold_answer(answer, gold):
    assert gold_answer(answer) == gold


@pytest.mark.parametrize("length,expected", [(100, 0.0), (412, 0.0), (462, -0.5), (512, -1.0), (600, -1.0)])
def test_overlong_penalty_is_dapo_soft_punishment(length, expected):
    assert overlong_penalty(length, RewardShaping(512, overlong_buffer=100, overlong_penalty=1.0)) == pytest.approx(expected)
    assert overlong_penalty(length, RewardShaping(512)) == 0.0
    assert reward(grade("#### 7", "7"), length, RewardShaping(512, 100, 1.0)) == pytest.approx(1.0 + expected)


def test_grade_rejects_a_gold_that_is_not_a_number():
    with pytest.raises(ValueError, match="not a number"):
        grade("#### 7", "seven")


def test_build_messages_appends_the_instruction():
    assert build_messages("What is 3 + 4?") == [{"role": "user", "content": "What is 3 + 4?\n" + INSTRUCTION}]


class _ListTokenizer:
    def __init__(self, result):
        self.result = result
        self.calls = []

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        self.calls.append((messages, add_generation_prompt, tokenize))
        return self.result


class _BatchEncoding(dict):
    """What newer transformers return: a dict subclass with input_ids."""


class _Tensor:
    def __init__(self, rows):
        self.rows = rows

    def tolist(self):
        return self.rows


@pytest.mark.parametrize(
    "result",
    [[5, 6, 7], (5, 6, 7), {"input_ids": [5, 6, 7], "attention_mask": [1, 1, 1]}, _BatchEncoding(input_ids=[[5, 6, 7]]), _BatchEncoding(input_ids=_Tensor([[5, 6, 7]]))],
)
def test_render_prompt_accepts_every_hugging_face_return_shape(result):
    tok = _ListTokenizer(result)
    assert render_prompt(tok, "Q?") == [5, 6, 7]
    assert tok.calls == [(build_messages("Q?"), True, True)]


def test_render_prompt_refuses_text_instead_of_ids():
    with pytest.raises(TypeError, match="not token ids"):
        render_prompt(_ListTokenizer("<user> Q?"), "Q?")


def test_render_prompt_with_the_toy_tokenizer_ends_at_the_assistant_turn():
    tok = ToyTokenizer()
    ids = render_prompt(tok, "Ann has 3 apples and buys 4 more. How many apples does she have?")
    assert all(isinstance(i, int) for i in ids)
    assert ids[-1] == tok.token_id("<assistant>")
    assert tok.token_id("####") in ids  # the instruction is part of the prompt


@pytest.mark.parametrize(
    "a, b, same",
    [
        ("How many  apples?", "how many apples?", True),
        ("  How\tmany\napples? ", "how many apples?", True),
        ("How many apples?", "How many pears?", False),
        ("How many apples?", "How many apples", False),  # punctuation matters
    ],
)
def test_normalize_question(a, b, same):
    assert (normalize_question(a) == normalize_question(b)) is same
