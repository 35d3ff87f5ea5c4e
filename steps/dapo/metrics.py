"""One metrics record per step, built here, written everywhere it is read.

The same figures go to the log lines (CloudWatch metric regexes of the
pipeline match them; fields are only ever appended), to ``metrics.jsonl``
(one JSON object per line, flushed per record, so a killed job keeps what it
logged and a resumed one continues the file), and to any tracker.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from steps.dapo import rollouts as rollout_records
from steps.dapo.batch import TrainSample
from steps.dapo.sampling import Group, StepBatch
from steps.platform import files
from steps.platform.billing import line as billing_line

# Fields of each log line, in order. The pipeline's metric regexes match them: only ever append.
SAMPLING_FIELDS = ("step", "gen_batches", "groups_sampled", "filtered_frac", "kept_groups", "empty_rollouts")
# accuracy: strict (only an answer committed in the instructed form counts: #### N or \boxed{N} for GSM8K);
# accuracy_lenient also takes one found otherwise, e.g. "the answer is N" (the task's grader: steps/dapo/task.py).
# Then the health figures (steps/dapo/health.py): entropy estimate, sampler-trainer mismatch (k3 KL), completion length
# percentiles, the share ending in a repetition loop, format errors.
TRAIN_FIELDS = ("step", "reward_mean", "accuracy", "loss", "tokens", "seconds", "accuracy_lenient",
                "completion_tokens_mean", "truncated_frac", "off_policy_steps",
                "entropy", "sampler_kl", "completion_tokens_p50", "completion_tokens_p95", "completion_tokens_max",
                "repetition_frac", "format_error_rate")
#: Figures not every step can measure: left out of the line (and the record) where not measured, with a
#: ``<name>_note`` in the record saying why (health.sampler_kl), so no regex or curve gets a NaN or a made-up 0.
MEASURED_WHERE_POSSIBLE = frozenset({"sampler_kl"})
EVAL_FIELDS = ("step", "accuracy")
# Appended to the train line after TRAIN_FIELDS: the billable tokens the run has sent and received so far (the
# client count, steps/platform/billing.py; sampling ahead, the next step's sampling is in it), and with
# session.prices their cost.
TOKEN_FIELDS = ("prefill_tokens", "sample_tokens", "train_tokens", "cost_usd")
# Appended after those: the length bias a step's fill can bring (issue 30). Completion lengths of the groups the
# step trained (carried ones included) against every group it sampled: a step filled by the groups that finish
# first trains short completions sooner than long ones. nan for the sampled ones when the step sampled nothing.
LENGTH_FIELDS = ("trained_completion_tokens_mean", "trained_completion_tokens_p95",
                 "sampled_completion_tokens_mean", "sampled_completion_tokens_p95")
# Appended after LENGTH_FIELDS when selective rollouts are on (steps/dapo/selective.py): prompts skipped as the
# step's generation batches were drawn, the share of its sampled prompts predicted mixed (last group mixed, or
# never sampled) and the share observed mixed (its keep rate), and the share sampled though predicted all-equal.
SELECTIVE_FIELDS = ("skipped_prompts", "predicted_keep_rate", "observed_keep_rate", "exploration_share")
# The forecast before step 1 (steps/dapo/forecast.py), in two lines: what the probe saw, then what it predicts.
FORECAST_FIELDS = (("prompts", "group_size", "pass_rate", "pass_rate_lenient", "format_rate", "keep_rate"),
                   ("gen_batches_per_step", "steps", "sampled_tokens", "trained_tokens", "cost_usd"))


def sampling_figures(step: int, batch: StepBatch) -> dict[str, Any]:
    sampled = len(batch.sampled)
    # A step filled by carried groups sampled nothing: its filtered fractions are not 0 (which reads as "every
    # group was useful") but undefined. NaN prints as "nan", which the metric regexes skip, so CloudWatch and
    # the curves get no point for that step rather than a false one.
    return {
        "step": step, "gen_batches": batch.gen_batches, "groups_sampled": sampled,
        "filtered_frac": batch.filtered / sampled if sampled else math.nan,
        "kept_groups": len(batch.kept), "empty_rollouts": batch.empty_rollouts,
        "filtered_all_wrong_frac": batch.filtered_all_wrong / sampled if sampled else math.nan,
        "carried_groups": len(batch.carry), "failed_groups": batch.failed_groups,
        "speculative_batches": batch.speculative,
    }


def train_figures(batch: StepBatch, samples: Sequence[TrainSample], fb_metrics: dict[str, float] | None,
                  seconds: float, update: int, stale_dropped: int = 0) -> dict[str, Any]:
    """The figures of optimizer step ``update``; ``stale_dropped``: surplus groups too old to carry into the next."""
    # The rollouts sampled this step; a step whose batch came entirely from carried groups sampled none,
    # so it reports the rollouts it trained on (sampled one step earlier) rather than zeros.
    groups: Sequence[Group] = batch.sampled or batch.kept
    rollouts = [r for g in groups for r in g.rollouts]
    n = len(rollouts) or 1
    return {
        "reward_mean": sum(r.reward for r in rollouts) / n,
        "accuracy": sum(r.grade.correct for r in rollouts) / n,
        "accuracy_lenient": sum(r.grade.correct_lenient for r in rollouts) / n,
        # Rollout lengths: a reasoning model's grow or shrink as it learns; cut-off ones hit max_tokens.
        "completion_tokens_mean": sum(len(r.tokens) for r in rollouts) / n,
        "truncated_frac": sum(r.stop_reason == "length" for r in rollouts) / n,
        "loss": float((fb_metrics or {}).get("loss:sum", float("nan"))),
        "tokens": sum(len(s.completion) for s in samples if s.weight > 0),
        "seconds": seconds,
        # Steps between the weights that sampled a trained group and the ones this update starts from.
        "off_policy_steps": max((update - 1 - g.sampler_step for g in batch.kept), default=0),
        "stale_groups_dropped": stale_dropped,
        **length_bias(batch),
    }


def _lengths(groups: Sequence[Group]) -> tuple[float, float]:
    """(mean, p95) completion tokens of ``groups``' rollouts (numpy's linear-interpolated percentile, as the
    health figures'); nan for none."""
    lengths = [len(r.tokens) for g in groups for r in g.rollouts]
    if not lengths:
        return math.nan, math.nan
    return sum(lengths) / len(lengths), float(np.percentile(lengths, 95))


