"""The one seam that picks the tokenizer: the base model's own, as the SDK resolves it.

Two sources, the same for every model (the local toy included):

- **the Hub** (default): ``DescribeHubContent`` of the base model publishes its
  ``HuggingfaceId``; the SDK's own ``load_tokenizer`` (what ``TrainingClient.get_tokenizer``
  calls) loads it with ``transformers.AutoTokenizer`` from the Hugging Face hub, which needs
  internet egress. The local service's record of ``local-toy-arith`` names a directory of
  Hugging Face files for the toy vocabulary instead, so locally nothing is downloaded.
- **a directory** of tokenizer files (``pipeline.tokenizer_s3_uri``: TrainDAPO's ``tokenizer``
  channel, ValidateData's and EvaluateModel's ``--tokenizer`` input), for jobs without
  egress: loaded with ``AutoTokenizer.from_pretrained(directory)``, no Hub call.

The Hub lookup goes where the SDK sends the training-session control plane when
``SAGEMAKER_TRAINING_SESSION_ENDPOINT`` overrides it (as the SDK's own model-registry
client does, and steps.approve), else to the region's SageMaker endpoint. The same
record gives the model's context: the largest ``SequenceLength`` ("32K") of its
``RecipeCollection``, what the SDK reads as the sequence-length ceiling of a model.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from steps.cli import Refused

_INSTALL = "pip install 'dapo-sagemaker-pipeline[image]' (the step image has it)"


@dataclass(frozen=True)
class HubModel:
    """What the Public Hub publishes about a base model, as far as the steps use it."""

    hf_model_id: str | None  # HuggingfaceId: what AutoTokenizer loads
    context_tokens: int | None  # the largest recipe SequenceLength; None when the record states none


def hub_client(region: str | None) -> Any:
    import boto3

    endpoint = os.environ.get("SAGEMAKER_TRAINING_SESSION_ENDPOINT") or None
    return boto3.client("sagemaker", region_name=region, endpoint_url=endpoint)


def region_of(base_model: str, region: str | None) -> str | None:
    """A Hub ARN names its region (arn:aws:sagemaker:<region>:aws:hub-content/...); else the configured one."""
    parts = base_model.split(":")
    return parts[3] if base_model.startswith("arn:") and len(parts) > 3 and parts[3] else region


def describe_base_model(base_model: str | None, region: str | None) -> HubModel:
    """One ``DescribeHubContent`` of the base model, through the SDK's own lookup."""
    from sagemaker.train.training_session._utils import _describe_base_model, _extract_hf_model_id

    if not base_model:
        raise Refused("session.base_model is not set: name the SageMaker Public Hub model to train")
    try:
        described = _describe_base_model(base_model, hub_client(region_of(base_model, region)))
    except ValueError as exc:
        raise Refused(f"{exc} (DescribeHubContent: {exc.__cause__})") from None
    return HubModel(_extract_hf_model_id(described), _context_tokens(described.get("HubContentDocument")))


def _context_tokens(document: str | None) -> int | None:
    try:
        recipes = json.loads(document or "{}").get("RecipeCollection") or []
    except (TypeError, ValueError, AttributeError):
        return None
    lengths = [_sequence_length(r.get("SequenceLength")) for r in recipes if isinstance(r, dict)]
    return max((n for n in lengths if n), default=None)


def _sequence_length(value: Any) -> int | None:
    """ "8K" -> 8192, as the SDK reads a recipe's SequenceLength; anything else -> None."""
    text = str(value or "").strip().upper()
    return int(text[:-1]) * 1024 if text.endswith("K") and text[:-1].isdigit() else None


def load_tokenizer(base_model: str | None, region: str | None, directory: str | Path | None = None,
                   hub: HubModel | None = None) -> Any:
    """The base model's tokenizer: from ``directory`` when given, else the Hub's Hugging Face id.

    ``hub`` is a :func:`describe_base_model` already made (ValidateData needs its context too).
    """
    if directory is not None:
        return _from_directory(Path(directory))
    hub = hub or describe_base_model(base_model, region)
    if not hub.hf_model_id:
        raise Refused(f"the Hub publishes no Hugging Face tokenizer for {base_model!r}: put the model's tokenizer "
                      "files under pipeline.tokenizer_s3_uri")
    from sagemaker.train.training_session._utils import load_tokenizer as sdk_load_tokenizer

    try:
        return sdk_load_tokenizer(base_model, None, hf_model_id=hub.hf_model_id)
    except ImportError:
        raise Refused(f"loading the tokenizer {hub.hf_model_id!r} needs the 'transformers' package: "
                      f"{_INSTALL}") from None
    except OSError as exc:  # not downloadable: no egress, a gated repo, a wrong id
        raise Refused(f"cannot load the tokenizer {hub.hf_model_id!r} of {base_model!r} ({exc}); a job without "
                      "internet egress takes the tokenizer files from pipeline.tokenizer_s3_uri") from None


def _from_directory(directory: Path) -> Any:
    if not (directory / "tokenizer_config.json").is_file() and not (directory / "tokenizer.json").is_file():
        raise Refused(f"{directory}: no tokenizer files (tokenizer.json, tokenizer_config.json); upload the base "
                      "model's tokenizer files to pipeline.tokenizer_s3_uri")
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise Refused(f"loading the tokenizer in {directory} needs the 'transformers' package: {_INSTALL}") from None
    return AutoTokenizer.from_pretrained(str(directory))
