"""What a training session bills: tokens counted two ways, and money when the config has a price table.

The service bills three kinds of token (DescribeTrainingSession's ``BillableTokenUsage``), and only for
operations that completed:

* **prefill**: a sampling request's prompt, once however many samples share it;
* **sample**: every token generated;
* **train**: every model-input token of a ``forward`` or ``forward_backward`` datum, prompt positions included.

The SDK (sagemaker-train) exposes none of it: it has no describe call, drops each sampled sequence's
``tokenUsage``, and keeps ``forward_backward``'s only in a private result. So a step counts the same three
figures from what it sent and received (:class:`TokenMeter`: the client count, logged as running totals per
step) and, once its session is stopped, reads the session's own count with boto3
(:func:`service_count`). The step's ``billing`` block (:func:`block`) carries both; its totals are the
service's when it could be read, the client's otherwise (``source`` says which). A describe that fails is a
warning, never a failed step: the client count is the same figure, counted on this side.

With ``session.prices`` set, :func:`cost_usd` turns a count into US dollars.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from steps.config.models import Prices

log = logging.getLogger("steps.billing")

SERVICE = "DescribeTrainingSession.BillableTokenUsage"
CLIENT = "client count"
#: The three kinds, as model.json, evaluation.json, metrics.jsonl and the log lines name them.
FIELDS = ("prefill_tokens", "sample_tokens", "train_tokens")


@dataclass(frozen=True)
class TokenCount:
    """Billable tokens of each kind."""

    prefill: int = 0
    sample: int = 0
    train: int = 0

    def __add__(self, other: TokenCount) -> TokenCount:
        return TokenCount(self.prefill + other.prefill, self.sample + other.sample, self.train + other.train)

    def fields(self) -> dict[str, int]:
        return dict(zip(FIELDS, (self.prefill, self.sample, self.train)))

    @classmethod
    def from_fields(cls, record: Mapping[str, Any]) -> TokenCount:
        """From a record with :data:`FIELDS` (a missing one, e.g. of a record older than them, counts 0)."""
        return cls(*(int(record.get(name) or 0) for name in FIELDS))

    @classmethod
    def from_service(cls, usage: Mapping[str, Any]) -> TokenCount:
        """From botocore's BillableTokenUsage."""
        return cls(int(usage.get("PrefillTokenCount") or 0), int(usage.get("SampleTokenCount") or 0),
                   int(usage.get("TrainingTokenCount") or 0))


class TokenMeter:
    """The client count: running totals of what the loop sent and received, as the service bills it.

    Called where the responses arrive, on the one thread that waits for them, so it needs no lock.
    ``start``: tokens counted before this process (an earlier attempt of a resumed step); ``prices``: the
    config's, for :meth:`figures`.
    """

    def __init__(self, start: TokenCount = TokenCount(), prices: Prices | None = None) -> None:
        self.total = start
        self.prices = prices

    def figures(self) -> dict[str, Any]:
        """The running totals as a step's record appends them: the three counts, and ``cost_usd`` with prices."""
        usd = cost_usd(self.total, self.prices)
        return {**self.total.fields(), **({} if usd is None else {"cost_usd": usd})}

    def sampled(self, prompt_tokens: int, sequences: Sequence[Sequence[int]]) -> None:
        """One completed sampling request: its prompt is prefilled once (prefill), each of its sequences'
        tokens were generated (sample). A request that failed is not called for: it bills nothing."""
        self.total += TokenCount(prefill=prompt_tokens, sample=sum(len(s) for s in sequences))

    def trained(self, datums: Sequence[Mapping[str, Any]]) -> None:
        """One completed forward/forward_backward: every model-input token of its datums (train)."""
        self.total += TokenCount(train=sum(len(chunk["tokens"]) for d in datums
                                           for chunk in d["modelInput"]["chunks"]))


def cost_usd(count: TokenCount, prices: Prices | None) -> float | None:
    """US dollars of ``count`` at ``prices`` (USD per million tokens of each kind); None without prices."""
    if prices is None:
        return None
    return (count.prefill * prices.prefill_usd_per_million + count.sample * prices.sample_usd_per_million
            + count.train * prices.train_usd_per_million) / 1e6


def control_client(region: str | None) -> Any:
    """boto3's ``sagemaker`` client at the endpoint the SDK creates sessions through
    (SAGEMAKER_TRAINING_SESSION_ENDPOINT when set, otherwise the Region's)."""
    import boto3

    endpoint = os.environ.get("SAGEMAKER_TRAINING_SESSION_ENDPOINT") or None
    return boto3.client("sagemaker", region_name=region, endpoint_url=endpoint)


def service_count(session_name: str, region: str | None, client: Any = None) -> TokenCount | None:
    """The session's BillableTokenUsage, or None (with a warning) when it cannot be read."""
    try:
        detail = (client or control_client(region)).describe_training_session(
            TrainingSessionName=session_name)["TrainingSessionDetail"]
        usage = detail.get("BillableTokenUsage")
    except Exception as exc:  # noqa: BLE001 - the bill is reported, never a reason to fail the step
        log.warning("billable tokens of training session %s not read: DescribeTrainingSession failed (%s: %s)",
                    session_name, type(exc).__name__, exc)
        return None
    if usage is None:
        log.warning("billable tokens of training session %s not read: DescribeTrainingSession returned no "
                    "BillableTokenUsage", session_name)
        return None
    return TokenCount.from_service(usage)


def block(client: TokenCount, service: TokenCount | None, session_name: str | None,
          prices: Prices | None, earlier: TokenCount = TokenCount()) -> dict[str, Any]:
    """A step's ``billing`` (model.json, evaluation.json): the totals (the service's count of this session when
    read, else the client's), where they come from, the client count beside them and, with prices, the money.
    ``earlier``: tokens of earlier sessions of a resumed step, as their train lines counted them: the client
    count starts from it, and it is added to the service's count of this session."""
    total = earlier + service if service is not None else client
    record: dict[str, Any] = {**total.fields(), "source": SERVICE if service is not None else CLIENT,
                              "session": session_name, "client_count": client.fields()}
    if earlier != TokenCount():
        record["earlier_sessions"] = earlier.fields()
    usd = cost_usd(total, prices)
    if usd is not None:
        record["cost_usd"] = round(usd, 6)
        record["prices"] = prices.model_dump()
    return record


def line(record: Mapping[str, Any]) -> str:
    """The step's ``billing:`` line."""
    text = "billing: " + " ".join(f"{k}={record[k]}" for k in FIELDS)
    if "cost_usd" in record:
        text += f" cost_usd={record['cost_usd']:.6f}"
    text += f" source={'service' if record['source'] == SERVICE else 'client'} session={record['session']}"
    return text + " " + " ".join(f"client_{k}={v}" for k, v in record["client_count"].items())


def totals(*blocks: Mapping[str, Any] | None) -> tuple[TokenCount, list[str]]:
    """The tokens of several steps' ``billing`` blocks together, and their sources (absent blocks skipped)."""
    found = [b for b in blocks if b]
    count = sum((TokenCount.from_fields(b) for b in found), TokenCount())
    return count, sorted({b.get("source", CLIENT) for b in found})
