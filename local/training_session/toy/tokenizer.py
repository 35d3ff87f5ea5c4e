"""The word-level tokenizer of the local base model ``local-toy-arith``.

The service's model works on its ids; its methods mirror the subset of Hugging
Face's tokenizer API the project uses (``encode``, ``decode``,
``apply_chat_template``, ``convert_ids_to_tokens``) for tests and examples. The
steps never import it: they load its Hugging Face files (below), as any model's.

Text is lowercased and split into words, whole numbers and punctuation (``\\boxed``
is one token, like ``####``, so a boxed answer decodes as ``\\boxed { 7 }``). Whole
numbers 0..99 are single tokens; a longer one is split as WordPiece splits it,
longest vocabulary entry first, then ``##d`` continuation digits (``123`` ->
``12 ##3``, ``007`` -> ``0 ##0 ##7``), which decode glues back together. Words
outside the small vocabulary become ``<unk>``. Decoding joins tokens with
spaces, so a completion reads e.g. ``#### 7``.

The same tokenizer as Hugging Face files (:func:`write_hf_tokenizer`, committed
in ``hf_tokenizer_files/``): what the local service's ``DescribeHubContent``
publishes as the model's ``HuggingfaceId``, so the steps load it with
``transformers.AutoTokenizer`` exactly as they load a real model's tokenizer.
"""
from __future__ import annotations

import operator
import re
from pathlib import Path
from typing import Sequence

from local import toy_data
from steps.platform import files

BASE_MODEL_NAME = "local-toy-arith"

CONTROL = ("<pad>", "<unk>", "<bos>", "<eos>", "<system>", "<user>", "<assistant>")
ROLES = ("system", "user", "assistant")
PUNCTUATION = ("####", ".", ",", "?", "!", ":", ";", "+", "-", "=", "*", "/", "$", "%", "(", ")", "'", "\n")
NUMBERS = tuple(str(i) for i in range(100))
DIGIT_CONTINUATIONS = tuple(f"##{d}" for d in range(10))
# The toy task's own words come from its generator; the rest are the built-in tasks' instructions
# and a few words a chat model's answers commonly contain.
_INSTRUCTION_WORDS = "solve the problem write final answer as followed by number"
_COMMON_WORDS = "a an is are of to in it its each total what there then now so she he they starts with left"
# The other answer formats' instructions ('\boxed{}', 'End with "The answer is:" ...', 'Choose the
# correct option ... its letter') and the option letters of a multiple-choice question ('a' is above).
_FORMAT_WORDS = "end choose correct option letter b c d e"
WORDS = tuple(dict.fromkeys(
    [name.lower() for name, _ in toy_data.NAMES]
    + [pronoun for _, pronoun in toy_data.NAMES]
    + list(toy_data.OBJECTS)
    + [w for verb in toy_data.PLUS_VERBS + toy_data.MINUS_VERBS for w in verb.split() if w != "{b}"]
    + "has and how many does have more".split()
    + _INSTRUCTION_WORDS.split()
    + _COMMON_WORDS.split()
    + _FORMAT_WORDS.split()
))
# Pieces of the other answer forms, after the words so the ids of the tokens above stay as they were.
FORM_PIECES = ("\\boxed", "{", "}", '"')
VOCAB = CONTROL + PUNCTUATION + NUMBERS + DIGIT_CONTINUATIONS + WORDS + FORM_PIECES

# Control tokens, "####", "\boxed", whole numbers, words, a newline, or any other single character.
_PIECE_RE = re.compile(r"<[a-z]+>|####|\\boxed|\d+|[a-z]+|\n|\S")