def length_bias(batch: StepBatch) -> dict[str, float]:
    """:data:`LENGTH_FIELDS` of a step: its trained groups' completion lengths against all it sampled."""
    trained, sampled = _lengths(batch.kept), _lengths(batch.sampled)
    return {"trained_completion_tokens_mean": trained[0], "trained_completion_tokens_p95": trained[1],
            "sampled_completion_tokens_mean": sampled[0], "sampled_completion_tokens_p95": sampled[1]}


#: Decimals of the float figures that are not fractions (those get 4); SIGNIFICANT ones get 6 significant digits.
DECIMALS = {"seconds": 2, "completion_tokens_mean": 1, "completion_tokens_p50": 1, "completion_tokens_p95": 1,
            "cost_usd": 6, **{k: 1 for k in LENGTH_FIELDS}}
SIGNIFICANT = {"loss", "sampler_kl"}  # the KL of a healthy run is ~1e-6: 4 decimals would print 0


def _format(value: Any, key: str) -> str:
    if isinstance(value, float):
        return f"{value:.6g}" if key in SIGNIFICANT else f"{value:.{DECIMALS.get(key, 4)}f}"
    return str(value)


def line(prefix: str, record: dict[str, Any], fields: Sequence[str]) -> str:
    return f"{prefix}: " + " ".join(f"{k}={_format(record[k], k)}" for k in fields)


def progress(step: int, total: int | None, seconds: Sequence[float]) -> str:
    """The train line's ending: `` progress=12/30 eta=1m05s``, the time left at the mean pace of ``seconds``
    (the steps trained so far; evaluations excluded). After every field: the metric regexes never see it."""
    if not total:
        return ""
    left = max(0, total - step) * (sum(seconds) / len(seconds) if seconds else 0.0)
    minutes, secs = divmod(round(left), 60)
    return f" progress={step}/{total} eta={f'{minutes}m{secs:02d}s' if minutes else f'{secs}s'}"


