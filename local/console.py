"""What a local run shows on the terminal: one compact line per training step, every line within 100 columns.

The steps print full ``key=value`` lines (steps/dapo/metrics.py): SageMaker's metric regexes read them from
the job's log, and a local run keeps them whole in ``runs/<id>/logs/<step>.log``. Here they are only *rendered*
for a person: a step's ``sampling:`` and ``train:`` lines become one line, and any other line is wrapped at
:data:`WIDTH` (a word that does not fit, a long path say, goes on its own line; cut only if it is wider
than the terminal itself).
"""
from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass, field

WIDTH = 100
#: A wrapped line's continuation: indented under its first line, a little further.
CONTINUATION = "    "


def fields(line: str) -> dict[str, str]:
    """``"train: step=3 reward_mean=0.42 ..."`` -> ``{"step": "3", "reward_mean": "0.42", ...}``."""
    _, _, rest = line.partition(": ")
    return dict(word.split("=", 1) for word in rest.split() if "=" in word)


def fit(text: str, width: int = WIDTH) -> list[str]:
    """``text`` (one line or several) in lines of at most ``width`` columns: each wrapped at spaces, its
    continuation lines indented under it; a word that cannot fit (a long path) gets a line of its own."""
    out: list[str] = []
    for line in text.split("\n"):
        if len(line) <= width:
            out.append(line)
            continue
        lead = line[:len(line) - len(line.lstrip())]
        for wrapped in textwrap.wrap(line.lstrip(), width=width, initial_indent=lead,
                                     subsequent_indent=lead + CONTINUATION, break_long_words=False,
                                     break_on_hyphens=False):
            out += _split(wrapped, width, lead + CONTINUATION)
    return out


def _split(line: str, width: int, indent: str) -> list[str]:
    """A line that is one word too long for any line (an ARN, a deep path; textwrap gave it a line of its
    own): cut at the width, the rest indented, so that nothing is wider than the terminal."""
    if len(line) <= width:
        return [line]
    room = max(width - len(indent), 20)
    return [line[:width]] + [indent + line[i:i + room] for i in range(width, len(line), room)]


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
