"""How fast the training-session service's GPUs work: the figures the product prices a run with.

``make start-pipeline`` and the local run print, before a run, the most session time a step may
take (``pipeline/budget.py``); the local service's cost model (``local/training_session/costs.py``)
simulates its GPUs at these same figures. They live here, with the product, because the estimate
is the product's promise; the simulator is a test stand-in that borrows them.

**Defaults**, for a 20-30B dense model with LoRA on a few H100s; what the comparisons depend on
are the ratios between them (decode against training, a lone sequence against a full batch, a
save against a step), not the absolute seconds:

* decode: 25 ms per token for one sequence, 6,000 tokens/s shared (a batch capacity of 150
  sequences). GPUStack's performance lab (docs.gpustack.ai, "Qwen3-32B on H100") measures
  vLLM and TensorRT-LLM at 2,100-6,800 total tokens/s per H100 under high concurrency, with
  mostly 43-290 ms per output token at that load; a lone sequence decodes in a few tens of ms.
* prefill: 20,000 tokens/s: Tinker (tinker-docs.thinkingmachines.ai, models and pricing:
  Qwen3.6-27B prefill $1.86, sample $5.60 per million tokens) and Prime Intellect
  (docs.primeintellect.ai, hosted training: Qwen3.5-35B-A3B input $0.25, output $0.75) price
  a prompt token at about a third of a generated one, and it batches far better.
* training: 5,000 tokens/s forward+backward, on hardware the size of the sampler's: both
  price a trained token at 1-1.3x a generated one (Prime Intellect: train $1.00 against
  output $0.75; Tinker's small models: train = sample).
* optim_step 1 s, save_weights_for_sampler 3 s (write a rank-32 adapter and load it into
  the sampler), save_state 10 s (the adapter and its Adam moments to S3): no public
  figures; orders of magnitude.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

#: A forward pass without the backward costs about a third of forward_backward.
FORWARD_SHARE = 1 / 3
#: The figures that are rates (> 0), and those that are fixed times (>= 0).
RATES = ("decode_tokens_per_s", "token_latency_ms", "prefill_tokens_per_s", "train_tokens_per_s")
SECONDS = ("optim_step_s", "save_weights_s", "save_state_s")


@dataclass(frozen=True)
class Throughput:
    """The service's GPU throughput (see the module docstring for where each default comes from)."""

    decode_tokens_per_s: float = 6000.0
    token_latency_ms: float = 25.0
    prefill_tokens_per_s: float = 20000.0
    train_tokens_per_s: float = 5000.0
    optim_step_s: float = 1.0
    save_weights_s: float = 3.0
    save_state_s: float = 10.0
    KIND: ClassVar[str] = "throughput"  # names the settings in an error message

    def __post_init__(self) -> None:
        for name in RATES:
            self._require(name, lambda v: v > 0, "a number > 0")
        for name in SECONDS:
            self._require(name, lambda v: v >= 0, "a number of seconds >= 0")

    def _require(self, name: str, ok: Any, expected: str) -> None:
        value = getattr(self, name)
        if not (isinstance(value, (int, float)) and not isinstance(value, bool) and ok(value)):
            raise ValueError(f"{self.KIND} setting {name}={value!r} is invalid: expected {expected}")

    @property
    def capacity(self) -> float:
        """Sequences the sampler decodes at full per-token speed."""
        return self.decode_tokens_per_s * self.token_latency_ms / 1000

    @property
    def fastest_token_s(self) -> float:
        """Seconds per token of a sequence decoding at full speed: no sequence decodes faster."""
        return self.token_latency_ms / 1000

    def decode_rate(self, active: int) -> float:
        """Tokens per second each of ``active`` sequences gets."""
        return min(1000 / self.token_latency_ms, self.decode_tokens_per_s / max(active, 1))

    def training_seconds(self, kind: str, tokens: int) -> float:
        """Seconds of one training operation (``kind``: the API's operationConfig member)."""
        if kind in ("forwardBackward", "forward"):
            share = 1.0 if kind == "forwardBackward" else FORWARD_SHARE
            return share * tokens / self.train_tokens_per_s
        fixed = {"optimizerStep": self.optim_step_s, "saveWeights": self.save_weights_s,
                 "saveState": self.save_state_s, "loadState": self.save_state_s}
        return fixed[kind]
