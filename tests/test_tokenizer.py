"""The tokenizer seam (steps/platform/tokenizer.py): the base model's own tokenizer, through the SDK's
resolution (the Hub record's HuggingfaceId, then transformers.AutoTokenizer) or from a directory of files;
and the local toy's Hugging Face files, which must be the toy tokenizer itself."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from local import toy_data
from local.training_session.responses import base_model_arn
from local.training_session.toy.policy import Policy
from local.training_session.toy.tokenizer import (
    HF_FILES,
    VOCAB,
    ToyTokenizer,
    hf_tokenizer_config,
    hf_tokenizer_json,
)
from steps.cli import Refused
from steps.dapo.chat import completion_text
from steps.gsm8k.answer import extract_answer, gold_answer
from steps.gsm8k.prompt import render_prompt
from steps.platform.tokenizer import describe_base_model, load_tokenizer
from tests.local_service import BASE_MODEL_ARN, ENDPOINT_ENV_VARS, REGION

ROOT = Path(__file__).resolve().parents[1]
TOY = ToyTokenizer()


@pytest.fixture(scope="module")
def hf_toy():
    """The committed files, loaded as a step loads a tokenizer directory."""
    return load_tokenizer(None, None, HF_FILES)


# -- the toy's Hugging Face files are the toy tokenizer ------------------------------------------------


def test_the_committed_files_are_what_the_builder_writes():
    """Regenerate with `python -m local.training_session.toy.tokenizer` after changing the toy vocabulary."""
    assert json.loads((HF_FILES / "tokenizer.json").read_text()) == json.loads(hf_tokenizer_json())
    assert json.loads((HF_FILES / "tokenizer_config.json").read_text()) == hf_tokenizer_config()


def test_ids_are_the_toy_vocabulary(hf_toy):
    assert hf_toy.convert_ids_to_tokens(list(range(len(VOCAB)))) == list(VOCAB)
    assert (hf_toy.bos_token_id, hf_toy.eos_token_id, hf_toy.unk_token_id, hf_toy.pad_token_id) == (
        TOY.bos_token_id, TOY.eos_token_id, TOY.unk_token_id, TOY.pad_token_id)


def test_prompts_of_the_toy_data_are_the_same_ids(hf_toy):
    for row in toy_data.generate_rows(400, seed=3):
        assert render_prompt(hf_toy, row["question"]) == render_prompt(TOY, row["question"]), row["question"]
        assert hf_toy.encode(row["answer"], add_special_tokens=False) == TOY.encode(row["answer"])


@pytest.mark.parametrize("text", [
    "Ann has 1234 apples, 07 pens and 100 cards.\nHow many?",  # long numbers, leading zeros, a newline
    "#### 123 ##### 5 <BOS> zebra shells 3+4=7 $1,000.50 (x)",  # '####' vs '#####', control tokens, unknown words
    "so then now so #### 17 <eos>",
])
def test_text_beyond_the_toy_data_tokenizes_and_decodes_the_same(hf_toy, text):
    ids = TOY.encode(text)
    assert hf_toy.encode(text, add_special_tokens=False) == ids
    for skip in (True, False):
        assert hf_toy.decode(ids, skip_special_tokens=skip) == TOY.decode(ids, skip_special_tokens=skip)


def test_the_toys_answers_decode_to_the_same_graded_numbers(hf_toy):
    """Completions the toy policy really samples (answers, thinking filler, cut-off ones) read the same."""
    policy = Policy.base()
    rows = toy_data.generate_rows(40, seed=4)
    answers = 0
    for i, row in enumerate(rows):
        prompt = render_prompt(TOY, row["question"])
        for seq in policy.sample(prompt, num_samples=4, max_tokens=512, temperature=1.0, seed=i):
            ours = extract_answer(completion_text(hf_toy, seq.tokens))
            assert ours == extract_answer(TOY.decode(seq.tokens, skip_special_tokens=False)), seq.tokens
            answers += ours[0] is not None
    assert answers > 40  # most completions answer: the comparison is not vacuous
    assert gold_answer(rows[0]["answer"]) is not None


def test_the_chat_template_refuses_a_bad_role_like_the_toy(hf_toy):
    with pytest.raises(Exception, match=r"messages\[0\]"):
        hf_toy.apply_chat_template([{"role": "robot", "content": "x"}], tokenize=False)


# -- the seam ---------------------------------------------------------------------------------------------


@pytest.mark.usefixtures("local_service")
def test_the_base_model_record_names_the_tokenizer_and_the_context():
    hub = describe_base_model(BASE_MODEL_ARN, None)
    assert hub.hf_model_id == str(HF_FILES)
    assert hub.context_tokens == 1024  # its recipe's SequenceLength "1K"
    tok = load_tokenizer(BASE_MODEL_ARN, None)
    assert tok.name_or_path == str(HF_FILES)
    assert render_prompt(tok, "Ann has 3 apples.") == render_prompt(TOY, "Ann has 3 apples.")


@pytest.mark.usefixtures("local_service")
def test_a_base_model_the_hub_does_not_have_is_refused_with_the_hub_answer():
    other = base_model_arn(REGION).replace("local-toy-arith", "qwen3-8b")
    with pytest.raises(Refused, match=r"Could not resolve base model .*qwen3-8b.*DescribeHubContent.*does not exist"):
        load_tokenizer(other, None)


def test_a_tokenizer_directory_needs_no_hub(monkeypatch, tmp_path):
    for var in ENDPOINT_ENV_VARS:  # no service: a Hub call would fail (and could not reach AWS either)
        monkeypatch.delenv(var, raising=False)
    tok = load_tokenizer(BASE_MODEL_ARN, None, HF_FILES)
    assert tok.encode("#### 7", add_special_tokens=False) == TOY.encode("#### 7")
    with pytest.raises(Refused, match=f"{tmp_path}: no tokenizer files"):
        load_tokenizer(BASE_MODEL_ARN, None, tmp_path)


def test_steps_never_import_local():
    """The toy is chosen through the seam (its Hub record), not by importing local/ from steps/."""
    offenders = [str(p.relative_to(ROOT)) for p in (ROOT / "steps").rglob("*.py")
                 if re.search(r"^\s*(from|import)\s+local\b", p.read_text(), re.M)]
    assert offenders == []