class Tracker(Protocol):
    def log_metrics(self, record: dict[str, Any], step: int) -> None: ...

    def log_table(self, data: dict[str, list[Any]], artifact_file: str) -> None: ...


@dataclass
class MetricsLog:
    """Where each record goes: stdout lines, ``metrics.jsonl``, trackers."""

    path: Path
    print_fn: Callable[[str], None] = print
    trackers: list[Tracker] = field(default_factory=list)
    total_steps: int | None = None  # the run's last step: train lines end with progress= and eta=
    _step_seconds: list[float] = field(default_factory=list)  # this process's steps, for the ETA

    def __post_init__(self) -> None:
        self.path = Path(self.path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def sampling(self, record: dict[str, Any]) -> None:
        """Printed as soon as a step's sampling ends: progress while it trains."""
        self.print_fn(line("sampling", record, SAMPLING_FIELDS))
        if record["speculative_batches"]:
            # Its own prefix: exactly one `sampling:` line per step keeps the metric regexes simple.
            self.print_fn(f"speculation: step={record['step']} early_gen_batches={record['speculative_batches']} "
                          "(the keep rate so far said one more generation batch would not fill the step, "
                          "so more were started at once)")

    def step(self, record: dict[str, Any]) -> None:
        self._step_seconds.append(float(record["seconds"]))
        fields = tuple(k for k in TRAIN_FIELDS if k in record or k not in MEASURED_WHERE_POSSIBLE) + tuple(
            k for k in TOKEN_FIELDS + LENGTH_FIELDS + SELECTIVE_FIELDS if k in record)
        self.print_fn(line("train", record, fields) + progress(record["step"], self.total_steps, self._step_seconds))
        self._write("step", record)

    def eval(self, record: dict[str, Any]) -> None:
        self.print_fn(line("eval", record, EVAL_FIELDS))
        self._write("eval", record)

    def forecast(self, record: dict[str, Any]) -> None:
        """The forecast before step 1: its two ``forecast:`` lines and a ``forecast`` record, of step 1 (its probe is
        step 1's first generation batch: a run resumed before step 1 forecasts again, and the record is redone)."""
        for fields in FORECAST_FIELDS:
            self.print_fn(line("forecast", record, tuple(k for k in fields if k in record)))
        self._write("forecast", {"step": 1, **record})

    def stopped(self, record: dict[str, Any]) -> None:
        self._write("stopped", record)

    def billing(self, step: int, block: dict[str, Any]) -> None:
        """The session's billed tokens once it stopped (steps/platform/billing.py's block): its ``billing:`` line,
        and a ``billing`` record (trackers: ``billing/prefill_tokens`` ...; ``client_*``: the client count)."""
        self.print_fn(billing_line(block))
        client = {f"client_{k}": v for k, v in block["client_count"].items()}
        self._write("billing", {"step": step, **{k: block[k] for k in TOKEN_FIELDS if k in block}, **client,
                                "source": block["source"]})

    def rollouts(self, records: Sequence[dict[str, Any]], step: int) -> None:
        """An evaluation's rollouts (steps/dapo/rollouts.py): rollouts.jsonl beside metrics.jsonl, and a table
        in every tracker."""
        if not records:
            return
        rollout_records.append(self.path.parent / rollout_records.FILE, records)
        for tracker in self.trackers:
            tracker.log_table(rollout_records.table(records), rollout_records.artifact_file(step))

    def _write(self, kind: str, record: dict[str, Any]) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"kind": kind, **record}) + "\n")
        for tracker in self.trackers:
            tracker.log_metrics({f"{kind}/{k}": v for k, v in record.items() if k != "step"}, step=record["step"])


def read(path: str | Path) -> list[dict[str, Any]]:
    p = Path(path)
    if not p.exists():
        return []
    return files.read_records(p)


def truncate_after(path: str | Path, step: int) -> None:
    """Drop records of steps beyond ``step``: a resumed run redoes them from its checkpoint."""
    p = Path(path)
    if not p.exists():
        return
    keep = [r for r in read(p) if r.get("step", 0) <= step]
    files.write_text(p, "".join(json.dumps(r) + "\n" for r in keep))
