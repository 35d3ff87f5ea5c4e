"""GSM8K prompt, answer extraction and grading."""
from __future__ import annotations

import pytest

from local.training_session.toy.tokenizer import ToyTokenizer
from steps.dapo.chat import answer_region, completion_text, opens_reasoning
from steps.dapo.sampling import RewardShaping, overlong_penalty, reward
from steps.gsm8k.answer import extract_answer, gold_answer, grade
from steps.gsm8k.prompt import INSTRUCTION, build_messages, render_prompt
from steps.gsm8k.task import GSM8K
from steps.tasks import Example
from steps.tasks.rules import normalize_question

# (completion, gold, extracted (lenient), formatted, strict correct, lenient correct)
COMPLETIONS = [
    ("#### 7", "7", "7", True, True, True),
    ("3 + 4 = 7\n#### 7", "7", "7", True, True, True),
    ("#### 7", "17", "7", True, False, False),  # a prefix of the gold is not the gold
    ("#### 17", "7", "17", True, False, False),
    ("the answer is 5 not 7 #### 5", "7", "5", True, False, False),  # #### beats the earlier mention of 7
    ("#### 7\nCheck: 3 + 4 = 7, plus 10 more is 17", "7", "7", True, True, True),  # numbers after the answer
    ("#### 7\nso 12", "12", "7", True, False, False),
    ("#### 3 wait, no\n#### 4", "4", "4", True, True, True),  # the LAST committed answer counts
    ("#### 4\n#### 3", "4", "3", True, False, False),
    ("\\boxed{5} ... no: #### 7", "7", "7", True, True, True),  # last by position, either form
    ("#### 5 ... no: \\boxed{7}", "7", "7", True, True, True),
    ("#### 4\n####", "4", "4", True, True, True),  # a bare #### commits to nothing
    ("####", "7", None, False, False, False),
    ("3 + 4 = 7 ####", "7", "7", False, False, True),  # empty ####: only the lenient fallback finds 7
    ("#### 1,000", "1000", "1000", True, True, True),
    ("#### 1000", "1,000", "1000", True, True, True),
    ("#### -3", "3", "-3", True, False, False),
    ("#### -3", "-3", "-3", True, True, True),
    ("#### 3", "-3", "3", True, False, False),
    ("#### 3.0", "3", "3", True, True, True),
    ("#### 2.50", "2.5", "2.5", True, True, True),
    ("#### +7", "7", "7", True, True, True),
    ("#### 7.00", "7", "7", True, True, True),
    ("#### 42 dollars.", "42", "42", True, True, True),
    ("#### $18", "18", "18", True, True, True),
    ("#### $1,234.50.", "1234.5", "1234.5", True, True, True),
    ("#### **42**", "42", "42", True, True, True),
    ("#### 7 .", "7", "7", True, True, True),  # toy tokenizer spacing
    ("#### - 5", "-5", "-5", True, True, True),  # toy tokenizer splits the sign off
    ("The total is \\boxed{1,234}.", "1234", "1234", True, True, True),
    ("so \\boxed{12} ... no, \\boxed{-12}", "-12", "-12", True, True, True),
    ("the answer is 7", "7", "7", False, False, True),
    ("The answer is: $18.", "18", "18", False, False, True),
    ("The answer is 7, not 8", "8", "7", False, False, False),
    ("She pays 10-5 = 5 dollars", "5", "5", False, False, True),  # subtraction, not a negative 5
    ("She has 3 apples, then 4 more, so 7.", "7", "7", False, False, True),
    ("I think it is 007", "7", "7", False, False, True),
    ("no number here", "7", None, False, False, False),
    ("", "0", None, False, False, False),
    ("#### 0.5", ".5", "0.5", True, True, True),
    ("#### -0", "0", "0", True, True, True),
    ("#### 123456789012345678901234567890", "123456789012345678901234567890",
     "123456789012345678901234567890", True, True, True),
    ("#### 123456789012345678901234567891", "123456789012345678901234567890",
     "123456789012345678901234567891", True, False, False),
]

