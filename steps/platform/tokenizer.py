"""The one seam that picks a tokenizer: chosen by config, not by `if local:` branches.

``session.tokenizer: toy`` uses the local training-session service's own
tokenizer; anything else is a Hugging Face id or a local directory, loaded with
``transformers.AutoTokenizer`` (in the step image; not needed locally). The SDK's
factories take no tokenizer, so the steps always send token ids.
"""
from __future__ import annotations

from typing import Any

from steps.cli import Refused

TOY = "toy"


def load_tokenizer(name: str | None) -> Any:
    if not name:
        raise Refused("session.tokenizer is not set: name the base model's Hugging Face tokenizer id")
    if name == TOY:
        from local.training_session.toy.tokenizer import ToyTokenizer

        return ToyTokenizer()
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise Refused(
            f"session.tokenizer is {name!r}, which needs the 'transformers' package "
            "(installed in the step image). Install it with: pip install 'dapo-sagemaker-pipeline[image]', "
            "or set session.tokenizer: toy for the local service."
        ) from None
    return AutoTokenizer.from_pretrained(name)