class ToyTokenizer:
    """Word-level tokenizer over :data:`VOCAB` (ids are positions in it)."""

    def __init__(self) -> None:
        self._id = {tok: i for i, tok in enumerate(VOCAB)}
        self.vocab_size = len(VOCAB)
        self.pad_token_id = self._id["<pad>"]
        self.unk_token_id = self._id["<unk>"]
        self.bos_token_id = self._id["<bos>"]
        self.eos_token_id = self._id["<eos>"]
        self.all_special_ids = [self._id[t] for t in CONTROL]

    def __len__(self) -> int:
        return self.vocab_size

    def token_id(self, token: str) -> int:
        """Id of one vocabulary entry (e.g. ``"####"``, ``"<assistant>"``, ``"7"``)."""
        try:
            return self._id[token]
        except KeyError:
            raise KeyError(f"{token!r} is not in the {BASE_MODEL_NAME} vocabulary") from None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids = [self.bos_token_id] if add_special_tokens else []
        for piece in _PIECE_RE.findall(text.lower()):
            if piece.isdigit():
                # WordPiece's greedy longest match: a whole number 0..99 first, then single continuation
                # digits, so leading zeros and long numbers survive decode.
                head = piece[:2] if piece[:2] in self._id else piece[0]
                ids.append(self._id[head])
                ids.extend(self._id["##" + d] for d in piece[len(head):])
            else:
                ids.append(self._id.get(piece, self.unk_token_id))
        return ids

    def convert_ids_to_tokens(self, ids: int | Sequence[int]) -> str | list[str]:
        try:
            return self._token(operator.index(ids))  # one id in, one token out, like Hugging Face
        except TypeError:
            return [self._token(i) for i in ids]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        text = ""
        for tok in self.convert_ids_to_tokens(list(ids)):
            if skip_special_tokens and tok in CONTROL:
                continue
            if tok.startswith("##") and tok != "####":
                text += tok[2:]  # a continuation digit joins the number before it
            else:
                text += (" " if text else "") + tok
        return text.replace(" \n ", "\n").replace(" \n", "\n")

    def apply_chat_template(
        self, messages: list[dict], add_generation_prompt: bool = True, tokenize: bool = True
    ) -> list[int] | str:
        """``<bos> <role> content ...``; an assistant turn ends with ``<eos>``.

        With ``add_generation_prompt`` the result ends with ``<assistant>``, where
        the model's completion starts. ``tokenize=False`` returns the rendered text,
        which :meth:`encode` turns into the same ids.
        """
        parts = ["<bos>"]
        for index, message in enumerate(messages):
            role, content = _role_and_content(message, index)
            parts.append(f"<{role}> {content}")
            if role == "assistant":
                parts.append("<eos>")
        if add_generation_prompt:
            parts.append("<assistant>")
        text = " ".join(parts)
        return self.encode(text) if tokenize else text

    def _token(self, token_id: int) -> str:
        if not 0 <= token_id < self.vocab_size:
            raise ValueError(f"token id {token_id} is outside the {BASE_MODEL_NAME} vocabulary "
                             f"(0..{self.vocab_size - 1})")
        return VOCAB[token_id]


def _role_and_content(message: dict, index: int) -> tuple[str, str]:
    if not isinstance(message, dict) or message.get("role") not in ROLES or not isinstance(message.get("content"), str):
        raise ValueError(
            f"messages[{index}] must be a dict with 'role' in {ROLES} and a string 'content', got {message!r}"
        )
    return message["role"], message["content"]


# -- the same tokenizer as Hugging Face files ---------------------------------------------------
#: Where the committed files live; the local service's DescribeHubContent names this directory.
HF_FILES = Path(__file__).resolve().parent / "hf_tokenizer_files"
# ToyTokenizer.apply_chat_template in Jinja, the language of Hugging Face chat templates.
CHAT_TEMPLATE = (
    "<bos>{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] or message['content'] is not string %}"
    "{{ raise_exception('messages[' ~ loop.index0 ~ '] must have a role in system, user, assistant "
    "and a string content') }}{% endif %}"
    " <{{ message['role'] }}> {{ message['content'] }}{% if message['role'] == 'assistant' %} <eos>{% endif %}"
    "{% endfor %}{% if add_generation_prompt %} <assistant>{% endif %}"
)


def hf_tokenizer_json() -> str:
    """``tokenizer.json`` of the toy vocabulary, built with the ``tokenizers`` library.

    A WordPiece model over :data:`VOCAB` (same ids), ``##`` continuations, a lowercase
    normaliser, and a pre-tokenizer cutting the pieces :data:`_PIECE_RE` cuts (spaces other
    than newlines dropped). The decoder is not WordPiece's: that one would glue ``####`` to the
    token before it, as it does any token starting with ``##``; this one joins tokens with
    spaces and glues only the ``##d`` digit continuations, like :meth:`ToyTokenizer.decode`.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    tok = Tokenizer(models.WordPiece(vocab={t: i for i, t in enumerate(VOCAB)}, unk_token="<unk>",
                                     continuing_subword_prefix="##", max_input_chars_per_word=1_000_000))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"[^\S\n]+"), behavior="removed"),
        pre_tokenizers.Split(Regex(_PIECE_RE.pattern), behavior="isolated"),
    ])
    tok.decoder = decoders.Sequence([
        decoders.Replace(Regex("^"), " "),  # every token after a space...
        decoders.Replace(Regex(r"^ ##(?=\d$)"), ""),  # ...but a continuation digit
        decoders.Fuse(),
        decoders.Strip(" ", 1, 0),
        decoders.Replace(" \n ", "\n"),
        decoders.Replace(" \n", "\n"),
    ])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in CONTROL])
    return tok.to_str(pretty=True)


def hf_tokenizer_config() -> dict:
    """``tokenizer_config.json``: the fast tokenizer class, the special tokens, the chat template."""
    return {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<bos>", "eos_token": "<eos>",
            "unk_token": "<unk>", "pad_token": "<pad>", "model_max_length": 1024, "chat_template": CHAT_TEMPLATE}


def write_hf_tokenizer(out_dir: Path) -> None:
    """Write the Hugging Face files; ``python -m local.training_session.toy.tokenizer`` regenerates HF_FILES."""
    files.write_text(out_dir / "tokenizer.json", hf_tokenizer_json() + "\n")
    files.write_json(out_dir / "tokenizer_config.json", hf_tokenizer_config(), indent=2)


if __name__ == "__main__":
    write_hf_tokenizer(HF_FILES)
    print(f"wrote {HF_FILES}")