HARMONY_FINAL = "<|start|>assistant<|channel|>final<|message|>"
# Completions of reasoning models: the answer is read only after the reasoning. (completion, extracted, formatted)
REASONING = [
    # <think> (Qwen3-family templates)
    ("<think>3 + 4 = 7. Check: 7.</think>\n\n#### 7", "7", True),
    ("<think>first guess #### 5</think>#### 7", "7", True),  # a '####' while thinking is not an answer
    ("<think>3 + 4 = 7</think>So she has seven.", None, False),  # nothing after the thinking
    ("<think>scratch: 12, 7</think>The answer is 7.", "7", False),
    ("<think>3 + 4 = 7, so the answer is 7", None, False),  # cut off mid-thought: no answer at all
    ("<think>#### 7", None, False),
    ("</think>\n\n#### 7", "7", True),  # the prompt opened the block (completion_text puts the tag back)
    ("<think>a</think>#### 7\n<think>hmm, or 8", None, False),  # thinking again when cut off
    # harmony (gpt-oss): analysis, then final
    ("<|channel|>analysis<|message|>3+4=7. Maybe #### 8?<|end|>" + HARMONY_FINAL + "#### 7<|return|>", "7", True),
    ("<|channel|>analysis<|message|>3+4=7<|end|>" + HARMONY_FINAL + "She has \\boxed{7} apples.<|return|>", "7", True),
    ("<|channel|>analysis<|message|>3+4=7<|end|>" + HARMONY_FINAL + "She has 7 apples.<|return|>", "7", False),
    ("<|channel|>analysis<|message|>We need 3+4 = 7, so #### 7", None, False),  # cut off in analysis
    ("<|channel|>analysis<|message|>3+4=7<|end|><|start|>assistant", None, False),  # cut off before final
    ("<|channel|>analysis<|message|>3+4=7<|end|>" + HARMONY_FINAL + "#### 7", "7", True),  # final cut after it
    ("<|channel|>analysis<|message|>x<|end|>" + HARMONY_FINAL + "#### 6<|end|>" + HARMONY_FINAL + "#### 7<|return|>",
     "7", True),  # two final messages: the last
    ("<|channel|>commentary to=functions.calc <|constrain|>json<|message|>{\"x\": 7}<|call|>", None, False),
]


@pytest.mark.parametrize("completion, gold, extracted, formatted, strict, lenient", COMPLETIONS)
def test_grade_table(completion, gold, extracted, formatted, strict, lenient):
    assert extract_answer(completion) == (extracted, formatted)
    result = grade(completion, gold)
    assert (result.extracted, result.formatted, result.correct, result.correct_lenient) == (
        extracted, formatted, strict, lenient)
    assert reward(result, 10, RewardShaping(512)) == (1.0 if strict else 0.0)
    assert reward(result, 10, RewardShaping(512, reward_format="lenient")) == (1.0 if lenient else 0.0)


@pytest.mark.parametrize("completion, extracted, formatted", REASONING)
def test_only_the_answer_region_is_read(completion, extracted, formatted):
    assert extract_answer(completion) == (extracted, formatted)
    result = grade(completion, "7")
    assert result.correct is (extracted == "7" and formatted)
    assert result.correct_lenient is (extracted == "7")


@pytest.mark.parametrize("completion, region", [
    ("#### 7", "#### 7"),
    ("<think>x</think>#### 7", "#### 7"),
    ("<think>x", None),
    ("<|channel|>analysis<|message|>x<|end|>" + HARMONY_FINAL + "#### 7<|return|>", "#### 7"),
    ("<|channel|>analysis<|message|>x", None),
])
def test_answer_region(completion, region):
    assert answer_region(completion) == region


def test_a_truncated_thought_whose_scratch_number_equals_the_gold_earns_nothing():
    """The reward noise this module exists to remove: the last number of a cut-off thought is the gold."""
    cut = "<think>Ann has 3 and buys 4, 3 + 4 = 7, but wait, does she"
    assert [reward(grade(cut, "7"), 512, RewardShaping(512, reward_format=f)) for f in ("strict", "lenient")] == [0, 0]
    assert grade(cut.replace("<think>", ""), "7").correct_lenient  # read as an answer, its 7 would have paid


def test_toy_tokenizer_completions_round_trip_and_grade():
    tok = ToyTokenizer()
    for text, gold, correct in [("#### 7 .", "7", True), ("the answer is 7", "7", False), ("#### 123", "123", True),
                                ("#### 12", "123", False)]:
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
    shaping = RewardShaping(512, overlong_buffer=100, overlong_penalty=1.0)
    assert overlong_penalty(length, shaping) == pytest.approx(expected)
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

    def apply_chat_template(self, messages, add_generation_prompt, tokenize, **template_kwargs):
        self.calls.append((messages, add_generation_prompt, tokenize, template_kwargs))
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
    [[5, 6, 7], (5, 6, 7), {"input_ids": [5, 6, 7], "attention_mask": [1, 1, 1]}, _BatchEncoding(input_ids=[[5, 6, 7]]),
     _BatchEncoding(input_ids=_Tensor([[5, 6, 7]]))],
)
def test_render_prompt_accepts_every_hugging_face_return_shape(result):
    tok = _ListTokenizer(result)
    assert render_prompt(tok, "Q?") == [5, 6, 7]
    assert tok.calls == [(build_messages("Q?"), True, True, {})]


