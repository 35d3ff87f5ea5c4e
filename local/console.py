"""What a local run shows on the terminal: one compact line per training step, every line within 100 columns.

The steps print full ``key=value`` lines (steps/dapo/metrics.py): SageMaker's metric regexes read them from
the job's log, and a local run keeps them whole in ``runs/<id>/logs/<step>.log``. Here they are only *rendered*
for a person: a step's ``sampling:`` and ``train:`` lines become one line, and any other line is wrapped at
:data:`WIDTH` (a word that does not fit, a long path say, goes on its own line, whole; a command to copy is
never wrapped). The local runner's own lines (:func:`say`) and its steps' (:class:`Progress`) are printed here.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from steps import terminal
from steps.terminal import WIDTH, fit


def fields(line: str) -> dict[str, str]:
    """``"train: step=3 reward_mean=0.42 ..."`` -> ``{"step": "3", "reward_mean": "0.42", ...}``."""
    _, _, rest = line.partition(": ")
    return dict(word.split("=", 1) for word in rest.split() if "=" in word)


def _number(text: str | None, spec: str) -> str:
    """A figure of a step line as the compact line shows it; "-" when the step did not print it or it is nan."""
    try:
        value = float(text) if text is not None else math.nan
    except ValueError:
        return text or "-"
    return "-" if math.isnan(value) else format(value, spec)


def compact_train_line(train: dict[str, str], sampling: dict[str, str] | None = None) -> str:
    """One training step in some 90 columns: progress (step/total), reward, sampled accuracy, kept/sampled
    groups, entropy, trained tokens per second and the time left. ``train``/``sampling``: the fields of the
    step's lines. Two decimals: a glance; the logs and metrics.jsonl keep every figure whole."""
    step = train.get("step", "?")
    parts = [f"step {train.get('progress') or step}",
             f"reward {_number(train.get('reward_mean'), '.2f')}",
             f"acc {_number(train.get('accuracy'), '.2f')}"]
    if sampling and sampling.get("step") == step:
        parts.append(f"kept {sampling.get('kept_groups', '?')}/{sampling.get('groups_sampled', '?')}")
    parts.append(f"entropy {_number(train.get('entropy'), '.3g')}")
    try:
        rate = float(train["tokens"]) / float(train["seconds"])
        parts.append(f"{rate / 1000:.0f}k tok/s" if rate >= 10_000 else f"{rate:,.0f} tok/s")
    except (KeyError, ValueError, ZeroDivisionError):
        pass
    if "eta" in train:
        parts.append(f"eta {train['eta']}")
    return "  ".join(parts)


def compact_eval_line(figures: dict[str, str]) -> str:
    """EvaluateModel's ``eval:`` line (the paired evaluation) in a line or two: both accuracies, the improvement
    with its 95% interval, pass@k of both; TrainDAPO's short in-training ``eval: step=N accuracy=A`` stays as is."""
    def number(key: str, spec: str = ".3f") -> str:
        return _number(figures.get(key), spec)

    text = (f"eval on {figures.get('n', '?')} questions: accuracy {number('accuracy')} (base "
            f"{number('base_accuracy')}), improvement {number('improvement', '+.3f')} (95% CI "
            f"{number('improvement_ci95_low', '+.3f')} to {number('improvement_ci95_high', '+.3f')})")
    k = next((key[len("pass_at_"):] for key in figures if key.startswith("pass_at_")), None)
    if k:
        text += f", pass@{k} {number(f'pass_at_{k}')} (base {number(f'base_pass_at_{k}')})"
    return text