def test_render_prompt_passes_the_chat_template_kwargs():
    tok = _ListTokenizer([1])
    render_prompt(tok, "Q?", {"reasoning_effort": "low"})
    assert tok.calls == [(build_messages("Q?"), True, True, {"reasoning_effort": "low"})]


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


# -- what the grader reads, with real Hugging Face tokenizers ----------------------------------------
# A small tokenizer with what matters of two served families: a Qwen3-style template (ChatML, <think>
# tags as ordinary added tokens, `enable_thinking` switching the generation prompt) and gpt-oss's harmony
# markers as special tokens. Built with the `tokenizers` library, loaded with AutoTokenizer.
CHATML_THINKING = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}"
    "{% endif %}"
)
HARMONY_SPECIAL = ("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>")
WORDS = ("####", "7", "8", "3", "+", "4", "=", "so", "the", "answer", "is", "analysis", "final", "assistant", "user",
         "system", "solve", "problem", "q?")


@pytest.fixture(scope="module")
def reasoning_tokenizer(tmp_path_factory):
    import json

    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    from transformers import AutoTokenizer

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(("[UNK]",) + WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_tokens([AddedToken(t, special=False) for t in ("<think>", "</think>")])
    tok.add_special_tokens([AddedToken(t, special=True) for t in ("<|im_start|>", "<|im_end|>") + HARMONY_SPECIAL])
    d = tmp_path_factory.mktemp("reasoning-tokenizer")
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "unk_token": "[UNK]",
        "chat_template": CHATML_THINKING}))
    return AutoTokenizer.from_pretrained(str(d))


def ids(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False)


def test_a_thinking_template_opens_the_block_in_the_prompt_and_the_grader_knows(reasoning_tokenizer):
    tok = reasoning_tokenizer
    thinking = render_prompt(tok, "Q?")
    direct = render_prompt(tok, "Q?", {"enable_thinking": False})
    assert tok.decode(thinking[-2:]).split() == ["assistant", "<think>"]
    assert opens_reasoning(tok, thinking) and not opens_reasoning(tok, direct)
    cut = ids(tok, "3 + 4 = 7 so the answer is 7")  # cut off mid-thought: no tag of its own
    assert grade(completion_text(tok, cut, reasoning_open=True), "7").correct_lenient is False
    done = ids(tok, "3 + 4 = 7 </think> #### 7 <|im_end|>")
    assert grade(completion_text(tok, done, reasoning_open=True), "7").correct
    assert grade(completion_text(tok, ids(tok, "#### 7 <|im_end|>"), reasoning_open=False), "7").correct


def test_the_grader_reads_harmony_with_its_markers_which_skip_special_tokens_would_drop(reasoning_tokenizer):
    tok = reasoning_tokenizer
    answered = ids(tok, "<|channel|> analysis <|message|> so #### 8 <|end|> <|start|> assistant <|channel|> final "
                        "<|message|> #### 7 <|return|>")
    cut_in_analysis = ids(tok, "<|channel|> analysis <|message|> 3 + 4 = 7 so #### 7")
    # Without the markers the analysis channel reads as an answer: 8 where the model said 7, and a
    # completion cut off while thinking scores.
    assert tok.decode(answered, skip_special_tokens=True).split()[:2] == ["analysis", "so"]
    assert extract_answer(tok.decode(cut_in_analysis, skip_special_tokens=True)) == ("7", True)
    # What the grader reads keeps them.
    assert extract_answer(completion_text(tok, answered)) == ("7", True)
    assert extract_answer(completion_text(tok, cut_in_analysis)) == (None, False)


def test_the_sampler_grades_the_text_completion_text_gives(reasoning_tokenizer):
    from types import SimpleNamespace

    from steps.dapo.sampling import GroupSampler

    sampler = GroupSampler(GSM8K, reasoning_tokenizer, [Example("Q?", "7")], 2, SimpleNamespace(), RewardShaping(512))
    assert sampler.text(0, ids(reasoning_tokenizer, "3 + 4 = 7")) == "<think>3 + 4 = 7"
    direct = GroupSampler(GSM8K, reasoning_tokenizer, [Example("Q?", "7")], 2, SimpleNamespace(), RewardShaping(512),
                          chat_template_kwargs={"enable_thinking": False})
    assert direct.text(0, ids(reasoning_tokenizer, "#### 7")) == "#### 7"