@dataclass
class StepLines:
    """Turns one step's output into what the terminal shows, line by line; remembers each step's last
    ``sampling:`` line, which the ``train:`` line of the same step is shown with."""

    width: int = WIDTH
    _sampling: dict[str, dict[str, str]] = field(default_factory=dict)  # per step name

    def render(self, step: str, line: str) -> list[str]:
        """The terminal lines for one line ``step`` printed (none for a ``sampling:`` line: it joins the next
        ``train:`` line); the caller decides which lines are shown at all."""
        if line.startswith("sampling: "):
            self._sampling[step] = fields(line)
            return []
        if line.startswith("train: "):
            return fit(f"[{step}] {compact_train_line(fields(line), self._sampling.get(step))}", self.width)
        if line.startswith("eval: ") and "base_accuracy=" in line:
            return fit(f"[{step}] {compact_eval_line(fields(line))}", self.width)
        if line.startswith("approve: ") and "; " in line:  # the package's whole description: in the step's log
            return fit(f"[{step}] {line.split('; ', 1)[0]}; ... (all of it: logs/{step}.log)", self.width)
        return fit(f"[{step}] {line}", self.width)


# -- the local run's own lines and its steps' ----------------------------------------------
def announcements(values: dict[str, Any]) -> dict[str, str]:
    """What each step does with this run's values, said when it starts."""
    size = values.get("EvalSize")
    questions = "every held-out question" if not size else f"the first {size} held-out questions"
    return {
        "ValidateData": "checks the train and held-out data",
        "TrainDAPO": (f"{values.get('MaxSteps')} optimizer steps of {values.get('BatchSize')} prompts x "
                      f"{values.get('GroupSize')} completions"),
        "EvaluateModel": f"evaluates the base model and the trained adapter, each on {questions}",
        "CheckAccuracy": f"accuracy >= {values.get('AccuracyThreshold')}, improvement's 95% lower bound >= "
                         f"{values.get('MinImprovement')}, >= 1 optimizer step, no guard stop?",
        "ApproveModel": "writes the evaluation onto the model package and approves it",
        "RecordRejection": "writes the evaluation and the failed conditions onto the model package, Rejected",
    }


#: The lines of a step's output the console shows (all of it is in runs/<id>/logs/<step>.log); by default a
#: step's sampling: and train: lines are shown as one compact line (:func:`fit`), with --verbose as printed.
SHOWN = ("data:", "forecast:", "sampling:", "train:", "eval:", "done:", "approve:", "warning:", "stopped:")


def say(text: str, file: Any = None) -> None:
    """One of the run's own messages, within the terminal's 100 columns (:func:`fit`); local-run.log
    keeps it too, timestamped, among the runner's warnings and tracebacks."""
    terminal.say(text, file)
    logging.getLogger("local.run").info("%s", text)


class Progress:
    """Step status lines, and the steps' own prefixed lines: compact and within 100 columns, or (``verbose``)
    the steps' full lines as they printed them."""

    def __init__(self, quiet: bool, log_dir: Path, verbose: bool = False) -> None:
        self.quiet = quiet
        self.verbose = verbose
        self.log_dir = log_dir
        self.started: dict[str, float] = {}
        self.about: dict[str, str] = {}
        self.rendered = StepLines()

    def _print(self, text: str) -> None:
        if self.verbose:
            print(text, flush=True)
            logging.getLogger("local.run").info("%s", text)
        else:
            say(text)

    def status(self, rec: Any) -> None:
        if rec.status == "Executing":
            self.started[rec.name] = time.monotonic()
            about = f": {self.about[rec.name]}" if rec.name in self.about else ""
            self._print(f"[{rec.name}] started ({rec.type}){about}")
            return
        took = f" in {time.monotonic() - self.started[rec.name]:.1f}s" if rec.name in self.started else ""
        extra = f": {rec.message}" if rec.message else ""
        log = self.log_dir / f"{rec.name}.log"
        if rec.status == "Failed" and log.exists():
            extra += f" (whole log: {log})"
        self._print(f"[{rec.name}] {rec.status}{took}{extra}")

    def line(self, step: str, line: str) -> None:
        if not (line.startswith(("error:", "stopped:")) or (not self.quiet and line.startswith(SHOWN))):
            return
        if self.verbose:
            print(f"[{step}] {line}", flush=True)
            return
        for shown in self.rendered.render(step, line):
            print(shown, flush=True)
